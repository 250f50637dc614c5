"""Launched on two processes by tests/test_train_script.py: `exit_run.py OUT_DIR [flags]` runs scripts/train_ada.py
with the flags, exactly as `accelerate launch scripts/train_ada.py [flags]` does (`trl_ada.cli.train`'s own exit path),
watched at the moment the process group is destroyed.

Writes `rank{N}.json` with the script's exit status and the number of `DistributedDataParallel` modules still alive
(after a garbage collection) when `torch.distributed.destroy_process_group` runs: a reducer alive then is freed at
interpreter exit, where it can deadlock with gloo's worker thread.
"""

import gc
import json
import os
import runpy
import sys
from pathlib import Path

import torch.distributed
from torch.nn.parallel import DistributedDataParallel

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "train_ada.py"

out_dir = Path(sys.argv[1])
live_ddp_modules: list[int] = []
destroy = torch.distributed.destroy_process_group


def watched_destroy(*args, **kwargs):
    gc.collect()
    live_ddp_modules.append(sum(isinstance(obj, DistributedDataParallel) for obj in gc.get_objects()))
    return destroy(*args, **kwargs)


torch.distributed.destroy_process_group = watched_destroy
rank = int(os.environ["RANK"])
sys.argv = [str(SCRIPT), *sys.argv[2:]]
try:
    runpy.run_path(str(SCRIPT), run_name="__main__")  # `sys.exit(cli_main())`
    status = 0
except SystemExit as exit_:
    status = exit_.code or 0
(out_dir / f"rank{rank}.json").write_text(json.dumps({"status": status, "live_ddp_modules": live_ddp_modules}))
