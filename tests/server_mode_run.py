"""Launched by tests/test_continuous_schedule.py in two gloo processes: AdaGRPOTrainer in vLLM server mode.

Every scenario runs TRL's real `VLLMGeneration` and `VLLMClient` against a stand-in server (`fake_vllm_server.py`, run
by the test; its URLs are in `out_dir`), with only the NCCL weight push replaced (vLLM is not installed here).
Scenarios, in this order (the last one leaves the processes out of step when it fails):

- `continuous`: the continuous schedule with a pass-rate tracker that already holds `TRACKED_PROMPTS` prompts. Records
  the bytes the schedule broadcasts per generation batch, each rank's selections and its sampler state afterwards.
- `reward_failure`: the continuous schedule; the reward function raises on the main process only, in the first
  scoring batch, while the other process scores its share of that batch and waits in the batch's reward gather.
- `lost_server`: the rounds schedule against a server whose engine dies at its second generation request (round 2 of
  step 1): the main process's request is abandoned after `vllm_server_timeout` while the other process waits for the
  completions.

Each process writes `rank{N}.json` (per scenario: the error it raised, none if it finished, and what it recorded), then
exits normally, so the test reads what every process saw; a process that hangs makes the launch time out.
"""

import hashlib
import json
import os
import pickle
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from conftest import TINY_MODEL_KWARGS, shut_down_distributed, starts_low_digit, tiny_args  # noqa: E402
from trl.generation import vllm_client as vllm_client_module  # noqa: E402
from trl.generation.vllm_client import VLLMClient  # noqa: E402
from trl.generation.vllm_generation import VLLMGeneration  # noqa: E402

import trl_ada.schedules.continuous as schedule_module  # noqa: E402
from trl_ada import AdaGRPOConfig, AdaGRPOTrainer  # noqa: E402
from trl_ada.tasks.arithmetic import make_dataset  # noqa: E402
from trl_ada.tiny import build_char_tokenizer, build_tiny_model  # noqa: E402

TRACKED_PROMPTS = 20_000
"""Prompts the `continuous` scenario's tracker holds before training (a long run's worth): about 1 MB of state."""
LOST_SERVER_TIMEOUT_S = 2.0
"""`vllm_server_timeout` of the `lost_server` scenario: how long `/health` must fail before a request is abandoned."""


def fails_on_the_main_process(completions, **kwargs):
    if int(os.environ.get("RANK", "0")) == 0:
        raise ValueError("the main process's verifier is down")
    return starts_low_digit(completions)


def always_wrong(completions, **kwargs):
    return [0.0] * len(completions)


def init_vllm(self: VLLMGeneration) -> None:
    if self.accelerator.is_main_process:
        self.vllm_client = VLLMClient(base_url=self.server_base_url, connection_timeout=10)
        self.vllm_client.update_named_params = lambda metadata, params: None  # no NCCL weight push on CPU


def server_mode_trainer(out_dir: Path, base_url: str, reward, schedule: str, **settings) -> AdaGRPOTrainer:
    tokenizer = build_char_tokenizer()
    config = AdaGRPOConfig(
        **tiny_args(out_dir, max_steps=2, per_device_train_batch_size=8, max_completion_length=8),
        **{"sampler": "seq_balance", "round_size": 4, "max_rounds": 4, **settings},
    )
    model = build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS)
    trainer = AdaGRPOTrainer(
        model, [reward], args=config, train_dataset=make_dataset(64, seed=0), processing_class=tokenizer
    )
    # What GRPOTrainer.__init__ sets for `use_vllm=True, vllm_mode="server"` (vLLM is not installed here).
    trainer.vllm_generation = VLLMGeneration(
        model=trainer.model,
        accelerator=trainer.accelerator,
        processing_class=tokenizer,
        mode="server",
        server_base_url=base_url,
        temperature=trainer.temperature,
        max_completion_length=trainer.max_completion_length,
        logprobs=0,
    )
    trainer.use_vllm, trainer.vllm_mode, trainer._last_loaded_step = True, "server", -1
    trainer.args.generation_schedule = schedule
    return trainer


def train(trainer: AdaGRPOTrainer, report: dict) -> None:
    report["error"] = None
    try:
        trainer.train()
    except Exception as error:
        report["error"] = f"{type(error).__name__}: {error}"
        report["traceback"] = traceback.format_exc()[-3000:]


def continuous(out_dir: Path, base_url: str) -> dict:
    report: dict = {"broadcast_bytes": [], "selections": []}
    trainer = server_mode_trainer(
        out_dir / "continuous", base_url, starts_low_digit, "continuous", round_policy="tracked"
    )
    tracker = trainer.ada_sampler.estimator
    tracker.counts.update({f"earlier-prompt-{i}": (2.0, 1.0) for i in range(TRACKED_PROMPTS)})
    report["state_bytes"] = len(json.dumps(trainer.ada_sampler.state_dict()))
    broadcast, sample = schedule_module.broadcast_object_list, schedule_module.sample_continuously
    sent: list[int] = []

    def measured_broadcast(objects):
        received = broadcast(objects)
        sent.append(sum(len(pickle.dumps(item)) for item in received))
        return received

    def recorded_sample(trainer_, group_inputs, keys, pools):
        sent.clear()
        selection, stats = sample(trainer_, group_inputs, keys, pools)
        report["broadcast_bytes"].append(sum(sent))
        report["selections"].append([list(result.kept) for result in selection.prompts])
        return selection, stats

    schedule_module.broadcast_object_list, schedule_module.sample_continuously = measured_broadcast, recorded_sample
    try:
        train(trainer, report)
    finally:
        schedule_module.broadcast_object_list, schedule_module.sample_continuously = broadcast, sample
    state = json.dumps(trainer.ada_sampler.state_dict(), sort_keys=True)
    report["tracked_prompts"] = len(tracker.counts)
    report["state_digest"] = hashlib.sha256(state.encode()).hexdigest()
    return report


def reward_failure(out_dir: Path, base_url: str) -> dict:
    report: dict = {}
    train(server_mode_trainer(out_dir / "reward_failure", base_url, fails_on_the_main_process, "continuous"), report)
    return report


def lost_server(out_dir: Path, base_url: str) -> dict:
    report: dict = {}
    trainer = server_mode_trainer(
        out_dir / "lost_server", base_url, always_wrong, "rounds", vllm_server_timeout=LOST_SERVER_TIMEOUT_S
    )
    train(trainer, report)
    return report


def main() -> None:
    out_dir = Path(sys.argv[1])
    rank = int(os.environ.get("RANK", "0"))
    VLLMGeneration._init_vllm = init_vllm
    vllm_client_module.is_vllm_available = lambda: True
    server_url = (out_dir / "server_url").read_text().strip()
    report: dict = {"rank": rank}
    report["continuous"] = continuous(out_dir, server_url)
    report["reward_failure"] = reward_failure(out_dir, server_url)
    report["lost_server"] = lost_server(out_dir, (out_dir / "dying_server_url").read_text().strip())
    (out_dir / f"rank{rank}.json").write_text(json.dumps(report))
    shut_down_distributed()


if __name__ == "__main__":
    main()
