"""Launched by tests/test_async_multiprocess.py under `accelerate launch --multi_gpu --num_processes 2` (gloo, CPU).

`AdaAsyncGRPOTrainer` on two processes, with TRL's real spawned rollout worker on the main process generating from
the stand-in server of `tests/async_fixtures.py` (hosted in the main process's threads). Each scenario ends in a
failure that the main process finds while it waits for samples, and every rank reports what it raised and when:

- `reward`: a reward function raises inside the worker (a `RolloutWorkerError`, at the first step);
- `server`: the server stops answering anything at the end of step 2 (a `VLLMServerError`), with no weight sync after
  it (`weight_sync_steps` past the run), so the failure is found on the data path, not in a sync.

The other process waits for its batch in accelerate's dispatcher all that time. Without the broadcast of the failure
it waited until rank 0 exited and then failed with gloo's "Connection closed by peer" (or was killed by torchrun),
without the reason.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).parent))
import torch  # noqa: E402
from accelerate import PartialState  # noqa: E402
from accelerate.utils import broadcast_object_list  # noqa: E402
from async_fixtures import (  # noqa: E402
    FaultyServer,
    InProcessWeightTransfer,
    chat_tokenizer,
    conversational,
    cpu_config,
    save_chat_model,
)
from conftest import shut_down_distributed  # noqa: E402
from transformers import AutoModelForCausalLM, TrainerCallback  # noqa: E402

from trl_ada import AdaAsyncGRPOConfig, AdaAsyncGRPOTrainer  # noqa: E402
from trl_ada.tasks.arithmetic import exact_match_reward, make_dataset  # noqa: E402
from trl_ada.tiny import load_tiny_arith_model  # noqa: E402

SCENARIOS = ("reward", "server")
SERVER_STOP_STEP = 2
SERVER_TIMEOUT_S = 3


def exploding_reward(completions, **kwargs):
    """Module-level (picklable): it reaches the worker's child process, and raises there."""
    raise ValueError("the grader crashed")


class StopServerAtStep(TrainerCallback):
    """On the main process, stops the server (nothing answers any more) at the end of step `step`, and records when."""

    def __init__(self, server: FaultyServer | None, step: int):
        self.server, self.step = server, step
        self.at: float | None = None

    def on_step_end(self, args, state, control, **kwargs):
        if self.server is not None and state.global_step == self.step and self.at is None:
            self.at = time.time()
            self.server.stop()


def run(scenario: str, out_dir: Path, model_dir: Path, state: PartialState) -> dict:
    server = None
    if state.is_main_process:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        server = FaultyServer(model, chat_tokenizer(load_tiny_arith_model()[1]))
    (base_url,) = broadcast_object_list([server.base_url if server else None], from_process=0)
    stop = StopServerAtStep(server if scenario == "server" else None, SERVER_STOP_STEP)
    rewards = [exact_match_reward, exploding_reward] if scenario == "reward" else [exact_match_reward]
    args = cpu_config(
        AdaAsyncGRPOConfig,
        out_dir / scenario,
        SimpleNamespace(base_url=base_url),
        max_steps=50,
        sampler="seq_balance",
        round_size=2,
        max_rounds=6,
        save_strategy="steps",
        save_steps=1,
        vllm_server_timeout=SERVER_TIMEOUT_S,
        weight_sync_steps=1000,  # only TRL's cold sync: the failure is found where the trainer waits for samples
        heartbeat_stale_after_s=60,
    )
    trainer = AdaAsyncGRPOTrainer(
        model=str(model_dir),
        reward_funcs=rewards,
        args=args,
        train_dataset=conversational(make_dataset(48, seed=0, levels=[0, 1, 2, 3])),
        processing_class=chat_tokenizer(load_tiny_arith_model()[1]),
        weight_transfer=InProcessWeightTransfer(server) if server else None,
        callbacks=[stop],
    )
    report: dict = {"process_index": state.process_index, "num_processes": state.num_processes}
    try:
        trainer.train()
        report["error"] = None
    except Exception as error:
        report["error"] = {"type": type(error).__name__, "message": str(error), "time": time.time()}
        report["traceback"] = "".join(traceback.format_exception(error))[-4000:]
    report["global_step"] = trainer.state.global_step
    report["output_dir"] = args.output_dir
    (report["server_stop"],) = broadcast_object_list([stop.at], from_process=0)
    if server is not None:
        server.close()
    return report


def main() -> None:
    out_dir = Path(sys.argv[1])
    from trl.experimental.async_grpo import async_rollout_worker

    # TRL's worker refuses to be built without vLLM; its child only needs aiohttp (as in tests/test_async_faults.py).
    async_rollout_worker.is_vllm_available = lambda: True
    state = PartialState(cpu=True)  # as the trainer builds it (`use_cpu`): gloo; without `cpu`, one process
    model_dir = out_dir / "model"
    if state.is_main_process:
        save_chat_model(model_dir)
    state.wait_for_everyone()
    reports = {}
    for scenario in SCENARIOS:
        reports[scenario] = run(scenario, out_dir, model_dir, state)
        state.wait_for_everyone()
    (out_dir / f"rank{state.process_index}.json").write_text(json.dumps(reports, indent=1))
    shut_down_distributed()


if __name__ == "__main__":
    main()
