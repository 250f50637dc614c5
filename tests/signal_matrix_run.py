"""Launched by tests/test_signal_matrix.py under `accelerate launch --multi_gpu --num_processes 2` (gloo on CPU).

Trains a few combinations of the signal-integrity matrix on two processes and checks each recorded update there
(tests/signal_matrix.py); writes, per rank, the failures and the trained advantages, which both ranks must share.
"""

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from conftest import shut_down_distributed, starts_low_digit  # noqa: E402
from signal_matrix import check_updates, run_combination  # noqa: E402

from trl_ada.tasks.arithmetic import make_dataset  # noqa: E402
from trl_ada.tiny import build_char_tokenizer  # noqa: E402

BASE = {"baseline": "pool", "scale_rewards": "group", "normalize_advantages": False, "objective": "linear"}
BASE |= {"train_on": "downsample", "dapo_refill": None}
CASES = [
    ({**BASE, "sampler": "spo", "baseline": "tracked", "scale_rewards": "none", "normalize_advantages": True}, {}),
    ({**BASE, "sampler": "dapo", "baseline": "tracked", "scale_rewards": "none"}, {"zero_variance_tolerance": 0.0}),
    ({**BASE, "sampler": "seq_balance", "scale_rewards": "none", "normalize_advantages": True}, {}),
    ({**BASE, "sampler": "seq_balance", "train_on": "pool"}, {"steps_per_generation": 2, "loss_type": "dapo"}),
    ({**BASE, "sampler": "seq_balance", "objective": "log"}, {}),
    ({**BASE, "sampler": "est", "scale_rewards": "batch"}, {"steps_per_generation": 2}),
    ({**BASE, "sampler": "uniform"}, {}),
]


def main() -> None:
    out_dir = Path(sys.argv[1])
    tokenizer = build_char_tokenizer()
    dataset = make_dataset(8, seed=0)
    report = {"cases": len(CASES), "checked": 0, "failures": {}, "trained": []}
    for index, (combination, run) in enumerate(CASES):
        with tempfile.TemporaryDirectory() as scratch:
            trainer = run_combination(combination, run, scratch, tokenizer, dataset, starts_low_digit)
        report["process_index"] = trainer.accelerator.process_index
        report["num_processes"] = trainer.accelerator.num_processes
        try:
            check_updates(trainer)
            report["checked"] += 1
        except AssertionError as error:
            report["failures"][str(index)] = str(error)[:2000]
        report["trained"].append([update["trained"].tolist() for update in trainer.updates])
        del trainer
    (out_dir / f"rank{report['process_index']}.json").write_text(json.dumps(report))
    shut_down_distributed()


if __name__ == "__main__":
    main()
