"""Launched by tests/test_predictor.py under `accelerate launch --multi_gpu --num_processes 2` (gloo on CPU).

Trains the tiny model with `sampler="est", pass_rate_predictor="learned"` and writes, per rank, every step's budgets
(pool sizes) and logged calibration, and the sampler's final state (the predictor's weights and counts), so the test
can check that both processes predicted and allocated identically.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from conftest import TINY_MODEL_KWARGS, shut_down_distributed, starts_low_digit, tiny_args  # noqa: E402

from trl_ada import AdaGRPOConfig, AdaGRPOTrainer  # noqa: E402
from trl_ada.tasks.arithmetic import make_dataset  # noqa: E402
from trl_ada.tiny import build_char_tokenizer, build_tiny_model  # noqa: E402


def sums_pass(completions, prompts, **kwargs):
    """Sums always score, products as `starts_low_digit` (~20%): a pass rate that the prompt's text predicts."""
    low = starts_low_digit(completions)
    return [1.0 if "+" in prompt else reward for reward, prompt in zip(low, prompts, strict=True)]


class Recording(AdaGRPOTrainer):
    def _log_selection(self, selection):
        self.__dict__.setdefault("steps", []).append(
            {
                "budgets": [len(pool) for pool in selection.pools],
                "log_loss": selection.metrics["pass_rate_predictor/log_loss"],
                "model_log_loss": selection.metrics["pass_rate_predictor/model_log_loss"],
            }
        )
        super()._log_selection(selection)


def main() -> None:
    out_dir = Path(sys.argv[1])
    tokenizer = build_char_tokenizer()
    config = AdaGRPOConfig(
        **tiny_args(out_dir / "est", max_steps=6, per_device_train_batch_size=16),
        sampler="est",
        est_max_samples=12,
        pass_rate_predictor="learned",
        pass_rate_predictor_learning_rate=1.0,  # learns the sums in a few steps, so budgets spread
        est_sample_power=1.0,
    )
    trainer = Recording(
        build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS),
        [sums_pass],
        args=config,
        train_dataset=make_dataset(64, seed=1),
        processing_class=tokenizer,
    )
    trainer.train()
    report = {
        "num_processes": trainer.accelerator.num_processes,
        "process_index": trainer.accelerator.process_index,
        "steps": trainer.steps,
        "state": trainer.ada_sampler.state_dict(),
    }
    (out_dir / f"rank{trainer.accelerator.process_index}.json").write_text(json.dumps(report))
    shut_down_distributed()


if __name__ == "__main__":
    main()
