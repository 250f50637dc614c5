"""The sandbox's private filesystem (`trl_ada.rewards.sandbox_root`): what the copy holds, that programs cannot change
it, that it goes with the process that made it and with nothing else, and the error where no tmpfs has room."""

from __future__ import annotations

import fcntl
import os
import pickle
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from trl_ada.rewards import sandbox_root
from trl_ada.rewards.sandbox import INSTALL_HINT, Sandbox, SandboxLimits

CI = os.environ.get("CI", "").lower() == "true"
needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None and not CI, reason=f"bubblewrap is not installed: {INSTALL_HINT}"
)
LIMITS = SandboxLimits(wall_time_s=10, cpu_time_s=5)
REPO = str(Path(sandbox_root.__file__).resolve().parents[2])


@pytest.fixture(scope="module")
def box() -> Sandbox:
    return Sandbox(LIMITS)


def _root_path(box: Sandbox) -> Path:
    assert box._root is not None
    return Path(box._root.path)


@needs_bwrap
def test_the_copy_holds_the_interpreter_and_its_standard_library_but_no_installed_packages(box):
    root = _root_path(box)
    assert (root / box.python.lstrip("/")).is_file()
    stdlib = subprocess.run(
        [box.python, "-I", "-S", "-c", "import sysconfig; print(sysconfig.get_path('stdlib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    copied = root / os.path.realpath(stdlib).lstrip("/")
    assert (copied / "os.py").is_file() and (copied / "json" / "__init__.py").is_file()
    # Byte code stays valid only with its source's modification time.
    assert (copied / "os.py").stat().st_mtime_ns == Path(os.path.realpath(stdlib), "os.py").stat().st_mtime_ns
    names = {path.name for path in root.rglob("*") if path.is_dir()}
    assert not names & {"site-packages", "dist-packages"}
    assert not (copied / "test").exists()
    assert all(not path.stat().st_mode & 0o022 for path in root.rglob("*") if not path.is_symlink())


@needs_bwrap
def test_the_interpreter_and_the_tools_are_on_the_path(box):
    program = """
import subprocess
print(subprocess.run(["python3", "-c", "print(6 * 7)"], capture_output=True, text=True).stdout.strip())
print(subprocess.run(["sh", "-c", "echo $((2 + 3)) | cat && true && ! false && sleep 0 && env"],
                     capture_output=True, text=True).stdout.split())
"""
    result = box.run(program=program)
    assert result.status == "ok", result
    python, shell = result.stdout.splitlines()
    assert python == "42" and shell.startswith("['5', ") and "PATH=" in shell, result


@needs_bwrap
def test_a_program_cannot_change_the_copy(box):
    program = """
import os
for attempt in (lambda: open(os.__file__, "a"), lambda: os.chmod(os.__file__, 0o777),
                lambda: os.rename(os.__file__, "/tmp/os.py"), lambda: open("/usr/bin/sh", "wb")):
    try:
        attempt()
        print("CHANGED")
    except OSError as error:
        print("refused", error.errno)
"""
    before = {path: path.stat().st_mtime_ns for path in _root_path(box).rglob("os.py")}
    result = box.run(program=program)
    assert result.status == "ok" and "CHANGED" not in result.stdout and result.stdout.count("refused") == 4, result
    assert before == {path: path.stat().st_mtime_ns for path in _root_path(box).rglob("os.py")}


def test_a_copy_is_swept_only_when_no_process_holds_its_lock(tmp_path):
    dead = tmp_path / f"{sandbox_root._PREFIX}dead"
    live = tmp_path / f"{sandbox_root._PREFIX}live"
    making = tmp_path / f"{sandbox_root._PREFIX}making"  # no lock file yet: it is being made
    other = tmp_path / "someone-elses"
    for directory in (dead, live, making, other):
        (directory / "usr").mkdir(parents=True)
    (dead / sandbox_root._OWNER_FILE).touch()
    (live / sandbox_root._OWNER_FILE).touch()
    (other / sandbox_root._OWNER_FILE).touch()
    # A lock another process holds: a child takes it and waits (a PID alone would not do: it names another process in
    # another PID namespace).
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys; f = open(sys.argv[1]); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); "
            "sys.stdin.read()",
            str(live / sandbox_root._OWNER_FILE),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        sandbox_root.remove_stale_roots(str(tmp_path))
        assert not dead.exists()
        assert live.exists() and making.exists() and other.exists()
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    sandbox_root.remove_stale_roots(str(tmp_path))
    assert not live.exists() and making.exists() and other.exists()


@needs_bwrap
def test_the_copy_goes_with_the_process_that_made_it_and_not_before():
    code = (
        f"import sys; sys.path.insert(0, {REPO!r}); from trl_ada.rewards.sandbox import Sandbox; box = Sandbox(); "
        "print(box._root.path, flush=True); assert box.run(['/bin/true']).status == 'ok'"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    made = Path(out.stdout.split()[0])
    assert made.parent == Path(sandbox_root.find_tmpfs(needed_bytes=0))
    assert not made.exists()


@needs_bwrap
def test_an_unpickled_sandbox_makes_its_own_copy_when_its_makers_is_gone(monkeypatch):
    monkeypatch.setattr(sandbox_root, "_roots", {})  # a copy of this test's own, not the other tests'
    data = pickle.dumps(Sandbox(LIMITS))
    made = Path(pickle.loads(data)._root.path)
    # As in a process the copy's maker has left: its copy and its registry entry are gone.
    shutil.rmtree(made)
    sandbox_root._roots.clear()
    revived = pickle.loads(data)
    assert Path(revived._root.path) != made and Path(revived._root.path).is_dir()
    assert revived.run(program="print('ran')").stdout == "ran\n"


@needs_bwrap
def test_no_tmpfs_with_room_is_a_clear_error_before_anything_runs(monkeypatch):
    monkeypatch.setattr(sandbox_root, "_roots", {})
    monkeypatch.setattr(sandbox_root, "TMPFS_CANDIDATES", ("/proc",))
    with pytest.raises(RuntimeError, match=r"noexec.*--tmpfs /tmp:exec.*filesystem='host'"):
        Sandbox(LIMITS)
    host = Sandbox(LIMITS, filesystem="host")
    assert host.run(program="print('ran')").stdout == "ran\n"


def test_a_bad_filesystem_is_refused():
    with pytest.raises(ValueError, match="'private' or 'host'"):
        Sandbox(LIMITS, filesystem="copy")  # type: ignore[arg-type]


def test_find_tmpfs_takes_only_a_writable_tmpfs_with_room():
    assert sandbox_root.find_tmpfs(["/proc", "/nonexistent"]) is None
    shm = sandbox_root.find_tmpfs(["/dev/shm"])
    if shm is None:
        pytest.skip("no tmpfs at /dev/shm on this machine")
    assert sandbox_root.find_tmpfs(["/dev/shm"], needed_bytes=1 << 60) is None


def test_find_tmpfs_passes_over_a_noexec_or_read_only_tmpfs(monkeypatch):
    """Docker mounts /dev/shm noexec: a copy there could not run the interpreter."""
    if sandbox_root.find_tmpfs(["/dev/shm"]) is None:
        pytest.skip("no tmpfs at /dev/shm on this machine")
    real_statvfs = os.statvfs
    for flag in (os.ST_NOEXEC, os.ST_RDONLY):

        def flagged(path, flag=flag):
            usage = real_statvfs(path)
            return types.SimpleNamespace(f_bavail=usage.f_bavail, f_frsize=usage.f_frsize, f_flag=usage.f_flag | flag)

        monkeypatch.setattr(sandbox_root.os, "statvfs", flagged)
        assert sandbox_root.find_tmpfs(["/dev/shm"]) is None


def test_the_owner_lock_is_taken_before_the_lock_file_is_named(tmp_path):
    sandbox_root._hold(str(tmp_path))
    try:
        fd = os.open(tmp_path / sandbox_root._OWNER_FILE, os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    finally:
        os.close(sandbox_root._held.pop(str(tmp_path)))
