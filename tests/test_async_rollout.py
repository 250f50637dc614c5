"""
`AdaRolloutLoop` (trl_ada/async_grpo/rollout.py) driven by hand: the draws its work iterator asks for are answered
with TRL's own `RolloutGroup`s, in an arrival order that is not the submission order, and scored through TRL's
`_score_group`. The kept samples must carry exactly the synchronous estimator's advantages on the same draws, their
own draw's policy version and one group id per prompt.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import multiprocessing as mp
import queue
import random
import statistics

import pytest
from async_fixtures import chat_tokenizer
from datasets import Dataset

from trl_ada import trl_seam
from trl_ada.samplers import SamplerSettings, build_sampler
from trl_ada.samplers.accounting import BANDS
from trl_ada.samplers.streaming import begin_streaming
from trl_ada.schedules import prompt_keys
from trl_ada.trl_seam import async_grpo_private

pytest.importorskip("aiohttp")
rollout_worker = pytest.importorskip("trl.experimental.async_grpo.async_rollout_worker")
from trl_ada.async_grpo.rollout import AdaRolloutLoop, AsyncSampling  # noqa: E402

NUM_PROMPTS = 6


@pytest.fixture(autouse=True)
def accelerate_state():
    # TRL's loop logs through accelerate's logger, which needs the state its child process sets up (`_child_main`).
    from accelerate.state import PartialState

    PartialState()


def right_answer(completions, **kwargs):
    return [1.0 if completion[0]["content"] == "right" else 0.0 for completion in completions]


REWARD_CALLS: list[tuple[str, int]] = []
"""`(reward function, completions scored)` of each call of the recording rewards below."""


def right_answer_recorded(completions, **kwargs):
    REWARD_CALLS.append(("sync", len(completions)))
    return right_answer(completions)


async def right_answer_async(completions, **kwargs):
    """`right_answer` as an `async def` reward (TRL's worker awaits it): module-level, so it pickles."""
    REWARD_CALLS.append(("async", len(completions)))
    await asyncio.sleep(0)  # gives the event loop a turn, as a reward calling a remote verifier would
    return right_answer(completions)


def make_loop(
    settings: SamplerSettings,
    prompts_per_batch: int,
    tokenizer,
    train_on: str = "downsample",
    reward_funcs: list | None = None,
) -> AdaRolloutLoop:
    rows = {
        "prompt": [[{"role": "user", "content": f"question {i}"}] for i in range(NUM_PROMPTS)],
        "pass_rate": [0.15 * i for i in range(NUM_PROMPTS)],
    }
    loop_kwargs = dict(
        model_name="tiny",
        dataset=Dataset.from_dict(rows),
        reward_funcs=reward_funcs or [right_answer],
        processing_class=chat_tokenizer(tokenizer),
        eos_token_ids=[tokenizer.eos_token_id],
        rollout_buffer=queue.Queue(),
        model_version_value=mp.Value("i", 0),
        heartbeat_value=mp.Value("d", 0.0),
        failed_event=mp.Event(),
        exception_info_queue=queue.Queue(),
        metrics_queue=queue.Queue(),
        num_generations=settings.num_generations,
        max_inflight_tasks=8,
    )
    # The installed TRL's arguments only (1.14's loop takes no `eos_token_ids`).
    accepted = inspect.signature(rollout_worker._AsyncRolloutLoop.__init__).parameters
    loop_kwargs = {key: value for key, value in loop_kwargs.items() if key in accepted}
    sampling = AsyncSampling(settings, prompts_per_batch=prompts_per_batch, train_on=train_on)
    return AdaRolloutLoop(ada_sampling=sampling, **loop_kwargs)


def outcome(row: dict, draw: int) -> bool:
    """A fixed outcome per (prompt, draw index), whoever asks: both paths see the same draws."""
    return random.Random(f"{row['prompt'][0]['content']}/{draw}").random() < row["pass_rate"]


def draw_group(group_id: int, row: dict, prompt: int, draw: int, version: int):
    """The one-draw `RolloutGroup` TRL's generate loop closes (num_generations=1), its ids naming the draw."""
    text = "right" if outcome(row, draw) else "wrong"
    ids = [100 + prompt, draw, 0]
    sequence = rollout_worker.TrainingSequence(
        input_ids=[7, *ids],
        completion_mask=[0, 1, 1, 1],
        old_log_probs=[0.0, -0.1, -0.2, -0.3],
        rollout_id=str(group_id),
    )
    return rollout_worker.RolloutGroup(
        prompts=[row["prompt"]],
        reward_kwargs={"pass_rate": [row["pass_rate"]]},
        completions=[[{"role": "assistant", "content": text}]],
        completions_ids=[ids],
        completions_sequences=[[sequence]],
        tool_call_counts=[0],
        tool_failure_counts=[0],
        model_version=version,
        group_id=group_id,
        env_rewards=[],
        rollout_rewards=[None],
    )


def drive_one_batch(loop: AdaRolloutLoop, seed: int):
    """Answer the first generation batch's draws out of submission order until its samples come out."""
    rng = random.Random(seed)
    work = loop._repeat_iterator()
    in_flight, submitted, versions = [], 0, {}
    while True:
        # Everything the loop wants drawn now (never more: a further next() would open the next batch).
        while not in_flight or loop._continuing or loop._fresh:
            group_id, row = next(work)
            draw = loop._draws[group_id]
            versions[(draw.prompt, draw.draw)] = submitted // 5  # a weight sync every five submissions
            in_flight.append(draw_group(group_id, row, draw.prompt, draw.draw, submitted // 5))
            submitted += 1
        rng.shuffle(in_flight)
        # At most what TRL's score queue holds (its generate loop waits when it is full).
        back = in_flight[: rng.randint(1, min(len(in_flight), loop._groups_to_score.maxsize + 1))]
        in_flight = [g for g in in_flight if g not in back]
        # The first group comes from TRL's score loop; the others wait on the queue and are scored with it.
        for group in back[1:]:
            loop._groups_to_score.put_nowait(group)
        samples = asyncio.run(loop._score_group(back[0]))
        assert loop._groups_to_score.empty()
        if samples:
            assert not in_flight  # a batch finishes once every draw is back
            return samples, versions


@pytest.mark.parametrize("sampler_name", ["seq_balance", "seq_pos", "est"])
@pytest.mark.parametrize("seed", [0, 1])
def test_pools_are_the_synchronous_estimator_on_the_same_draws_whatever_the_arrival_order(
    tokenizer, sampler_name, seed
):
    extra = {"round_size": 2, "max_rounds": 6} if sampler_name != "est" else {}
    settings = SamplerSettings(sampler=sampler_name, num_generations=4, seed=3, **extra).validated()
    loop = make_loop(settings, NUM_PROMPTS, tokenizer)
    samples, versions = drive_one_batch(loop, seed)

    # The reference: the same sampler's streaming step on the same draws, completed in submission order.
    rows = [loop.dataset[i] for i in range(NUM_PROMPTS)]
    step = begin_streaming(build_sampler(settings), NUM_PROMPTS, prompt_keys(rows))
    while pairs := step.to_submit():
        for prompt, draw in pairs:
            step.complete(prompt, draw, float(outcome(rows[prompt], draw)))
    want = step.finish()

    got: dict[int, dict[int, tuple[float, int, int]]] = {}
    for sample in samples:
        prompt, draw = int(sample.input_ids[1]) - 100, int(sample.input_ids[2])
        got.setdefault(prompt, {})[draw] = (sample.advantage, sample.model_version, sample.group_id)
    for prompt, result in enumerate(want.prompts):
        kept = got.get(prompt, {})
        assert sorted(kept) == sorted(result.kept)  # the kept draws, by draw index
        assert [kept[d][0] for d in result.kept] == list(result.advantages)  # exactly the synchronous advantages
        assert all(kept[d][1] == versions[(prompt, d)] for d in kept)  # each draw's own policy version
        assert len({kept[d][2] for d in kept}) <= 1  # one group id per prompt
    assert len({s.group_id for s in samples}) == sum(1 for r in want.prompts if r.kept)
    if sampler_name != "est":  # est's first step has no history: every budget is the mean, num_generations
        assert max(len(pool) for pool in want.pools) > settings.num_generations  # a pool outgrew its update group

    metrics = {}
    while not loop._metrics_queue.empty():
        metrics.update(loop._metrics_queue.get_nowait())
    assert metrics["ada/samples_per_prompt/mean"] == want.metrics["samples_per_prompt/mean"]
    # Where the draws went: the worker's rates over its one batch are the synchronous step's shares.
    for name in ("draws/useful_share", *(f"draws/{band}/share" for band in BANDS)):
        numerator, denominator = metrics[f"ada/{name}"]
        assert numerator / denominator == pytest.approx(want.metrics.get(name, 0.0)), name


def test_the_loop_keeps_the_score_loops_end_signal(tokenizer):
    settings = SamplerSettings(sampler="seq_balance", num_generations=4, seed=0).validated()
    loop = make_loop(settings, 2, tokenizer)
    work = loop._repeat_iterator()
    groups = []
    for _ in range(3):
        group_id, row = next(work)
        draw = loop._draws[group_id]
        groups.append(draw_group(group_id, row, draw.prompt, draw.draw, 0))
    loop._groups_to_score.put_nowait(groups[1])
    loop._groups_to_score.put_nowait(groups[2])
    loop._groups_to_score.put_nowait(None)  # the generate loop ended (its last put)
    asyncio.run(loop._score_group(groups[0]))
    assert loop._groups_to_score.get_nowait() is None  # still there for TRL's score loop
    assert loop._groups_to_score.empty()  # the waiting groups were scored with the first
    assert all(g.group_id not in loop._draws for g in groups)  # each one scored was completed in its step


def update_group(rewards: list[bool], group_id: int):
    row = {"prompt": [{"role": "user", "content": "q"}], "pass_rate": 0.5}
    groups = [draw_group(group_id, row, 0, d, 0) for d in range(len(rewards))]
    for group, right in zip(groups, rewards, strict=True):
        group.completions[0][0]["content"] = "right" if right else "wrong"
    return async_grpo_private.merge_rollout_groups(groups)


def test_dapo_drops_groups_without_a_signal_and_keeps_trls_advantages(tokenizer):
    settings = SamplerSettings(sampler="dapo", num_generations=4, seed=0).validated()
    loop = make_loop(settings, 1, tokenizer)
    assert not loop.ada_sampling.pooled and loop.num_generations == 4  # TRL's own groups
    assert asyncio.run(loop._score_group(update_group([True] * 4, 0))) == []
    assert asyncio.run(loop._score_group(update_group([False] * 4, 1))) == []
    mixed = update_group([True, False, False, False], 2)
    samples = asyncio.run(loop._score_group(mixed))
    # TRL's advantages: (r - mean) / (population std + 1e-8), here mean 0.25 and std sqrt(0.1875).
    std = 0.1875**0.5
    assert [s.advantage for s in samples] == pytest.approx([0.75 / std, -0.25 / std, -0.25 / std, -0.25 / std])
    dropped = total = 0.0
    window: dict[str, list] = {}
    while not loop._metrics_queue.empty():
        payload = loop._metrics_queue.get_nowait()
        dropped += payload.get("ada/dapo/groups_dropped_total", 0.0)
        total += payload.get("ada/dapo/groups_total", 0.0)
        for name, value in payload.items():
            if name.startswith("ada/draws/"):
                window.setdefault(name, []).append(value)
    assert (dropped, total) == (2.0, 3.0)
    # Where the draws went, as TRL's trainer reduces the window: 12 draws, the mixed group's 4 useful.
    from trl.experimental.async_grpo.async_grpo_trainer import _reduce_metric

    draws = {name.removeprefix("ada/"): _reduce_metric(name, values) for name, values in window.items()}
    assert draws["draws/drawn"] == 4.0 and draws["draws/useful_share"] == pytest.approx(4 / 12)
    assert draws["draws/trained_share"] == pytest.approx(4 / 12)
    assert [draws[f"draws/{band}/share"] for band in ("all_right", "none_right", "low")] == pytest.approx([1 / 3] * 3)
    assert [draws[f"draws/{band}/useful_share"] for band in ("all_right", "none_right", "low")] == [0.0, 0.0, 1.0]


def test_merging_groups_keeps_each_conversation_and_its_reward_kwargs():
    row = {"prompt": [{"role": "user", "content": "q"}], "pass_rate": 0.25}
    groups = [draw_group(10 + d, row, 0, d, version=d) for d in range(3)]
    merged = async_grpo_private.merge_rollout_groups(groups)
    assert merged.completions_ids == [g.completions_ids[0] for g in groups]
    assert merged.reward_kwargs == {"pass_rate": [0.25] * 3}
    assert (merged.group_id, merged.model_version) == (10, 0)
    with pytest.raises(RuntimeError, match="returned 2 samples for 3 training sequences"):
        async_grpo_private.samples_per_conversation(groups, [object(), object()])


def test_a_changed_pinned_trl_method_fails_loudly(monkeypatch):
    source = inspect.getsource(rollout_worker)
    async_grpo_private.check_async_pins(source)  # the installed TRL is one the pins were taken on
    changed = source.replace("group_id += 1", "group_id += 2")
    monkeypatch.delenv(trl_seam.ALLOW_UNSUPPORTED_ENV, raising=False)
    with pytest.raises(ImportError, match="_repeat_iterator"):
        async_grpo_private.check_async_pins(changed, version="9.9.9")
    monkeypatch.setenv(trl_seam.ALLOW_UNSUPPORTED_ENV, "1")
    async_grpo_private.check_async_pins(changed, version="9.9.9")  # warns instead


# -- train_on="pool": every draw of the pool is a training sample ---------------------------------------------------


def by_prompt(samples) -> dict[int, list[tuple[int, float, float, int, int]]]:
    """Each prompt's samples in queue order: `(draw, reward, advantage, policy version, group id)`."""
    out: dict[int, list[tuple[int, float, float, int, int]]] = {}
    for sample in samples:
        prompt, draw = int(sample.input_ids[1]) - 100, int(sample.input_ids[2])
        out.setdefault(prompt, []).append(
            (draw, sample.metrics["reward"], sample.advantage, sample.model_version, sample.group_id)
        )
    return out


def drained_metrics(loop) -> dict[str, float]:
    """The counters (`*_total`) the loop pushed since the last call, summed as TRL's log window sums them."""
    totals: dict[str, float] = {}
    while not loop._metrics_queue.empty():
        for name, value in loop._metrics_queue.get_nowait().items():
            if name.endswith("_total"):
                totals[name] = totals.get(name, 0.0) + value
    return totals


def pool_advantages(pools: dict[int, list[float]], settings: SamplerSettings) -> dict[int, list[float]]:
    """
    `w_x (r_i - p̂_x) / (std_x + 1e-4)` for every draw, written out from the 0/1 rewards alone: `p̂_x` the pool's mean
    (its pass rate), `std_x` its unbiased std, `w_x` the objective's weight (est: the residual weight), clipped, then
    normalised to mean 1 over the batch's prompts whose pool is not constant (those get zeros); times, for `seq_*`, the
    share of the draw's outcome that the balanced update group keeps (`balanced_shares`: the prompt weighs what its
    update group would, outcome by outcome), 1 for est (its kept group is its pool).
    """
    weights = {}
    for prompt, rewards in pools.items():
        p = statistics.fmean(rewards)
        if settings.sampler == "est":
            weight = (p + settings.est_epsilon) ** -(1.0 - settings.est_sample_power)
        elif settings.objective == "log":
            weight = 1.0 / p if p > 0 else math.inf
        else:
            weight = 1.0
        weights[prompt] = min(weight, settings.max_weight)
    mixed = {prompt for prompt, rewards in pools.items() if 0 < sum(rewards) < len(rewards)}
    mean_weight = statistics.fmean(weights[prompt] for prompt in mixed) if mixed else 1.0
    advantages = {}
    for prompt, rewards in pools.items():
        mean, std = statistics.fmean(rewards), statistics.stdev(rewards)
        w = weights[prompt] / mean_weight
        shares = [1.0] * len(rewards)
        if settings.sampler != "est":
            shares = balanced_shares(rewards, settings.num_generations)
        advantages[prompt] = [
            share * w * (r - mean) / (std + 1e-4) if prompt in mixed else 0.0
            for share, r in zip(shares, rewards, strict=True)
        ]
    return advantages


def balanced_shares(rewards: list[float], group_size: int) -> list[float]:
    """Per 0/1 reward, the share of its outcome's draws that a balanced group of `group_size` keeps: half positives
    where there are that many, the rest negatives, topped up from the positives."""
    positives = sum(r > 0.5 for r in rewards)
    negatives = len(rewards) - positives
    kept_positives = min(group_size // 2, positives)
    kept_negatives = min(group_size - kept_positives, negatives)
    kept_positives = min(group_size - kept_negatives, positives)
    return [kept_positives / positives if r > 0.5 else kept_negatives / negatives for r in rewards]


@pytest.mark.parametrize(
    ("sampler_name", "knobs"),
    [
        ("seq_balance", {"round_size": 2, "max_rounds": 6}),
        ("seq_pos", {"round_size": 2, "max_rounds": 6}),
        ("seq_balance", {"round_size": 2, "max_rounds": 6, "objective": "log"}),  # weights normalised over the batch
        ("est", {}),
    ],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_train_on_pool_trains_on_every_draw_in_submission_order_with_the_pool_advantage(
    tokenizer, sampler_name, knobs, seed
):
    settings = SamplerSettings(sampler=sampler_name, num_generations=4, seed=3, **knobs).validated()
    pooled = make_loop(settings, NUM_PROMPTS, tokenizer, train_on="pool")
    downsampled = make_loop(settings, NUM_PROMPTS, tokenizer, train_on="downsample")
    outgrew = False
    # Two generation batches: est's second one has budgets from its tracker (its first gives every prompt n).
    for batch in range(2):
        samples, versions = drive_one_batch(pooled, seed + 10 * batch)
        got = by_prompt(samples)
        # The draws accounting counts every draw of a pool with a signal as trained, not its group of 4.
        counted = drained_metrics(pooled)
        assert counted["ada/draws/trained_total"] == counted["ada/draws/useful_total"] > 0
        submitted = {prompt: sorted(d for p, d in versions if p == prompt) for prompt in range(NUM_PROMPTS)}
        assert sorted(got) == list(range(NUM_PROMPTS))
        pools = {}
        for prompt, rows in got.items():
            # Exactly the prompt's draws, each once, in submission order (they came back shuffled).
            assert [draw for draw, *_ in rows] == submitted[prompt] == list(range(len(rows)))
            assert all(version == versions[(prompt, draw)] for draw, _, _, version, _ in rows)  # its own draw's
            assert {group_id for *_, group_id in rows} == {rows[0][4]}  # one group id per prompt
            pools[prompt] = [reward for _, reward, *_ in rows]
            outgrew |= len(rows) > settings.num_generations
        want = pool_advantages(pools, settings)
        for prompt, rows in got.items():
            assert [advantage for _, _, advantage, _, _ in rows] == pytest.approx(want[prompt], rel=1e-12, abs=1e-15)

        # "downsample" on the same draws is unchanged: its kept draws carry the pool run's advantages over its share.
        kept_samples, kept_versions = drive_one_batch(downsampled, seed + 10 * batch)
        assert kept_versions == versions  # the same draws, submitted alike
        for prompt, rows in by_prompt(kept_samples).items():
            # est trains on its whole pool either way (est_train_on='all'); seq_* on num_generations of it.
            assert len(rows) == (len(got[prompt]) if sampler_name == "est" else settings.num_generations)
            pool_rewards = [reward for _, reward, *_ in got[prompt]]
            shares = [1.0] * len(pool_rewards)
            if sampler_name != "est":
                shares = balanced_shares(pool_rewards, settings.num_generations)
            pool_rows = {draw: advantage / shares[draw] for draw, _, advantage, _, _ in got[prompt]}
            want_kept = [pool_rows[draw] for draw, *_ in rows]
            assert [advantage for _, _, advantage, _, _ in rows] == pytest.approx(want_kept, rel=1e-12, abs=1e-15)
    assert outgrew  # some pool was larger than its update group, so "pool" trained on more than "downsample"


def async_config(tmp_path, **knobs):
    from trl_ada import AdaAsyncGRPOConfig

    return AdaAsyncGRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", num_generations=4, **knobs
    )


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"sampler": "uniform"}, r"sampler='uniform' draws num_generations = 4 per prompt: its pool is its update"),
        ({"sampler": "dapo"}, r"sampler='dapo' draws num_generations = 4 .* use sampler='seq_pos', 'seq_balance'"),
        ({"round_size": 2, "max_rounds": 2}, r"round_size \* max_rounds = 4 is num_generations.* Raise round_size"),
        ({"baseline": "group"}, r"baseline='group' would centre it .* Remove baseline \(default 'pool'\)"),
        ({"sampler": "est", "est_train_on": "downsample"}, r"est_train_on='downsample' cuts each pool .*choose one"),
    ],
)
def test_train_on_pool_is_rejected_at_construction_where_the_pool_is_not_what_trains(tmp_path, knobs, message):
    with pytest.raises(ValueError, match=message):
        async_config(tmp_path, train_on="pool", **knobs)
    async_config(tmp_path, **knobs)  # each is valid with train_on="downsample"


def test_train_on_is_declared_once_and_checked_by_the_config_and_the_loop(tmp_path):
    from transformers import HfArgumentParser

    from trl_ada import AdaAsyncGRPOConfig
    from trl_ada.config import TRAIN_ON_CHOICES

    assert async_config(tmp_path).train_on == "downsample"
    assert async_config(tmp_path, sampler="seq_pos", train_on="pool").train_on == "pool"
    assert async_config(tmp_path, sampler="est", train_on="pool").est_train_on == "all"  # est's whole pool already
    with pytest.raises(ValueError, match=r"train_on='everything' is not supported. Choose one of"):
        async_config(tmp_path, train_on="everything")
    # The rollout loop's own settings are held to the same rule (an injected worker builds them directly).
    with pytest.raises(ValueError, match=r"sampler='dapo' draws num_generations"):
        AsyncSampling(SamplerSettings(sampler="dapo", num_generations=4).validated(), 1, train_on="pool")
    # One declaration for both trainers, documented as the sampler knobs are: each docstring gives its --help text.
    from trl_ada import AdaGRPOConfig

    declared = AdaAsyncGRPOConfig.__dataclass_fields__["train_on"]
    assert AdaGRPOConfig.__dataclass_fields__["train_on"] is declared
    help_text = " ".join(declared.metadata["help"].split())
    assert "the share of its outcome's draws that the group kept" in help_text
    assert declared.metadata["choices"] == list(TRAIN_ON_CHOICES)
    for config_class in (AdaAsyncGRPOConfig, AdaGRPOConfig):
        doc = " ".join(config_class.__doc__.split())
        assert doc.count(" train_on (") == 1 and 'train_on (`str`, *optional*, defaults to `"downsample"`)' in doc
        assert help_text.split("`")[0][:40] in " ".join(HfArgumentParser(config_class).format_help().split())
    assert help_text in " ".join(AdaGRPOConfig.__doc__.split())  # the asynchronous config's points to it
    assert "as in [`AdaGRPOConfig`]" in AdaAsyncGRPOConfig.__doc__.split(" train_on (")[1].split("prompts_per")[0]


# -- async reward functions -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("sampler_name", ["seq_balance", "est"])
def test_an_async_reward_function_scores_batches_of_draws_as_the_sync_one_does(tokenizer, sampler_name):
    extra = {"round_size": 2, "max_rounds": 6} if sampler_name != "est" else {}
    settings = SamplerSettings(sampler=sampler_name, num_generations=4, seed=3, **extra).validated()
    results = {}
    for kind, reward in (("sync", right_answer_recorded), ("async", right_answer_async)):
        REWARD_CALLS.clear()
        loop = make_loop(settings, NUM_PROMPTS, tokenizer, reward_funcs=[reward])
        samples, versions = drive_one_batch(loop, seed=0)
        calls = [size for name, size in REWARD_CALLS if name == kind]
        assert len(calls) == len(REWARD_CALLS)
        # Every draw scored once, and batched: the draws waiting on the score queue went in one call.
        assert sum(calls) == len(versions) and max(calls) > 1 and len(calls) < len(versions)
        results[kind] = (
            sorted((s.group_id, tuple(s.input_ids), s.metrics["reward"], s.advantage) for s in samples),
            calls,
        )
    assert results["async"] == results["sync"]  # the same draws, rewards, advantages and reward calls
