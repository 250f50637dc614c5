"""
Bytes moved between processes and peak pool memory per process, per training step, for three designs on the same data:

- `grpo`: what `trl.GRPOTrainer` itself moves for the step's kept rows (B x n). Its cross-process traffic in
  `_generate_and_score_completions` with transformers or colocated vLLM generation (TRL 1.16): the gathered rewards
  (`_calculate_rewards`), prompt and completion lengths and truncation flags (metrics), and the prompt and completion
  texts all-gathered for the completions log (`gather_object(prompts)`, `gather_object(completions)`). The same calls
  run on these fake rows here (scalars such as the loss are left out: a few bytes).
- `all_gather_pools` (the previous trl-ada design): every round all-gathers every completion (ids, log-probs, text, as
  pickled objects) to every process, so each process holds the whole global pool; then the `grpo` traffic for the kept
  rows.
- `rank_local_pools` (`trl_ada.schedules.pools`, the current design): per round only the rewards and one truncation flag per row
  are gathered; completions stay compact on the process that generated them; at the end of the step each kept row
  moves once, by `all_to_all`, to the process that trains on it; then the `grpo` traffic for the kept rows.

A fake generator (no model) produces paper-sized rows: `seq_balance` with rounds of 8, a cap of 32 and n=4 over
--prompts prompts whose pass rates follow the paper's training-set mix (984 / 3,082 / 870 / 63 of 4,999 prompts at
pass rate 0, (0, 0.2], (0.2, 0.5], (0.5, 1]; uniform within a band), completions of 500-2,500 tokens (mean 1,500, an
assumption: the paper gives no length distribution), prompts of 100-300 tokens, 4 characters of text per token, and
a float32-valued sampling log-prob per token (vLLM) unless --no-logprobs. Every row is a deterministic function of
(prompt, draw), so the three designs see identical rows and decisions.

Measured on --processes gloo processes (each design in fresh processes): bytes each process receives through
collectives (all_gather, all_gather_into_tensor, all_to_all_single; wrapped and counted), and peak resident memory
above the process's memory before the step. Then a table extrapolates bytes and pool memory per process to 8, 64 and
256 processes from the measured per-row sizes and the exact round layouts (`trl_ada.schedules.rounds.RoundLayout`) of that many
processes; its row for --processes is checked against the measurement.

    python benchmarks/pool_memory.py                       # paper scale: 512 prompts (~3 GB, ~2 min)
    python benchmarks/pool_memory.py --prompts 16 --completion-tokens 64 --json out.json   # a quick look

`--one-launch` (the test suite's smoke run) runs the three designs one after another in the same two processes
instead of fresh ones: the bytes received and the rows held are counted per design as before (they do not depend on
the process), but peak memory would include the earlier designs' high-water mark, so it is reported as NaN.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import socket
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trl_ada.samplers import SamplerSettings, build_sampler  # noqa: E402
from trl_ada.schedules.pools import LocalRow, PoolEntry, moved_fraction, pack_rows, route_kept_rows  # noqa: E402
from trl_ada.schedules.rounds import RoundLayout  # noqa: E402

DESIGNS = ("grpo", "all_gather_pools", "rank_local_pools")
PAPER_MIX = ((984, 0.0, 0.0), (3082, 0.0, 0.2), (870, 0.2, 0.5), (63, 0.5, 1.0))
"""(prompts, lowest, highest pass rate) of the paper's 4,999 training prompts under the initial model."""
VOCAB = 151_936  # Qwen2.5's vocabulary: token ids need 18 bits
CHARS_PER_TOKEN = 4
TEXT = "the quick brown fox jumps over the lazy dog; 2 + 2 = 4, so x = 17. " * 2000


@dataclass
class Setting:
    prompts: int = 512
    num_generations: int = 4
    round_size: int = 8
    max_rounds: int = 4
    completion_tokens: int = 1500
    prompt_tokens: int = 200
    logprobs: bool = True
    seed: int = 0

    def sampler_settings(self) -> SamplerSettings:
        return SamplerSettings(
            scale_rewards="none",
            sampler="seq_balance",
            num_generations=self.num_generations,
            round_size=self.round_size,
            max_rounds=self.max_rounds,
            seed=self.seed,
        ).validated()


# ---- The fake generator: every row a deterministic function of (prompt, draw) ---------------------------------------


def pass_rates(setting: Setting) -> list[float]:
    rng = np.random.default_rng(setting.seed)
    weights = np.array([count for count, _, _ in PAPER_MIX], dtype=float)
    bands = rng.choice(len(PAPER_MIX), size=setting.prompts, p=weights / weights.sum())
    return [float(rng.uniform(PAPER_MIX[b][1], PAPER_MIX[b][2])) for b in bands]


def outcome(setting: Setting, rates: list[float], prompt: int, draw: int) -> float:
    return float(np.random.default_rng((setting.seed, 1, prompt, draw)).random() < rates[prompt])


def fake_row(setting: Setting, prompt: int, draw: int) -> tuple[list[int], list[int], str, list[float] | None, str]:
    """(prompt_ids, completion_ids, completion text, logprobs, prompt text) as TRL's `_generate` returns them: lists."""
    rng = np.random.default_rng((setting.seed, 2, prompt, draw))
    prompt_rng = np.random.default_rng((setting.seed, 3, prompt))
    prompt_length = int(prompt_rng.integers(setting.prompt_tokens // 2, setting.prompt_tokens * 3 // 2 + 1))
    length = int(rng.integers(setting.completion_tokens // 3, setting.completion_tokens * 5 // 3 + 1))
    prompt_ids = prompt_rng.integers(0, VOCAB, prompt_length).tolist()
    completion_ids = rng.integers(0, VOCAB, length).tolist()
    logprobs = (-rng.exponential(0.3, length)).astype(np.float32).tolist() if setting.logprobs else None
    start = int(rng.integers(0, 1000))
    return (
        prompt_ids,
        completion_ids,
        TEXT[start : start + CHARS_PER_TOKEN * length],
        logprobs,
        TEXT[: CHARS_PER_TOKEN * prompt_length],
    )


# ---- The step's control, without data: identical on every process and in every design -------------------------------


@dataclass
class Plan:
    rounds: list[list[tuple[int, int]]] = field(default_factory=list)
    """Each round's requests (prompt, count)."""
    kept: list[tuple[int, int]] = field(default_factory=list)
    """(prompt, draw) of each kept row, in the global kept order."""


def plan_step(setting: Setting) -> Plan:
    rates = pass_rates(setting)
    step = build_sampler(setting.sampler_settings()).begin(setting.prompts, list(range(setting.prompts)))
    drawn = [0] * setting.prompts
    plan = Plan()
    while requests := step.requests():
        plan.rounds.append(list(requests))
        rewards = []
        for prompt, count in requests:
            rewards += [outcome(setting, rates, prompt, drawn[prompt] + k) for k in range(count)]
            drawn[prompt] += count
        step.observe(requests, rewards)
    selection = step.finish()
    plan.kept = [(g, i) for g, result in enumerate(selection.prompts) for i in result.kept]
    return plan


def layout_counts(setting: Setting, plan: Plan, processes: int) -> dict[str, float]:
    """Rows per step by the round layouts of `processes` processes: generated (with padding), held, kept, moved."""
    generated = held_max = 0
    held = [0] * processes
    holders: dict[tuple[int, int], int] = {}
    drawn = [0] * setting.prompts
    for requests in plan.rounds:
        layout = RoundLayout.plan(requests, processes)
        generated += len(layout.padded)
        for j, prompt in enumerate(layout.order):
            holder = layout.holder(j)[0]
            holders[(prompt, drawn[prompt])] = holder
            drawn[prompt] += 1
            held[holder] += 1
    held_max = max(held)
    kept = [PoolEntry(None, False, holders[key]) for key in plan.kept]  # type: ignore[arg-type]
    return {
        "generated": generated,
        "requested": sum(drawn),
        "held_max": held_max,
        "kept": len(kept),
        "moved": moved_fraction(kept, processes) * len(kept),
    }


# ---- One process of one design --------------------------------------------------------------------------------------


class Traffic:
    """Bytes this process receives through the collectives, by phase."""

    def __init__(self) -> None:
        self.phase = "control"
        self.received: dict[str, int] = {}

    def add(self, nbytes: int) -> None:
        self.received[self.phase] = self.received.get(self.phase, 0) + int(nbytes)

    def install(self) -> None:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        original_all_gather, original_into, original_a2a = (
            c10d.all_gather,
            c10d.all_gather_into_tensor,
            dist.all_to_all_single,
        )

        def all_gather(tensor_list, tensor, *args, **kwargs):
            self.add(sum(t.nbytes for t in tensor_list) - tensor.nbytes)
            return original_all_gather(tensor_list, tensor, *args, **kwargs)

        def all_gather_into_tensor(output, tensor, *args, **kwargs):
            self.add(output.nbytes - tensor.nbytes)
            return original_into(output, tensor, *args, **kwargs)

        def all_to_all_single(output, tensor, output_split_sizes=None, input_split_sizes=None, *args, **kwargs):
            rank, world = dist.get_rank(), dist.get_world_size()
            own = (
                output.nbytes // world
                if output_split_sizes is None
                else output_split_sizes[rank] * output.element_size()
            )
            self.add(output.nbytes - own)
            return original_a2a(output, tensor, output_split_sizes, input_split_sizes, *args, **kwargs)

        # all_gather_object calls c10d.all_gather; accelerate's gather calls all_gather_into_tensor.
        c10d.all_gather = dist.all_gather = all_gather
        c10d.all_gather_into_tensor = dist.all_gather_into_tensor = all_gather_into_tensor
        dist.all_to_all_single = all_to_all_single


def _gather(tensor):
    """`accelerate.utils.gather` on gloo: an all_gather into a list of tensors."""
    import torch
    import torch.distributed as dist

    output = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(output, tensor)
    return torch.cat(output)


def _gather_object(obj: list) -> list:
    import torch.distributed as dist

    output: list = [None] * dist.get_world_size()
    dist.all_gather_object(output, obj)
    return [item for part in output for item in part]


def trl_update_traffic(rows: list[tuple], traffic: Traffic) -> None:
    """`GRPOTrainer._generate_and_score_completions`' collectives for this process's rows (see the module docstring)."""
    import torch

    traffic.phase = "trl_update"
    _gather(torch.zeros(len(rows), 1, dtype=torch.float32))  # rewards_per_func (one reward function)
    _gather(torch.tensor([len(row[0]) for row in rows], dtype=torch.int64))  # prompt lengths
    _gather(torch.tensor([len(row[1]) for row in rows], dtype=torch.int64))  # completion lengths
    _gather(torch.zeros(len(rows), dtype=torch.uint8))  # is_truncated
    _gather_object([row[4] for row in rows])  # prompts for the completions log
    _gather_object([row[2] for row in rows])  # completions for the completions log


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_design(rank: int, processes: int, port: int, design: str, setting: Setting, out_dir: str) -> None:
    """One design in fresh processes (the default): its peak memory is its own."""
    run_designs(rank, processes, port, (design,), setting, out_dir, peak_memory=True)


def run_designs(
    rank: int,
    processes: int,
    port: int,
    designs: tuple[str, ...],
    setting: Setting,
    out_dir: str,
    peak_memory: bool = False,
) -> None:
    """`designs` one after another in this process group; `peak_memory=False`: reported as NaN (`--one-launch`)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=processes)
    traffic = Traffic()
    traffic.install()
    for design in designs:
        traffic.phase, traffic.received = "control", {}
        report = design_step(rank, processes, design, setting, traffic)
        if not peak_memory:
            report["peak_memory"] = float("nan")
        Path(out_dir, f"{design}-{rank}.json").write_text(json.dumps(report))
        dist.barrier()
    dist.destroy_process_group()


def design_step(rank: int, processes: int, design: str, setting: Setting, traffic: Traffic) -> dict:
    """One step of `design` on this process: what it received, its peak memory, the rows it held and kept."""
    import torch

    plan = plan_step(setting)  # the control's decisions (every design reproduces them; checked below)
    rates = pass_rates(setting)
    n = setting.num_generations
    before = _rss()
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    kept_local: list[tuple] = []
    rows_held = 0

    if design == "grpo":
        local = setting.prompts * n // processes
        kept_local = [fake_row(setting, j // n, j % n) for j in range(rank * local, (rank + 1) * local)]
        rows_held = len(kept_local)
    else:
        step = build_sampler(setting.sampler_settings()).begin(setting.prompts, list(range(setting.prompts)))
        drawn = [0] * setting.prompts
        pools: list[list] = [[] for _ in range(setting.prompts)]
        while requests := step.requests():
            layout = RoundLayout.plan(requests, processes)
            keys = []
            for prompt in layout.padded:
                keys.append((prompt, drawn[prompt]))
                drawn[prompt] += 1
            for prompt in layout.padded[len(layout.order) :]:
                drawn[prompt] -= 1  # padding rows are generated and dropped: their draw indices are reused
            share = keys[rank * layout.share_size : (rank + 1) * layout.share_size]
            generated = [fake_row(setting, *key) for key in share]  # lists, as TRL's `_generate` returns
            local_rewards = torch.tensor([[outcome(setting, rates, *key)] for key in share], dtype=torch.float32)
            traffic.phase = "control"
            gathered = _gather(local_rewards)[: len(layout.order)]
            rewards = gathered[:, 0].tolist()
            if design == "all_gather_pools":
                everything = _gather_object(generated)
                for j, prompt in enumerate(layout.order):
                    pools[prompt].append(everything[j])
                rows_held += len(layout.order)
            else:
                _gather(torch.zeros(len(share), dtype=torch.uint8))  # truncation flags
                for j, prompt in enumerate(layout.order):
                    holder, i = layout.holder(j)
                    row = None
                    if holder == rank:
                        p_ids, c_ids, text, lps, _ = generated[i]
                        row = LocalRow.from_lists(p_ids, c_ids, text, lps, {})
                        rows_held += 1
                    pools[prompt].append(PoolEntry(gathered[j], False, holder, row))
            del generated
            step.observe(requests, rewards)
        selection = step.finish()
        kept_keys = [(g, i) for g, result in enumerate(selection.prompts) for i in result.kept]
        assert kept_keys == plan.kept, "the designs must make the same decisions"
        kept = [pools[g][i] for g, i in kept_keys]
        kept_prompts = [(fake_row(setting, g, 0)[4], g) for g, _ in kept_keys] if design == "rank_local_pools" else []
        local = len(kept) // processes
        if design == "all_gather_pools":
            kept_local = kept[rank * local : (rank + 1) * local]
        else:
            traffic.phase = "kept_rows"
            routed = route_kept_rows(kept, rank, processes)
            kept_local = [
                (
                    row.prompt_ids.tolist(),
                    row.completion_ids.tolist(),
                    row.completion,
                    None if row.logprobs is None else row.logprobs.tolist(),
                    prompt_text,  # the trainer takes it from the batch's dataset rows, which every process has
                )
                for row, (prompt_text, _) in zip(routed, kept_prompts[rank * local : (rank + 1) * local], strict=True)
            ]
        del pools, kept
    trl_update_traffic(kept_local, traffic)
    peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, peak_before)
    return {
        "received": traffic.received,
        "peak_memory": peak - before,
        "rows_held": rows_held,
        "kept_local": len(kept_local),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(setting: Setting, processes: int, one_launch: bool = False) -> dict[str, list[dict]]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out_dir:
        if one_launch:
            args = (processes, _free_port(), DESIGNS, setting, out_dir)
            mp.spawn(run_designs, args=args, nprocs=processes, join=True)
        else:
            for design in DESIGNS:
                args = (processes, _free_port(), design, setting, out_dir)
                mp.spawn(run_design, args=args, nprocs=processes, join=True)
        return {
            design: [json.loads(Path(out_dir, f"{design}-{r}.json").read_text()) for r in range(processes)]
            for design in DESIGNS
        }


# ---- Per-row sizes and the extrapolation ----------------------------------------------------------------------------


def _list_bytes(values: list) -> int:
    """Heap bytes of a list of Python ints or floats (the list, its pointers and each number object)."""
    return sys.getsizeof(values) + sum(sys.getsizeof(v) for v in values)


def row_sizes(setting: Setting, sample: int = 64) -> dict[str, float]:
    rows = [fake_row(setting, prompt, 0) for prompt in range(min(sample, setting.prompts))]

    def mean(values) -> float:
        return float(np.mean(list(values)))

    return {
        # pickled (ids, ids, text, logprobs, prompt text): what all_gather_object moves per row
        "pickled_row": mean(len(pickle.dumps(row)) for row in rows),
        # pack_rows: int32 ids, float32 log-probs, pickled text
        "packed_row": mean(len(pack_rows([LocalRow.from_lists(r[0], r[1], r[2], r[3], {})])) for r in rows),
        # the completions log's texts, pickled
        "texts": mean(len(pickle.dumps(r[4])) + len(pickle.dumps(r[2])) for r in rows),
        # heap bytes of a row as Python lists (TRL's `_generate` output) and as a compact LocalRow
        "list_row_heap": mean(
            _list_bytes(r[0]) + _list_bytes(r[1]) + (_list_bytes(r[3]) if r[3] else 0) + sys.getsizeof(r[2])
            for r in rows
        ),
        "compact_row_heap": mean(
            LocalRow.from_lists(r[0], r[1], r[2], r[3], {}).nbytes + sys.getsizeof(r[2]) for r in rows
        ),
    }


def extrapolate(setting: Setting, plan: Plan, sizes: dict[str, float], processes: int) -> dict[str, float]:
    """Bytes received and pool memory per process (averages over processes; memory: the busiest process)."""
    if len(plan.kept) % processes:
        raise ValueError(f"{len(plan.kept)} kept rows cannot be split over {processes} processes; use more --prompts")
    counts = layout_counts(setting, plan, processes)
    others = (processes - 1) / processes
    kept = counts["kept"]
    grpo_bytes = kept * others * (4 + 8 + 8 + 1 + sizes["texts"])
    control = counts["generated"] * others * 4  # float32 rewards, one reward function
    grpo_memory = kept / processes * sizes["list_row_heap"] + kept * sizes["texts"]
    return {
        "processes": processes,
        "rows_generated": counts["generated"],
        "rows_requested": counts["requested"],
        "kept_rows_moved": counts["moved"] / kept,
        "bytes_grpo": grpo_bytes,
        "bytes_all_gather_pools": grpo_bytes + control + counts["generated"] * others * sizes["pickled_row"],
        "bytes_rank_local_pools": grpo_bytes
        + control
        + counts["generated"] * others
        + counts["moved"] / processes * sizes["packed_row"],
        "memory_grpo": grpo_memory,
        "memory_all_gather_pools": counts["requested"] * sizes["list_row_heap"] + grpo_memory,
        "memory_rank_local_pools": counts["held_max"] * sizes["compact_row_heap"] + grpo_memory,
    }


def summarize(measured: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    summary = {}
    for design, reports in measured.items():
        received = [sum(r["received"].values()) for r in reports]
        phases = sorted({phase for r in reports for phase in r["received"]})
        summary[design] = {
            "bytes_per_process": float(np.mean(received)),
            **{f"bytes_{p}": float(np.mean([r["received"].get(p, 0) for r in reports])) for p in phases},
            "peak_memory_max": float(max(r["peak_memory"] for r in reports)),
            "rows_held_max": max(r["rows_held"] for r in reports),
        }
    return summary


def _mb(value: float) -> str:
    return f"{value / 2**20:,.1f}"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--completion-tokens", type=int, default=1500, help="mean completion length")
    parser.add_argument("--prompt-tokens", type=int, default=200, help="mean prompt length")
    parser.add_argument("--no-logprobs", action="store_true", help="transformers generation: no sampling log-probs")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--extrapolate", type=int, nargs="*", default=[8, 64, 256])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--one-launch",
        action="store_true",
        help="every design in the same processes (a smoke run: bytes and rows as usual, peak memory NaN)",
    )
    args = parser.parse_args(argv)
    setting = Setting(
        prompts=args.prompts,
        completion_tokens=args.completion_tokens,
        prompt_tokens=args.prompt_tokens,
        logprobs=not args.no_logprobs,
        seed=args.seed,
    )
    plan = plan_step(setting)
    measured = measure(setting, args.processes, one_launch=args.one_launch)
    summary = summarize(measured)
    sizes = row_sizes(setting)
    table = [
        extrapolate(setting, plan, sizes, w) for w in [args.processes, *args.extrapolate] if len(plan.kept) % w == 0
    ]

    grpo = summary["grpo"]
    print(
        f"One step: {setting.prompts} prompts, seq_balance (rounds of {setting.round_size}, cap "
        f"{setting.round_size * setting.max_rounds}, n={setting.num_generations}), {len(plan.rounds)} rounds, "
        f"{table[0]['rows_requested']} completions drawn ({table[0]['rows_requested'] / setting.prompts:.1f} per prompt), "
        f"mean completion {setting.completion_tokens} tokens; measured on {args.processes} gloo processes."
    )
    print(f"\n{'design':<18} {'MiB received/process':>21} {'x GRPO':>7} {'peak MiB/process':>17} {'x GRPO':>7}")
    for design in DESIGNS:
        row = summary[design]
        print(
            f"{design:<18} {_mb(row['bytes_per_process']):>21} {row['bytes_per_process'] / grpo['bytes_per_process']:>7.2f} "
            f"{_mb(row['peak_memory_max']):>17} {row['peak_memory_max'] / grpo['peak_memory_max']:>7.2f}"
        )
    print("\nReceived per process by phase (MiB):")
    for design in DESIGNS:
        phases = {k[6:]: v for k, v in summary[design].items() if k.startswith("bytes_") and k != "bytes_per_process"}
        print(f"  {design:<18} " + ", ".join(f"{k} {_mb(v)}" for k, v in phases.items()))
    print(
        f"\nExtrapolated per process (model from measured row sizes and exact round layouts; first row = the "
        f"measured setting):\n{'processes':>9} {'rows gen.':>9} {'moved':>6} "
        f"{'MiB GRPO':>9} {'old x':>7} {'new x':>6} {'pool MiB GRPO':>13} {'old x':>7} {'new x':>6}"
    )
    for row in table:
        print(
            f"{row['processes']:>9} {row['rows_generated']:>9} {row['kept_rows_moved']:>6.2f} "
            f"{_mb(row['bytes_grpo']):>9} {row['bytes_all_gather_pools'] / row['bytes_grpo']:>7.2f} "
            f"{row['bytes_rank_local_pools'] / row['bytes_grpo']:>6.2f} {_mb(row['memory_grpo']):>13} "
            f"{row['memory_all_gather_pools'] / row['memory_grpo']:>7.2f} "
            f"{row['memory_rank_local_pools'] / row['memory_grpo']:>6.2f}"
        )
    result = {
        "setting": setting.__dict__,
        "rounds": len(plan.rounds),
        "measured": summary,
        "row_sizes": sizes,
        "extrapolated": table,
        "command": "python benchmarks/pool_memory.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
