"""
What Reinforce-Ada's sequential samplers cost, simulated with Bernoulli rewards (no model), in one command:

1. `fig10_sampling_cost.{png,csv}`: the paper's Figure 10 (Appendix D). Expected completions drawn per prompt against
   the pass rate p for `seq_pos` (stop at K positives) and `seq_balance` (K positives and K negatives), caps
   N_max in {32, 64, 128} drawn in at most 8 rounds of N_max / 8. Dots: `simulate()`; lines: the exact expectation.
2. `fig2_unmixed_groups.{png,csv}`: the paper's Figure 2 (right). Share of all-correct and all-wrong groups against
   the group size k for a population of pass rates like the paper's hard prompts (Appendix C.1). Dots: the
   `uniform` sampler on sampled prompts; lines: the closed forms E[p^k] and E[(1-p)^k].
3. `round_policies.{png,csv}`: round policies of `seq_balance` (n=4, quotas 2/2, rounds of 8, at most 4 rounds) on
   pass rates spread evenly over [0.02, 0.98]: `fixed`, `predictive` and `tracked` over a sweep of
   `round_confidence`, plus an oracle that knows every prompt's true pass rate. Mean samples against mean rounds
   per prompt, the expected rounds of a whole generation batch (what wall time follows: every round waits for its
   longest completion) and the share of prompts still active in each round.

    python benchmarks/sampling_cost.py [--quick] [--out benchmarks/results/sampling_cost]

Deterministic for a `--seed`. A single `seq_*` point is also what `trl-ada simulate` prints, e.g.
`trl-ada simulate --sampler seq_pos --round-size 4 --max-rounds 8 --num-generations 2 --positive-quota 1`.
"""

from __future__ import annotations

import argparse
import csv
import logging
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from trl_ada.samplers import Sampler, SamplerSettings, Selection, build_sampler, rules, simulate
from trl_ada.samplers.simulate import run_population

logger = logging.getLogger("sampling_cost")

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "sampling_cost"

# The paper's 5000-prompt hard subset by the base model's pass@16 (Appendix C.1): 984 prompts at p = 0, 3,082 in
# (0, 0.2], 870 in (0.2, 0.5] and 63 in (0.5, 1] (4,999 in all; the text's 19.7/61.7/17.4/1.3% add up to 100.1%).
# Weights are these counts normalised; inside a band p is uniform.
PAPER_POPULATION: tuple[tuple[int, float, float], ...] = (
    (984, 0.0, 0.0),
    (3082, 0.0, 0.2),
    (870, 0.2, 0.5),
    (63, 0.5, 1.0),
)

FIG10_FILE, FIG2_FILE, ROUNDS_FILE = "fig10_sampling_cost", "fig2_unmixed_groups", "round_policies"

ORACLE_PSEUDO_COUNT = 1e5
"""Pseudo-observations of the true pass rate the oracle's tracker starts with (posterior sd <= 0.0016)."""


@dataclass(frozen=True)
class Plan:
    """Every size the benchmark uses; `--quick` swaps in a smaller one."""

    fig10_pass_rates: tuple[float, ...]
    fig10_caps: tuple[int, ...]
    fig10_quotas: tuple[int, ...]
    fig10_trials: int
    fig2_group_sizes: tuple[int, ...]
    fig2_prompts: int
    rounds_pass_rates: tuple[float, ...]
    rounds_trials: int
    rounds_steps: int
    confidences: tuple[float, ...]
    batch_sizes: tuple[int, ...] = (64, 512)


def _grid(low: float, high: float, count: int) -> tuple[float, ...]:
    return tuple(round(low + (high - low) * i / (count - 1), 6) for i in range(count))


FULL = Plan(
    fig10_pass_rates=_grid(0.02, 0.98, 49),
    fig10_caps=(32, 64, 128),
    fig10_quotas=(1, 2, 4, 8),
    fig10_trials=500,
    fig2_group_sizes=(2, 4, 8, 16, 32, 64, 128, 256),
    fig2_prompts=20_000,
    rounds_pass_rates=_grid(0.02, 0.98, 49),
    rounds_trials=200,
    rounds_steps=10,
    confidences=(0.4, 0.5, 0.6, 0.65, 0.7, 0.75, 0.8, 0.9, 0.95),
)
QUICK = Plan(
    fig10_pass_rates=(0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95),
    fig10_caps=(32, 64, 128),
    fig10_quotas=(1, 2, 4),
    fig10_trials=200,
    fig2_group_sizes=(2, 4, 8, 16, 32),
    fig2_prompts=3000,
    rounds_pass_rates=_grid(0.02, 0.98, 13),
    rounds_trials=20,
    rounds_steps=3,
    confidences=(0.6, 0.8, 0.95),
)


# ---- Driving a sampler ---------------------------------------------------------------------------------------------


def mixed_flags(selection: Selection, threshold: float) -> list[bool]:
    """Whether each prompt's kept group holds both outcomes (a non-zero GRPO gradient), as `simulate()` counts it."""
    flags = []
    for pool, result in zip(selection.pools, selection.prompts):
        positives, negatives = rules.count_outcomes([pool[i] for i in result.kept], threshold)
        flags.append(positives > 0 and negatives > 0)
    return flags


def _mean_and_se(values: Sequence[float]) -> tuple[float, float]:
    mean, std = rules.mean_and_std(values)
    return mean, std / math.sqrt(len(values))


# ---- 1. Figure 10: samples until K positives (and K negatives) -----------------------------------------------------


def exit_probability(draws: int, p: float, positives_needed: int, negatives_needed: int) -> float:
    """P(at least `positives_needed` positives and `negatives_needed` negatives among `draws` Bernoulli(p) draws)."""
    return math.fsum(
        math.comb(draws, x) * p**x * (1.0 - p) ** (draws - x)
        for x in range(positives_needed, draws - negatives_needed + 1)
    )


def exact_sequential_cost(
    p: float, positive_quota: int, negative_quota: int, round_size: int, max_rounds: int
) -> tuple[float, float, float]:
    """Exact (mean, sd) of the completions a `fixed`-policy sequential sampler draws for a prompt of pass rate p, and
    its mean rounds. The exit rule is checked after every round of `round_size`, so with T the rounds used, P(T >= r +
    1) = 1 - P(quotas met within r * round_size draws) and samples = round_size * T. (Exact as long as the update group
    never binds the exit, i.e. num_generations <= max(quotas, round_size); see `fig10_group_size`.)"""
    survival = [1.0] + [
        1.0 - exit_probability(r * round_size, p, positive_quota, negative_quota) for r in range(1, max_rounds)
    ]
    mean_rounds = math.fsum(survival)
    second_moment = math.fsum((2 * r - 1) * s for r, s in enumerate(survival, start=1))
    variance = max(second_moment - mean_rounds**2, 0.0)
    return round_size * mean_rounds, round_size * math.sqrt(variance), mean_rounds


def fig10_group_size(sampler: str, quota: int) -> int:
    """The update group n: the largest even size the exit rule already guarantees, so n never delays an exit and the
    curves show the stopping rule alone (seq_pos: K rounded up to even, at least 2; seq_balance: 2K)."""
    return 2 * quota if sampler == "seq_balance" else max(2, quota + quota % 2)


def run_fig10(plan: Plan, seed: int) -> list[dict]:
    rows = []
    for sampler in ("seq_pos", "seq_balance"):
        for cap in plan.fig10_caps:
            round_size, max_rounds = cap // 8, 8
            for quota in plan.fig10_quotas:
                negative_quota = quota if sampler == "seq_balance" else 0
                if quota + negative_quota > cap:
                    continue
                n = fig10_group_size(sampler, quota)
                assert n <= max(quota + negative_quota, round_size), "the update group would delay exits"
                settings = SamplerSettings(
                    scale_rewards="none",
                    sampler=sampler,
                    num_generations=n,
                    round_size=round_size,
                    max_rounds=max_rounds,
                    positive_quota=quota,
                    negative_quota=negative_quota if sampler == "seq_balance" else None,
                    seed=seed,
                )
                start = time.perf_counter()
                results = simulate(settings, plan.fig10_pass_rates, trials=plan.fig10_trials, seed=seed)
                logger.info(
                    "fig10 %-11s cap=%3d K=%d n=%2d: %.1fs", sampler, cap, quota, n, time.perf_counter() - start
                )
                for result in results:
                    mean, sd, rounds = exact_sequential_cost(
                        result.pass_rate, quota, negative_quota, round_size, max_rounds
                    )
                    rows.append(dict(
                        sampler=sampler, cap=cap, quota=quota, num_generations=n, round_size=round_size,
                        pass_rate=result.pass_rate, mean_samples=result.mean_samples, mean_rounds=result.mean_rounds,
                        mixed_share=result.mixed_share, max_samples=result.max_samples, trials=result.trials,
                        exact_mean_samples=mean, exact_sd_samples=sd, exact_mean_rounds=rounds,
                    ))  # fmt: skip
    return rows


def plot_fig10(rows: list[dict], path: Path) -> None:
    caps = sorted({r["cap"] for r in rows})
    quotas = sorted({r["quota"] for r in rows})
    figure, canvas = _figure((4.6 * len(caps), 8.0))
    axes = figure.subplots(2, len(caps), squeeze=False, sharex=True)
    colors = dict(zip(quotas, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")))
    titles = {"seq_pos": "seq_pos: stop at K positives", "seq_balance": "seq_balance: stop at K pos. and K neg."}
    for row_index, sampler in enumerate(("seq_pos", "seq_balance")):
        for col_index, cap in enumerate(caps):
            ax = axes[row_index][col_index]
            for quota in quotas:
                points = [r for r in rows if r["sampler"] == sampler and r["cap"] == cap and r["quota"] == quota]
                if not points:
                    continue
                p = [r["pass_rate"] for r in points]
                ax.plot(p, [r["exact_mean_samples"] for r in points], color=colors[quota], lw=1.5, label=f"K={quota}")
                ax.plot(p, [r["mean_samples"] for r in points], "o", color=colors[quota], ms=2.5)
            ax.axhline(cap, color="grey", ls=":", lw=1)
            ax.set_ylim(0, cap * 1.05)
            ax.set_title(f"{titles[sampler]}\n$N_{{max}}$={cap}, {cap // 8} per round x 8 rounds", fontsize=10)
            ax.grid(alpha=0.3)
            if row_index == 1:
                ax.set_xlabel("pass rate p")
            if col_index == 0:
                ax.set_ylabel("expected completions per prompt")
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9, title="quota K")
    trials = rows[0]["trials"]
    figure.suptitle(
        f"Sampling cost of Reinforce-Ada-Seq (paper Figure 10): lines exact expectation, dots simulate() "
        f"({trials} prompts per p); dotted: the cap $N_{{max}}$"
    )
    figure.tight_layout(rect=(0, 0.07, 1, 1))
    canvas.print_png(str(path))


# ---- 2. Figure 2: all-correct / all-wrong groups against the group size --------------------------------------------


def population_weights() -> list[float]:
    total = sum(count for count, _, _ in PAPER_POPULATION)
    return [count / total for count, _, _ in PAPER_POPULATION]


def sample_population(count: int, seed: int) -> list[float]:
    """`count` i.i.d. pass rates: a band by its weight, then p uniform in (low, high] (exactly 0 for the p=0 band)."""
    rng = random.Random(seed)
    bands = rng.choices(PAPER_POPULATION, weights=population_weights(), k=count)
    return [low + (high - low) * (1.0 - rng.random()) for _, low, high in bands]


def _uniform_moment(k: int, low: float, high: float, flip: bool) -> float:
    """E[p^k] (or E[(1-p)^k] with `flip`) for p uniform on [low, high] (a point mass when low == high)."""
    if flip:
        low, high = 1.0 - high, 1.0 - low
    if high == low:
        return low**k
    return (high ** (k + 1) - low ** (k + 1)) / ((k + 1) * (high - low))


def closed_form_unmixed(k: int) -> tuple[float, float]:
    """(E[p^k], E[(1-p)^k]) over the population: the shares of all-correct and all-wrong groups of size k."""
    weights = population_weights()
    correct = math.fsum(w * _uniform_moment(k, lo, hi, False) for w, (_, lo, hi) in zip(weights, PAPER_POPULATION))
    wrong = math.fsum(w * _uniform_moment(k, lo, hi, True) for w, (_, lo, hi) in zip(weights, PAPER_POPULATION))
    return correct, wrong


def run_fig2(plan: Plan, seed: int) -> list[dict]:
    population = sample_population(plan.fig2_prompts, seed)
    count = len(population)
    rows = []
    for k in plan.fig2_group_sizes:
        start = time.perf_counter()
        sampler = build_sampler(SamplerSettings(scale_rewards="none", sampler="uniform", num_generations=k, seed=seed))
        selection = run_population(sampler, population, seed=seed + k)
        all_correct = sum(all(r > 0.5 for r in pool) for pool in selection.pools) / count
        all_wrong = sum(all(r <= 0.5 for r in pool) for pool in selection.pools) / count
        correct, wrong = closed_form_unmixed(k)
        logger.info("fig2 k=%3d: %.1fs", k, time.perf_counter() - start)
        rows.append(dict(
            group_size=k, prompts=count, all_correct_mc=all_correct, all_wrong_mc=all_wrong,
            all_correct_exact=correct, all_wrong_exact=wrong,
            all_correct_se=math.sqrt(correct * (1.0 - correct) / count),
            all_wrong_se=math.sqrt(wrong * (1.0 - wrong) / count),
            mixed_share_mc=1.0 - all_correct - all_wrong,
        ))  # fmt: skip
    return rows


def plot_fig2(rows: list[dict], path: Path) -> None:
    largest = max(r["group_size"] for r in rows)
    ks = list(range(1, largest + 1))
    exact = [closed_form_unmixed(k) for k in ks]
    curves = (
        ("all-correct", "tab:green", [c for c, _ in exact], "all_correct_mc"),
        ("all-wrong", "tab:red", [w for _, w in exact], "all_wrong_mc"),
        ("either (zero gradient)", "tab:blue", [c + w for c, w in exact], None),
    )
    figure, canvas = _figure((11.0, 4.4))
    left, right = figure.subplots(1, 2)
    mc_k = [r["group_size"] for r in rows]
    for ax, log_y in ((left, False), (right, True)):
        for label, color, line, column in curves:
            ax.plot(ks, line, color=color, lw=1.5, label=f"{label}: closed form")
            dots = [r[column] for r in rows] if column else [r["all_correct_mc"] + r["all_wrong_mc"] for r in rows]
            if log_y:
                mc_k_plot, dots = zip(*[(k, d) for k, d in zip(mc_k, dots) if d > 0]) if any(dots) else ((), ())
            else:
                mc_k_plot = mc_k
            ax.plot(mc_k_plot, dots, "o", color=color, ms=4, label=f"{label}: uniform sampler")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("group size k (completions per prompt)")
        ax.grid(alpha=0.3, which="both")
        if log_y:
            ax.set_yscale("log")
            ax.set_ylabel("share of prompts (log scale)")
        else:
            ax.set_ylim(0, 1)
            ax.set_ylabel("share of prompts")
    left.legend(fontsize=7, loc="center right")
    shares = ", ".join(
        f"{w:.1%} {'p=0' if lo == hi else f'p~U({lo:g},{hi:g}]'}"
        for w, (_, lo, hi) in zip(population_weights(), PAPER_POPULATION)
    )
    figure.suptitle(
        f"Groups with no learning signal against group size (paper Figure 2)\npopulation: {shares}; "
        f"{rows[0]['prompts']} prompts",
        fontsize=10,
    )
    figure.tight_layout()
    canvas.print_png(str(path))


# ---- 3. Round policies ---------------------------------------------------------------------------------------------

ROUNDS_SETTINGS = SamplerSettings(
    scale_rewards="none",
    seed=0,
    sampler="seq_balance",
    num_generations=4,
    round_size=8,
    max_rounds=4,
    positive_quota=2,
    negative_quota=2,
)
"""The authors' setting: update group 4, quotas 2/2, rounds of 8, at most 4 rounds (cap 32)."""

GOAL_ROUNDS, GOAL_SAMPLES = 0.75, 1.10
MIXED_NOISE_SE = 3.0
"""'Same mixed share' means within this many standard errors of the difference from the fixed policy's."""


def expected_batch_rounds(rounds_per_prompt: Sequence[int], batch_size: int, max_rounds: int) -> float:
    """E[max rounds over a generation batch of `batch_size` prompts drawn with replacement from the population]: the
    number of synchronous generation calls the batch makes. E[max] = sum_r P(max >= r) = sum_r 1 - F(r - 1)^B."""
    total = len(rounds_per_prompt)
    return math.fsum(
        1.0 - (sum(1 for t in rounds_per_prompt if t < r) / total) ** batch_size for r in range(1, max_rounds + 1)
    )


def policy_point(policy: str, confidence: float | None, selection: Selection, plan: Plan, steps: int) -> dict:
    settings = ROUNDS_SETTINGS
    sizes = [len(pool) for pool in selection.pools]
    rounds = list(selection.rounds_per_prompt)
    mixed = mixed_flags(selection, settings.positive_threshold)
    samples, samples_se = _mean_and_se(sizes)
    mean_rounds, rounds_se = _mean_and_se(rounds)
    row = dict(
        policy=policy, confidence="" if confidence is None else confidence, steps=steps, prompts=len(sizes),
        mean_samples=samples, samples_se=samples_se, mean_rounds=mean_rounds, rounds_se=rounds_se,
        mixed_share=sum(mixed) / len(mixed), max_samples=max(sizes),
    )  # fmt: skip
    for batch_size in plan.batch_sizes:
        row[f"batch_rounds_b{batch_size}"] = expected_batch_rounds(rounds, batch_size, settings.max_rounds)
    for r in range(1, settings.max_rounds + 1):
        row[f"active_round_{r}"] = sum(1 for t in rounds if t >= r) / len(rounds)
    return row


def oracle_sampler(settings: SamplerSettings, population: Sequence[float]) -> Sampler:
    """The `tracked` policy with its tracker pre-loaded with ORACLE_PSEUDO_COUNT observations at each prompt's true
    pass rate (pass_rate_decay=1): every request, the first included, is sized from (essentially) the true p."""
    sampler = build_sampler(replace(settings, round_policy="tracked", pass_rate_decay=1.0))
    counts = {str(i): [ORACLE_PSEUDO_COUNT, ORACLE_PSEUDO_COUNT * p] for i, p in enumerate(population)}
    sampler.estimator.load_state_dict({"counts": counts})
    return sampler


def run_rounds(plan: Plan, seed: int) -> list[dict]:
    population = [p for p in plan.rounds_pass_rates for _ in range(plan.rounds_trials)]
    runs: list[tuple[str, float | None, Callable[[], Sampler], int]] = [
        ("fixed", None, lambda: build_sampler(replace(ROUNDS_SETTINGS, seed=seed)), plan.rounds_steps)
    ]
    for policy in ("predictive", "tracked", "oracle"):
        for c in plan.confidences:
            if policy == "oracle":
                settings = replace(ROUNDS_SETTINGS, round_confidence=c, seed=seed)
                runs.append((policy, c, lambda s=settings: oracle_sampler(s, population), 1))
            else:
                settings = replace(ROUNDS_SETTINGS, round_policy=policy, round_confidence=c, seed=seed)
                runs.append((policy, c, lambda s=settings: build_sampler(s), plan.rounds_steps))
    rows = []
    for policy, confidence, make, steps in runs:
        start = time.perf_counter()
        selection = run_population(make(), population, seed=seed, steps=steps)
        rows.append(policy_point(policy, confidence, selection, plan, steps))
        logger.info(
            "rounds %-10s c=%-4s: samples %.2f rounds %.3f (%.1fs)",
            policy,
            confidence,
            rows[-1]["mean_samples"],
            rows[-1]["mean_rounds"],
            time.perf_counter() - start,
        )
    fixed = rows[0]
    for row in rows:
        row["samples_ratio_vs_fixed"] = row["mean_samples"] / fixed["mean_samples"]
        row["rounds_ratio_vs_fixed"] = row["mean_rounds"] / fixed["mean_rounds"]
        both = row["mixed_share"] * (1 - row["mixed_share"]) + fixed["mixed_share"] * (1 - fixed["mixed_share"])
        row["mixed_diff_se"] = math.sqrt(both / row["prompts"])
        row["mixed_within_noise"] = (
            abs(row["mixed_share"] - fixed["mixed_share"]) <= MIXED_NOISE_SE * row["mixed_diff_se"] + 1e-12
        )
        batch_column = f"batch_rounds_b{max(plan.batch_sizes)}"
        row["batch_rounds_ratio_vs_fixed"] = row[batch_column] / fixed[batch_column]
        candidate = (
            row["policy"] != "fixed" and row["samples_ratio_vs_fixed"] <= GOAL_SAMPLES and row["mixed_within_noise"]
        )
        row["goal_met"] = candidate and row["rounds_ratio_vs_fixed"] <= GOAL_ROUNDS
        row["goal_met_batch_rounds"] = candidate and row["batch_rounds_ratio_vs_fixed"] <= GOAL_ROUNDS
    return rows


def best_point(rows: list[dict], policy: str) -> dict | None:
    """Fewest rounds within the samples budget (GOAL_SAMPLES x fixed); the cheapest point when none fits."""
    points = [r for r in rows if r["policy"] == policy]
    if not points:
        return None
    within = [r for r in points if r["samples_ratio_vs_fixed"] <= GOAL_SAMPLES]
    if within:
        return min(within, key=lambda r: (r["mean_rounds"], r["mean_samples"]))
    return min(points, key=lambda r: r["mean_samples"])


POLICY_STYLE = {
    "fixed": ("black", "*"),
    "predictive": ("tab:blue", "o"),
    "tracked": ("tab:orange", "s"),
    "oracle": ("tab:green", "^"),
}


def plot_rounds(rows: list[dict], plan: Plan, path: Path) -> None:
    fixed = rows[0]
    batch_column = f"batch_rounds_b{max(plan.batch_sizes)}"
    figure, canvas = _figure((17.0, 5.4))
    ax_rounds, ax_batch, ax_active = figure.subplots(1, 3)
    x_goal = fixed["mean_samples"] * GOAL_SAMPLES
    x_low = min(r["mean_samples"] for r in rows) * 0.97
    for ax, column, ylabel in (
        (ax_rounds, "mean_rounds", "mean rounds per prompt"),
        (ax_batch, batch_column, f"expected rounds of a batch of {max(plan.batch_sizes)} prompts"),
    ):
        y_goal = fixed[column] * GOAL_ROUNDS
        ax.fill_between(
            [x_low, x_goal],
            0,
            y_goal,
            color="gold",
            alpha=0.25,
            label=f"goal: <={GOAL_SAMPLES:g}x samples, <={GOAL_ROUNDS:g}x rounds",
        )
        for policy, (color, marker) in POLICY_STYLE.items():
            points = sorted((r for r in rows if r["policy"] == policy), key=lambda r: r["confidence"] or 0.0)
            label = {"oracle": "oracle (first request from true p)", "tracked": f"tracked (step {plan.rounds_steps})"}
            ax.plot(
                [r["mean_samples"] for r in points],
                [r[column] for r in points],
                marker=marker,
                color=color,
                ms=12 if policy == "fixed" else 5,
                lw=1.2,
                label=label.get(policy, policy),
                zorder=3 if policy == "fixed" else 2,
            )
            for r in points:
                if r["confidence"] != "" and (ax is ax_rounds or r[column] < 0.97 * fixed[column]):
                    ax.annotate(
                        f"{r['confidence']:g}",
                        (r["mean_samples"], r[column]),
                        textcoords="offset points",
                        xytext=(4, 2),
                        fontsize=6.5,
                        color=color,
                    )
        ax.set_xlabel("mean completions per prompt")
        ax.set_ylabel(ylabel)
        ax.set_xlim(left=x_low)
        ax.set_ylim(bottom=min(min(r[column] for r in rows), y_goal) * 0.9, top=fixed[column] * 1.08)
        ax.grid(alpha=0.3)
    ax_rounds.legend(fontsize=8)
    ax_rounds.set_title("samples vs rounds per prompt (labels: round_confidence)", fontsize=10)
    ax_batch.set_title("what wall time follows: synchronous rounds of the whole batch", fontsize=10)

    chosen = [("fixed", fixed)] + [
        (policy, best_point(rows, policy))
        for policy in ("predictive", "tracked", "oracle")
        if best_point(rows, policy)
    ]
    rounds_axis = list(range(1, ROUNDS_SETTINGS.max_rounds + 1))
    width = 0.8 / len(chosen)
    for i, (policy, row) in enumerate(chosen):
        color, _ = POLICY_STYLE[policy]
        label = policy if row["confidence"] == "" else f"{policy} c={row['confidence']:g}"
        ax_active.bar(
            [r + (i - (len(chosen) - 1) / 2) * width for r in rounds_axis],
            [row[f"active_round_{r}"] for r in rounds_axis],
            width=width,
            color=color,
            label=label,
        )
    ax_active.set_xticks(rounds_axis)
    ax_active.set_xlabel("round r")
    ax_active.set_ylabel("share of prompts still active in round r")
    ax_active.set_title(f"active prompts per round (fewest rounds within {GOAL_SAMPLES:g}x samples)", fontsize=10)
    ax_active.legend(fontsize=8)
    ax_active.grid(alpha=0.3, axis="y")
    lo, hi = plan.rounds_pass_rates[0], plan.rounds_pass_rates[-1]
    figure.suptitle(
        f"Round policies, seq_balance n=4, quotas 2/2, rounds of 8, max 4 rounds (cap 32); "
        f"{len(plan.rounds_pass_rates)} pass rates in [{lo:g}, {hi:g}] x {plan.rounds_trials} prompts; "
        f"last of {plan.rounds_steps} steps",
        fontsize=11,
    )
    figure.tight_layout()
    canvas.print_png(str(path))


# ---- Output --------------------------------------------------------------------------------------------------------


def _figure(size: tuple[float, float]):
    """A figure on the Agg canvas (no pyplot, no global backend state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=size, dpi=110)
    return figure, FigureCanvasAgg(figure)


def write_csv(rows: list[dict], path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: f"{v:.6g}" if isinstance(v, float) else v for k, v in row.items()})


def _goal_line(rows: list[dict], column: str, what: str) -> str:
    met = [r for r in rows if r[column]]
    goal = f"Goal on {what} (<= {GOAL_ROUNDS}x, with <= {GOAL_SAMPLES}x samples and the same mixed share)"
    if not met:
        return f"{goal}: NOT met by any point"
    ratio = "rounds_ratio_vs_fixed" if column == "goal_met" else "batch_rounds_ratio_vs_fixed"
    names = ", ".join(
        f"{r['policy']} c={r['confidence']:g} ({r['samples_ratio_vs_fixed']:.2f}x/{r[ratio]:.2f}x)" for r in met
    )
    return f"{goal}: met by {names}"


def summary(fig10: list[dict], fig2: list[dict], rounds: list[dict], plan: Plan) -> str:
    batch = max(plan.batch_sizes)
    lines = [
        f"Round policies (seq_balance n=4, quotas 2/2, rounds of 8, max 4; last of {plan.rounds_steps} steps; "
        f"{rounds[0]['prompts']} prompts). rounds: mean per prompt; batch: E[rounds of a {batch}-prompt batch]",
        f"{'policy':<11}{'conf':>5}{'samples':>9}{'rounds':>8}{'batch':>7}{'x samp':>8}{'x rnds':>8}{'x batch':>8}"
        f"{'mixed':>7}  goal(rounds/batch)",
    ]
    chosen = [rounds[0]] + [best_point(rounds, p) for p in ("predictive", "tracked", "oracle")]
    for row in (r for r in chosen if r is not None):
        conf = "" if row["confidence"] == "" else f"{row['confidence']:g}"
        lines.append(
            f"{row['policy']:<11}{conf:>5}{row['mean_samples']:>9.2f}{row['mean_rounds']:>8.3f}"
            f"{row[f'batch_rounds_b{batch}']:>7.2f}{row['samples_ratio_vs_fixed']:>8.3f}"
            f"{row['rounds_ratio_vs_fixed']:>8.3f}{row['batch_rounds_ratio_vs_fixed']:>8.3f}{row['mixed_share']:>7.3f}"
            f"  {'yes' if row['goal_met'] else 'no'}/{'yes' if row['goal_met_batch_rounds'] else 'no'}"
        )
    lines.append("(best = fewest mean rounds within the samples budget; the oracle is a reference, not a policy)")
    policies = [r for r in rounds if r["policy"] != "oracle"]
    lines.append(_goal_line(policies, "goal_met", "mean rounds per prompt"))
    lines.append(_goal_line(policies, "goal_met_batch_rounds", f"rounds per {batch}-prompt batch"))
    gaps = [
        (abs(r["mean_samples"] - r["exact_mean_samples"]), r["exact_sd_samples"] / math.sqrt(r["trials"]))
        for r in fig10
    ]
    worst = max(gaps)
    lines.append(
        f"Figure 10: {len(fig10)} points; largest |simulate - exact| = {worst[0]:.3f} completions "
        f"({worst[0] / max(worst[1], 1e-12):.1f} standard errors)"
    )
    worst2 = max(
        abs(r[f"{side}_mc"] - r[f"{side}_exact"]) / max(r[f"{side}_se"], 1e-12)
        for r in fig2
        for side in ("all_correct", "all_wrong")
    )
    first, last = fig2[0], fig2[-1]
    lines.append(
        f"Figure 2: all-wrong {first['all_wrong_exact']:.3f} at k={first['group_size']} -> "
        f"{last['all_wrong_exact']:.3f} at k={last['group_size']}; all-correct {first['all_correct_exact']:.4f} -> "
        f"{last['all_correct_exact']:.2e}; largest |MC - closed form| = {worst2:.1f} standard errors"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="Output folder for the PNGs and CSVs.")
    parser.add_argument("--quick", action="store_true", help="Small grids and few trials (a smoke test, < 20 s).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fig10-trials", type=int, default=None, help="Prompts per pass rate for Figure 10.")
    parser.add_argument("--fig2-prompts", type=int, default=None, help="Prompts sampled for Figure 2.")
    parser.add_argument(
        "--rounds-trials", type=int, default=None, help="Prompts per pass rate for the round policies."
    )
    parser.add_argument("--rounds-steps", type=int, default=None, help="Steps over the same prompts (last reported).")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)

    plan = QUICK if args.quick else FULL
    overrides = dict(
        fig10_trials=args.fig10_trials,
        fig2_prompts=args.fig2_prompts,
        rounds_trials=args.rounds_trials,
        rounds_steps=args.rounds_steps,
    )
    plan = replace(plan, **{k: v for k, v in overrides.items() if v is not None})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()

    fig10 = run_fig10(plan, args.seed)
    write_csv(fig10, out / f"{FIG10_FILE}.csv")
    plot_fig10(fig10, out / f"{FIG10_FILE}.png")

    fig2 = run_fig2(plan, args.seed)
    write_csv(fig2, out / f"{FIG2_FILE}.csv")
    plot_fig2(fig2, out / f"{FIG2_FILE}.png")

    rounds = run_rounds(plan, args.seed)
    write_csv(rounds, out / f"{ROUNDS_FILE}.csv")
    plot_rounds(rounds, plan, out / f"{ROUNDS_FILE}.png")

    logger.info("wrote %s in %.1fs", out, time.perf_counter() - start)
    print(summary(fig10, fig2, rounds, plan))
    return 0


if __name__ == "__main__":
    sys.exit(main())
