"""Launched by tests/test_resume.py under `accelerate launch --multi_gpu --num_processes 2` (gloo on CPU).

Both processes train two steps into one (shared) output_dir, saving checkpoint-1 and checkpoint-2; then the main
process corrupts checkpoint-2's sampler state and both resume with `resume_from_checkpoint=True`. Each rank writes the
checkpoint it resumed from and how many steps it trained, so the test can check that they picked the same one.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from conftest import TINY_MODEL_KWARGS, shut_down_distributed, starts_low_digit, tiny_args  # noqa: E402

from trl_ada import AdaGRPOConfig, AdaGRPOTrainer  # noqa: E402
from trl_ada.checkpoints import SAMPLER_STATE_NAME  # noqa: E402
from trl_ada.tasks.arithmetic import make_dataset  # noqa: E402
from trl_ada.tiny import build_char_tokenizer, build_tiny_model  # noqa: E402


class Resuming(AdaGRPOTrainer):
    def _load_optimizer_and_scheduler(self, checkpoint):
        self.__dict__["resumed_from"] = None if checkpoint is None else Path(checkpoint).name
        super()._load_optimizer_and_scheduler(checkpoint)

    def _log_selection(self, selection):
        self.__dict__["steps"] = self.__dict__.get("steps", 0) + 1
        super()._log_selection(selection)


def build(out_dir: Path, max_steps: int) -> Resuming:
    tokenizer = build_char_tokenizer()
    config = AdaGRPOConfig(
        **tiny_args(out_dir, max_steps=max_steps, save_strategy="steps", save_steps=1, per_device_train_batch_size=4),
        sampler="seq_balance",
        round_size=4,
        max_rounds=2,
    )
    return Resuming(
        build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS),
        [starts_low_digit],
        args=config,
        train_dataset=make_dataset(64, seed=1),
        processing_class=tokenizer,
    )


def main(out_dir: Path) -> None:
    run = out_dir / "run"
    first = build(run, max_steps=2)
    first.train()
    accelerator = first.accelerator
    if accelerator.is_main_process:
        (run / "checkpoint-2" / SAMPLER_STATE_NAME).write_text('{"sampler": {')
    accelerator.wait_for_everyone()
    del first
    resumed = build(run, max_steps=3)
    resumed.train(resume_from_checkpoint=True)
    report = {"resumed_from": resumed.resumed_from, "steps": resumed.steps, "global_step": resumed.state.global_step}
    (out_dir / f"rank{resumed.accelerator.process_index}.json").write_text(json.dumps(report))
    del resumed
    shut_down_distributed()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
