"""The generation seam proposed to TRL (`docs/upstream/grpo-generation-seam.patch`), applied to a copy of TRL 1.16.0.

The patch factors the batch set-up and generation of `GRPOTrainer._generate_and_score_completions` into
`_prepare_and_generate(inputs)`. This test applies it to a copy of the installed TRL, then trains the same short runs
in two subprocesses, one on the installed TRL and one on the patched copy (run as this file's `__main__`): on the
patched TRL a sampling round calls the seam and never raises `_RoundGenerated`, and every run trains the same batches
as on the installed TRL, `GRPOTrainer`'s included (the patch changes nothing for TRL); `sampler="uniform"` still
reproduces `GRPOTrainer` exactly.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PATCH = Path(__file__).parents[1] / "docs" / "upstream" / "grpo-generation-seam.patch"
PATCHED_RELEASE = "1.16.0"


def run(trainer_class, config, reward_funcs, dataset, tokenizer, **kwargs) -> dict:
    """Train a tiny model; return what each generation batch handed to TRL's loss, the losses and a weights digest."""
    import torch
    from conftest import TINY_MODEL_KWARGS

    from trl_ada.tiny import build_tiny_model

    model = build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS)
    batches = []

    class Recording(trainer_class):
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            batches.append({key: output[key].tolist() for key in ("prompt_ids", "completion_ids", "advantages")})
            return output

    trainer = Recording(model, reward_funcs, args=config, train_dataset=dataset, processing_class=tokenizer, **kwargs)
    trainer.train()
    weights = hashlib.sha256(b"".join(p.detach().to(torch.float32).numpy().tobytes() for p in model.parameters()))
    return {
        "batches": batches,
        "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
        "weights": weights.hexdigest(),
    }


def main(out: Path) -> None:
    """Train the runs on whichever TRL is first on the path and write what they trained, and how rounds generated."""
    import envs
    from conftest import length_or_none, starts_low_digit, tiny_args
    from test_environments import chat_tokenizer
    from trl import GRPOConfig, GRPOTrainer

    from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
    from trl_ada import trainer as ada_trainer
    from trl_ada.tasks.arithmetic import make_dataset
    from trl_ada.tiny import build_char_tokenizer

    counts = {"rounds": 0, "raised": 0, "seam_calls_in_rounds": 0}
    generate_round = AdaGRPOTrainer._generate_round

    @functools.wraps(generate_round)
    def counting_round(self, *args, **kwargs):
        counts["rounds"] += 1
        return generate_round(self, *args, **kwargs)

    AdaGRPOTrainer._generate_round = counting_round
    raised_init = ada_trainer._RoundGenerated.__init__

    def counting_raise(self, *args):
        counts["raised"] += 1
        raised_init(self, *args)

    ada_trainer._RoundGenerated.__init__ = counting_raise
    seam = getattr(GRPOTrainer, "_prepare_and_generate", None)
    if seam is not None:

        @functools.wraps(seam)
        def counting_seam(self, inputs):
            counts["seam_calls_in_rounds"] += getattr(self, "_ada_round", None) is not None
            return seam(self, inputs)

        GRPOTrainer._prepare_and_generate = counting_seam

    tokenizer = build_char_tokenizer()
    dataset = make_dataset(64, seed=0)
    rewards = [starts_low_digit, length_or_none]  # two functions, weights, a dataset column, None rewards
    common = tiny_args(out / "runs", max_steps=2, reward_weights=[1.0, 0.5])
    runs = {
        "grpo": run(GRPOTrainer, GRPOConfig(**common), rewards, dataset, tokenizer),
        "uniform": run(AdaGRPOTrainer, AdaGRPOConfig(**common, sampler="uniform"), rewards, dataset, tokenizer),
        "seq_balance": run(
            AdaGRPOTrainer, AdaGRPOConfig(**common, sampler="seq_balance"), rewards, dataset, tokenizer
        ),
    }
    # Environments are what the set-up is for: each draw's `reset` in a routed pair, scored by its own episode.
    routed = envs.dataset(64, routed=True)
    factory = {"low": envs.Low, "high": envs.High}
    env_config = AdaGRPOConfig(**tiny_args(out / "runs", max_steps=2), sampler="seq_balance", round_size=4)
    envs.reset_counters()
    runs["environments"] = run(
        AdaGRPOTrainer, env_config, [envs.target_reward], routed, chat_tokenizer(), environment_factory=factory
    )
    runs["environments"]["resets"] = list(envs.RESETS)
    report = {"seam": ada_trainer.TRL_HAS_GENERATION_SEAM, "counts": counts, "runs": runs}
    (out / "report.json").write_text(json.dumps(report))


def patched_trl(tmp_path: Path) -> Path:
    """A copy of the installed TRL with the patch applied (`patch`, else `git apply`); the directory holding it."""
    import trl

    root = tmp_path / "patched-trl"
    shutil.copytree(Path(trl.__file__).parent, root / "trl", ignore=shutil.ignore_patterns("__pycache__"))
    if shutil.which("patch"):
        command = ["patch", "-p1", "--forward", "--batch", "-i", str(PATCH)]
    else:
        command = ["git", "apply", "-p1", str(PATCH)]
    applied = subprocess.run(command, cwd=root, capture_output=True, text=True)
    assert applied.returncode == 0 and "offset" not in applied.stdout and "fuzz" not in applied.stdout, applied
    return root


def reports(tmp_path: Path, patched: Path) -> tuple[dict, dict]:
    """The reports of `main` on the installed TRL and on the patched copy, run side by side."""
    repo = Path(__file__).parents[1]
    processes = {}
    for name, path in (("installed", []), ("patched", [str(patched)])):
        out = tmp_path / name
        out.mkdir()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(repo)]), "OMP_NUM_THREADS": "1"}
        env["TRL_EXPERIMENTAL_SILENCE"] = "1"  # environment_factory is experimental in TRL
        processes[name] = (
            out,
            subprocess.Popen(
                [sys.executable, __file__, str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            ),
        )
    found = []
    try:
        for out, process in processes.values():
            output, _ = process.communicate(timeout=240)
            assert process.returncode == 0, output.decode()[-4000:]
            found.append(json.loads((out / "report.json").read_text()))
    finally:
        for _, process in processes.values():
            if process.poll() is None:  # a failed or timed-out comparison must not leave its sibling training
                process.kill()
                process.wait()
    return found[0], found[1]


def test_adaptive_sampling_uses_the_seam_on_a_patched_trl_and_trains_the_same(tmp_path):
    import trl

    if trl.__version__ != PATCHED_RELEASE:
        pytest.skip(f"the patch is written against TRL {PATCHED_RELEASE}; TRL {trl.__version__} is installed")
    installed, patched = reports(tmp_path, patched_trl(tmp_path))

    # Installed TRL: every round stops `_generate_and_score_completions` by raising; patched: none does.
    assert installed["seam"] is False and patched["seam"] is True
    rounds = installed["counts"]["rounds"]
    assert rounds > 0 and installed["counts"] == {"rounds": rounds, "raised": rounds, "seam_calls_in_rounds": 0}
    assert patched["counts"] == {"rounds": rounds, "raised": 0, "seam_calls_in_rounds": rounds}

    # Every run trains the same batches, losses and weights on both TRLs; GRPOTrainer's shows the patch changes nothing.
    assert set(installed["runs"]) == set(patched["runs"]) == {"grpo", "uniform", "seq_balance", "environments"}
    for name, expected in installed["runs"].items():
        assert patched["runs"][name] == expected, name
    assert len(installed["runs"]["environments"]["resets"]) > 0

    # On the patched TRL, sampler="uniform" still reproduces GRPOTrainer exactly.
    grpo, uniform = patched["runs"]["grpo"], patched["runs"]["uniform"]
    assert len(grpo["batches"]) == 2 and uniform == grpo
    assert any(any(a != 0 for a in batch["advantages"]) for batch in grpo["batches"])  # the comparison had signal


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main(Path(sys.argv[1]))
