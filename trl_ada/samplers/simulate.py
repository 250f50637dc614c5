"""Run a sampler against Bernoulli pass rates, with no model: the cost and signal of a sampling rule in microseconds."""

from __future__ import annotations

import heapq
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from . import rules
from .base import Sampler, Selection, build_sampler
from .settings import SamplerSettings


@dataclass(frozen=True)
class SimulationResult:
    """Averages over `trials` prompts that share one pass rate."""

    pass_rate: float
    mean_samples: float
    """Completions drawn per prompt."""
    mean_rounds: float
    """Rounds in which a prompt received completions."""
    mixed_share: float
    """Share of prompts whose kept group holds both outcomes (a non-zero GRPO gradient)."""
    max_samples: int
    trials: int

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


GENERATION_SCHEDULES = ("rounds", "continuous")
ARRIVALS = ("in_order", "length_correlated")
RIGHT_MEAN_LENGTH, WRONG_MEAN_LENGTH = 1.0, 4.0
"""`arrival="length_correlated"`: a completion's generation time is exponential with this mean, right ones short."""


def run_population(
    sampler: Sampler,
    population: Sequence[float],
    seed: int,
    steps: int = 1,
    schedule: str = "rounds",
    arrival: str = "in_order",
    common_draws: bool = False,
) -> Selection:
    """Run `steps` generation batches of `sampler` over one prompt per entry of `population` (its pass rate; its key is
    its index) and return the last batch's `Selection`. `schedule="continuous"` returns each draw after its generation
    time: `arrival="in_order"` in submission order, `"length_correlated"` right completions first. `common_draws=True`
    (rounds): each prompt draws from a stream of its own, so two settings see the same draws for each prompt."""
    _check_run(schedule, arrival, steps=steps)
    draws = random.Random(seed)
    keys = list(range(len(population)))
    streams = [random.Random(f"{seed}/{index}") for index in keys] if common_draws else None
    selection = None
    for _ in range(steps):
        if schedule == "continuous":
            selection = _continuous_batch(sampler, population, keys, draws, arrival)
            continue
        step = sampler.begin(len(population), keys)
        while requests := step.requests():
            rewards = []
            for index, count in requests:
                p, source = population[index], draws if streams is None else streams[index]
                rewards.extend(1.0 if source.random() < p else 0.0 for _ in range(count))
            step.observe(requests, rewards)
        selection = step.finish()
    assert selection is not None
    return selection


def _continuous_batch(
    sampler: Sampler, population: Sequence[float], keys: list[int], draws: random.Random, arrival: str
) -> Selection:
    """One round-free generation batch: each prompt's rewards come from its own stream, in submission order."""
    streams = [random.Random(draws.getrandbits(64)) for _ in population]
    # Generation times come from a stream of their own: the arrival model never changes what is drawn.
    timing = random.Random(draws.getrandbits(64))
    step = sampler.begin_continuous(len(population), keys)
    queue: list[tuple[float, int, int, int, float]] = []  # (finish time, sequence, prompt, draw, reward)
    clock, sequence = 0.0, 0

    def submit() -> None:
        nonlocal sequence
        for prompt, draw in step.to_submit():
            right = streams[prompt].random() < population[prompt]
            if arrival == "in_order":
                finish = float(sequence)
            else:
                finish = clock + timing.expovariate(1.0 / (RIGHT_MEAN_LENGTH if right else WRONG_MEAN_LENGTH))
            heapq.heappush(queue, (finish, sequence, prompt, draw, 1.0 if right else 0.0))
            sequence += 1

    submit()
    while queue:
        clock, _, prompt, draw, reward = heapq.heappop(queue)
        step.complete(prompt, draw, reward)
        submit()
    return step.finish()


def _check_run(schedule: str, arrival: str, trials: int = 1, steps: int = 1) -> None:
    if trials < 1:
        raise ValueError(f"trials must be at least 1, got {trials}")
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    for name, value, choices in (("schedule", schedule, GENERATION_SCHEDULES), ("arrival", arrival, ARRIVALS)):
        if value not in choices:
            raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}.")


def simulate(
    settings: SamplerSettings,
    pass_rates: Sequence[float],
    trials: int,
    seed: int = 0,
    steps: int = 1,
    schedule: str = "rounds",
    arrival: str = "in_order",
) -> list[SimulationResult]:
    """Run `steps` generation batches (one batch: the whole population) over `trials` prompts per pass rate, each
    completion positive (reward 1) with its prompt's pass rate, and report the last batch per pass rate. With
    `steps > 1` the same prompts come back, so trackers learn them. Deterministic for a `seed`; `schedule` and
    `arrival`: see `run_population`."""
    _check_run(schedule, arrival, trials, steps)
    if schedule == "continuous" and not settings.has_exit_rule:
        raise ValueError(
            f"the continuous schedule runs sampler='seq_pos' or 'seq_balance', got {settings.sampler!r}: pick one of "
            "those, or simulate the rounds schedule (schedule='rounds', `--generation-schedule rounds`)."
        )
    for p in pass_rates:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"every pass rate must lie in [0, 1], got {p}")
    sampler = build_sampler(settings)
    population = [p for p in pass_rates for _ in range(trials)]
    selection = run_population(sampler, population, seed=seed, steps=steps, schedule=schedule, arrival=arrival)

    threshold = sampler.settings.positive_threshold
    results = []
    for offset, p in zip(range(0, len(population), trials), pass_rates, strict=True):
        block = range(offset, offset + trials)
        mixed = sum(_kept_group_is_mixed(selection, index, threshold) for index in block)
        sizes = [len(selection.pools[index]) for index in block]
        results.append(
            SimulationResult(
                pass_rate=p,
                mean_samples=sum(sizes) / trials,
                mean_rounds=sum(selection.rounds_per_prompt[index] for index in block) / trials,
                mixed_share=mixed / trials,
                max_samples=max(sizes),
                trials=trials,
            )
        )
    return results


def _kept_group_is_mixed(selection: Selection, index: int, threshold: float) -> bool:
    """Whether prompt `index`'s kept group holds both outcomes (a non-zero GRPO gradient)."""
    pool, result = selection.pools[index], selection.prompts[index]
    positives, negatives = rules.count_outcomes(result.kept_rewards(pool), threshold)
    return positives > 0 and negatives > 0


# Planning on a file of pass rates (`trl-ada simulate --pass-rates-from FILE`).

PASS_RATE_COLUMN = "pass_rate"
"""The column `trl-ada prepare-data` writes (correct samples / samples per prompt) and planning reads."""
REFERENCE_GENERATIONS = 16
"""The reference a plan matches: GRPO (`sampler="uniform"`) with `num_generations=16`."""
MAX_MATCH_COMPLETIONS = 256
"""The budget search stops at settings whose cap exceeds this many completions per prompt (16x the reference's)."""


def read_pass_rates(path: str | Path) -> list[float]:
    """The `pass_rate` column of a `.jsonl`/`.json` (JSON lines) or `.parquet` file, as `trl-ada prepare-data` writes
    it. Raises `ValueError` naming the fix for a missing file, another format, no such column, no rows, and a value
    that is not a number in [0, 1] (NaN and null included: prompts prepare-data could not score)."""
    path = Path(path)
    advice = (
        f"give a .jsonl or .parquet file with a {PASS_RATE_COLUMN!r} column, as `trl-ada prepare-data "
        "--pass_rate_band ... --output FILE` writes (its difficulty stage adds the column)"
    )
    if not path.is_file():
        raise ValueError(f"--pass-rates-from {str(path)!r}: no such file; {advice}.")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        values, columns = _read_parquet_column(path)
    elif suffix in (".jsonl", ".json"):
        values, columns = _read_json_lines_column(path, advice)
    else:
        raise ValueError(f"--pass-rates-from {str(path)!r}: unknown format {path.suffix!r}; {advice}.")
    if values is None:
        found = ", ".join(map(repr, columns)) or "none"
        raise ValueError(
            f"--pass-rates-from {str(path)!r} has no {PASS_RATE_COLUMN!r} column (columns: {found}); {advice}."
        )
    if not values:
        raise ValueError(f"--pass-rates-from {str(path)!r} holds no prompts; {advice}.")
    bad = [
        (row, value)
        for row, value in enumerate(values, start=1)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0
    ]
    if bad:
        row, value = bad[0]
        raise ValueError(
            f"--pass-rates-from {str(path)!r}: {len(bad)} of {len(values)} rows have a {PASS_RATE_COLUMN!r} that is "
            f"not a number in [0, 1] (row {row}: {value!r}; null or NaN is a prompt that could not be scored). Drop "
            "those rows, or score them again."
        )
    return [float(value) for value in values]


def _read_parquet_column(path: Path) -> tuple[list | None, list[str]]:
    # pyarrow comes with `datasets` (a dependency) and reads one column without loading `datasets` or caching a copy.
    import pyarrow.parquet as parquet

    try:
        columns = parquet.read_schema(path).names
        if PASS_RATE_COLUMN not in columns:
            return None, columns
        return parquet.read_table(path, columns=[PASS_RATE_COLUMN]).column(0).to_pylist(), columns
    except (OSError, ValueError) as error:  # pyarrow's ArrowInvalid is a ValueError
        raise ValueError(f"--pass-rates-from {str(path)!r} is not a readable parquet file ({error}).") from None


def _read_json_lines_column(path: Path, advice: str) -> tuple[list | None, list[str]]:
    values: list = []
    columns: dict[str, None] = {}
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"--pass-rates-from {str(path)!r}, line {number}: not JSON ({error}); {advice} (one JSON object "
                    "per line)."
                ) from None
            if not isinstance(row, dict):
                raise ValueError(f"--pass-rates-from {str(path)!r}, line {number}: not a JSON object; {advice}.")
            columns.update(dict.fromkeys(row))
            values.append(row.get(PASS_RATE_COLUMN, _MISSING))
    if values and all(value is _MISSING for value in values):
        return None, list(columns)
    if any(value is _MISSING for value in values):
        missing = next(row for row, value in enumerate(values, start=1) if value is _MISSING)
        raise ValueError(
            f"--pass-rates-from {str(path)!r}: line {missing} (a row of {len(values)}) has no {PASS_RATE_COLUMN!r}; "
            "every row needs one: drop those rows, or score them with trl-ada prepare-data."
        )
    return values, list(columns)


_MISSING = object()


def budget_knob(settings: SamplerSettings) -> str:
    """The integer knob that scales a sampler's budget in a plan: `max_rounds` if read, else `num_generations`."""
    return "max_rounds" if settings.reads("max_rounds") else "num_generations"


def simulated_population(pass_rates: Sequence[float], trials: int) -> list[float]:
    """The simulated prompts of a plan: every pass rate of the file `ceil(trials / len(pass_rates))` times, or, for a
    file of more than `trials` prompts, `trials` prompts at evenly spaced quantiles of its pass rates."""
    count = len(pass_rates)
    if count <= trials:
        copies = -(-trials // count)
        return [p for p in pass_rates for _ in range(copies)]
    ordered = sorted(pass_rates)
    return [ordered[(2 * i + 1) * count // (2 * trials)] for i in range(trials)]


@dataclass(frozen=True)
class Measurement:
    """One setting run over a plan's population."""

    completions_per_prompt: float
    mixed_share: float
    """Share of prompts whose kept (update) group holds both outcomes."""


def measure(settings: SamplerSettings, population: Sequence[float], run: Mapping[str, Any]) -> Measurement:
    """Run `settings` over `population` (`run`: `run_population`'s keywords, with common draws) and average."""
    sampler = build_sampler(settings)
    selection = run_population(sampler, population, **run, common_draws=True)
    threshold = sampler.settings.positive_threshold
    mixed = sum(_kept_group_is_mixed(selection, index, threshold) for index in range(len(population)))
    drawn = sum(len(pool) for pool in selection.pools)
    return Measurement(completions_per_prompt=drawn / len(population), mixed_share=mixed / len(population))


@dataclass(frozen=True)
class SamplerPlan:
    """What one sampler costs and yields on a file's pass rates, and the budget it needs to match GRPO n=16."""

    sampler: str
    completions_per_prompt: float
    mixed_share: float
    completions_per_mixed_prompt: float | None
    """`completions_per_prompt / mixed_share`: the cost of one group with a signal (`None` when none has one)."""
    budget_knob: str
    budget_value: int | None
    """The smallest value of `budget_knob` whose mixed share reaches the reference's (`None`: not reached)."""
    budget_completions_per_prompt: float | None
    """Completions per prompt at `budget_value`."""
    budget_note: str
    """Why the reference's share was not reached (empty when it was)."""
    reference_mixed_share: float
    prompts: int
    simulated_prompts: int

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def plan(
    settings_list: Sequence[SamplerSettings],
    pass_rates: Sequence[float],
    trials: int,
    *,
    reference: SamplerSettings | None = None,
    seed: int = 0,
    steps: int = 1,
    schedule: str = "rounds",
    arrival: str = "in_order",
) -> list[SamplerPlan]:
    """Plan on a file's pass rates: each settings' completions per prompt and mixed share over `simulated_population`,
    and the smallest `budget_knob` value that matches the reference's mixed share (GRPO `num_generations=16` unless
    `reference` is given), found by doubling then bisecting, up to `MAX_MATCH_COMPLETIONS` completions per prompt."""
    _check_run(schedule, arrival, trials, steps)
    if not pass_rates:
        raise ValueError("a plan needs at least one pass rate")
    for settings in settings_list:
        if schedule == "continuous" and not settings.has_exit_rule:
            raise ValueError(
                f"the continuous schedule runs sampler='seq_pos' or 'seq_balance', and sampler={settings.sampler!r} is "
                "compared: name only those with --sampler, or plan the rounds schedule (--generation-schedule rounds)."
            )
        settings.validated()  # every error before any compute
    if reference is None:
        reference = SamplerSettings(sampler="uniform", num_generations=REFERENCE_GENERATIONS)
    population = simulated_population(pass_rates, trials)
    run = dict(seed=seed, steps=steps, schedule=schedule, arrival=arrival)
    # GRPO draws one round: the reference runs the rounds schedule whatever the compared samplers run.
    target = measure(reference, population, {**run, "schedule": "rounds"}).mixed_share
    plans = []
    for settings in settings_list:
        # The search replaces the knob in the settings as given: the resolved ones fix defaults derived from it.
        knob = budget_knob(settings)
        here = measure(settings, population, run)
        found, note = _smallest_budget(settings, knob, population, target, run, {getattr(settings, knob): here})
        plans.append(
            SamplerPlan(
                sampler=settings.sampler,
                completions_per_prompt=here.completions_per_prompt,
                mixed_share=here.mixed_share,
                completions_per_mixed_prompt=(
                    here.completions_per_prompt / here.mixed_share if here.mixed_share > 0 else None
                ),
                budget_knob=knob,
                budget_value=None if found is None else found[0],
                budget_completions_per_prompt=None if found is None else found[1].completions_per_prompt,
                budget_note=note,
                reference_mixed_share=target,
                prompts=len(pass_rates),
                simulated_prompts=len(population),
            )
        )
    return plans


def _smallest_budget(
    settings: SamplerSettings,
    knob: str,
    population: Sequence[float],
    target: float,
    run: dict,
    known: dict[int, Measurement],
) -> tuple[tuple[int, Measurement] | None, str]:
    """`((value, measurement), "")` for the smallest `knob` value reaching `target`, or `(None, why not)`."""
    results: dict[int, Measurement | None] = dict(known)
    rejections: list[str] = []

    def reaches(value: int) -> bool:
        if value not in results:
            try:
                candidate = replace(settings, **{knob: value}).validated()
            except ValueError as error:
                rejections.append(f"{knob}={value}: {error}")
                results[value] = None
            else:
                results[value] = measure(candidate, population, run)
        found = results[value]
        return found is not None and found.mixed_share >= target

    def within_cap(value: int) -> bool:
        try:
            return replace(settings, **{knob: value}).validated().max_pool_size <= MAX_MATCH_COMPLETIONS
        except ValueError:
            return True  # rejected settings are skipped by `reaches`, which says why

    failed, value = 0, 1
    while not reaches(value):
        failed, value = value, 2 * value
        if value > MAX_MATCH_COMPLETIONS or not within_cap(value):
            why = f"not reached within {MAX_MATCH_COMPLETIONS} completions per prompt"
            if len(rejections) == len(results):
                why += f" (every setting tried was rejected; first: {rejections[0]})"
            return None, why
    while value - failed > 1:  # `failed` does not reach the target, `value` does
        middle = (failed + value) // 2
        failed, value = (failed, middle) if reaches(middle) else (middle, value)
    found = results[value]
    assert found is not None
    return (value, found), ""
