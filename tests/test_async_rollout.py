"""
`AdaRolloutLoop` (trl_ada/async_grpo/rollout.py) driven by hand: the draws its work iterator asks for are answered
with TRL's own `RolloutGroup`s, in an arrival order that is not the submission order, and scored through TRL's
`_score_group`. The kept samples must carry exactly the synchronous estimator's advantages on the same draws, their
own draw's policy version and one group id per prompt.
"""

from __future__ import annotations

import asyncio
import inspect
import multiprocessing as mp
import queue
import random

import pytest
from async_fixtures import chat_tokenizer
from datasets import Dataset

from trl_ada import trl_seam
from trl_ada.samplers import SamplerSettings, build_sampler
from trl_ada.samplers.continuous import begin_streaming
from trl_ada.schedules import prompt_keys

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


def make_loop(settings: SamplerSettings, prompts_per_batch: int, tokenizer) -> AdaRolloutLoop:
    rows = {
        "prompt": [[{"role": "user", "content": f"question {i}"}] for i in range(NUM_PROMPTS)],
        "pass_rate": [0.15 * i for i in range(NUM_PROMPTS)],
    }
    loop_kwargs = dict(
        model_name="tiny",
        dataset=Dataset.from_dict(rows),
        reward_funcs=[right_answer],
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
    return AdaRolloutLoop(ada_sampling=AsyncSampling(settings, prompts_per_batch=prompts_per_batch), **loop_kwargs)


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
    return trl_seam.merge_rollout_groups(groups)


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
    while not loop._metrics_queue.empty():
        payload = loop._metrics_queue.get_nowait()
        dropped += payload.get("ada/dapo/groups_dropped_total", 0.0)
        total += payload.get("ada/dapo/groups_total", 0.0)
    assert (dropped, total) == (2.0, 3.0)


def test_merging_groups_keeps_each_conversation_and_its_reward_kwargs():
    row = {"prompt": [{"role": "user", "content": "q"}], "pass_rate": 0.25}
    groups = [draw_group(10 + d, row, 0, d, version=d) for d in range(3)]
    merged = trl_seam.merge_rollout_groups(groups)
    assert merged.completions_ids == [g.completions_ids[0] for g in groups]
    assert merged.reward_kwargs == {"pass_rate": [0.25] * 3}
    assert (merged.group_id, merged.model_version) == (10, 0)
    with pytest.raises(RuntimeError, match="returned 2 samples for 3 training sequences"):
        trl_seam.samples_per_conversation(groups, [object(), object()])


def test_a_changed_pinned_trl_method_fails_loudly(monkeypatch):
    source = inspect.getsource(rollout_worker)
    trl_seam.check_async_pins(source)  # the installed TRL is one the pins were taken on
    changed = source.replace("group_id += 1", "group_id += 2")
    monkeypatch.delenv(trl_seam.ALLOW_UNSUPPORTED_ENV, raising=False)
    with pytest.raises(ImportError, match="_repeat_iterator"):
        trl_seam.check_async_pins(changed, version="9.9.9")
    monkeypatch.setenv(trl_seam.ALLOW_UNSUPPORTED_ENV, "1")
    trl_seam.check_async_pins(changed, version="9.9.9")  # warns instead
