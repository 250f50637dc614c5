"""Launched on two processes by tests/test_train_script.py: `trl_ada.train`'s own exit path, watched at the moment
the process group is destroyed.

Writes `rank{N}.json` with the number of `DistributedDataParallel` modules still alive (after a garbage collection)
when `torch.distributed.destroy_process_group` runs: a reducer alive then is freed at interpreter exit, where it can
deadlock with gloo's worker thread.
"""

import gc
import json
import os
import sys
from pathlib import Path

import torch.distributed
from torch.nn.parallel import DistributedDataParallel

from trl_ada.cli.train import cli_main

out_dir = Path(sys.argv[1])
live_ddp_modules: list[int] = []
destroy = torch.distributed.destroy_process_group


def watched_destroy(*args, **kwargs):
    gc.collect()
    live_ddp_modules.append(sum(isinstance(obj, DistributedDataParallel) for obj in gc.get_objects()))
    return destroy(*args, **kwargs)


torch.distributed.destroy_process_group = watched_destroy
rank = int(os.environ["RANK"])
status = cli_main(
    [
        "--max_steps", "1", "--heldout_size", "0", "--arithmetic_train_size", "64",
        "--per_device_train_batch_size", "16", "--output_dir", str(out_dir / "run"),
    ]
)  # fmt: skip
(out_dir / f"rank{rank}.json").write_text(json.dumps({"status": status, "live_ddp_modules": live_ddp_modules}))
