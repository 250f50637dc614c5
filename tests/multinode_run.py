"""Launched by tests/test_multinode.py: one process of a two-machine `accelerate launch` (gloo on CPU).

    ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_machines 2 --num_processes 2 --machine_rank R \
        --main_process_ip 127.0.0.1 --main_process_port PORT tests/multinode_run.py MACHINE_DIR R

`MACHINE_DIR` stands for the machine's own disk: the run trains there (`MACHINE_DIR/train`, a checkpoint every
2 steps), saves the final model to `MACHINE_DIR/final`, and writes `MACHINE_DIR/report.json` with what accelerate and
the Trainer say about this process, the launcher's environment, what every machine claims to be (all-gathered), the
sampler's decisions per step, so the test can check that both machines agreed and that only the global main process
wrote the model and checkpoints.
"""

import json
import math
import os
import sys
from pathlib import Path

from accelerate import PartialState
from accelerate.utils import gather_object

sys.path.insert(0, str(Path(__file__).parent))
from conftest import TINY_MODEL_KWARGS, shut_down_distributed, starts_low_digit, tiny_args  # noqa: E402
from multiprocess_run import Recording  # noqa: E402

from trl_ada import AdaGRPOConfig  # noqa: E402
from trl_ada.tasks.arithmetic import make_dataset  # noqa: E402
from trl_ada.tiny import build_char_tokenizer, build_tiny_model  # noqa: E402

# What torchrun (started by `accelerate launch`) and accelerate put in each worker's environment.
ENV_KEYS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "ACCELERATE_USE_CPU",
    "OMP_NUM_THREADS",
)


def main() -> None:
    machine_dir, claimed_machine_rank = Path(sys.argv[1]), int(sys.argv[2])
    # No PartialState before the trainer: the first one fixes the distributed setup for the whole process.
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS)
    config = AdaGRPOConfig(
        **tiny_args(
            machine_dir / "train",
            sampler="seq_balance",
            round_size=4,
            max_rounds=3,
            per_device_train_batch_size=4,  # 2 machines x 4 rows = 2 prompts x n=4 per step
            max_steps=3,
            save_strategy="steps",
            save_steps=2,
        )
    )
    trainer = Recording(
        model, [starts_low_digit], args=config, train_dataset=make_dataset(64, seed=1), processing_class=tokenizer
    )
    train_output = trainer.train()
    # Called on every process, as the Trainer requires (FSDP/ZeRO-3 gather there); it writes only where should_save.
    trainer.save_model(str(machine_dir / "final"))

    state = PartialState()
    report = {
        "state": {
            "num_processes": state.num_processes,
            "process_index": state.process_index,
            "local_process_index": state.local_process_index,
            "is_main_process": state.is_main_process,
            "is_local_main_process": state.is_local_main_process,
            "distributed_type": str(state.distributed_type),
            "backend": state.backend,
            "device": str(state.device),
        },
        "args": {
            "world_size": trainer.args.world_size,
            "process_index": trainer.args.process_index,
            "local_process_index": trainer.args.local_process_index,
            "save_on_each_node": trainer.args.save_on_each_node,
            "should_save": trainer.args.should_save,
            "should_log": trainer.args.should_log,
        },
        "env": {key: os.environ.get(key) for key in ENV_KEYS},
        # (process index, machine rank passed on the command line) of every process, in process order.
        "gathered": gather_object([[state.process_index, claimed_machine_rank]]),
        "global_step": trainer.state.global_step,
        "train_loss_finite": math.isfinite(train_output.training_loss),
        "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
        "selections": trainer.selections,
        "local_rows": trainer.local_rows,
    }
    (machine_dir / "report.json").write_text(json.dumps(report))
    del trainer, model, train_output
    shut_down_distributed()


if __name__ == "__main__":
    main()
