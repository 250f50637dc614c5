"""Launched by tests/test_environments.py under `accelerate launch --multi_gpu --num_processes 2` (gloo on CPU):
seq_balance with two environments (a dict `environment_factory`); each rank writes what it checked."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import envs  # noqa: E402
from conftest import shut_down_distributed, tiny_args  # noqa: E402
from test_environments import recording, train  # noqa: E402

from trl_ada import AdaGRPOConfig, AdaGRPOTrainer  # noqa: E402


def main(out_dir: Path) -> None:
    config = AdaGRPOConfig(
        **tiny_args(out_dir / "run", max_steps=3, per_device_train_batch_size=8),
        sampler="seq_balance",
        round_size=4,
        max_rounds=4,
    )
    trainer = train(AdaGRPOTrainer, config, {"low": envs.Low, "high": envs.High}, envs.dataset(64, routed=True))
    report = {
        "selections": [[list(result.kept) for result in s.prompts] for s in trainer.selections],
        "drew_more_than_n": any(len(pool) > 4 for s in trainer.selections for pool in s.pools),
        "handed_over": trainer.handed_over,
        "resets": len(trainer.resets),
        "scored": trainer.scored,
        "environments": sorted({name for name, _ in trainer.resets}),
        "moved": [
            entry["ada/kept_rows_moved"] for entry in trainer.state.log_history if "ada/kept_rows_moved" in entry
        ],
        "weights": [round(float(p.sum()), 6) for p in trainer.model.parameters()],
    }
    rank = trainer.accelerator.process_index
    (out_dir / f"rank{rank}.json").write_text(json.dumps(report))
    del trainer
    shut_down_distributed()


if __name__ == "__main__":
    assert recording  # imported for `train`
    main(Path(sys.argv[1]))
