"""Launched by tests/test_vlm.py under `accelerate launch --multi_gpu --num_processes 2` (gloo on CPU).

Trains the tiny vision-language model of `tiny_vlm.py` with `seq_balance` on two processes and writes, per rank, what
was generated from which image, the kept rows handed to TRL's loss, the sampler's pools and a digest of the final
weights, so the test can check that every row kept its own image and reward and that both processes agree.
"""

import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import torch  # noqa: E402
from conftest import shut_down_distributed, tiny_args  # noqa: E402
from tiny_vlm import (  # noqa: E402
    build_processor,
    build_tiny_vlm,
    colour_dataset,
    colour_fingerprint,
    contains_colour_letter,
    kept_row_problems,
    recording,
)

from trl_ada import AdaGRPOConfig, AdaGRPOTrainer  # noqa: E402


def digest(model) -> str:
    hasher = hashlib.sha1()
    for name, parameter in model.named_parameters():
        hasher.update(name.encode())
        hasher.update(parameter.detach().cpu().numpy().tobytes())
    return hasher.hexdigest()


class Recording(recording(AdaGRPOTrainer)):
    def _sample(self, inputs):
        kept_inputs = super()._sample(inputs)
        moved = self._metrics["train"].get("ada/kept_rows_moved", [])
        self.__dict__.setdefault("moved", []).append(moved[-1] if moved else None)
        return kept_inputs


def run(out_dir: Path) -> dict:
    processor = build_processor()
    model, _ = build_tiny_vlm(processor, seed=0)
    initial = digest(model)
    config = AdaGRPOConfig(
        **tiny_args(out_dir / "vlm", max_completion_length=8, max_steps=3, per_device_train_batch_size=8),
        reward_weights=[1.0, 0.0],
        sampler="seq_balance",
        round_size=4,
        max_rounds=4,
    )
    trainer = Recording(
        model,
        [contains_colour_letter, colour_fingerprint],
        args=config,
        train_dataset=colour_dataset(8),
        processing_class=processor,
    )
    trainer.train()
    # What TRL's loss received on this process, against this process's kept rows (generation is checked by the test
    # with both processes' records).
    loss_inputs = [
        [p for p in kept_row_problems([], [rows], processor.image_processor, [record]) if "generated from" not in p]
        for rows, record in zip(trainer.handed_over, trainer.recorded, strict=True)
    ]
    return {
        "num_processes": trainer.accelerator.num_processes,
        "process_index": trainer.accelerator.process_index,
        "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
        "generated": trainer.generated,
        "handed_over": trainer.handed_over,
        "loss_inputs_line_up": loss_inputs,
        "pools": trainer.pools,
        "moved": trainer.moved,
        "initial_weights": initial,
        "weights": digest(trainer.model),
    }


def main() -> None:
    torch.set_num_threads(1)
    out_dir = Path(sys.argv[1])
    # No PartialState before the trainer: the first one fixes the distributed setup for the whole process.
    report = run(out_dir)  # the trainer is gone once `run` returns
    (out_dir / f"rank{report['process_index']}.json").write_text(json.dumps(report))
    shut_down_distributed()


if __name__ == "__main__":
    main()
