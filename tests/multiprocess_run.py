"""Launched by tests/test_multiprocess.py under `accelerate launch --multi_gpu --num_processes 2` (gloo on CPU).

Runs short trainings and writes, per rank, what the sampler decided at every step, so the test can check that
all processes agreed. Scenario `balance`: a normal seq_balance run. Scenario `sparse`: one prompt per generation batch,
`round_size=1` and a reward that never lets it retire, so every round has fewer requested rows than processes.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from conftest import TINY_MODEL_KWARGS, starts_low_digit, tiny_args  # noqa: E402

from trl_ada import AdaGRPOConfig, AdaGRPOTrainer  # noqa: E402
from trl_ada.tasks.arithmetic import make_dataset  # noqa: E402
from trl_ada.tiny import build_char_tokenizer, build_tiny_model  # noqa: E402


def always_right(completions, **kwargs):
    return [1.0] * len(completions)


class Recording(AdaGRPOTrainer):
    def _log_selection(self, selection):
        self.__dict__.setdefault("selections", []).append(
            {
                "kept": [list(r.kept) for r in selection.prompts],
                "advantages": [list(r.advantages) for r in selection.prompts],
                "pools": [list(p) for p in selection.pools],
                "active_after_round": list(selection.active_after_round),
            }
        )
        super()._log_selection(selection)

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self.__dict__.setdefault("local_rows", []).append(int(output["completion_ids"].shape[0]))
        return output


def run(out_dir: Path, name: str, reward, **overrides) -> dict:
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS)
    config = AdaGRPOConfig(**tiny_args(out_dir / name, **overrides))
    trainer = Recording(
        model, [reward], args=config, train_dataset=make_dataset(64, seed=1), processing_class=tokenizer
    )
    trainer.train()
    return {
        "num_processes": trainer.accelerator.num_processes,
        "process_index": trainer.accelerator.process_index,
        "selections": trainer.selections,
        "local_rows": trainer.local_rows,
    }


def main() -> None:
    out_dir = Path(sys.argv[1])
    # No PartialState before the trainer: the first one fixes the distributed setup for the whole process.
    report = {
        "balance": run(
            out_dir,
            "balance",
            starts_low_digit,
            sampler="seq_balance",
            round_size=4,
            max_rounds=3,
            per_device_train_batch_size=4,
            max_steps=3,
        ),
        "est": run(
            out_dir,
            "est",
            starts_low_digit,
            sampler="est",
            est_max_samples=12,
            per_device_train_batch_size=8,
            max_steps=3,
        ),
        "dapo": run(
            out_dir,
            "dapo",
            starts_low_digit,
            sampler="dapo",
            dapo_max_refills=20,
            per_device_train_batch_size=4,
            max_steps=2,
        ),
        "sparse": run(
            out_dir,
            "sparse",
            always_right,
            sampler="seq_balance",
            num_generations=2,
            round_size=1,
            max_rounds=3,
            per_device_train_batch_size=1,
            max_steps=2,
        ),
    }
    (out_dir / f"rank{report['balance']['process_index']}.json").write_text(json.dumps(report))
    import torch.distributed

    if torch.distributed.is_initialized():  # a clean gloo shutdown; without it a rank occasionally aborted at exit
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
