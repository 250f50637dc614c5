"""`trl_ada.checkpoints.resolve_resume_checkpoint` on its own, with stand-in collectives (no trainer, no process group).

The trainer-level behaviour (a real resume, the messages a user sees) is tests/test_resume.py's; the two-process case
of a checkpoint only the main process can read is tests/test_multiprocess.py's.
"""

from pathlib import Path

import pytest

from trl_ada.checkpoints import check_resumable, resolve_resume_checkpoint


def complete_checkpoint(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text("{}")
    return path


def no_collective(objects):
    raise AssertionError("no collective expected")


@pytest.mark.parametrize("value", [None, False])
def test_no_resume_passes_through_without_a_collective(tmp_path, value):
    got = resolve_resume_checkpoint(
        value, str(tmp_path), is_main_process=True, broadcast=no_collective, gather=no_collective
    )
    assert got is value


def test_true_picks_the_newest_loadable_checkpoint_on_the_main_process(tmp_path):
    complete_checkpoint(tmp_path / "checkpoint-1")
    (tmp_path / "checkpoint-2").mkdir()  # a save cut short: no trainer_state.json
    sent = []

    def broadcast(objects):
        sent.append(list(objects))
        return objects

    got = resolve_resume_checkpoint(True, str(tmp_path), is_main_process=True, broadcast=broadcast, gather=lambda o: o)
    assert got == str(tmp_path / "checkpoint-1") and sent == [[got]]


def test_other_processes_take_the_main_processs_pick(tmp_path):
    picked = str(complete_checkpoint(tmp_path / "checkpoint-3"))
    sent = []

    def broadcast(objects):  # what the main process sent
        sent.append(list(objects))
        return [picked]

    got = resolve_resume_checkpoint(
        True, str(tmp_path), is_main_process=False, broadcast=broadcast, gather=lambda o: o
    )
    assert got == picked and sent == [[None]]  # a non-main process does not look for itself


def test_true_without_a_loadable_checkpoint_fails_listing_them(tmp_path):
    (tmp_path / "checkpoint-1").mkdir()
    with pytest.raises(ValueError, match="no complete checkpoint") as error:
        resolve_resume_checkpoint(True, str(tmp_path), is_main_process=True, broadcast=lambda o: o)
    assert f"{str(tmp_path)!r} holds checkpoint-1 (cannot be loaded)." in str(error.value)


def test_a_path_is_returned_as_given_once_every_process_can_load_it(tmp_path):
    checkpoint = complete_checkpoint(tmp_path / "checkpoint-1")
    got = resolve_resume_checkpoint(checkpoint, str(tmp_path), is_main_process=True, gather=lambda o: o + o)
    assert got is checkpoint  # a PathLike stays a PathLike, as Trainer.train got it before


def test_every_process_fails_when_another_cannot_read_the_checkpoint(tmp_path):
    checkpoint = str(complete_checkpoint(tmp_path / "checkpoint-1"))

    def gather(objects):  # rank 1 sees no such directory
        return objects + [(False, f"{checkpoint} does not exist", None)]

    with pytest.raises(ValueError, match=r"Process\(es\) \[1\] of 2 cannot read the complete checkpoint"):
        check_resumable(checkpoint, str(tmp_path), is_main_process=True, gather=gather)


def test_the_main_processs_view_decides_and_its_listing_is_shown(tmp_path):
    complete_checkpoint(tmp_path / "checkpoint-1")
    missing = str(tmp_path / "checkpoint-9")
    with pytest.raises(ValueError, match="does not exist") as error:
        check_resumable(missing, str(tmp_path), is_main_process=True, gather=lambda o: o)
    assert f"{str(tmp_path)!r} holds checkpoint-1." in str(error.value)
