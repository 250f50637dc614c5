"""
What Reinforce-Ada's schedules cost in wall time on a vLLM-like engine: a discrete-event model, driven by the real
samplers of `trl_ada.samplers` with Bernoulli rewards, of one training step at the paper's scale.

The model (every constant and where it comes from is in `SOURCES` and printed with the results):

- Engine: continuous batching, one iteration at a time. An iteration admits waiting requests in submission order
  (FIFO) while `max_num_seqs`, the per-iteration token budget (`max_num_batched_tokens`, chunked prefill) and the
  KV-cache capacity allow, then decodes one token for every running sequence. Its time is a roofline:
  `overhead + max(bytes / achieved bandwidth, FLOPs / achieved compute)` with bytes = the weights plus the KV cache
  of every running sequence, FLOPs = 2 x params per token (decode and prefill) plus attention over the context.
  A sequence that overflows the KV cache is preempted and recomputed, as vLLM does.
- Cluster: the paper's 8 x H100 with one engine per GPU (`tensor_model_parallel_size=1` in the authors' scripts).
  A synchronous generate call splits its requests into 8 contiguous equal chunks (verl's data-parallel split) and
  waits for the slowest engine; verl syncs the weights into vLLM and wakes the KV cache at every call.
- Workload: the paper's 512 prompts, drawn from its difficulty mix (Appendix C.1); Bernoulli rewards from each
  prompt's pass rate; completion lengths lognormal, optionally longer when wrong, truncated at the authors'
  `max_response_length` = 2048 (a truncated completion scores 0).
- Step: generation + reward scoring + one weight sync per generate call + old-log-prob pass + actor update, the
  last two proportional to the rows trained on (the paper: actor update 15 s of GRPO-n4's 102 s). Reward scoring
  follows the authors' released code: every reward call starts a fresh 16-process Math-Verify pool (a fixed cost per
  call) and scores its completions; the multi-round schedules score every round's completions and then score the
  kept rows once more (verl's `fit` loop), and the old-log-prob pass runs on the kept rows only.

Schedules: `uniform` n = 4 (GRPO; also 8 and 16), `seq_pos` / `seq_balance` in synchronous rounds (round policies
`fixed`, `predictive`, `tracked`), `est` (one call with per-prompt budgets), and `seq_balance` continuous (round-free:
each prompt draws its rounds as blocks without waiting for the other prompts, so its pool is the rounds' pool with the
same settings; `rounds_k*` are those rounds). Table 3 of the paper is an average over 600 training steps during which pass rates rise, so
every schedule runs on two populations, the base model's mix (start) and that mix raised by Table 5's per-band GRPO
gains (end), and the reported step time is their mean. No constant is fitted to Table 3.

Asynchronous schedule (`--async-schedule`: an extra section after the synchronous one; `--async-only`: that section
and the synchronous rows it is set against, GRPO-n4 and the continuous seq_balance schedules). A PROJECTION of TRL's
`AsyncGRPOTrainer` (`uniform` n = 4, 16) and trl-ada's `AdaAsyncGRPOTrainer` (`dapo` n = 4, `seq_balance` fixed and
predictive, the continuous schedule's settings and pools through `begin_streaming`) on the same engines, workload and
per-row training cost, simulated event by event (`run_async`): the rollout worker keeps `max_inflight` one-completion
requests open on a separate vLLM server, scores serially, queues samples into a bounded buffer; the trainer trains them
as they arrive, drops those more than `max_staleness` versions old and syncs the weights (engines paused) every step.
trl-ada's pools are released as its worker does (`AsyncSchedule.release`): a prompt's samples as soon as its pool is
done where every rule is per prompt (seq_balance's settings); `seq_balance/*/batch` is the previous worker, releasing
a step's 512 prompts at once, for comparison.
TRL's defaults (`max_staleness` 4, `max_inflight` = 4 x samples_per_step, buffer 1,024). The paper's 8 GPUs are split
between engines and trainer (`ASYNC_SPLITS`, each schedule's best split reported; `8+8` adds 8 trainer GPUs); step
times are set against synchronous GRPO-n4's from the same run and against asynchronous GRPO-n4's. Constants:
`SOURCES['async_*']`, printed with the section; with `--quick`, fewer prompts, steps and splits.

    python benchmarks/generation_cost.py [--quick] [--json PATH] [--constants CONSTANTS.json] [--async-schedule]
    python benchmarks/generation_cost.py --async-only [--quick] [--no-sensitivity]

`--constants` replaces the engine and step constants (the hook for a CPU calibration: a JSON of constants fitted on
measured vLLM timings, see `load_constants`). `benchmarks/calibrate_cpu_vllm.py` writes one from trl-ada's own server
path (one engine, measured prompts and lengths, per-request and trainer-side round costs, and the continuous schedule's
serial driver loop, `run_continuous_serial`); those `StepCosts` and `Workload` fields are zero or empty on the GPU
setup, whose numbers they leave unchanged. Deterministic for a `--seed`.
"""

from __future__ import annotations

import argparse
import heapq
import json
import logging
import math
import random
import sys
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from trl_ada.samplers import Sampler, SamplerSettings, Selection, build_sampler, rules
from trl_ada.samplers.streaming import begin_streaming

logger = logging.getLogger("generation_cost")

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "generation_cost"

# ---- Constants and their sources -----------------------------------------------------------------------------------

SOURCES: dict[str, str] = {
    "model": (
        "Qwen2.5-Math-1.5B config.json (huggingface.co/Qwen/Qwen2.5-Math-1.5B; Qwen2.5 technical report, arXiv "
        "2412.15115): 28 layers, hidden 1536, 12 query / 2 KV heads of 128, MLP 8960, vocab 151936, tied embeddings "
        "-> 1.54e9 parameters, 3.09 GB in bf16, KV 2*28*2*128*2 = 28,672 B per token"
    ),
    "hbm_bandwidth": "NVIDIA H100 SXM5 datasheet: HBM3 3.35 TB/s",
    "peak_flops": "NVIDIA H100 SXM5 datasheet: 989 TFLOP/s dense BF16",
    "bandwidth_efficiency": (
        "0.77: single-request vLLM decode reaches ~77% of the HBM roofline (johnmusgrave.com/p/vllm-throughput-"
        "latency-sweep-on, Llama-3.1-8B on A100, vLLM 0.23); the same fraction is assumed on H100"
    ),
    "compute_efficiency": "0.6: ASSUMPTION (achieved share of dense BF16 peak for the decode/prefill GEMMs)",
    "iteration_overhead_s": (
        "1.93 ms: vLLM 0.19 on H100 serving Qwen3-0.6B (28 layers, like Qwen2.5-1.5B) at 16 req/s has TPOT 2.39 ms "
        "(github.com/ovg-project/kvcached PR #331, benchmarks/bench_layout/H100_results.md, 'F - vanilla'); minus "
        "that model's roofline weight read (1.19 GB at 0.77 x 3.35 TB/s = 0.46 ms) leaves the per-iteration "
        "scheduling/launch overhead. CUDA graphs on: verl made enforce_eager=False its rollout default in "
        "github.com/volcengine/verl PR #2956 (Aug 2025), before the authors' verl snapshot (its ppo_trainer.yaml "
        "already has trainer.use_legacy_worker_impl), and their scripts do not override it"
    ),
    "iteration_scale": (
        "1.0 (vLLM V1 engine, FlashAttention, CUDA graphs). NOT settled by the sources, so shown as sensitivity "
        "rows: the released run_reinforce_ada.sh exports VLLM_ATTENTION_BACKEND=XFORMERS with vllm==0.10.1 "
        "(README), which vLLM's V1 oracle (vllm/engine/arg_utils.py _is_v1_supported_oracle) rejects in versions "
        "whose V1_BACKENDS list lacks 'XFORMERS', falling back to the V0 engine; run_grpo.sh has that line "
        "commented out and the authors' 1.5B Seq-pos script (github.com/Chenluye99/Reinforce-Ada, "
        "run_reinforce_ada_pos_15b.sh) does not set it. V0: x1.7 (vLLM V1 blog, blog.vllm.ai/2025/01/27/"
        "v1-alpha-release.html: up to 1.7x V1 throughput over V0). Eager mode (no CUDA graphs): x3.84 "
        "(github.com/pytorch/torchtitan PR #2373, vLLM decode eager 199 ms vs compiled+graphs 52 ms) and x4.3 "
        "(github.com/vllm-project/vllm-omni issue #7960, Qwen2.5-Omni-3B thinker decode on H200, eager vs graphs)"
    ),
    "max_num_seqs": "1024: verl rollout default (verl docs, ppo_trainer.yaml rollout.max_num_seqs)",
    "max_num_batched_tokens": (
        "3072: authors' run_reinforce_ada.sh (github.com/RLHFlow/Reinforce-Ada, max_prompt_length + "
        "max_response_length)"
    ),
    "kv_capacity_tokens": (
        "gpu_memory_utilization 0.8 (authors' scripts) x 80 GB - 3.09 GB weights - 4 GB activations/graphs "
        "(ASSUMPTION) = 56.9 GB / 28,672 B = 1.98M tokens per GPU"
    ),
    "engines": "8: 8 x H100 (paper, Table 3), tensor_model_parallel_size=1 (authors' scripts) -> 8 engines",
    "max_response_length": "2048: authors' run_grpo.sh and run_reinforce_ada.sh (data.max_response_length)",
    "prompt_tokens": (
        "lognormal, mean 200 tokens, sigma 0.4, at most 1024: ASSUMPTION (the paper gives no prompt lengths; 1024 "
        "is the authors' max_prompt_length)"
    ),
    "mean_completion_tokens": (
        "600: ASSUMPTION (the paper reports no training response lengths); per-prompt sigma 0.3 and per-completion "
        "sigma 0.5 (lognormal): ASSUMPTION. Sensitivity rows at 400 and 1000"
    ),
    "wrong_length_factor": (
        "1.0 (no length/correctness correlation): ASSUMPTION; 1.5 in the sensitivity table, the direction reported "
        "for GRPO by Liu et al. 2025 (Dr. GRPO, arXiv 2503.20783: incorrect responses grow longer)"
    ),
    "actor_update_s_per_row": "15 s / 2048 rows: the paper (Sec. 4.3: actor update 15 s of GRPO's 102 s on 1.5B)",
    "old_logprob_s_per_row": (
        "actor_update / 4 per row: ASSUMPTION (a forward pass against forward + backward with gradient "
        "checkpointing, which the authors' scripts enable). Rows: the KEPT rows only: the authors' verl/trainer/"
        "ppo/ray_trainer.py (github.com/Chenluye99/Reinforce-Ada) runs actor_rollout_wg.compute_log_prob on the "
        "downsampled final_batch after _generate_multi_round_adaptive_downsampling, not on the pool. No reference "
        "pass: run_reinforce_ada.sh sets use_kl_loss=False and use_kl_in_reward=False (the released run_grpo.sh "
        "sets use_kl_loss=True last, which would add a reference pass with param_offload=True to GRPO only; not "
        "modelled)"
    ),
    "generate_call_s": (
        "1.0 s per generate call: ASSUMPTION (verl enters its FSDP->vLLM sharding manager on every "
        "generate_sequences call: weight sync of 3.09 GB and KV-cache wake/sleep)"
    ),
    "reward_call_s": (
        "0.9 s per reward call: MEASURED here (results/generation_cost/math_verify_timing.txt; 2-core CPU, math-verify 0.9.0): "
        "the authors' verl/utils/reward_score/math_verify.py parallel_compute_score creates a new "
        "multiprocessing Pool (forkserver, 16 processes from their naive.py) on EVERY call, and each worker imports "
        "math_verify/sympy before its first task: pool start + import + first verify took 0.86-1.12 s"
    ),
    "reward_s_per_completion": (
        "1.1 ms per completion after each reward call: Math-Verify on the extracted \\boxed{} strings, MEASURED "
        "here at 5.75 ms mean (0.69 ms median) per pair in the first run (12.4 ms mean, 0.76 ms median in a second, busier one: 1.5 ms per completion, inside the 6 ms row), over 16 processes = 0.36 ms; worker restarts every 200 "
        "tasks (maxtasksperchild=200) re-import math_verify: 0.9 s / 200 / 16 = 0.28 ms; the serial main-process "
        "loop (DataProto item, two tokenizer.decode calls, apply_async/get): 0.5 ms ASSUMPTION. Range: up to "
        "6 ms (verl PR #1206: verl's serial naive manager took 200+ s for 2048 math-verify generations, ~100 ms "
        "each, / 16 processes), a sensitivity row. Multi-round schedules score every round, then the kept rows "
        "again (the authors' fit loop calls compute_reward on the final batch); the continuous schedule scores as "
        "results arrive, overlapped with generation, without a pool per call"
    ),
    "population": (
        "the paper's Appendix C.1 mix: 984 / 3,082 / 870 / 63 of 4,999 prompts at p = 0, (0, 0.2], (0.2, 0.5], "
        "(0.5, 1], uniform inside a band (start of training); end of training: every p raised by its band's GRPO "
        "gain in Table 5 (+0.341, +0.375, +0.355, +0.071); Table 3 averages the step over training, modelled as "
        "the mean of the two"
    ),
    "sampler_settings": (
        "paper / authors' defaults: batch 512, update group n = 4, rounds of 8, at most 4 (cap 32) "
        "(algorithm.round_repeat=8, max_rounds=4 in their ppo_trainer.yaml), seq_pos quota 2 positives (their "
        "positive_focused exit: len(pos_cache) >= algorithm.min_positive_samples, default 2, also set in "
        "run_reinforce_ada_pos_15b.sh; the paper's K=1 is the motivating example), seq_balance 2 + 2; est: 8 per prompt on average (the paper: 'hyper-parameter 8'), budgets "
        "in [2, 32], trained on all rows (comparable to GRPO-n8, Sec. 4.1)"
    ),
    "async_topology": (
        "ASSUMPTION: TRL's asynchronous trainer generates on a separate `vllm serve` server (README: the server in "
        "one terminal, `accelerate launch` in another), so the paper's 8 GPUs are split between E engines (data "
        "parallel, one per GPU, least-loaded routing like vLLM's data-parallel balancer) and 8 - E trainer GPUs; "
        "splits 1+7 to 4+4 are run (more engines only slowed every schedule) and each schedule's best is "
        "reported. '8+8': the synchronous model's 8 engines plus 8 trainer GPUs at the paper's speed (16 GPUs, "
        "not the paper's hardware)"
    ),
    "async_engine_limits": (
        "`vllm serve` defaults on a >= 70 GiB GPU that is not an A100 (vllm/engine/arg_utils.py get_batch_defaults, "
        "OPENAI_API_SERVER: max_num_seqs 1024, max_num_batched_tokens 8192); gpu_memory_utilization 0.9 (vLLM's "
        "default: the server command in README.md sets none) x 80 GB - 3.09 GB weights - 4 GB activations "
        "(ASSUMPTION, as kv_capacity_tokens) = 64.9 GB / 28,672 B = 2.26M KV tokens per engine; prefix caching on "
        "(V1 default), cleared at every weight sync (TRL's VLLMClient.pause: mode='keep', 'Freeze in-flight requests "
        "and clear caches')"
    ),
    "async_max_staleness": (
        "4: AsyncGRPOConfig.max_staleness default (TRL 1.16, trl/experimental/async_grpo/async_grpo_config.py); "
        "RolloutQueueDataset drops a sample whose trainer version - sample version exceeds it, where the trainer "
        "pulls it"
    ),
    "async_max_inflight": (
        "AsyncGRPOConfig.max_inflight_tasks=-1 -> max(max_staleness, 1) x samples_per_step "
        "(AsyncGRPOTrainer.__init__, TRL 1.16) = 4 x 2048 = 8,192 one-completion requests for n=4. "
        "samples_per_step = 512 prompts x n rows: ASSUMPTION (the batch set so one step trains the paper's 512 "
        "prompts; n=16 trains 8,192 rows, as the synchronous grpo_n16 does); trl-ada's generation batch "
        "(trl_ada/async_grpo/async_grpo_trainer.py async_sampling) is 1 prompt where every rule is per prompt "
        "(SamplerSettings.rules_are_per_prompt: seq_balance's settings here), else samples_per_step / n = 512 prompts"
    ),
    "async_queues": (
        "rollout buffer 1,024 samples (AsyncGRPOConfig.queue_maxsize default), score queue 16 closed groups "
        "(_AsyncRolloutLoop score_queue_maxsize default): a full buffer blocks the score loop, a full score queue "
        "blocks the generate loop, which then takes nothing back and submits nothing (async_rollout_worker.py "
        "_generate_loop, _score_loop). --quick scales the buffer with its batch (64 prompts: 128)"
    ),
    "async_weight_sync": (
        "1.0 s per step (weight_sync_steps=1, TRL's default), trainer and engines both stopped: ASSUMPTION, as "
        "generate_call_s (an NCCL push of the 3.09 GB bf16 weights plus pause and resume; TRL logs it as "
        "perf/weight_sync_s). The version goes up after the resume (_sync_weight_merged); draws in flight are kept"
    ),
    "async_trainer": (
        "actor_update_s_per_row (the paper's 15 s / 2048 rows on 8 GPUs) x 8 / trainer GPUs: ASSUMPTION (linear "
        "data-parallel scaling under FSDP2, TRL's trainer at the verl actor's per-row speed in bf16; TRL's async "
        "default dtype is float32). No old-log-prob pass: TRL's asynchronous loss reads the server's log-probs "
        "(sample.old_log_probs, `--logprobs-mode processed_logprobs`); AsyncConfig.old_logprob_pass adds it. "
        "Samples are trained as they arrive, 16 at a time (ASSUMPTION: TRL's TokenBudgetBatcher fills rows of "
        "max_model_len tokens per rank, a few samples each), the optimizer step after samples_per_step"
    ),
    "async_scoring": (
        "one call at a time (TRL awaits each _score_group; sync reward functions run in asyncio.to_thread): 1 ms per "
        "call (ASSUMPTION) + 1.1 ms per completion (reward_s_per_completion, the authors' 16-process pool; a serial "
        "Math-Verify measured 5.75 ms mean here, see reward_s_per_completion); pools score every draw waiting in one "
        "call (trl_seam.async_grpo_private.take_waiting_groups)"
    ),
    "async_release": (
        "trl-ada's worker (trl_ada/async_grpo/rollout.py): a generation batch queues its kept samples only once EVERY "
        "prompt of the batch is done (_finish_batches), each sample carrying its own draw's version; next blocks of "
        "open prompts go out before a new batch's first blocks, and a new batch opens whenever a slot is free and "
        "nothing else waits (_repeat_iterator). Its batch (async_sampling's prompts_per_batch): 1 prompt where "
        "SamplerSettings.rules_are_per_prompt (no scale_rewards='batch', and objective='linear' or "
        "normalize_weights=False; est: never), so a prompt's samples are queued as soon as ITS pool is done; else "
        "one optimizer step's prompts (samples_per_step / n). '/batch' schedules: the previous worker, step-sized "
        "batches whatever the rules (release='batch'), for comparison. TRL's groups: stamped with their first "
        "request's version, queued once their n completions are scored"
    ),
    "async_schedules": (
        "grpo_n4, grpo_n16: TRL's AsyncGRPOTrainer (sampler='uniform'). dapo_n4: TRL's groups, one with constant "
        "rewards dropped and the worker drawing on (trl-ada's _score_update_group). seq_balance/fixed and "
        "/predictive: the settings of the continuous schedule's seq_balance/continuous_k8 and /continuous_predictive "
        "(rounds of 8, at most 4, quota 2 + 2), through begin_streaming's ContinuousStep, one prompt per batch (the "
        "worker's rule); seq_balance/*/batch: the same, in the previous worker's 512-prompt batches"
    ),
    "async_steady_state": (
        "4 warm-up steps, then 12 timed (--quick: 3 + 4): ASSUMPTION that a pipeline max_staleness = 4 versions deep "
        "has settled by then (pools in step-sized batches close a batch at a time, so their step intervals are "
        "lumpy). The dataset is "
        "the synchronous step's prompts, cycled: every generation batch is the same population as the synchronous "
        "step's, with fresh draws"
    ),
}

PAPER_TABLE3 = {"grpo": 102.0, "seq_pos": 228.0, "seq_balance": 290.0, "est": 128.0}
"""Table 3, Qwen2.5-Math-1.5B on 8 x H100: average step time in seconds (only compared against, never fitted)."""

PAPER_POPULATION: tuple[tuple[int, float, float, float], ...] = (
    # (prompts, low, high, GRPO's gain on this band after training, Table 5)
    (984, 0.0, 0.0, 0.3414),
    (3082, 0.0, 0.2, 0.3751),
    (870, 0.2, 0.5, 0.3546),
    (63, 0.5, 1.0, 0.0714),
)


@dataclass(frozen=True)
class ModelShape:
    """What one decode token costs in bytes and FLOPs (Qwen2.5-Math-1.5B by default; `SOURCES['model']`)."""

    params: float = 1.54e9
    weight_bytes: float = 3.09e9
    kv_bytes_per_token: float = 2 * 28 * 2 * 128 * 2
    attention_flops_per_context_token: float = 4 * 28 * 12 * 128  # QK^T and AV over the context, per new token


class IterationCost(Protocol):
    """Time of one engine iteration: `running` sequences decoding over `context_tokens`, plus `prefill_tokens`."""

    def iteration_time(self, running: int, context_tokens: int, prefill_tokens: int) -> float: ...


@dataclass(frozen=True)
class RooflineCost:
    """`overhead + max(memory time, compute time)`: decode is memory-bound at small batches, compute-bound at large."""

    shape: ModelShape = field(default_factory=ModelShape)
    hbm_bandwidth: float = 3.35e12
    bandwidth_efficiency: float = 0.77
    peak_flops: float = 989e12
    compute_efficiency: float = 0.6
    iteration_overhead_s: float = 1.93e-3
    iteration_scale: float = 1.0
    """Multiplies the whole iteration (V0 engine, eager mode: `SOURCES['iteration_scale']`)."""

    def iteration_time(self, running: int, context_tokens: int, prefill_tokens: int) -> float:
        shape = self.shape
        memory = (shape.weight_bytes + shape.kv_bytes_per_token * context_tokens) / (
            self.hbm_bandwidth * self.bandwidth_efficiency
        )
        flops = 2.0 * shape.params * (running + prefill_tokens) + shape.attention_flops_per_context_token * (
            context_tokens
        )
        compute = flops / (self.peak_flops * self.compute_efficiency)
        return self.iteration_scale * (self.iteration_overhead_s + max(memory, compute))


@dataclass(frozen=True)
class LinearCost:
    """`a + b * running + c * context_tokens + d * prefill_tokens` seconds: the form a CPU calibration fits (measured
    vLLM iteration timings regressed on the batch's shape; see `load_constants`)."""

    a: float
    b: float = 0.0
    c: float = 0.0
    d: float = 0.0

    def iteration_time(self, running: int, context_tokens: int, prefill_tokens: int) -> float:
        return self.a + self.b * running + self.c * context_tokens + self.d * prefill_tokens


@dataclass(frozen=True)
class ScaledCost:
    """Another iteration cost times `scale` (an engine sharing its CPU with a busy client, see
    `StepCosts.continuous_engine_scale`)."""

    inner: IterationCost
    scale: float = 1.0

    def iteration_time(self, running: int, context_tokens: int, prefill_tokens: int) -> float:
        return self.scale * self.inner.iteration_time(running, context_tokens, prefill_tokens)


@dataclass(frozen=True)
class EngineLimits:
    """Scheduler limits of one engine (`SOURCES`)."""

    max_num_seqs: int = 1024
    max_num_batched_tokens: int = 3072
    kv_capacity_tokens: int = 1_984_000
    prefix_caching: bool = True
    """A prompt is prefilled once per engine per generate call; its other draws reuse the cached prefix. `False`:
    every draw prefills its prompt (vLLM caches whole KV blocks only, so a prompt shorter than a block, 16 tokens
    at least, is never reused)."""


@dataclass(frozen=True)
class StepCosts:
    """Per-step work outside the engine (`SOURCES`)."""

    actor_update_s_per_row: float = 15.0 / 2048
    old_logprob_s_per_row: float = 15.0 / 2048 / 4
    generate_call_s: float = 1.0
    reward_call_s: float = 0.9
    reward_s_per_completion: float = 1.1e-3
    rescore_kept_rows: bool = True
    """Multi-round schedules score the kept rows once more after the rounds (the authors' `fit` loop)."""
    # The rest is zero (or "overlapped") on the GPU setup; a CPU calibration of trl-ada's own server path sets them.
    sampling_step_s: float = 0.0
    """Fixed sampling cost per step, any schedule (trl-ada: one weight sync per step, the batch's set-up)."""
    generate_request_s: float = 0.0
    """HTTP/server overhead of one batched generate call (a round's request), client and server."""
    request_s_per_completion: float = 0.0
    """Per completion a batched generate call returns (output processing, JSON, client parsing)."""
    round_s: float = 0.0
    """Trainer-side cost of one round apart from generation and reward (TRL's batch set-up, gather, pool entries)."""
    round_s_per_row: float = 0.0
    continuous_driver: str = "overlapped"
    """`"overlapped"`: draws resubmitted as results arrive, scoring off the critical path (the GPU model).
    `"serial"`: trl-ada's driver loop (`trl_ada.schedules.continuous._drive`), see `run_continuous_serial`."""
    draw_request_s: float = 0.0
    """Serial driver: per one-draw request, the server/client time that requests queue for (FIFO, one at a time)."""
    draw_latency_s: float = 0.0
    """Serial driver: per one-draw request, latency on top of `draw_request_s` that does not queue."""
    scoring_batch_s: float = 0.0
    """Serial driver: trainer-side cost of one scoring batch (its round code on replayed completions), rewards apart."""
    scoring_batch_s_per_row: float = 0.0
    continuous_max_in_flight: int = 0
    """Serial driver: draws holding a connection at most (trl-ada's `continuous_max_in_flight`); later ones wait on the
    training side, in submission order, until a draw finishes or is aborted. 0: no cap."""
    continuous_engine_scale: float = 1.0
    """Serial driver: the engine's iteration time is multiplied by this (on a CPU server the driver process, which
    scores or handles a request per draw while the engine decodes, competes with it for cores; a synchronous round's
    caller just waits)."""


@dataclass(frozen=True)
class Workload:
    """Prompt and completion lengths, and the pass rates' population (`SOURCES`)."""

    prompt_mean_tokens: float = 200.0
    prompt_sigma: float = 0.4
    max_prompt_tokens: int = 1024
    mean_completion_tokens: float = 600.0
    prompt_length_sigma: float = 0.3
    completion_length_sigma: float = 0.5
    max_response_tokens: int = 2048
    wrong_length_factor: float = 1.0
    prompts: tuple[tuple[float, int], ...] = ()
    """Measured prompts, `(pass rate, prompt tokens)` (a CPU calibration): when set, `sample_population` draws from
    them instead of the paper's mix (and `stage` changes nothing)."""
    lengths_correct: tuple[int, ...] = ()
    lengths_wrong: tuple[int, ...] = ()
    """Measured completion lengths by outcome: when both are set, a completion's length is drawn from its outcome's
    list (the lognormal and the truncation rule are not used)."""


@dataclass(frozen=True)
class Setup:
    """Everything one run of the model reads."""

    cost: IterationCost = field(default_factory=RooflineCost)
    limits: EngineLimits = field(default_factory=EngineLimits)
    step_costs: StepCosts = field(default_factory=StepCosts)
    workload: Workload = field(default_factory=Workload)
    engines: int = 8
    batch_prompts: int = 512


def load_constants(path: Path, setup: Setup | None = None) -> Setup:
    """Read a JSON of constants over `setup` (the H100 defaults when `None`). Keys, all optional:
    `{"cost": {"model": "linear", "a": ..., "b": ..., "c": ..., "d": ...}}` (or `"model": "roofline"` with any
    `RooflineCost` field), `"limits"`, `"step_costs"`, `"workload"` (fields of those dataclasses), `"engines"`,
    `"batch_prompts"`, and `"source"` (free text, printed). This is where a CPU calibration plugs in."""
    setup = setup or Setup()
    data = json.loads(Path(path).read_text())
    cost = setup.cost
    if "cost" in data:
        spec = dict(data["cost"])
        kind = spec.pop("model", "roofline")
        if kind == "linear":
            cost = LinearCost(**spec)
        elif kind == "roofline":
            shape = ModelShape(**spec.pop("shape", {}))
            cost = RooflineCost(shape=shape, **spec)
        else:
            raise ValueError(f"cost.model must be 'linear' or 'roofline', got {kind!r}")
    workload = dict(data.get("workload", {}))
    if "prompts" in workload:
        workload["prompts"] = tuple((float(p), int(t)) for p, t in workload["prompts"])
    for key in ("lengths_correct", "lengths_wrong"):
        if key in workload:
            workload[key] = tuple(int(v) for v in workload[key])
    return replace(
        setup,
        cost=cost,
        limits=replace(setup.limits, **data.get("limits", {})),
        step_costs=replace(setup.step_costs, **data.get("step_costs", {})),
        workload=replace(setup.workload, **workload),
        engines=int(data.get("engines", setup.engines)),
        batch_prompts=int(data.get("batch_prompts", setup.batch_prompts)),
    )


# ---- The engine: continuous batching, one iteration at a time ------------------------------------------------------

WAITING, RUNNING, FINISHED, ABORTED = "waiting", "running", "finished", "aborted"


@dataclass(eq=False)
class Request:
    """One completion to generate: `length` tokens after a `prompt_tokens` prompt."""

    rid: int
    prompt: int
    draw: int
    prompt_tokens: int
    length: int
    reward: float = 0.0
    generated: int = 0
    """Tokens decoded so far, as of `admitted_at` (a preempted request keeps its tokens)."""
    admitted_at: int = -1
    """Engine iteration at which the request was (last) admitted."""
    state: str = WAITING
    finish_time: float = math.nan


class Engine:
    """One vLLM-like engine. `start_iteration(now)` admits waiting requests (submission order) and fixes the
    iteration's end time; `finish_iteration()` commits it (one token per running sequence) and returns the requests
    that finished. Token counts are exact: a running request's tokens follow from the iterations since its admission,
    so an iteration costs O(admissions + completions), not O(running)."""

    def __init__(self, cost: IterationCost, limits: EngineLimits, index: int = 0) -> None:
        self.cost, self.limits, self.index = cost, limits, index
        self.clock = 0.0
        self.iteration = 0
        self.waiting: deque[Request] = deque()
        self.running: dict[int, Request] = {}
        self._finishing: list[tuple[int, int, int]] = []  # (finish iteration, rid, admitted_at)
        self._admission_order: list[int] = []  # newest last: the preemption victim
        self.context_tokens = 0
        self.pending_end: float | None = None
        self.cached_prompts: set[int] = set()
        self.decoded_tokens = 0
        self.prefill_tokens = 0
        self.aborted_tokens = 0
        self.preemptions = 0
        self.iterations = 0
        self.in_transit = 0  # routed here, still on their way (a serial driver's request queue)

    @property
    def load(self) -> int:
        # Requests on their way count: a router that sends a burst to the engine that looks idle would put all of it
        # on one engine (vLLM's data-parallel balancer counts the requests it has sent, not only those arrived).
        return len(self.waiting) + len(self.running) + self.in_transit

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def reset_cache(self) -> None:
        """Forget cached prefixes (verl frees the KV cache after every generate call)."""
        self.cached_prompts.clear()

    def submit(self, request: Request) -> None:
        request.state = WAITING
        self.waiting.append(request)

    def start_iteration(self, now: float) -> float | None:
        """Admit what fits and fix this iteration's end time; `None` when there is nothing to run."""
        if self.pending_end is not None:
            raise RuntimeError("finish the current iteration first")
        if not self.has_work():
            return None
        self.clock = max(self.clock, now)
        limits = self.limits
        prefill = 0
        budget = limits.max_num_batched_tokens - len(self.running)
        while self.waiting and len(self.running) < limits.max_num_seqs:
            request = self.waiting[0]
            tokens = request.prompt_tokens + request.generated  # KV the request needs now
            # A prompt cached on this engine costs no prefill; a preempted request recomputes its own tokens.
            cached = limits.prefix_caching and request.prompt in self.cached_prompts
            charged = request.generated + (0 if cached else request.prompt_tokens)
            # Chunked prefill is folded into whole prompts: one oversized prompt still runs alone.
            if (prefill or self.running) and prefill + charged > budget:
                break
            if self.running and self.context_tokens + tokens > limits.kv_capacity_tokens:
                break
            self.waiting.popleft()
            request.state, request.admitted_at = RUNNING, self.iteration
            self.running[request.rid] = request
            self._admission_order.append(request.rid)
            self.context_tokens += tokens
            self.cached_prompts.add(request.prompt)
            prefill += charged
            # Its token number `generated + k` comes out of iteration `admitted_at + k - 1`.
            last = self.iteration + request.length - request.generated - 1
            heapq.heappush(self._finishing, (last, request.rid, request.admitted_at))
        if not self.running:
            return None
        self.prefill_tokens += prefill
        self.pending_end = self.clock + self.cost.iteration_time(len(self.running), self.context_tokens, prefill)
        return self.pending_end

    def finish_iteration(self) -> list[Request]:
        """Commit the started iteration: every running sequence gains a token; return those that finished."""
        if self.pending_end is None:
            raise RuntimeError("no iteration started")
        self.clock, self.pending_end = self.pending_end, None
        produced = len(self.running)
        self.decoded_tokens += produced
        self.context_tokens += produced
        finished = []
        while self._finishing and self._finishing[0][0] <= self.iteration:
            _, rid, admitted_at = heapq.heappop(self._finishing)
            request = self.running.get(rid)
            if request is None or request.admitted_at != admitted_at:
                continue  # aborted or preempted since: a stale entry
            del self.running[rid]
            request.generated, request.state, request.finish_time = request.length, FINISHED, self.clock
            self.context_tokens -= request.prompt_tokens + request.length
            finished.append(request)
        self.iteration += 1
        self.iterations += 1
        self._preempt_overflow()
        return finished

    def _preempt_overflow(self) -> None:
        # vLLM preempts the newest sequences (recomputed later) when the KV cache cannot hold the next tokens.
        while self.context_tokens + len(self.running) > self.limits.kv_capacity_tokens and len(self.running) > 1:
            while self._admission_order[-1] not in self.running:
                self._admission_order.pop()
            request = self.running.pop(self._admission_order.pop())
            request.generated = self.tokens_of_running(request)
            request.state = WAITING
            self.context_tokens -= request.prompt_tokens + request.generated
            self.waiting.appendleft(request)
            self.preemptions += 1

    def tokens_of_running(self, request: Request) -> int:
        """Tokens a running request has decoded by now (completed iterations only)."""
        return request.generated + (self.iteration - request.admitted_at)

    def abort(self, request: Request) -> int:
        """Drop a waiting or running request; return the tokens it had decoded (wasted work)."""
        if request.state == RUNNING:
            tokens = self.tokens_of_running(request)
            del self.running[request.rid]
            self.context_tokens -= request.prompt_tokens + tokens
        elif request.state == WAITING:
            tokens = request.generated
            self.waiting.remove(request)
        else:
            raise RuntimeError(f"cannot abort a {request.state} request")
        request.generated, request.state = tokens, ABORTED
        self.aborted_tokens += tokens
        return tokens

    def run_to_completion(self, now: float = 0.0) -> float:
        """Run until idle (a synchronous generate call); return the time the last request finished."""
        self.clock = max(self.clock, now)
        while self.start_iteration(self.clock) is not None:
            self.finish_iteration()
        return self.clock


class Cluster:
    """`engines` data-parallel engines (one per GPU)."""

    def __init__(self, cost: IterationCost, limits: EngineLimits, engines: int) -> None:
        self.engines = [Engine(cost, limits, index) for index in range(engines)]
        self._next_rid = 0

    def new_request(self, prompt: int, draw: int, prompt_tokens: int, length: int, reward: float) -> Request:
        request = Request(self._next_rid, prompt, draw, prompt_tokens, length, reward)
        self._next_rid += 1
        return request

    def generate(self, requests: Sequence[Request]) -> float:
        """One synchronous generate call: split `requests` into contiguous, nearly equal chunks, one per engine (verl's
        data-parallel split), run every engine to completion and return the slowest engine's time."""
        count, chunks = len(requests), len(self.engines)
        longest = 0.0
        for index, engine in enumerate(self.engines):
            engine.clock = 0.0
            engine.reset_cache()
            for request in requests[index * count // chunks : (index + 1) * count // chunks]:
                engine.submit(request)
            longest = max(longest, engine.run_to_completion(0.0))
        return longest

    def least_loaded(self) -> Engine:
        return min(self.engines, key=lambda engine: (engine.load, engine.index))

    @property
    def decoded_tokens(self) -> int:
        return sum(e.decoded_tokens for e in self.engines)

    @property
    def aborted_tokens(self) -> int:
        return sum(e.aborted_tokens for e in self.engines)

    @property
    def prefill_tokens(self) -> int:
        return sum(e.prefill_tokens for e in self.engines)

    @property
    def preemptions(self) -> int:
        return sum(e.preemptions for e in self.engines)


# ---- Workload: prompts, rewards and lengths ------------------------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    pass_rate: float
    prompt_tokens: int
    log_length: float
    """Log of this prompt's median completion length (before the correctness factor)."""


def sample_population(count: int, workload: Workload, seed: int, stage: str = "start") -> list[Prompt]:
    """`count` prompts from the paper's mix; `stage="end"` raises every pass rate by its band's Table 5 gain."""
    rng = random.Random(seed)
    if workload.prompts:
        if stage not in ("start", "end"):
            raise ValueError(f"stage must be 'start' or 'end', got {stage!r}")
        return measured_population([rng.choice(workload.prompts) for _ in range(count)])
    weights = [band[0] for band in PAPER_POPULATION]
    total_sigma2 = workload.prompt_length_sigma**2 + workload.completion_length_sigma**2
    mu = math.log(workload.mean_completion_tokens) - total_sigma2 / 2  # so the mean length is the stated one
    prompt_mu = math.log(workload.prompt_mean_tokens) - workload.prompt_sigma**2 / 2
    prompts = []
    for _ in range(count):
        _, low, high, gain = rng.choices(PAPER_POPULATION, weights)[0]
        p = low + (high - low) * rng.random()
        if stage == "end":
            p = min(p + gain, 1.0)
        elif stage != "start":
            raise ValueError(f"stage must be 'start' or 'end', got {stage!r}")
        prompt_tokens = min(
            max(int(rng.lognormvariate(prompt_mu, workload.prompt_sigma)), 1), workload.max_prompt_tokens
        )
        prompts.append(Prompt(p, prompt_tokens, rng.gauss(mu, workload.prompt_length_sigma)))
    return prompts


def measured_population(prompts: Sequence[tuple[float, int]]) -> list[Prompt]:
    """Prompts given as measured `(pass rate, prompt tokens)` pairs (lengths come from `Workload.lengths_*`)."""
    return [Prompt(float(p), max(int(tokens), 1), 0.0) for p, tokens in prompts]


def draw_completion(prompt: Prompt, workload: Workload, rng: random.Random) -> tuple[float, int]:
    """One completion's (reward, length): a truncated completion has no final answer and scores 0."""
    correct = rng.random() < prompt.pass_rate
    if workload.lengths_correct and workload.lengths_wrong:
        return (1.0, rng.choice(workload.lengths_correct)) if correct else (0.0, rng.choice(workload.lengths_wrong))
    length = rng.lognormvariate(prompt.log_length, workload.completion_length_sigma)
    if not correct:
        length *= workload.wrong_length_factor
    length = max(int(length), 1)
    if length >= workload.max_response_tokens:
        return 0.0, workload.max_response_tokens
    return (1.0 if correct else 0.0), length


# ---- The continuous (round-free) scheduler -------------------------------------------------------------------------


def make_continuous_step(sampler: Sampler, num_prompts: int, keys: Sequence[Hashable]) -> tuple[Any, str]:
    """The real round-free step (`sampler.begin_continuous`, `trl_ada.samplers.streaming.ContinuousStep`), named."""
    return sampler.begin_continuous(num_prompts, keys), "trl_ada.samplers.streaming.ContinuousStep"


# ---- Schedules: one training step each -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Schedule:
    """A schedule to time: a sampler configuration plus how its draws reach the engine."""

    name: str
    settings: SamplerSettings
    mode: str = "rounds"
    """`"rounds"` (synchronous generate calls) or `"continuous"` (round-free: each prompt's current round, a block of
    its round policy's request, outstanding; the same pools as rounds with the same settings)."""
    warmup_steps: int = 0
    """Untimed steps first, so stateful samplers (est, tracked) have seen their prompts before."""


@dataclass
class StepResult:
    """What one step did and cost."""

    schedule: str
    generation_s: float
    reward_s: float
    sync_s: float
    logprob_s: float
    update_s: float
    generate_calls: int
    completions: int
    rows_trained: int
    tokens_decoded: int
    tokens_finished: int
    tokens_aborted: int
    aborted_draws: int
    dropped_draws: int
    prefill_tokens: int
    preemptions: int
    mixed_share: float
    continuous_impl: str = ""
    trainer_s: float = 0.0
    """Trainer-side round cost outside generation and rewards (`StepCosts.round_s`; zero on the GPU setup)."""
    scoring_batches: int = 0
    scoring_s: float = 0.0
    """Serial continuous driver only (diagnostics, inside `generation_s`): scoring batches and their time."""

    @property
    def step_s(self) -> float:
        return self.generation_s + self.reward_s + self.sync_s + self.logprob_s + self.update_s + self.trainer_s


def mixed_share(selection: Selection, threshold: float) -> float:
    """Share of prompts whose kept group holds both outcomes (a non-zero GRPO gradient)."""
    mixed = 0
    for pool, result in zip(selection.pools, selection.prompts, strict=True):
        positives, negatives = rules.count_outcomes([pool[i] for i in result.kept], threshold)
        mixed += positives > 0 and negatives > 0
    return mixed / len(selection.prompts)


def _bernoulli_step(sampler: Sampler, prompts: Sequence[Prompt], workload: Workload, rng: random.Random) -> None:
    """An untimed step (rewards only) so a stateful sampler learns its prompts."""
    step = sampler.begin(len(prompts), list(range(len(prompts))))
    while requests := step.requests():
        rewards = [draw_completion(prompts[i], workload, rng)[0] for i, count in requests for _ in range(count)]
        step.observe(requests, rewards)
    step.finish()


def run_rounds(sampler: Sampler, prompts: Sequence[Prompt], setup: Setup, rng: random.Random, name: str) -> StepResult:
    """One step in synchronous rounds: each round is one generate call over every active prompt's requests."""
    cluster = Cluster(setup.cost, setup.limits, setup.engines)
    step = sampler.begin(len(prompts), list(range(len(prompts))))
    costs = setup.step_costs
    generation = reward_time = trainer_time = 0.0
    calls = completions = finished_tokens = 0
    while requests := step.requests():
        batch = []
        for index, count in requests:
            prompt = prompts[index]
            for _ in range(count):
                reward, length = draw_completion(prompt, setup.workload, rng)
                batch.append(cluster.new_request(index, 0, prompt.prompt_tokens, length, reward))
        # The request's own overhead (zero on the GPU setup) on top of the engine's time.
        generation += cluster.generate(batch) + costs.generate_request_s + len(batch) * costs.request_s_per_completion
        trainer_time += costs.round_s + len(batch) * costs.round_s_per_row
        calls += 1
        completions += len(batch)
        finished_tokens += sum(r.length for r in batch)
        reward_time += setup.step_costs.reward_call_s + len(batch) * setup.step_costs.reward_s_per_completion
        step.observe(requests, [r.reward for r in batch])
    selection = step.finish()
    reward_time += rescoring_time(sampler, selection, setup.step_costs)
    result = _result(
        name, sampler, selection, setup, cluster, generation, reward_time, calls, completions, finished_tokens
    )
    result.trainer_s = trainer_time
    return result


def rescoring_time(sampler: Sampler, selection: Selection, costs: StepCosts) -> float:
    """The authors' multi-round path scores each round inside the generation loop and then, in `fit`, calls
    `compute_reward` once more on the kept batch; GRPO's (and Est's single-call) only reward call is the one above."""
    if not costs.rescore_kept_rows or not hasattr(sampler, "has_exited"):
        return 0.0
    rows = sum(len(r.kept) for r in selection.prompts)
    return costs.reward_call_s + rows * costs.reward_s_per_completion


def run_continuous(
    schedule: Schedule,
    sampler: Sampler,
    prompts: Sequence[Prompt],
    setup: Setup,
    rng: random.Random,
    outcome: Callable[[int, int], tuple[float, int]] | None = None,
) -> StepResult:
    """One round-free step: a single generate call that lasts until every prompt has exited. Each prompt draws its
    rounds as blocks without waiting for the others (`ContinuousStep`); a block's draws go to the least loaded engine
    as soon as the scheduler asks for them, engines admit them in submission order, and each result is scored the
    moment it arrives (every draw submitted enters its pool: nothing is aborted). Events are processed in time order:
    the engine whose current iteration ends first commits it. `outcome(prompt, draw) -> (reward, length)` replaces the
    draws from `rng` (in submission order) by fixed ones, so another schedule can be run on the same draws."""
    cluster = Cluster(setup.cost, setup.limits, setup.engines)
    step, impl = make_continuous_step(sampler, len(prompts), list(range(len(prompts))))
    completions = finished_tokens = 0
    now = 0.0

    def submit_new() -> None:
        for index, draw in step.to_submit():
            prompt = prompts[index]
            if outcome is None:
                reward, length = draw_completion(prompt, setup.workload, rng)
            else:
                reward, length = outcome(index, draw)
            cluster.least_loaded().submit(cluster.new_request(index, draw, prompt.prompt_tokens, length, reward))

    submit_new()
    while not step.done:
        for engine in cluster.engines:
            if engine.pending_end is None and engine.has_work():
                engine.start_iteration(now)
        busy = [e for e in cluster.engines if e.pending_end is not None]
        if not busy:
            raise RuntimeError("the continuous scheduler stalled: prompts active, nothing in flight")
        engine = min(busy, key=lambda e: (e.pending_end, e.index))
        finished = engine.finish_iteration()
        now = engine.clock
        for request in finished:
            completions += 1
            finished_tokens += request.length
            step.complete(request.prompt, request.draw, request.reward, False)
        if finished:
            submit_new()
    if step.in_flight:
        raise RuntimeError("draws left in flight after every prompt exited")
    selection = step.finish()
    result = _result(
        schedule.name,
        sampler,
        selection,
        setup,
        cluster,
        generation=now,
        # Rewards are scored as results arrive, overlapped with generation: only the last one is on the path.
        reward_time=setup.step_costs.reward_s_per_completion,
        calls=1,
        completions=completions,
        finished_tokens=finished_tokens,
    )
    result.continuous_impl = impl
    return result


def run_continuous_serial(
    schedule: Schedule, sampler: Sampler, prompts: Sequence[Prompt], setup: Setup, rng: random.Random
) -> StepResult:
    """One round-free step driven as trl-ada's `schedules.continuous._drive` drives a vLLM server: one loop that
    submits what the scheduler asks for (each draw its own request), waits until at least one draw has come back
    (unless some already are), takes every draw back by then, scores them as one "scoring batch" (every draw submitted
    enters its pool, so all of them, in any order), and only then completes those draws in the scheduler and submits
    again. The engine keeps decoding while a batch is scored. Request overhead: each draw queues for `draw_request_s`
    (one request at a time, FIFO) and then reaches the engine after `draw_latency_s`. The step's generation time is the
    whole loop, its scoring batches included."""
    costs = setup.step_costs
    cost = (
        setup.cost if costs.continuous_engine_scale == 1.0 else ScaledCost(setup.cost, costs.continuous_engine_scale)
    )
    cluster = Cluster(cost, setup.limits, setup.engines)
    step, impl = make_continuous_step(sampler, len(prompts), list(range(len(prompts))))
    arrivals: list[tuple[float, int, Engine, Request]] = []  # sent, not yet at the engine
    back: list[Request] = []  # finished on the engine, not yet taken back by the driver
    waiting: deque[Request] = deque()  # submitted, waiting for a connection (`continuous_max_in_flight`)
    cap = costs.continuous_max_in_flight
    connections = {"held": 0}
    clock = {"now": 0.0, "queue_free": 0.0}
    completions = finished_tokens = batches = 0
    scoring_total = 0.0

    def send_waiting() -> None:
        # A draw takes a connection as soon as one is free (trl-ada's client thread, whatever the loop is doing).
        while waiting and (not cap or connections["held"] < cap):
            request = waiting.popleft()
            engine = cluster.least_loaded()
            clock["queue_free"] = max(clock["queue_free"], clock["now"]) + costs.draw_request_s
            heapq.heappush(arrivals, (clock["queue_free"] + costs.draw_latency_s, request.rid, engine, request))
            engine.in_transit += 1
            connections["held"] += 1

    def submit_new() -> None:
        for index, draw in step.to_submit():
            prompt = prompts[index]
            reward, length = draw_completion(prompt, setup.workload, rng)
            waiting.append(cluster.new_request(index, draw, prompt.prompt_tokens, length, reward))
        send_waiting()

    def advance(until: float | None) -> None:
        """Run arrivals and engine iterations in time order, up to `until` or (`None`) until a draw finished."""
        while True:
            now = clock["now"]
            for engine in cluster.engines:
                if engine.pending_end is None and engine.has_work():
                    engine.start_iteration(now)
            next_arrival = arrivals[0][0] if arrivals else math.inf
            busy = [e for e in cluster.engines if e.pending_end is not None]
            next_end = min((e.pending_end for e in busy), default=math.inf)  # type: ignore[type-var]
            upcoming = min(next_arrival, next_end)
            if until is not None and upcoming > until:
                clock["now"] = until
                return
            if upcoming == math.inf:
                raise RuntimeError("the continuous scheduler stalled: prompts active, nothing in flight")
            if next_arrival <= next_end:
                _, _, engine, request = heapq.heappop(arrivals)
                clock["now"] = next_arrival
                engine.in_transit -= 1
                engine.submit(request)
                continue
            engine = min(busy, key=lambda e: (e.pending_end, e.index))
            finished = engine.finish_iteration()
            clock["now"] = engine.clock
            back.extend(finished)
            connections["held"] -= len(finished)  # a finished draw's response is read: its connection is free
            send_waiting()
            if until is None and finished:
                return

    while not step.done:
        submit_new()
        if not back:
            advance(None)  # the driver's wait blocks only when nothing is back to score
        batch = sorted(back, key=lambda r: (r.prompt, r.draw))
        back.clear()
        batches += 1
        completions += len(batch)
        finished_tokens += sum(request.length for request in batch)
        # trl-ada's scoring batch calls the reward functions itself: no per-call pool start (`reward_call_s` is the
        # authors' verl reward manager's), its fixed cost is `scoring_batch_s`.
        scoring = costs.scoring_batch_s + len(batch) * (costs.scoring_batch_s_per_row + costs.reward_s_per_completion)
        scoring_total += scoring
        advance(clock["now"] + scoring)
        for request in batch:
            step.complete(request.prompt, request.draw, request.reward, False)
    if step.in_flight or waiting or connections["held"] or back:
        raise RuntimeError("draws left in flight after every prompt exited")
    selection = step.finish()
    result = _result(
        schedule.name,
        sampler,
        selection,
        setup,
        cluster,
        generation=clock["now"],
        reward_time=0.0,  # inside the loop (scoring batches)
        calls=1,
        completions=completions,
        finished_tokens=finished_tokens,
    )
    result.continuous_impl = impl + " (serial driver)"
    result.scoring_batches, result.scoring_s = batches, scoring_total
    return result


def _result(
    name: str,
    sampler: Sampler,
    selection: Selection,
    setup: Setup,
    cluster: Cluster,
    generation: float,
    reward_time: float,
    calls: int,
    completions: int,
    finished_tokens: int,
) -> StepResult:
    rows = sum(len(r.kept) for r in selection.prompts)
    costs = setup.step_costs
    return StepResult(
        schedule=name,
        generation_s=generation,
        reward_s=reward_time,
        sync_s=calls * costs.generate_call_s + costs.sampling_step_s,
        logprob_s=rows * costs.old_logprob_s_per_row,
        update_s=rows * costs.actor_update_s_per_row,
        generate_calls=calls,
        completions=completions,
        rows_trained=rows,
        tokens_decoded=cluster.decoded_tokens,
        tokens_finished=finished_tokens,
        tokens_aborted=cluster.aborted_tokens,
        aborted_draws=0,
        dropped_draws=0,
        prefill_tokens=cluster.prefill_tokens,
        preemptions=cluster.preemptions,
        mixed_share=mixed_share(selection, sampler.settings.positive_threshold),
    )


def run_schedule(
    schedule: Schedule, prompts: Sequence[Prompt], setup: Setup, seed: int, steps: int
) -> list[StepResult]:
    """`schedule.warmup_steps` untimed steps, then `steps` timed ones (fresh draws each), on the same prompts."""
    sampler = build_sampler(schedule.settings)
    rng = random.Random(seed)
    for _ in range(schedule.warmup_steps):
        _bernoulli_step(sampler, prompts, setup.workload, rng)
    results = []
    for _ in range(steps):
        if schedule.mode == "continuous" and setup.step_costs.continuous_driver == "serial":
            results.append(run_continuous_serial(schedule, sampler, prompts, setup, rng))
        elif schedule.mode == "continuous":
            results.append(run_continuous(schedule, sampler, prompts, setup, rng))
        else:
            results.append(run_rounds(sampler, prompts, setup, rng, schedule.name))
    return results


SEQ_POS_QUOTA = 2
"""The authors' `algorithm.min_positive_samples` (`SOURCES['sampler_settings']`)."""


def _seq(sampler: str, policy: str = "fixed", quota: int = SEQ_POS_QUOTA, **extra: Any) -> SamplerSettings:
    options = {"round_size": 8, "max_rounds": 4, **extra}
    if sampler == "seq_pos":
        options.setdefault("positive_quota", quota)
    return SamplerSettings(
        sampler=sampler, num_generations=4, round_policy=policy, seed=0, **{"scale_rewards": "none", **options}
    )


WARMUP = 5


def schedules(seq_pos_quota: int = SEQ_POS_QUOTA) -> list[Schedule]:
    """Every schedule the benchmark times (the paper's settings; `SOURCES['sampler_settings']`)."""
    out = [
        Schedule(f"grpo_n{n}", SamplerSettings(scale_rewards="none", seed=0, sampler="uniform", num_generations=n))
        for n in (4, 8, 16)
    ]
    for sampler in ("seq_pos", "seq_balance"):
        q = seq_pos_quota
        out.append(Schedule(f"{sampler}/fixed", _seq(sampler, quota=q)))
        out.append(Schedule(f"{sampler}/predictive", _seq(sampler, "predictive", q, round_confidence=0.7)))
        out.append(
            Schedule(f"{sampler}/tracked", _seq(sampler, "tracked", q, round_confidence=0.7), warmup_steps=WARMUP)
        )
    out.append(
        Schedule(
            "est",
            SamplerSettings(scale_rewards="none", seed=0, sampler="est", num_generations=8, est_train_on="all"),
            warmup_steps=WARMUP,
        )
    )
    # Round-free, and rounds with the same settings (the same estimator: blocks of k, cap 32 = k * max_rounds kept;
    # k = 8 is `seq_balance/fixed`).
    for k in (1, 2, 4, 8):
        settings = _seq("seq_balance", round_size=k, max_rounds=32 // k)
        if k != 8:
            out.append(Schedule(f"seq_balance/rounds_k{k}", settings))
        out.append(Schedule(f"seq_balance/continuous_k{k}", settings, mode="continuous"))
    for policy in ("predictive", "tracked"):
        settings = _seq("seq_balance", policy, round_confidence=0.7)
        warmup = WARMUP if policy == "tracked" else 0
        out.append(Schedule(f"seq_balance/continuous_{policy}", settings, mode="continuous", warmup_steps=warmup))
    out.append(Schedule("seq_pos/rounds_k4", _seq("seq_pos", quota=seq_pos_quota, round_size=4, max_rounds=8)))
    out.append(
        Schedule(
            "seq_pos/continuous_k4",
            _seq("seq_pos", quota=seq_pos_quota, round_size=4, max_rounds=8),
            mode="continuous",
        )
    )
    return out


# ---- Running, reporting --------------------------------------------------------------------------------------------

NUMERIC = ("step_s", "generation_s", "reward_s", "sync_s", "logprob_s", "update_s", "generate_calls", "completions",
           "rows_trained", "tokens_decoded", "tokens_finished", "tokens_aborted", "aborted_draws", "dropped_draws",
           "prefill_tokens", "preemptions", "mixed_share", "trainer_s")  # fmt: skip


def average(results: Sequence[StepResult]) -> dict[str, float]:
    """Mean of every numeric field over steps (and populations)."""
    row: dict[str, float] = {}
    for key in NUMERIC:
        row[key] = sum(getattr(r, key) for r in results) / len(results)
    return row


def evaluate(
    setup: Setup, chosen: Sequence[Schedule], seed: int, steps: int, stages: Sequence[str] = ("start", "end")
) -> dict[str, dict[str, dict[str, float]]]:
    """`{schedule: {stage or "mean": averaged row}}`; the same prompts (per stage) and seed for every schedule."""
    populations = {stage: sample_population(setup.batch_prompts, setup.workload, seed, stage) for stage in stages}
    table: dict[str, dict[str, dict[str, float]]] = {}
    for schedule in chosen:
        started = time.perf_counter()
        per_stage = {stage: run_schedule(schedule, populations[stage], setup, seed + 1, steps) for stage in stages}
        rows = {stage: average(results) for stage, results in per_stage.items()}
        rows["mean"] = average([r for results in per_stage.values() for r in results])
        impl = {r.continuous_impl for results in per_stage.values() for r in results} - {""}
        if impl:
            rows["mean"]["continuous_impl"] = impl.pop()  # type: ignore[assignment]
        table[schedule.name] = rows
        logger.info(
            "%-28s %6.1fs step (mean)   [%.1fs]", schedule.name, rows["mean"]["step_s"], time.perf_counter() - started
        )
    return table


def ratios(table: dict[str, dict[str, dict[str, float]]], stage: str = "mean") -> dict[str, float]:
    base = table["grpo_n4"][stage]["step_s"]
    return {name: rows[stage]["step_s"] / base for name, rows in table.items()}


def table3_check(table: dict[str, dict[str, dict[str, float]]]) -> list[dict[str, Any]]:
    """The model's step-time ratios against Table 3's (the paper's `fixed` rounds and Est)."""
    model = ratios(table)
    rows = []
    for name, key in (("seq_pos/fixed", "seq_pos"), ("seq_balance/fixed", "seq_balance"), ("est", "est")):
        paper = PAPER_TABLE3[key] / PAPER_TABLE3["grpo"]
        rows.append(
            {
                "schedule": name,
                "paper_ratio": round(paper, 3),
                "model_ratio": round(model[name], 3),
                "model_over_paper": round(model[name] / paper, 3),
                "within_15pct": abs(model[name] / paper - 1.0) <= 0.15,
            }
        )
    return rows


def generation_scale_diagnostic(table: dict[str, dict[str, dict[str, float]]]) -> dict[str, Any]:
    """A DIAGNOSTIC, not a calibration (no other number uses it): the single factor on engine (generation) time that
    brings the three Table 3 ratios closest (least squares in log ratio), and what the continuous schedules would cost
    at that factor. A factor far from 1 that reconciles all three says the schedules' structure is right and only the
    absolute generation speed differs from the paper's setup."""
    targets = {"seq_pos/fixed": "seq_pos", "seq_balance/fixed": "seq_balance", "est": "est"}

    def ratio_at(name: str, factor: float) -> float:
        mean, base = table[name]["mean"], table["grpo_n4"]["mean"]
        scaled = mean["step_s"] + (factor - 1.0) * mean["generation_s"]
        return scaled / (base["step_s"] + (factor - 1.0) * base["generation_s"])

    def loss(factor: float) -> float:
        return sum(
            math.log(ratio_at(name, factor) / (PAPER_TABLE3[key] / PAPER_TABLE3["grpo"])) ** 2
            for name, key in targets.items()
        )

    factor = min((1.0 + 0.25 * i for i in range(80)), key=loss)
    return {
        "factor": factor,
        "grpo_n4_step_s": table["grpo_n4"]["mean"]["step_s"]
        + (factor - 1.0) * table["grpo_n4"]["mean"]["generation_s"],
        "table3_ratios": {name: round(ratio_at(name, factor), 3) for name in targets},
        "model_over_paper": {
            name: round(ratio_at(name, factor) / (PAPER_TABLE3[key] / PAPER_TABLE3["grpo"]), 3)
            for name, key in targets.items()
        },
        "continuous_ratios": {name: round(ratio_at(name, factor), 3) for name in table if "continuous" in name},
    }


def format_table(table: dict[str, dict[str, dict[str, float]]]) -> str:
    base = table["grpo_n4"]
    header = (
        f"{'schedule':<28} {'step s':>7} {'x n4':>6} {'x start':>7} {'x end':>6} {'gen s':>6} {'calls':>5} "
        f"{'compl/p':>7} {'Mtok dec':>8} {'Mtok abort':>10} {'abort%':>6} {'rows':>5} {'mixed':>6}"
    )
    lines = [header, "-" * len(header)]
    prompts = None
    for name, rows in table.items():
        mean = rows["mean"]
        prompts = prompts or (base["mean"]["rows_trained"] / 4)
        lines.append(
            f"{name:<28} {mean['step_s']:7.1f} {mean['step_s'] / base['mean']['step_s']:6.2f} "
            f"{rows['start']['step_s'] / base['start']['step_s']:7.2f} {rows['end']['step_s'] / base['end']['step_s']:6.2f} "
            f"{mean['generation_s']:6.1f} {mean['generate_calls']:5.2f} {mean['completions'] / prompts:7.2f} "
            f"{mean['tokens_decoded'] / 1e6:8.2f} {mean['tokens_aborted'] / 1e6:10.3f} "
            f"{100 * mean['tokens_aborted'] / max(mean['tokens_decoded'], 1):6.1f} {mean['rows_trained']:5.0f} "
            f"{mean['mixed_share']:6.3f}"
        )
    return "\n".join(lines)


SENSITIVITY = {
    "defaults": {},
    "V0 engine (x1.7)": {"cost": {"iteration_scale": 1.7}},
    "eager (x3.84)": {"cost": {"iteration_scale": 3.84}},
    "eager (x4.3)": {"cost": {"iteration_scale": 4.3}},
    "V0 + eager (x1.7x3.84)": {"cost": {"iteration_scale": 1.7 * 3.84}},
    "mean length 400": {"workload": {"mean_completion_tokens": 400.0}},
    "mean length 1000": {"workload": {"mean_completion_tokens": 1000.0}},
    "wrong 1.5x longer": {"workload": {"wrong_length_factor": 1.5}},
    "reward 0 ms, 0 s/call": {"step_costs": {"reward_s_per_completion": 0.0, "reward_call_s": 0.0}},
    "reward 6 ms (PR 1206)": {"step_costs": {"reward_s_per_completion": 6e-3}},
    "no kept-row rescoring": {"step_costs": {"rescore_kept_rows": False}},
    "seq_pos quota 1": {"seq_pos_quota": 1},
    "sync 0 s / call": {"step_costs": {"generate_call_s": 0.0}},
    "sync 5 s / call": {"step_costs": {"generate_call_s": 5.0}},
}
SENSITIVITY_SCHEDULES = ("grpo_n4", "seq_pos/fixed", "seq_balance/fixed", "est", "seq_balance/continuous_k4")


def apply_overrides(setup: Setup, overrides: dict[str, Any]) -> Setup:
    cost = setup.cost
    if "cost" in overrides:
        if not isinstance(cost, RooflineCost):
            return setup  # sensitivity rows are stated for the roofline model only
        cost = replace(cost, **overrides["cost"])
    return replace(
        setup,
        cost=cost,
        workload=replace(setup.workload, **overrides.get("workload", {})),
        step_costs=replace(setup.step_costs, **overrides.get("step_costs", {})),
    )


def run_sensitivity(setup: Setup, seed: int, steps: int) -> dict[str, dict[str, float]]:
    out = {}
    for label, overrides in SENSITIVITY.items():
        quota = overrides.get("seq_pos_quota", SEQ_POS_QUOTA)
        chosen = [s for s in schedules(quota) if s.name in SENSITIVITY_SCHEDULES]
        table = evaluate(apply_overrides(setup, overrides), chosen, seed, steps)
        r = ratios(table)
        out[label] = {"grpo_n4_step_s": table["grpo_n4"]["mean"]["step_s"], **{k: r[k] for k in SENSITIVITY_SCHEDULES}}
    return out


def format_sensitivity(rows: dict[str, dict[str, float]]) -> str:
    names = SENSITIVITY_SCHEDULES[1:]
    header = f"{'variant':<22} {'n4 step s':>9} " + " ".join(f"{n:>26}" for n in names)
    lines = [header, "-" * len(header)]
    for label, row in rows.items():
        lines.append(f"{label:<22} {row['grpo_n4_step_s']:9.1f} " + " ".join(f"{row[n]:26.2f}" for n in names))
    return "\n".join(lines)


# trl-ada's own driver loop (`run_continuous_serial`, `trl_ada.schedules.continuous._drive`) on the GPU setup, against
# the overlapped ideal of the main table: scoring on the loop's path, every draw its own HTTP request, at most
# `continuous_max_in_flight` draws (trl-ada's default, 2,048) holding a connection. The loop's costs are not published
# for a GPU host; these are this repository's CPU measurements (`calibrate_cpu_vllm.py`): scoring batches took 1.4 ms
# + 0.08 ms a row in the quietest calibration and 26 ms + 0.09 ms a row in the slowest quiet one, and the server's
# front end queued each one-draw request for 1.8-6.8 ms on 2 shared cores.
_QUIET_BATCHES = {"scoring_batch_s": 1.4e-3, "scoring_batch_s_per_row": 0.08e-3}
DRIVER_VARIANTS: dict[str, dict[str, float]] = {
    "trl-ada loop, no loop costs": {},
    "scoring batch 1.4 ms + 0.08 ms/row": _QUIET_BATCHES,
    "scoring batch 26 ms + 0.09 ms/row": {"scoring_batch_s": 26e-3, "scoring_batch_s_per_row": 0.09e-3},
    "1.4 ms batches, 0.5 ms/request": {**_QUIET_BATCHES, "draw_request_s": 0.5e-3},
    "1.4 ms batches, 1 ms/request": {**_QUIET_BATCHES, "draw_request_s": 1e-3},
    "1.4 ms batches, 2 ms/request": {**_QUIET_BATCHES, "draw_request_s": 2e-3},
    "1.4 ms batches, at most 512 in flight": {**_QUIET_BATCHES, "continuous_max_in_flight": 512},
    "1.4 ms batches, no cap on draws in flight": {**_QUIET_BATCHES, "continuous_max_in_flight": 0},
}
TRL_ADA_MAX_IN_FLIGHT = 2048  # AdaGRPOConfig.continuous_max_in_flight's default
DRIVER_SCHEDULES = ("seq_balance/continuous_k8", "seq_balance/continuous_predictive")


def run_driver_table(
    setup: Setup, table: dict[str, dict[str, dict[str, float]]], seed: int, steps: int
) -> dict[str, dict[str, dict[str, float]]]:
    """`{variant: {schedule: ratios}}`: the continuous schedules under trl-ada's loop, same prompts and seed as `table`
    (whose GRPO-n4 and seq_balance rounds rows the loop's costs do not touch)."""
    chosen = [s for s in schedules() if s.name in DRIVER_SCHEDULES]
    n4 = table["grpo_n4"]["mean"]["step_s"]
    rounds = table["seq_balance/fixed"]["mean"]["step_s"]
    out: dict[str, dict[str, dict[str, float]]] = {}
    for label, costs in DRIVER_VARIANTS.items():
        loop = {"continuous_driver": "serial", "continuous_max_in_flight": TRL_ADA_MAX_IN_FLIGHT, **costs}
        variant = replace(setup, step_costs=replace(setup.step_costs, **loop))
        rows = evaluate(variant, chosen, seed, steps)
        out[label] = {
            name: {
                "step_s": rows[name]["mean"]["step_s"],
                "x_grpo_n4": rows[name]["mean"]["step_s"] / n4,
                "x_seq_balance_rounds": rows[name]["mean"]["step_s"] / rounds,
                "generation_s": rows[name]["mean"]["generation_s"],
                "aborted_pct": 100
                * rows[name]["mean"]["tokens_aborted"]
                / max(rows[name]["mean"]["tokens_decoded"], 1),
                "draws_sent": rows[name]["mean"]["completions"] + rows[name]["mean"]["aborted_draws"],
            }
            for name in DRIVER_SCHEDULES
        }
    return out


def format_driver_table(rows: dict[str, dict[str, dict[str, float]]]) -> str:
    header = f"{'trl-ada loop':<36} " + " ".join(
        f"{name.split('/')[-1] + ' x n4 / x rounds':>36}" for name in DRIVER_SCHEDULES
    )
    lines = [header, "-" * len(header)]
    for label, by_schedule in rows.items():
        cells = [
            f"{r['x_grpo_n4']:.2f} / {r['x_seq_balance_rounds']:.2f} (abort {r['aborted_pct']:.1f}%)"
            for r in (by_schedule[name] for name in DRIVER_SCHEDULES)
        ]
        lines.append(f"{label:<36} " + " ".join(f"{cell:>36}" for cell in cells))
    return "\n".join(lines)


# ---- The asynchronous schedule: TRL's AsyncGRPOTrainer (trl-ada's AdaAsyncGRPOTrainer), generation beside training

ASYNC_LIMITS = EngineLimits(max_num_seqs=1024, max_num_batched_tokens=8192, kv_capacity_tokens=2_263_000)
"""`vllm serve` on an H100 (`SOURCES['async_engine_limits']`): vLLM's defaults, not verl's."""


@dataclass(frozen=True)
class AsyncConfig:
    """TRL's asynchronous pipeline on the paper's cluster (`SOURCES['async_*']`)."""

    engines: int = 4
    """GPUs serving vLLM (one data-parallel engine each). The trainer has `trainer_gpus` other GPUs."""
    trainer_gpus: int = 4
    paper_gpus: int = 8
    """The GPUs `StepCosts`' per-row training costs were measured on (the paper's actor update ran on all 8)."""
    max_staleness: int = 4
    max_inflight: int = -1
    """One-completion requests open on the server at most; -1: TRL's inference, `max(max_staleness, 1) x
    samples_per_step`."""
    queue_maxsize: int = 1024
    """Scored samples the rollout buffer holds at most (the score loop blocks on a full buffer)."""
    score_queue_maxsize: int = 16
    """Closed groups waiting to be scored at most (the generate loop blocks on a full score queue)."""
    weight_sync_steps: int = 1
    weight_sync_s: float = 1.0
    """Pause vLLM, push the weights, resume: the trainer and the engines both stop for it."""
    score_call_s: float = 1e-3
    score_s_per_completion: float = 1.1e-3
    """The worker's score loop: one call at a time (TRL awaits each `_score_group`), per call plus per completion."""
    microbatch_rows: int = 16
    """Samples the trainer pulls before it trains on them (its batcher's micro-batch)."""
    old_logprob_pass: bool = False
    """TRL's asynchronous trainer takes the old log-probs from the server (no forward pass); `True` adds
    `StepCosts.old_logprob_s_per_row` per row, as the synchronous model charges."""
    limits: EngineLimits = ASYNC_LIMITS
    warmup_steps: int = 4
    timed_steps: int = 12

    def train_s_per_row(self, costs: StepCosts) -> float:
        """Trainer seconds per trained row: the paper's per-row cost on `paper_gpus`, scaled to `trainer_gpus`."""
        per_row = costs.actor_update_s_per_row + (costs.old_logprob_s_per_row if self.old_logprob_pass else 0.0)
        return per_row * self.paper_gpus / self.trainer_gpus


ASYNC_RELEASES = ("worker", "batch")
"""`AsyncSchedule.release`: trl-ada's worker as it is, or the previous worker's release of whole step-sized batches."""


@dataclass(frozen=True)
class AsyncSchedule:
    """A sampler in TRL's asynchronous worker: TRL's groups (`uniform`, `dapo`) or trl-ada's pools (`seq_*`)."""

    name: str
    settings: SamplerSettings
    release: str = "worker"
    """How a pooled schedule's kept samples are released (`SOURCES['async_release']`). `"worker"`: as trl-ada's worker
    does (`trl_ada/async_grpo/async_grpo_trainer.py::async_sampling`): each prompt a generation batch of its own where every rule
    is per prompt (`SamplerSettings.rules_are_per_prompt`), its samples queued as soon as its pool is done; otherwise one
    optimizer step's prompts. `"batch"`: the previous worker, always one optimizer step's prompts, the kept samples
    queued once every prompt of the batch is done (for comparison)."""

    def __post_init__(self) -> None:
        if self.release not in ASYNC_RELEASES:
            raise ValueError(f"release={self.release!r}: one of {ASYNC_RELEASES}")

    @property
    def pooled(self) -> bool:
        """A pool can outgrow its update group (`AsyncSampling.pooled`): every draw is scored on its own."""
        settings = self.settings
        return settings.max_pool_size > settings.num_generations

    def prompts_per_batch(self, samples_per_step: int) -> int:
        """Prompts per generation batch, by the worker's rule (`async_sampling`), unless `release="batch"`."""
        settings = self.settings
        if self.release == "worker" and settings.rules_are_per_prompt:
            return 1
        return max(1, samples_per_step // settings.num_generations)


@dataclass
class AsyncResult:
    """Steady state of one asynchronous run, over its timed steps (the warm-up steps excluded)."""

    schedule: str
    step_s: float
    """Mean interval between two optimizer steps' ends (training + weight sync done)."""
    engine_busy: float
    """Share of engine-seconds spent in an iteration."""
    trainer_wait: float
    """Share of the trainer's time blocked on an empty rollout queue."""
    generate_blocked: float
    """Share of the time the worker's generate loop was blocked on a full score queue (nothing submitted)."""
    train_s: float
    """Trainer compute per step: `samples_per_step` rows at `AsyncConfig.train_s_per_row`."""
    sync_s: float
    staleness_mean: float
    """Trained samples: trainer version when pulled minus the version the sample's draw (TRL: its group's first
    draw) was submitted under."""
    staleness_max: int
    stale_dropped_per_step: float
    draws_per_step: float
    """Completions the engines finished per step."""
    draws_per_kept_prompt: float
    """Draws of the groups / generation batches closed in the window, per prompt whose samples were queued."""
    mixed_share: float
    """Share of queued prompts whose kept group holds both outcomes."""
    release_wait_s: float
    """Pools: mean seconds between a prompt's pool being done (its last block scored, the exit rule spoken) and its
    kept samples being queued, over the prompts released in the window (0 for TRL's groups)."""
    tokens_per_step: float
    samples_per_step: int
    max_inflight: int
    prompts_per_batch: int
    """Pools: prompts per generation batch (`AsyncSchedule.prompts_per_batch`); TRL's groups: 1."""
    step_ends: list[float] = field(default_factory=list)
    trained_staleness: list[int] = field(default_factory=list)
    """Every sample trained in the timed steps, its staleness (for the tests)."""
    release_waits: list[float] = field(default_factory=list)
    """Pools: every prompt released in the timed steps, its `release_wait_s` (for the tests)."""
    released_pools: list[tuple[int, int, bool]] = field(default_factory=list)
    """Pools: every prompt released in the timed steps, (dataset row, pool size, kept draws hold both outcomes)."""


ASYNC_NUMERIC = ("step_s", "engine_busy", "trainer_wait", "generate_blocked", "train_s", "sync_s", "staleness_mean",
                 "staleness_max", "stale_dropped_per_step", "draws_per_step", "draws_per_kept_prompt", "mixed_share",
                 "release_wait_s", "tokens_per_step", "samples_per_step", "max_inflight",
                 "prompts_per_batch")  # fmt: skip


def run_async(
    schedule: AsyncSchedule,
    prompts: Sequence[Prompt],
    setup: Setup,
    config: AsyncConfig,
    seed: int,
    outcome: Callable[[int, int, int], tuple[float, int]] | None = None,
) -> AsyncResult:
    """
    TRL's asynchronous pipeline, one event at a time, over `config.warmup_steps + config.timed_steps` optimizer steps.

    - Rollout worker, generate loop (TRL's `_generate_loop`): keeps `max_inflight` one-completion requests open,
      each sent to the least loaded of `config.engines` engines under the current weight version. TRL's work iterator
      (`uniform`, `dapo`): each dataset row `n` times under one group id, the group stamped with the version of its
      first request and closed when its `n` completions are back. trl-ada's (`seq_*`): generation batches of
      `schedule.prompts_per_batch(samples_per_step)` rows (the worker's rule: 1 where every rule is per prompt, else
      `setup.batch_prompts`; `release="batch"` forces the latter), each a `begin_streaming` step of the sampler (the
      real `ContinuousStep`), yielding the next blocks of open prompts before the first blocks of a new batch; every
      draw is its own group, carrying its own version. A closed group goes into the score queue; on a full score
      queue the generate loop blocks (no result is taken back and nothing is submitted) until the score loop takes
      one.
    - Score loop (TRL's `_score_loop`), one call at a time: a group (pools: every draw waiting, one reward call), then
      its samples go into the rollout buffer one by one, waiting while it is full. `dapo` drops a group with constant
      rewards; pools complete their draws in their step, queue the next blocks, and when every prompt of a batch is
      done, `Selection` gives the kept draws, which enter the buffer then (trl-ada's `_finish_batches`): at once for
      a batch of one prompt, after the batch's slowest pool for a step-sized one (`AsyncResult.release_wait_s`).
    - Trainer: pulls samples in order, drops one more than `max_staleness` versions behind its own version, trains on
      `microbatch_rows` at a time (`AsyncConfig.train_s_per_row` each); after `samples_per_step` it steps, and every
      `weight_sync_steps` steps syncs the weights: the engines pause (requests kept, prefix cache cleared) and the
      trainer waits for `weight_sync_s`, then the version goes up.
    Rewards, lengths and prompts as in the synchronous model (`outcome(unit, prompt, draw) -> (reward, length)`
    replaces the draws from the shared generator: unit is the group or batch id, draw the index in the group or pool).
    The dataset is `prompts`, cycled.
    """
    settings = schedule.settings
    n = settings.num_generations
    pooled = schedule.pooled
    samples_per_step = setup.batch_prompts * n
    batch_prompts = schedule.prompts_per_batch(samples_per_step) if pooled else 1
    max_inflight = config.max_inflight if config.max_inflight > 0 else max(config.max_staleness, 1) * samples_per_step
    per_row = config.train_s_per_row(setup.step_costs)
    threshold, tolerance = settings.positive_threshold, settings.zero_variance_tolerance
    total_steps = config.warmup_steps + config.timed_steps
    rng = random.Random(seed)
    cluster = Cluster(setup.cost, config.limits, config.engines)
    sampler = build_sampler(settings) if pooled else None

    now = 0.0
    paused_until = 0.0
    version = 0
    inflight = 0
    meta: dict[int, tuple[int, int, int, int]] = {}  # request id -> (unit, prompt or local index, draw, version)
    backlog: deque[Request] = deque()  # finished on an engine, not yet taken back by the generate loop
    blocked: tuple | None = None  # a closed group the generate loop waits to put into the full score queue
    score_queue: deque[tuple] = deque()
    scoring: list[tuple] = []
    scoring_end = math.inf
    outbox: deque[int] = deque()  # sample versions the score loop is putting into the buffer
    buffer: deque[int] = deque()
    groups: dict[int, list[Any]] = {}  # TRL groups: id -> [version, rewards]
    group_cursor = {"next": 0, "left": 0}
    batches: dict[int, dict[str, Any]] = {}
    continuing: deque[tuple[int, int, int]] = deque()
    fresh: deque[tuple[int, int, int]] = deque()
    next_batch = 0
    trainer = {"state": "idle", "end": math.inf, "rows": 0, "idle_since": 0.0, "steps": 0}
    holding: list[int] = []  # staleness of the samples pulled for the next micro-batch
    training: list[int] = []
    counts = dict.fromkeys(
        ("busy", "wait", "blocked", "draws", "stale", "trained", "staleness", "kept", "unit_draws", "mixed", "tokens",
         "released", "release_wait"),
        0.0,
    )  # fmt: skip
    blocked_since = [0.0]
    snapshots: list[dict[str, float]] = [dict(counts)]
    step_ends: list[float] = []
    trained_staleness: list[int] = []
    release_waits: list[float] = []
    released_pools: list[tuple[int, int, bool]] = []

    def open_batch() -> None:
        nonlocal next_batch
        batch_id, next_batch = next_batch, next_batch + 1
        rows = [(batch_id * batch_prompts + i) % len(prompts) for i in range(batch_prompts)]
        step, _ = make_async_step(sampler, rows)
        batches[batch_id] = {"step": step, "rows": rows, "versions": {}, "done_at": {}}
        fresh.extend((batch_id, local, draw) for local, draw in step.to_submit())
        if step.done:  # every prompt skipped: the batch is released at once (the worker's _open_batch)
            release(batch_id)

    def release(batch_id: int) -> None:
        """A done generation batch: `Selection` gives its kept draws, queued now (trl-ada's `_finish_batches`)."""
        batch = batches.pop(batch_id)
        selection = batch["step"].finish()
        counts["unit_draws"] += batch["step"].stats.submitted
        timed = len(step_ends) >= config.warmup_steps
        for local, result in enumerate(selection.prompts):
            wait = now - batch["done_at"].get(local, now)
            counts["released"] += 1
            counts["release_wait"] += wait
            positives, negatives = rules.count_outcomes([selection.pools[local][i] for i in result.kept], threshold)
            mixed = positives > 0 and negatives > 0
            if timed:
                release_waits.append(wait)
                released_pools.append((batch["rows"][local], len(selection.pools[local]), mixed))
            if settings.refills and not result.has_signal:
                continue
            counts["kept"] += 1
            counts["mixed"] += mixed
            outbox.extend(batch["versions"][(local, draw)] for draw in result.kept)

    def next_item() -> tuple[int, int, int]:
        if not pooled:
            if group_cursor["left"] == 0:
                group_cursor["next"] += 1
                group_cursor["left"] = n
                groups[group_cursor["next"] - 1] = [version, []]  # stamped at its first request, as TRL does
            group_cursor["left"] -= 1
            group_id = group_cursor["next"] - 1
            return group_id, group_id % len(prompts), n - group_cursor["left"] - 1
        for _ in range(1000):
            if continuing:
                return continuing.popleft()
            if fresh:
                return fresh.popleft()
            open_batch()
        raise RuntimeError("1000 generation batches in a row asked for no draws")

    def submit() -> None:
        nonlocal inflight
        unit, local, draw = next_item()
        index = batches[unit]["rows"][local] if pooled else local
        prompt = prompts[index]
        reward, length = (
            draw_completion(prompt, setup.workload, rng) if outcome is None else outcome(unit, index, draw)
        )
        request = cluster.new_request(index, draw, prompt.prompt_tokens, length, reward)
        meta[request.rid] = (unit, local, draw, version)
        cluster.least_loaded().submit(request)
        inflight += 1

    def take_back(request: Request) -> tuple | None:
        """The generate loop takes a finished draw back: the group it closes, if any."""
        nonlocal inflight
        inflight -= 1
        unit, local, draw, drawn_at = meta.pop(request.rid)
        if pooled:
            return ("draw", unit, local, draw, drawn_at, request.reward)
        group = groups[unit]
        group[1].append(request.reward)
        if len(group[1]) < n:
            return None
        del groups[unit]
        return ("group", unit, group[0], group[1])

    def finish_scoring(entries: list[tuple]) -> None:
        if not pooled:
            for _, _, drawn_at, rewards in entries:
                counts["unit_draws"] += n
                if settings.refills and rules.has_zero_variance(rewards, tolerance):
                    continue  # dapo: no signal, dropped; the worker goes on drawing further prompts
                positives, negatives = rules.count_outcomes(rewards, threshold)
                counts["kept"] += 1
                counts["mixed"] += positives > 0 and negatives > 0
                outbox.extend([drawn_at] * n)
            return
        touched: set[int] = set()
        for _, batch_id, local, draw, drawn_at, reward in entries:
            batch = batches[batch_id]
            batch["versions"][(local, draw)] = drawn_at
            step = batch["step"]
            step.complete(local, draw, reward, False)
            continuing.extend((batch_id, p, d) for p, d in step.to_submit())
            if local not in batch["done_at"] and step.current_request(local) == 0:
                batch["done_at"][local] = now  # its pool is done: the exit rule spoke, nothing of it in flight
            touched.add(batch_id)
        # Only a batch with a draw completed here can have become done; in batch order, as the worker's dict is.
        for batch_id in sorted(b for b in touched if batches[b]["step"].done):
            release(batch_id)

    def trainer_pull() -> bool:
        """The trainer, when free, pulls samples for its next micro-batch; `True` when it took any."""
        if trainer["state"] != "idle":
            return False
        need = min(config.microbatch_rows, samples_per_step - trainer["rows"])
        took = False
        while buffer and len(holding) < need:
            staleness = version - buffer.popleft()
            took = True
            if staleness > config.max_staleness:
                counts["stale"] += 1  # TRL's RolloutQueueDataset drops it and pulls the next
            else:
                holding.append(staleness)
        if len(holding) == need:
            counts["wait"] += now - trainer["idle_since"]
            training[:] = holding
            holding.clear()
            trainer["state"], trainer["end"] = "train", now + need * per_row
            return True
        return took

    def react() -> None:
        """Everything that happens at `now` without time passing, until nothing more does."""
        nonlocal blocked, scoring_end
        progress = True
        while progress:
            progress = False
            if blocked is not None and len(score_queue) < config.score_queue_maxsize:
                score_queue.append(blocked)
                blocked, progress = None, True
                counts["blocked"] += now - blocked_since[0]
            while blocked is None and backlog:
                closed = take_back(backlog.popleft())
                progress = True
                if closed is not None:
                    if len(score_queue) < config.score_queue_maxsize:
                        score_queue.append(closed)
                    else:
                        blocked = closed
                        blocked_since[0] = now
            while blocked is None and inflight < max_inflight:
                submit()
                progress = True
            if not scoring and not outbox and score_queue:
                scoring.append(score_queue.popleft())
                while pooled and score_queue:  # trl-ada scores every draw waiting in one reward call
                    scoring.append(score_queue.popleft())
                rows = len(scoring) if pooled else n * len(scoring)
                scoring_end = now + config.score_call_s + rows * config.score_s_per_completion
                progress = True
            while outbox and len(buffer) < config.queue_maxsize:
                buffer.append(outbox.popleft())
                progress = True
            progress = trainer_pull() or progress

    def end_step() -> None:
        step_ends.append(now)
        counts["tokens"] = cluster.decoded_tokens
        if blocked is not None:
            counts["blocked"] += now - blocked_since[0]
            blocked_since[0] = now
        snapshots.append(dict(counts))
        trainer["state"], trainer["end"], trainer["idle_since"] = "idle", math.inf, now

    def trainer_event() -> None:
        nonlocal version, paused_until
        if trainer["state"] == "sync":
            version += 1
            end_step()
            return
        counts["trained"] += len(training)
        counts["staleness"] += sum(training)
        if len(step_ends) >= config.warmup_steps:
            trained_staleness.extend(training)
        trainer["rows"] += len(training)
        training.clear()
        if trainer["rows"] < samples_per_step:
            trainer["state"], trainer["end"], trainer["idle_since"] = "idle", math.inf, now
            return
        trainer["rows"] = 0
        trainer["steps"] += 1
        if trainer["steps"] % config.weight_sync_steps:
            end_step()
        elif config.weight_sync_s > 0:
            trainer["state"], trainer["end"] = "sync", now + config.weight_sync_s
            paused_until = trainer["end"]
            for engine in cluster.engines:
                engine.reset_cache()  # vLLM's pause clears the prefix cache
        else:
            version += 1
            end_step()

    while len(step_ends) < total_steps:
        react()
        if now >= paused_until:
            for engine in cluster.engines:
                if engine.pending_end is None and engine.has_work():
                    start = max(engine.clock, now)
                    end = engine.start_iteration(now)
                    if end is not None:
                        counts["busy"] += end - start
        busy = [e for e in cluster.engines if e.pending_end is not None]
        engine_next = min(busy, key=lambda e: (e.pending_end, e.index)) if busy else None
        engine_end = engine_next.pending_end if engine_next is not None else math.inf
        resume = paused_until if paused_until > now and any(e.has_work() for e in cluster.engines) else math.inf
        upcoming = min(engine_end, scoring_end, trainer["end"], resume)  # type: ignore[type-var]
        if upcoming == math.inf:
            raise RuntimeError("the asynchronous pipeline stalled: nothing in flight, nothing to train")
        now = upcoming
        if engine_next is not None and engine_end == upcoming:
            finished = engine_next.finish_iteration()
            counts["draws"] += len(finished)
            backlog.extend(finished)
        elif scoring_end == upcoming:
            entries = list(scoring)
            scoring.clear()
            scoring_end = math.inf
            finish_scoring(entries)
        elif trainer["end"] == upcoming:
            trainer_event()

    first, last = snapshots[config.warmup_steps], snapshots[-1]
    start = step_ends[config.warmup_steps - 1] if config.warmup_steps else 0.0
    window = step_ends[-1] - start
    steps = config.timed_steps

    def delta(key: str) -> float:
        return last[key] - first[key]

    kept = delta("kept")
    trained = delta("trained")
    return AsyncResult(
        schedule=schedule.name,
        step_s=window / steps,
        engine_busy=delta("busy") / (config.engines * window) if window > 0 else math.nan,
        trainer_wait=delta("wait") / window if window > 0 else math.nan,
        generate_blocked=delta("blocked") / window if window > 0 else math.nan,
        train_s=samples_per_step * per_row,
        sync_s=config.weight_sync_s / config.weight_sync_steps,
        staleness_mean=delta("staleness") / trained if trained else math.nan,
        staleness_max=max(trained_staleness, default=0),
        stale_dropped_per_step=delta("stale") / steps,
        draws_per_step=delta("draws") / steps,
        draws_per_kept_prompt=delta("unit_draws") / kept if kept else math.nan,
        mixed_share=delta("mixed") / kept if kept else math.nan,
        release_wait_s=delta("release_wait") / delta("released") if delta("released") else 0.0,
        tokens_per_step=delta("tokens") / steps,
        samples_per_step=samples_per_step,
        max_inflight=max_inflight,
        prompts_per_batch=batch_prompts,
        step_ends=step_ends,
        trained_staleness=trained_staleness,
        release_waits=release_waits,
        released_pools=released_pools,
    )


def make_async_step(sampler: Sampler, rows: Sequence[int]) -> tuple[Any, str]:
    """trl-ada's worker's generation batch: `trl_ada.samplers.streaming.begin_streaming`, named."""
    step = begin_streaming(sampler, len(rows), list(rows))
    return step, f"trl_ada.samplers.streaming.begin_streaming -> {type(step).__name__}"


ASYNC_SPLITS: dict[str, tuple[int, int]] = {
    "1+7": (1, 7),
    "2+6": (2, 6),
    "3+5": (3, 5),
    "4+4": (4, 4),
    "8+8": (8, 8),
}
"""`engines + trainer GPUs`: the paper's 8 GPUs split between the vLLM server and the trainer, and `8+8`, the
synchronous model's 8 engines plus 8 more GPUs for the trainer (16 in all: not the paper's hardware)."""
EXTRA_HARDWARE = "8+8"
ASYNC_QUICK_SPLITS = ("2+6", "4+4", "8+8")
ASYNC_SYNC_REFERENCES = ("grpo_n4", "seq_balance/continuous_k8", "seq_balance/continuous_predictive")
"""The synchronous rows the asynchronous section is set against (run with it under `--async-only`)."""
ASYNC_SAME_POOLS = {
    "seq_balance/fixed": "seq_balance/continuous_k8",
    "seq_balance/predictive": "seq_balance/continuous_predictive",
    "seq_balance/fixed/batch": "seq_balance/continuous_k8",
    "seq_balance/predictive/batch": "seq_balance/continuous_predictive",
}
BATCH_RELEASE_SUFFIX = "/batch"
"""Names the `release="batch"` variants: the previous worker (every generation batch one step's prompts)."""


def async_schedules() -> list[AsyncSchedule]:
    """The asynchronous schedules the benchmark times (`SOURCES['async_schedules']`)."""

    def uniform(n: int) -> SamplerSettings:
        return SamplerSettings(scale_rewards="none", seed=0, sampler="uniform", num_generations=n)

    return [
        AsyncSchedule("grpo_n4", uniform(4)),
        AsyncSchedule("grpo_n16", uniform(16)),
        AsyncSchedule("dapo_n4", SamplerSettings(scale_rewards="none", seed=0, sampler="dapo", num_generations=4)),
        # The continuous schedule's settings (`seq_balance/continuous_k8`, `.../continuous_predictive`): same pools.
        AsyncSchedule("seq_balance/fixed", _seq("seq_balance", round_size=8, max_rounds=4)),
        AsyncSchedule("seq_balance/predictive", _seq("seq_balance", "predictive", round_confidence=0.7)),
        # The previous worker: the same pools, released a step's batch at a time (for comparison).
        AsyncSchedule(
            "seq_balance/fixed" + BATCH_RELEASE_SUFFIX, _seq("seq_balance", round_size=8, max_rounds=4), "batch"
        ),
        AsyncSchedule(
            "seq_balance/predictive" + BATCH_RELEASE_SUFFIX,
            _seq("seq_balance", "predictive", round_confidence=0.7),
            "batch",
        ),
    ]


def average_async(results: Sequence[AsyncResult]) -> dict[str, float]:
    """Mean of every numeric field over populations (the worst staleness: the largest)."""
    row = {key: sum(getattr(r, key) for r in results) / len(results) for key in ASYNC_NUMERIC}
    row["staleness_max"] = max(r.staleness_max for r in results)
    return row


def evaluate_async(
    setup: Setup,
    config: AsyncConfig,
    chosen: Sequence[AsyncSchedule],
    splits: Sequence[str],
    seed: int,
    stages: Sequence[str] = ("start", "end"),
) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    """`{split: {schedule: {stage or "mean": row}}}` on the prompts (and seed) `evaluate` uses."""
    populations = {stage: sample_population(setup.batch_prompts, setup.workload, seed, stage) for stage in stages}
    out: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for split in splits:
        engines, trainer_gpus = ASYNC_SPLITS[split]
        split_config = replace(config, engines=engines, trainer_gpus=trainer_gpus)
        out[split] = {}
        for schedule in chosen:
            started = time.perf_counter()
            per_stage = {
                stage: run_async(schedule, populations[stage], setup, split_config, seed + 1) for stage in stages
            }
            rows = {stage: average_async([result]) for stage, result in per_stage.items()}
            rows["mean"] = average_async(list(per_stage.values()))
            out[split][schedule.name] = rows
            logger.info(
                "async %-4s %-24s %6.1fs step (mean)   [%.1fs]",
                split,
                schedule.name,
                rows["mean"]["step_s"],
                time.perf_counter() - started,
            )
    return out


def best_split(table: dict[str, dict[str, dict[str, dict[str, float]]]], schedule: str) -> str:
    """The split of the paper's 8 GPUs with the shortest mean step for `schedule`."""
    within = [split for split in table if split != EXTRA_HARDWARE and sum(ASYNC_SPLITS[split]) == 8]
    return min(within, key=lambda split: table[split][schedule]["mean"]["step_s"])


def _async_variant(**changes: Any) -> Callable[[Setup, AsyncConfig], tuple[Setup, AsyncConfig]]:
    return lambda setup, config: (setup, replace(config, **changes))


def _no_server_queue(setup: Setup, config: AsyncConfig) -> tuple[Setup, AsyncConfig]:
    return setup, replace(config, max_inflight=config.engines * config.limits.max_num_seqs)


def _engine_scale(scale: float) -> Callable[[Setup, AsyncConfig], tuple[Setup, AsyncConfig]]:
    return lambda setup, config: (apply_overrides(setup, {"cost": {"iteration_scale": scale}}), config)


def _big_buffer_no_server_queue(setup: Setup, config: AsyncConfig) -> tuple[Setup, AsyncConfig]:
    return _no_server_queue(setup, replace(config, queue_maxsize=8192))


ASYNC_SENSITIVITY: dict[str, Callable[[Setup, AsyncConfig], tuple[Setup, AsyncConfig]]] = {
    "max_inflight = engines x max_num_seqs": _no_server_queue,
    "max_staleness 1 (inflight 1 step)": _async_variant(max_staleness=1),
    "max_staleness 8 (inflight 8 steps)": _async_variant(max_staleness=8),
    "buffer 8192 samples": _async_variant(queue_maxsize=8192),
    "buffer 8192 + max_inflight = E x seqs": _big_buffer_no_server_queue,
    "old-log-prob pass": _async_variant(old_logprob_pass=True),
    "scoring 5.75 ms/completion": _async_variant(score_s_per_completion=5.75e-3),
    "weight sync 5 s": _async_variant(weight_sync_s=5.0),
    "engines x3.84 slower (eager)": _engine_scale(3.84),
}
"""One changed constant each (`SOURCES['async_*']`, `SOURCES['iteration_scale']`), every schedule at its best split
of the defaults; an engine change also reruns synchronous GRPO-n4, the ratio's base, and picks each schedule's best
split again (slower engines move it)."""
ASYNC_SENSITIVITY_SCHEDULES = ("grpo_n4", "seq_balance/fixed", "seq_balance/predictive")


def run_async_sensitivity(
    setup: Setup,
    config: AsyncConfig,
    table: dict[str, dict[str, dict[str, dict[str, float]]]],
    sync_n4: float,
    seed: int,
    sync_steps: int,
) -> dict[str, dict[str, dict[str, Any]]]:
    """`{variant: {schedule: {"split", "step_s", "sync_n4_s"}}}`: each schedule at its default best split."""
    chosen = [s for s in async_schedules() if s.name in ASYNC_SENSITIVITY_SCHEDULES]
    best = {s.name: best_split(table, s.name) for s in chosen}
    out: dict[str, dict[str, dict[str, Any]]] = {
        "defaults": {
            name: {"split": split, "step_s": table[split][name]["mean"]["step_s"], "sync_n4_s": sync_n4}
            for name, split in best.items()
        }
    }
    grpo = next(s for s in schedules() if s.name == "grpo_n4")
    for label, change in ASYNC_SENSITIVITY.items():
        variant_setup, variant_config = change(setup, config)
        base = sync_n4
        splits_of = {name: [split] for name, split in best.items()}
        if variant_setup != setup:
            base = evaluate(variant_setup, [grpo], seed, sync_steps)["grpo_n4"]["mean"]["step_s"]
            within = [split for split in table if split != EXTRA_HARDWARE]
            splits_of = {name: within for name in best}
        out[label] = {}
        for schedule in chosen:
            rows = evaluate_async(variant_setup, variant_config, [schedule], splits_of[schedule.name], seed)
            split = best_split(rows, schedule.name)
            step = rows[split][schedule.name]["mean"]["step_s"]
            out[label][schedule.name] = {"split": split, "step_s": step, "sync_n4_s": base}
    return out


def format_async_sensitivity(rows: dict[str, dict[str, dict[str, Any]]]) -> str:
    names = list(rows["defaults"])
    splits = ", ".join(f"{name} {cell['split']}" for name, cell in rows["defaults"].items())
    header = f"  {'variant':<38} " + " ".join(f"{name:>28}" for name in names)
    lines = [
        f"Sensitivity (one constant changed; each schedule at its default best split: {splits}),",
        "step s (x synchronous GRPO-n4 under the same variant / x asynchronous GRPO-n4 under the same variant), and "
        "the split where it moved:",
        header,
        "  " + "-" * (len(header) - 2),
    ]
    for label, by_name in rows.items():
        base = by_name["grpo_n4"]["step_s"] if "grpo_n4" in by_name else math.nan
        cells = [
            f"{cell['step_s']:5.1f} ({cell['step_s'] / cell['sync_n4_s']:.2f} / {cell['step_s'] / base:.2f})"
            + (f" {cell['split']}" if cell["split"] != rows["defaults"][name]["split"] else "")
            for name, cell in by_name.items()
        ]
        lines.append(f"  {label:<38} " + " ".join(f"{cell:>28}" for cell in cells))
    return "\n".join(lines)


NAME_WIDTH = 28
"""The asynchronous tables' schedule column (`seq_balance/predictive/batch`)."""

ASYNC_SOURCE_KEYS = ("async_topology", "async_engine_limits", "async_max_staleness", "async_max_inflight",
                     "async_queues", "async_weight_sync", "async_trainer", "async_scoring", "async_release",
                     "async_schedules", "async_steady_state")  # fmt: skip


def format_async(
    table: dict[str, dict[str, dict[str, dict[str, float]]]],
    sync: dict[str, dict[str, dict[str, float]]],
    config: AsyncConfig,
    setup: Setup,
    sensitivity: dict[str, dict[str, dict[str, Any]]] | None = None,
) -> str:
    splits = list(table)
    names = list(next(iter(table.values())))
    sync_n4 = sync["grpo_n4"]["mean"]["step_s"]
    within = [s for s in splits if s != EXTRA_HARDWARE]
    lines = [
        "ASYNCHRONOUS SCHEDULE: a PROJECTION from the model (nothing here is measured). TRL's AsyncGRPOTrainer "
        "(grpo_n*),",
        "trl-ada's AdaAsyncGRPOTrainer (dapo_n4, seq_balance/*) on the paper's 8 x H100, the GPUs split between the "
        "vLLM server",
        f"and the trainer ('E+T'); '{EXTRA_HARDWARE}' gives the trainer 8 more GPUs (16 in all, NOT the paper's "
        "hardware). Steady state over",
        f"{config.timed_steps} optimizer steps after {config.warmup_steps} warm-up steps, mean of the start and end "
        f"populations; {setup.batch_prompts} prompts per step, max_staleness {config.max_staleness}, max_inflight "
        "max_staleness x samples_per_step.",
        f"Synchronous GRPO-n4 in this run (8 GPUs, colocated): {sync_n4:.1f} s per step.",
        "seq_balance/*: trl-ada's worker as it is (every rule per prompt, so each prompt is a generation batch of its "
        "own, queued",
        f"as soon as its pool is done); seq_balance/*{BATCH_RELEASE_SUFFIX}: the PREVIOUS worker, the same pools "
        "released a step's batch at a time",
        f"({setup.batch_prompts} prompts, queued once the batch's slowest pool is done).",
        "",
        "Step time / SYNCHRONOUS GRPO-n4's step time (same run):",
    ]
    header = f"  {'schedule':<{NAME_WIDTH}} " + " ".join(f"{s:>6}" for s in within) + f" {'best of 8':>15}"
    if EXTRA_HARDWARE in table:
        header += f" {EXTRA_HARDWARE + ' (16 GPUs)':>14}"
    lines += [header, "  " + "-" * (len(header) - 2)]
    for name in names:
        best = best_split(table, name)
        cells = " ".join(f"{table[s][name]['mean']['step_s'] / sync_n4:6.2f}" for s in within)
        best_cell = f"{table[best][name]['mean']['step_s'] / sync_n4:.2f} ({best})"
        row = f"  {name:<{NAME_WIDTH}} {cells} {best_cell:>15}"
        if EXTRA_HARDWARE in table:
            row += f" {table[EXTRA_HARDWARE][name]['mean']['step_s'] / sync_n4:14.2f}"
        lines.append(row)
    lines += ["", "Step time / ASYNCHRONOUS GRPO-n4's at the same split (best of 8: each at its own best split):"]
    lines += [header, "  " + "-" * (len(header) - 2)]
    async_best = table[best_split(table, "grpo_n4")]["grpo_n4"]["mean"]["step_s"]
    for name in names:
        best = best_split(table, name)
        cells = " ".join(
            f"{table[s][name]['mean']['step_s'] / table[s]['grpo_n4']['mean']['step_s']:6.2f}" for s in within
        )
        best_cell = f"{table[best][name]['mean']['step_s'] / async_best:.2f} ({best})"
        row = f"  {name:<{NAME_WIDTH}} {cells} {best_cell:>15}"
        if EXTRA_HARDWARE in table:
            extra = table[EXTRA_HARDWARE]
            row += f" {extra[name]['mean']['step_s'] / extra['grpo_n4']['mean']['step_s']:14.2f}"
        lines.append(row)
    lines += [
        "",
        "Steady state (mean of the two populations). busy: engine-seconds in an iteration; wait: trainer blocked on "
        "an empty queue;",
        "blocked: the worker's generate loop blocked on a full score queue; stale: staleness of trained samples "
        "(versions), mean/max;",
        "dropped: samples dropped as too stale per step; draws/kept: draws per prompt whose samples were queued;",
        "held s: mean seconds a prompt's samples waited, its pool done, for the rest of its generation batch.",
    ]
    header = (
        f"  {'split':<5} {'schedule':<{NAME_WIDTH}} {'step s':>7} {'x sync':>6} {'x async':>7} {'train s':>7} "
        f"{'busy':>5} {'wait':>5} {'blocked':>7} {'stale':>8} {'dropped':>7} {'held s':>6} {'draws/step':>10} "
        f"{'draws/kept':>10} {'mixed':>6}"
    )
    lines += [header, "  " + "-" * (len(header) - 2)]
    for split in splits:
        for name in names:
            row = table[split][name]["mean"]
            base = table[split]["grpo_n4"]["mean"]["step_s"]
            lines.append(
                f"  {split:<5} {name:<{NAME_WIDTH}} {row['step_s']:7.1f} {row['step_s'] / sync_n4:6.2f} "
                f"{row['step_s'] / base:7.2f} {row['train_s'] + row['sync_s']:7.1f} {row['engine_busy']:5.2f} "
                f"{row['trainer_wait']:5.2f} {row['generate_blocked']:7.2f} "
                f"{row['staleness_mean']:4.2f}/{row['staleness_max']:<3.0f} {row['stale_dropped_per_step']:7.0f} "
                f"{row['release_wait_s']:6.2f} {row['draws_per_step']:10.0f} {row['draws_per_kept_prompt']:10.2f} "
                f"{row['mixed_share']:6.3f}"
            )
    lines += ["", "Same pools as the synchronous continuous schedule (draws per kept prompt, same populations):"]
    any_split = splits[0]
    prompts = sync["grpo_n4"]["mean"]["rows_trained"] / 4
    for name, same in ASYNC_SAME_POOLS.items():
        if name in table[any_split] and same in sync:
            draws = [table[s][name]["mean"]["draws_per_kept_prompt"] for s in splits]
            lines.append(
                f"  {name:<{NAME_WIDTH}} async {min(draws):.2f}-{max(draws):.2f} over the splits; {same} "
                f"{sync[same]['mean']['completions'] / prompts:.2f}; mixed async "
                f"{table[any_split][name]['mean']['mixed_share']:.3f} vs {sync[same]['mean']['mixed_share']:.3f}"
            )
    if sensitivity:
        lines += ["", format_async_sensitivity(sensitivity)]
    lines += ["", "Sources of the asynchronous schedule's constants:"]
    lines += [f"  {key}: {SOURCES[key]}" for key in ASYNC_SOURCE_KEYS]
    return "\n".join(lines)


@dataclass(frozen=True)
class Plan:
    prompts: int
    steps: int
    sensitivity_steps: int


FULL = Plan(prompts=512, steps=2, sensitivity_steps=1)
QUICK = Plan(prompts=64, steps=1, sensitivity_steps=0)


def async_plan(plan: Plan) -> tuple[AsyncConfig, tuple[str, ...]]:
    """The asynchronous section's configuration and splits for a plan (`--quick`: fewer steps and splits, and the
    rollout buffer scaled with the batch, so it holds the same share of a step)."""
    if plan.prompts >= FULL.prompts:
        return AsyncConfig(), tuple(ASYNC_SPLITS)
    queue = max(16, AsyncConfig.queue_maxsize * plan.prompts // FULL.prompts)
    return AsyncConfig(warmup_steps=3, timed_steps=4, queue_maxsize=queue), ASYNC_QUICK_SPLITS


def describe_setup(setup: Setup) -> dict[str, Any]:
    cost = setup.cost
    return {
        "cost_model": type(cost).__name__,
        "cost": asdict(cost) if hasattr(cost, "__dataclass_fields__") else repr(cost),  # type: ignore[arg-type]
        "limits": asdict(setup.limits),
        "step_costs": asdict(setup.step_costs),
        "workload": asdict(setup.workload),
        "engines": setup.engines,
        "batch_prompts": setup.batch_prompts,
    }


def summary(
    table: dict[str, dict[str, dict[str, float]]],
    sensitivity: dict[str, dict[str, float]],
    setup: Setup,
    driver: dict[str, dict[str, dict[str, float]]] | None = None,
) -> str:
    lines = [
        f"One training step, {setup.batch_prompts} prompts on {setup.engines} engines "
        f"({type(setup.cost).__name__}); step time averaged over the start- and end-of-training populations.",
        "x n4: step time / GRPO-n4's in this run. compl/p: completions decoded to the end per prompt. Mtok dec: "
        "tokens decoded (finished + aborted partials). abort%: decoded tokens wasted on aborted draws.",
        "",
        format_table(table),
        "",
        "Table 3 (8 x H100, Qwen2.5-Math-1.5B) against the model (no constant fitted to it):",
    ]
    for row in table3_check(table):
        lines.append(
            f"  {row['schedule']:<20} paper {row['paper_ratio']:.2f}x   model {row['model_ratio']:.2f}x   "
            f"model/paper {row['model_over_paper']:.2f}   {'within' if row['within_15pct'] else 'OUTSIDE'} 15%"
        )
    n4 = table["grpo_n4"]["mean"]
    lines.append(
        f"  GRPO-n4 absolute: model {n4['step_s']:.1f} s (generation {n4['generation_s']:.1f} s) vs paper 102 s"
    )
    diagnostic = generation_scale_diagnostic(table)
    lines += [
        "",
        f"Diagnostic only (used for no number above): scaling engine time by {diagnostic['factor']:.2f} (GRPO-n4 "
        f"step {diagnostic['grpo_n4_step_s']:.0f} s) is the single factor closest to Table 3; model/paper then: "
        + ", ".join(f"{k} {v:.2f}" for k, v in diagnostic["model_over_paper"].items())
        + ". Continuous seq_balance at that factor: "
        + ", ".join(f"{k} {v:.2f}x" for k, v in diagnostic["continuous_ratios"].items()),
    ]
    continuous = {k: v for k, v in ratios(table).items() if "continuous" in k}
    balance_mixed = table["seq_balance/fixed"]["mean"]["mixed_share"]
    lines += [
        "",
        "Continuous schedules (goal: seq_balance <= 1.5x GRPO-n4 with the mixed share of seq_balance/fixed), against",
        "rounds with the same settings (the same estimator: the same pools on the same draws):",
    ]
    by_name = {s.name: s for s in schedules()}
    for name, ratio in continuous.items():
        mean = table[name]["mean"]
        same = next(s.name for s in by_name.values() if s.mode == "rounds" and s.settings == by_name[name].settings)
        lines.append(
            f"  {name:<34} {ratio:5.2f}x GRPO-n4, {mean['step_s'] / table[same]['mean']['step_s']:4.2f}x {same:<24} "
            f"mixed {mean['mixed_share']:.3f} (rounds {table[same]['mean']['mixed_share']:.3f}; seq_balance/fixed "
            f"{balance_mixed:.3f})  aborted {100 * mean['tokens_aborted'] / max(mean['tokens_decoded'], 1):.1f}%"
        )
    impl = next(
        (rows["mean"].get("continuous_impl") for rows in table.values() if "continuous_impl" in rows["mean"]), ""
    )
    lines.append(f"  continuous scheduler used: {impl}")
    if driver:
        draws = next(iter(driver.values()))["seq_balance/continuous_predictive"]["draws_sent"]
        lines += [
            "",
            "The same, driven by trl-ada's loop (scoring on the loop's path, one HTTP request per draw; "
            f"predictive sends {draws:.0f} draws per step), ratio to GRPO-n4 / to seq_balance rounds:",
            format_driver_table(driver),
        ]
    if sensitivity:
        lines += [
            "",
            "Sensitivity (step-time ratio to GRPO-n4 under one changed constant):",
            format_sensitivity(sensitivity),
        ]
    lines += ["", "Sources of every constant (the asynchronous schedule's: with its section):"]
    lines += [f"  {key}: {text}" for key, text in SOURCES.items() if not key.startswith("async_")]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="64 prompts, one step, no sensitivity (a smoke run).")
    parser.add_argument("--json", type=Path, default=None, help="Write every number to this JSON file.")
    parser.add_argument("--constants", type=Path, default=None, help="JSON of constants (see load_constants).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None, help="Timed steps per schedule and population.")
    parser.add_argument("--no-sensitivity", action="store_true")
    parser.add_argument(
        "--async-schedule",
        action="store_true",
        help="Also project TRL's asynchronous trainer (AsyncGRPOTrainer / AdaAsyncGRPOTrainer): a separate section.",
    )
    parser.add_argument(
        "--async-only",
        action="store_true",
        help="Only the asynchronous projection and the synchronous rows it is set against (implies --async-schedule).",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)

    plan = QUICK if args.quick else FULL
    if args.steps is not None:
        plan = replace(plan, steps=args.steps)
    setup = Setup(batch_prompts=plan.prompts)
    if args.constants is not None:
        setup = load_constants(args.constants, setup)
    started = time.perf_counter()
    if args.async_only:
        table = evaluate(setup, [s for s in schedules() if s.name in ASYNC_SYNC_REFERENCES], args.seed, plan.steps)
    else:
        table = evaluate(setup, schedules(), args.seed, plan.steps)
    sensitivity = {}
    driver = {}
    if plan.sensitivity_steps and not args.no_sensitivity and not args.async_only:
        sensitivity = run_sensitivity(setup, args.seed, plan.sensitivity_steps)
        if setup.step_costs.continuous_driver == "overlapped":  # the GPU setup (a CPU calibration is the loop already)
            driver = run_driver_table(setup, table, args.seed, plan.steps)
    async_table: dict[str, Any] = {}
    async_sensitivity: dict[str, Any] = {}
    if args.async_schedule or args.async_only:
        async_config, splits = async_plan(plan)
        async_table = evaluate_async(setup, async_config, async_schedules(), splits, args.seed)
        if plan.sensitivity_steps and not args.no_sensitivity:
            sync_n4 = table["grpo_n4"]["mean"]["step_s"]
            async_sensitivity = run_async_sensitivity(setup, async_config, async_table, sync_n4, args.seed, plan.steps)
    elapsed = time.perf_counter() - started
    if args.async_only:
        text = (
            f"{setup.batch_prompts} prompts per step ({type(setup.cost).__name__}); synchronous references:\n"
            + format_table(table)
        )
    else:
        text = summary(table, sensitivity, setup, driver)
    if async_table:
        text += "\n\n" + format_async(async_table, table, async_config, setup, async_sensitivity)
    print(text)
    print(f"\n(ran in {elapsed:.0f} s on one core, seed {args.seed}, {plan.steps} timed step(s) per schedule)")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "setup": describe_setup(setup),
            "seed": args.seed,
            "plan": asdict(plan),
            "schedules": table,
            "ratios_vs_grpo_n4": ratios(table),
            "table3": [] if args.async_only else table3_check(table),
            "generation_scale_diagnostic": {} if args.async_only else generation_scale_diagnostic(table),
            "paper_table3_s": PAPER_TABLE3,
            "sensitivity": sensitivity,
            "trl_ada_loop": driver,
            "async": (
                {
                    "config": asdict(async_config),
                    "splits": {k: ASYNC_SPLITS[k] for k in async_table},
                    "sensitivity": async_sensitivity,
                    **async_table,
                }
                if async_table
                else {}
            ),
            "sources": SOURCES,
            "elapsed_s": elapsed,
        }
        args.json.write_text(json.dumps(payload, indent=2, default=str) + "\n")
        logger.info("wrote %s", args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
