"""
The rules of Reinforce-Ada, each in one place, in pure Python. `NaN` marks an unscorable reward (every reward function
returned `None`): neither positive nor negative, never in a mean or a std, and a zero advantage.
"""

from __future__ import annotations

import functools
import math
import random
from collections import Counter
from collections.abc import Collection, Sequence

# Added to the std before dividing, exactly as TRL's GRPOTrainer does, so that `scale_rewards` means the same here.
STD_EPSILON = 1e-4


def is_scorable(reward: float) -> bool:
    return not math.isnan(reward)


def is_positive(reward: float, threshold: float) -> bool:
    """The positive test: a reward strictly above `threshold` (NaN never is; a negative is also `is_scorable`)."""
    return reward > threshold


def count_outcomes(rewards: Sequence[float], threshold: float) -> tuple[int, int]:
    """Return `(positives, negatives)` by [`is_positive`]. NaN counts as neither."""
    scorable = [reward for reward in rewards if is_scorable(reward)]
    positives = sum(is_positive(reward, threshold) for reward in scorable)
    return positives, len(scorable) - positives


def mean_and_std(rewards: Sequence[float]) -> tuple[float, float]:
    """Mean and unbiased std (as `torch.std`) of the scorable rewards; `(nan, 0.0)` when none is scorable."""
    values = [r for r in rewards if not math.isnan(r)]
    if not values:
        return math.nan, 0.0
    mean = math.fsum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    variance = math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(variance)


def has_zero_variance(rewards: Sequence[float], tolerance: float) -> bool:
    """A group teaches nothing when its rewards are (numerically) constant."""
    return mean_and_std(rewards)[1] <= tolerance


def downsample(
    rewards: Sequence[float],
    size: int,
    mode: str,
    threshold: float,
    rng: random.Random,
    excluded: Collection[int] = (),
) -> list[int]:
    """Indices (in draw order) of the `size` completions of a pool that form the update group. `"balanced"` keeps
    `min(size // 2, #positives)` positives and fills the rest with negatives, topping up from the positives when
    negatives run short (an odd `size` gives the extra slot to a negative: positives are the scarce side on hard
    prompts, so needing fewer lets them exit sooner); unscorable completions come last. `"random"` chooses uniformly.
    `excluded` completions (those the loss will mask) are kept only when the others cannot fill the group."""
    if size > len(rewards):
        raise ValueError(f"cannot keep {size} completions from a pool of {len(rewards)}")
    if size == len(rewards):
        return list(range(size))
    excluded = set(excluded)
    if mode == "random":
        candidates = [i for i in range(len(rewards)) if i not in excluded]
        if len(candidates) >= size:
            return sorted(rng.sample(candidates, size))
        return sorted(candidates + rng.sample(sorted(excluded), size - len(candidates)))
    if mode != "balanced":
        raise ValueError(f"unknown downsample mode {mode!r}")
    scorable = [i for i, r in enumerate(rewards) if not math.isnan(r) and i not in excluded]
    positives = [i for i in scorable if is_positive(rewards[i], threshold)]
    negatives = [i for i in scorable if not is_positive(rewards[i], threshold)]
    last_resort = [i for i, r in enumerate(rewards) if math.isnan(r) or i in excluded]
    take_positive = min(size // 2, len(positives))
    take_negative = min(size - take_positive, len(negatives))
    take_positive = min(size - take_negative, len(positives))
    take_last_resort = size - take_positive - take_negative
    kept = (
        rng.sample(positives, take_positive)
        + rng.sample(negatives, take_negative)
        + rng.sample(last_resort, take_last_resort)
    )
    return sorted(kept)


def outcome_shares(
    pool: Sequence[float], group: Sequence[int], threshold: float, excluded: Collection[int] = ()
) -> list[float]:
    """Per draw of `pool`, the share of the draws of its outcome (positive, negative, or neither) that `group` holds.
    The pool's gradient with each advantage scaled by its share is the expectation of the group's over the draws the
    downsampling could have taken, so the outcome mix it chose keeps its weight. The shares sum to `len(group)`."""
    outcomes = [
        -1 if index in excluded or not is_scorable(reward) else int(is_positive(reward, threshold))
        for index, reward in enumerate(pool)
    ]
    drawn = Counter(outcomes)
    kept = Counter(outcomes[index] for index in group)
    return [kept[outcome] / drawn[outcome] for outcome in outcomes]


LOSS_NORMALISERS: dict[str, str] = {
    **dict.fromkeys(("grpo", "sapo", "dr_grpo", "luspo"), "rows"),
    **dict.fromkeys(("bnpo", "dapo", "cispo", "vespo"), "tokens"),
}
"""What each TRL `loss_type` divides its summed loss by: the rows it trains (a per-row mean, or a constant per row), or
their loss tokens."""


def loss_normaliser(loss_type: str) -> str:
    """`"rows"` or `"tokens"` ([`LOSS_NORMALISERS`]); `ValueError` for a loss type trl-ada does not know."""
    if loss_type not in LOSS_NORMALISERS:
        raise ValueError(
            f"train_on='pool' rescales the step by what loss_type divides by, and loss_type={loss_type!r} is not one "
            f"trl-ada knows ({sorted(LOSS_NORMALISERS)}). Use one of them, or train_on='downsample'."
        )
    return LOSS_NORMALISERS[loss_type]


def pool_step_scale(size_total: float, shared_size_total: float) -> float:
    """`train_on="pool"`'s factor on every advantage, `sum c_i / sum share_i c_i` over the update's rows, where `c_i`
    is what the loss counts of row `i` (1, or its tokens) and `share_i` its [`outcome_shares`]. The shared advantages
    make the pool's summed gradient the expectation of the downsampled group's; the loss then divides it by
    `sum c_i`, where the downsampled rule divides by its group's count, whose expectation is `sum share_i c_i`, so
    the factor restores that rule's step (exactly for rows, as a ratio of expectations for tokens)."""
    return size_total / shared_size_total if shared_size_total > 0 else 1.0


def objective_weight(pass_rate: float, objective: str, power_alpha: float, max_weight: float) -> float:
    """Gradient weight `w = f'(p)` of the objective `f`, clipped at `max_weight`: `linear` 1, `log` 1/p, `power`
    alpha * p^(alpha - 1). At `p = 0` the log and power weights are infinite and clip to `max_weight`."""
    if objective == "linear":
        weight = 1.0
    elif objective == "log":
        weight = math.inf if pass_rate <= 0.0 else 1.0 / pass_rate
    elif objective == "power":
        weight = math.inf if pass_rate <= 0.0 else power_alpha * pass_rate ** (power_alpha - 1.0)
    else:
        raise ValueError(f"unknown objective {objective!r}")
    return min(weight, max_weight)


def advantage(reward: float, baseline: float, scale: float | None, weight: float) -> float:
    """`w * (r - b)`, divided by `scale + 1e-4` when reward scaling is on; zero for an unscorable completion."""
    if math.isnan(reward) or math.isnan(baseline):
        return 0.0
    centred = reward - baseline
    if scale is not None:
        centred = centred / (scale + STD_EPSILON)
    return weight * centred


def residual_weight(pass_rate: float, sample_power: float, epsilon: float, max_weight: float) -> float:
    """Reinforce-Ada-Est's explicit weight `(p + eps)^-(1 - s)`, clipped at `max_weight`. With sampling `N ∝ p^-s`, the
    product of sampling and gradient weight is the log objective's `1/p` (up to `eps`)."""
    return min((pass_rate + epsilon) ** -(1.0 - sample_power), max_weight)


def allocate_budget(scores: Sequence[float], total: int, low: int, high: int) -> list[int]:
    """Integers `N_i` in `[low, high]` with `sum(N_i) == total`, proportional to `scores` where the bounds allow: the
    scale `c` with `sum(clip(c * score_i, low, high)) == total` by bisection, then rounding by largest remainder."""
    count = len(scores)
    if count == 0:
        raise ValueError("cannot allocate a budget over no prompts")
    if not count * low <= total <= count * high:
        raise ValueError(f"a total of {total} cannot be split over {count} prompts within [{low}, {high}] each")
    if any(not score > 0.0 or math.isinf(score) for score in scores):
        raise ValueError("allocation scores must be positive and finite")

    def used(scale: float) -> float:
        return math.fsum(min(max(scale * score, low), high) for score in scores)

    lo_scale, hi_scale = 0.0, high / min(scores)  # used(0) = count * low <= total <= count * high = used(hi_scale)
    while hi_scale - lo_scale > 1e-12 * hi_scale:
        mid = (lo_scale + hi_scale) / 2
        if used(mid) < total:
            lo_scale = mid
        else:
            hi_scale = mid
    targets = [min(max(hi_scale * score, low), high) for score in scores]
    budgets = [min(max(math.floor(t), low), high) for t in targets]
    remainder = total - sum(budgets)
    # Hand out (or take back, smallest fractional part first) the rounding remainder, never leaving [low, high].
    order = sorted(range(count), key=lambda i: (-(targets[i] - budgets[i]), i))
    step, bound = (1, high) if remainder > 0 else (-1, low)
    while remainder:
        for i in order if step > 0 else reversed(order):
            if remainder == 0:
                break
            if budgets[i] != bound:
                budgets[i] += step
                remainder -= step
    return budgets


def unmixed_chance(pass_rate: float, draws: int) -> float:
    """Probability that `draws` Bernoulli(`pass_rate`) outcomes all agree (an all-right or all-wrong group)."""
    return pass_rate**draws + (1.0 - pass_rate) ** draws


def skipped_prompts(estimates: Sequence[float], draws: int, threshold: float | None) -> list[bool] | None:
    """Which prompts `skip_unmixed_above` skips: [`unmixed_chance`] above `threshold` (`None`: the skip is off)."""
    if threshold is None:
        return None
    return [unmixed_chance(p, draws) > threshold for p in estimates]


def allocate_budget_with_skips(
    scores: Sequence[float], skipped: Sequence[bool], total: int, low: int, high: int
) -> list[int]:
    """[`allocate_budget`] where the `skipped` prompts get `low` and the others share the rest of `total`; when the
    others cannot take it within `high` each, they get `high` and the skipped prompts split what is left evenly."""
    unskipped = [i for i, skip in enumerate(skipped) if not skip]
    chosen = [i for i, skip in enumerate(skipped) if skip]
    if not chosen:
        return allocate_budget(scores, total, low, high)
    if not low * len(scores) <= total <= high * len(scores):
        raise ValueError(f"a total of {total} cannot be split over {len(scores)} prompts within [{low}, {high}] each")
    budgets = [0] * len(scores)
    rest = total - low * len(chosen)
    if unskipped and rest <= high * len(unskipped):
        for i, budget in zip(unskipped, allocate_budget([scores[i] for i in unskipped], rest, low, high), strict=True):
            budgets[i] = budget
        for i in chosen:
            budgets[i] = low
        return budgets
    for i in unskipped:
        budgets[i] = high
    left = total - high * len(unskipped)
    for i, budget in zip(chosen, allocate_budget([1.0] * len(chosen), left, low, high), strict=True):
        budgets[i] = budget
    return budgets


@functools.lru_cache(maxsize=65536)
def quota_probability(draws: int, positives_needed: int, negatives_needed: int, alpha: float, beta: float) -> float:
    """P(at least `positives_needed` positives and `negatives_needed` negatives among `draws` more completions) when
    the pass rate is Beta(alpha, beta) distributed: a sum of beta-binomial probabilities."""
    low, high = positives_needed, draws - negatives_needed
    if low > high:
        return 0.0
    log_norm = math.lgamma(alpha + beta) - math.lgamma(alpha) - math.lgamma(beta) - math.lgamma(alpha + beta + draws)
    total = 0.0
    for x in range(low, high + 1):
        log_choose = math.lgamma(draws + 1) - math.lgamma(x + 1) - math.lgamma(draws - x + 1)
        total += math.exp(log_choose + math.lgamma(x + alpha) + math.lgamma(draws - x + beta) + log_norm)
    return min(total, 1.0)


def predictive_request(
    positives_needed: int,
    negatives_needed: int,
    alpha: float,
    beta: float,
    confidence: float,
    min_request: int,
    max_request: int,
) -> int:
    """The smallest request in `[min_request, max_request]` whose chance of meeting the remaining quotas under a
    Beta(alpha, beta) pass rate reaches `confidence` (`max_request` when none does), by binary search."""
    low, high = max(min_request, positives_needed + negatives_needed, 1), max_request
    if low >= high:
        return max(min(low, max_request), 1)
    if quota_probability(high, positives_needed, negatives_needed, alpha, beta) < confidence:
        return high
    while low < high:
        middle = (low + high) // 2
        if quota_probability(middle, positives_needed, negatives_needed, alpha, beta) >= confidence:
            high = middle
        else:
            low = middle + 1
    return low
