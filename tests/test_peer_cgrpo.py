"""The trl-cgrpo peer runner's pure parts (benchmarks/peer/cgrpo_learning.py): completion counting over a fake
C-GRPO trainer, and run JSON that the tournament report reads. Needs neither trl-cgrpo nor torch."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the learning benchmarks' harness

from harness.tournament import tournament_summary, tournament_table  # noqa: E402


def _load(name: str, path: Path):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except ImportError as error:  # the runner's own imports (trl_ada's pure accounting) are missing
        del sys.modules[name]
        pytest.skip(f"the peer runner does not import here: {error}")
    return module


@pytest.fixture(scope="module")
def runner():
    return _load("cgrpo_learning", ROOT / "benchmarks" / "peer" / "cgrpo_learning.py")


class _Rows(list):
    """A list of reward rows with the one tensor method the runner calls."""

    def tolist(self):
        return [list(row) for row in self]


class FakeCGRPO:
    """The four CGRPOTrainer methods the counting wraps, with C-GRPO's row layout (groups padded to the width)."""

    num_generations = 4

    def __init__(self):
        self.state = SimpleNamespace(global_step=0)
        self.args = SimpleNamespace(calibration_answer_column="answer")
        self._padded_rows = None

    def _base_generate(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        return [[7] for _ in prompt_ids], None

    def _outcomes(self, texts, example):
        return [text.strip() for text in texts]

    def calibrate(self):
        for example, texts in (({"prompt": "1+1=", "answer": "2"}, ["2", "2", "3", ""]), ({"answer": "5"}, ["4"] * 4)):
            self._base_generate([[1]] * len(texts), None, {}, len(texts))
            self._outcomes(texts, example)
        return {4: 1.0}

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        return _Rows([[value] for value in self.fake_rewards])


def _fake_trainer(runner):
    class Counting(runner.CompletionCounting, FakeCGRPO):
        completion_ledger = runner.CompletionLedger()

    return Counting()


def test_counts_calibration_rollouts_and_budget_increments_but_not_padded_rows(runner):
    trainer = _fake_trainer(runner)
    ledger = trainer.completion_ledger
    # Step 0: a calibration (2 prompts x 4 rollouts), then two prompts drawn 2 each and one drawn 2 more.
    trainer.calibrate()
    trainer._padded_rows = [False, False, True, True, False, False, False, False]
    trainer._base_generate([[1]] * 4, None, {}, 2)
    trainer._base_generate([[2]] * 2, None, {}, 2)
    nan = math.nan
    trainer.fake_rewards = [1.0, 0.0, nan, nan, 0.0, 0.0, 0.0, 0.0]
    trainer._calculate_rewards(None, None, None, None)
    # Step 1: both prompts drawn 4 times, all right.
    trainer.state.global_step = 1
    trainer._padded_rows = [False] * 8
    trainer._base_generate([[1]] * 8, None, {}, 4)
    trainer.fake_rewards = [1.0] * 8
    trainer._calculate_rewards(None, None, None, None)
    # An evaluation-time reward call (no padded rows known) is not a training batch.
    trainer._padded_rows = None
    trainer._calculate_rewards(None, None, None, None)

    assert ledger.generated == [14, 8]  # 8 calibration + 6 drawn (the 2 padded rows were never generated)
    assert ledger.calibration == [8, 0]
    assert ledger.completions_before(1) == 14
    assert ledger.completions_before(2) == 22
    draws = ledger.draws()
    assert draws["total"] == 22
    assert draws["useful"] == 2 and draws["trained"] == 2  # only the mixed group of 2 draws
    # Calibration prompts are drawn, not useful: 2/4 right ("mid") and 0/4 right; the training groups 1/2, 0/4, 4/4.
    assert draws["bands"] == {
        "none_right": {"drawn": 8.0, "useful": 0.0},
        "mid": {"drawn": 6.0, "useful": 2.0},
        "all_right": {"drawn": 8.0, "useful": 0.0},
    }
    assert ledger.draws(steps=1)["total"] == 14


def test_group_draws_ignore_padded_rows_and_need_whole_groups(runner):
    nan = math.nan
    groups = runner.group_draws([1.0, nan, nan, nan, 1.0, 1.0, 0.0, nan], 4)
    assert [(g.draws, g.useful, g.trained) for g in groups] == [(1, False, 0), (3, True, 3)]
    assert groups[1].pass_rate == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="whole groups"):
        runner.group_draws([1.0] * 6, 4)


def test_calibration_set_is_taken_out_of_the_training_set(runner):
    rows = [{"prompt": f"{i}+0=", "answer": str(i)} for i in range(30)]
    train, calibration = runner.split_calibration(rows, 5, seed=3)
    assert len(train) == 25 and len(calibration) == 5
    assert {r["prompt"] for r in train}.isdisjoint(r["prompt"] for r in calibration)
    assert runner.split_calibration(rows, 5, seed=3) == (train, calibration)
    with pytest.raises(ValueError, match="--calibration_size 30"):
        runner.split_calibration(rows, 30, seed=0)


def test_run_json_is_read_by_the_tournament_report(runner):
    trainer = _fake_trainer(runner)
    trainer.calibrate()
    trainer._padded_rows = [False] * 4
    trainer._base_generate([[1]] * 4, None, {}, 4)
    trainer.fake_rewards = [1.0, 0.0, 0.0, 0.0]
    trainer._calculate_rewards(None, None, None, None)
    ledger = trainer.completion_ledger
    curve = [
        {"step": 0, "epoch": 0.0, "heldout": 0.1, "bands": {"a": 0.1}, "samples": 0.0, "train_seconds": 0.0},
        {"step": 1, "epoch": 0.5, "heldout": 0.2, "bands": {"a": 0.2}, "samples": 12.0, "train_seconds": 1.5},
    ]
    run = {"curve": curve, "ledger": ledger, "step_seconds": [1.5], "visits": [[0]], "run_seconds": 2.0, "extra": {}}
    record = runner.run_record(0, run, train_size=8, heldout_size=4, prompts_per_step=1, per_epoch=2)
    assert record["completions"] == 12 and record["calibration_completions"] == 8
    reference = {**record, "method": "dapo", "label": "DAPO n=4", "draws": {**record["draws"], "useful": 0.0}}
    summary = tournament_summary([reference, record], budget=12)
    row = summary["methods"]["cgrpo"]
    assert row["completions"] == 12 and row["train_seconds"] == 1.5
    assert row["useful_share"] == pytest.approx(4 / 12) and row["trained_share"] == pytest.approx(4 / 12)
    assert row["minus_reference"]["mean"] == pytest.approx(0.0)
    assert "trl-cgrpo" in tournament_table(summary)


def test_stream_calibration_prompts_never_come_back_in_training(runner):
    stream = [{"prompt": p, "answer": "0"} for p in ["a", "b", "a", "c", "b", "d", "e", "c"]]
    train, calibration = runner.split_stream_calibration(stream, 2)
    assert [r["prompt"] for r in calibration] == ["a", "b"]
    assert [r["prompt"] for r in train] == ["c", "d", "e", "c"]
    with pytest.raises(ValueError, match="--calibration_size 9"):
        runner.split_stream_calibration(stream, 9)


def _trace_tournament_arguments(**overrides):
    """The command line of `run_tournament.sh trace`, as the runner's parser leaves it."""
    data = "benchmarks/results/trace-arithmetic/data"
    arguments = {
        "eval_every": 10, "learning_rate": 1e-4, "completions_budget": 8064, "heldout_size": 600,
        "train_data": Path(f"{data}/train_paper.jsonl"), "heldout_data": Path(f"{data}/heldout_paper.jsonl"),
        "prompts_per_step": 16, "eval_samples": 2, "task": "trace", "budget_grid": [2, 4, 8, 16, 32],
        "calibration_size": 50, "recalibrate_every": 50,
    }  # fmt: skip
    return SimpleNamespace(**{**arguments, **overrides})


def test_trace_runs_record_the_settings_the_trace_tournament_pairs_with(runner):
    # The report pairs C-GRPO only with runs of equal shared settings: the trace tournament's runs record the task.
    committed = ROOT / "benchmarks/results/trace-arithmetic/tournament/runs/dapo-seed0.json"
    if not committed.exists():
        pytest.skip("the trace tournament's runs are not in this checkout")
    reference = json.loads(committed.read_text())["settings"]
    settings = runner.run_settings(_trace_tournament_arguments(), steps=reference["steps"])
    assert runner.shared_settings(settings) == reference
    assert "task" not in runner.run_settings(_trace_tournament_arguments(task="arithmetic"), steps=140)


def test_answer_extractor_is_the_one_the_tasks_reward_checks(runner):
    from trl_ada.tasks.arithmetic import exact_match_reward
    from trl_ada.tasks.trace_arithmetic import final_answer_reward

    trace = runner.answer_extractor("trace")
    assert trace("3+4:c0:7:A=7<eos>junk") == "7" and trace("3+4:c0:7<eos>") is None
    for text in ["12<eos>", "x:A=12<eos>", " 12 \n3"]:
        assert final_answer_reward([text], ["12"]) == [float(trace(text) == "12")]
        assert exact_match_reward([text], ["12"]) == [float(runner.answer_extractor("arithmetic")(text) == "12")]


def test_the_trace_task_needs_a_prompt_set_before_any_model_loads(runner, capsys):
    with pytest.raises(SystemExit) as stopped:
        runner.main(["--out", "unused", "--task", "trace"])
    assert stopped.value.code == 2 and "--task trace runs on a fixed prompt set" in capsys.readouterr().err
