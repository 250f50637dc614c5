"""
What gathering the ZeRO-3 parameters once per round costs, against once per step (DeepSpeed on two CPU processes).

TRL gathers every ZeRO-3 parameter for each transformers `generate` call; a seq_balance step of R rounds therefore
gathers R times. `AdaGRPOTrainer` gathers once around all of a step's rounds
(`trl_ada.generation.weight_sync.one_parameter_gather_per_step`). This trains the same seq_balance run both ways (the
once-per-step context replaced by a no-op for the per-round run) and reports, per step: rounds, gathers, seconds spent entering the gathers, and the
wall time of the sampling phase; then the ratios per-round / per-step. The decisions must be identical (checked).

Needs deepspeed (`pip install --no-build-isolation deepspeed`, which keeps torch; `.ci/deepspeed_stage.sh` builds
such a venv). Run:

    DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 accelerate launch \\
        --config_file configs/accelerate/zero3_cpu_two_processes.yaml --main_process_port 0 \\
        benchmarks/zero3_round_gather.py [--steps 6] [--hidden-size 256] [--layers 4] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def starts_low_digit(completions, **kwargs):
    return [1.0 if c[:1].isdigit() and int(c[:1]) < 5 else 0.0 for c in completions]


def run(mode: str, args: argparse.Namespace, model_dir: Path, out_dir: Path) -> dict:
    import deepspeed
    from transformers import AutoTokenizer

    import trl_ada.schedules.rounds
    import trl_ada.trainer
    from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
    from trl_ada.tasks.arithmetic import make_dataset

    gather_seconds: list[float] = []
    original_enter = deepspeed.zero.GatheredParameters.__enter__

    def timed_enter(self):
        start = time.perf_counter()
        result = original_enter(self)
        gather_seconds.append(time.perf_counter() - start)
        return result

    class Timed(AdaGRPOTrainer):
        def _sample(self, inputs):
            gathers = len(gather_seconds)
            self._rounds = 0
            start = time.perf_counter()
            kept = super()._sample(inputs)
            self.__dict__.setdefault("steps", []).append(
                {
                    "sampling_seconds": time.perf_counter() - start,
                    "rounds": self._rounds,
                    "gathers": len(gather_seconds) - gathers,
                    "gather_seconds": sum(gather_seconds[gathers:]),
                }
            )
            return kept

        def _log_selection(self, selection):
            self.__dict__.setdefault("decisions", []).append([list(r.kept) for r in selection.prompts])
            super()._log_selection(selection)

    original_run_round = trl_ada.schedules.rounds.run_round

    def run_round(trainer_, *a, **k):
        trainer_._rounds += 1
        return original_run_round(trainer_, *a, **k)

    trl_ada.schedules.rounds.run_round = run_round
    once_per_step = trl_ada.trainer.one_parameter_gather_per_step
    if mode == "per_round":
        trl_ada.trainer.one_parameter_gather_per_step = lambda trainer: contextlib.nullcontext()
    deepspeed.zero.GatheredParameters.__enter__ = timed_enter
    try:
        config = AdaGRPOConfig(
            output_dir=str(out_dir / mode),
            sampler="seq_balance",
            num_generations=4,
            round_size=4,
            max_rounds=4,
            per_device_train_batch_size=8,
            max_completion_length=args.completion_tokens,
            max_steps=args.steps,
            learning_rate=1e-4,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            seed=0,
            use_cpu=False,  # accelerate skips DeepSpeed for a process forced onto the CPU
            ddp_backend="gloo",
            bf16=False,
            disable_tqdm=True,
        )
        trainer = Timed(
            str(model_dir),
            [starts_low_digit],
            args=config,
            train_dataset=make_dataset(256, seed=1),
            processing_class=AutoTokenizer.from_pretrained(model_dir),
        )
        trainer.train()
    finally:
        trl_ada.trainer.one_parameter_gather_per_step = once_per_step
        trl_ada.schedules.rounds.run_round = original_run_round
        deepspeed.zero.GatheredParameters.__enter__ = original_enter
    return {"steps": trainer.steps, "decisions": trainer.decisions}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--completion-tokens", type=int, default=16)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import torch
    from accelerate import PartialState

    from trl_ada.tiny import build_char_tokenizer, build_tiny_model, save_tiny

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        model_dir = tmp_path / "model"
        tokenizer = build_char_tokenizer()
        # Every process builds the same seeded model and saves it to its own temporary directory.
        model = build_tiny_model(
            tokenizer,
            seed=0,
            hidden_size=args.hidden_size,
            num_hidden_layers=args.layers,
            intermediate_size=4 * args.hidden_size,
        )
        parameters = sum(p.numel() for p in model.parameters())
        save_tiny(model, tokenizer, model_dir)
        results = {mode: run(mode, args, model_dir, tmp_path) for mode in ("per_step", "per_round")}
    state = PartialState()
    if results["per_step"]["decisions"] != results["per_round"]["decisions"]:
        raise SystemExit("the two runs made different sampling decisions")
    if state.is_main_process:
        summary = {}
        for mode, result in results.items():
            steps = result["steps"][1:]  # the first step warms up
            summary[mode] = {
                "rounds_per_step": statistics.mean(s["rounds"] for s in steps),
                "gathers_per_step": statistics.mean(s["gathers"] for s in steps),
                "gather_seconds_per_step": statistics.median(s["gather_seconds"] for s in steps),
                "sampling_seconds_per_step": statistics.median(s["sampling_seconds"] for s in steps),
            }
        per_step, per_round = summary["per_step"], summary["per_round"]
        print(
            f"ZeRO-3, 2 CPU processes, {parameters / 1e6:.1f}M parameters, seq_balance (4 prompts, n=4, rounds of 4, cap 16)"
        )
        print(f"{'':<22}{'per step':>10}{'per round':>11}{'ratio':>8}")
        for key, label in [
            ("rounds_per_step", "rounds / step"),
            ("gathers_per_step", "gathers / step"),
            ("gather_seconds_per_step", "gather s / step"),
            ("sampling_seconds_per_step", "sampling s / step"),
        ]:
            ratio = per_round[key] / per_step[key] if per_step[key] else float("nan")
            print(f"{label:<22}{per_step[key]:>10.3f}{per_round[key]:>11.3f}{ratio:>8.2f}")
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"parameters": parameters, **summary}, indent=2))
    state.wait_for_everyone()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
