"""DAPO's refill walk and its dynamic-sampling loop (`trl_ada.samplers.dapo`), as pure rules: no model, no TRL."""

import random

import pytest
from test_est_dapo import selection_for

from trl_ada.samplers.dapo import BatchExhaustedError, RefillWalk, fill_update


def shuffled(size):
    """A seeded permutation per epoch, as the trainer's (TRL's RepeatSampler seeded `seed + 1 + epoch`)."""
    return lambda epoch: random.Random(epoch).sample(range(size), size)


def walk_over(rows):
    return RefillWalk(rows, shuffled(len(rows)), key=lambda row: row["prompt"])


def test_the_walk_skips_prompts_of_the_step_and_moves_on_to_the_next_epoch():
    rows = [{"prompt": f"p{i}"} for i in range(6)]
    walk = walk_over(rows)
    first_epoch = [rows[i]["prompt"] for i in shuffled(6)(0)]
    in_step = {first_epoch[0], first_epoch[2]}
    got = walk.next_prompts(3, exclude=in_step)
    assert [row["prompt"] for row in got] == [first_epoch[1], first_epoch[3], first_epoch[4]]
    assert in_step == {first_epoch[i] for i in range(5)}  # the prompts returned joined the step
    assert walk.state_dict() == {"epoch": 0, "position": 5}
    # The last prompt of the epoch, then the next epoch's order: no prompt of the step comes back.
    again = walk.next_prompts(3, exclude=in_step)
    assert [row["prompt"] for row in again] == [first_epoch[5]]
    assert walk.state_dict()["epoch"] == 1


def test_a_loaded_walk_continues_where_the_saved_one_stopped():
    rows = [{"prompt": f"p{i}"} for i in range(5)]
    walk = walk_over(rows)
    walk.next_prompts(4, exclude=set())
    state = walk.state_dict()
    expected = [row["prompt"] for row in walk.next_prompts(4, exclude=set())]
    resumed = walk_over(rows)
    resumed.load_state_dict(state)
    assert [row["prompt"] for row in resumed.next_prompts(4, exclude=set())] == expected
    assert resumed.state_dict() == walk.state_dict()


def test_fill_update_refills_until_full_and_keeps_the_informative_groups():
    rows = [{"prompt": f"p{i}"} for i in range(8)]
    refills = iter([[[0.0, 0.0], [0.0, 1.0], [1.0, 1.0]], [[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]]])
    sampled = []

    def sample(batch_rows):
        sampled.append([row["prompt"] for row in batch_rows])
        return selection_for(next(refills))

    first = selection_for([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    filler = fill_update(first, ["x", "y", "z"], sample, walk_over(rows), max_refills=5, keep_partial=False)
    assert filler.taken == [(0, 0), (1, 1), (2, 0)]
    assert len(sampled) == 2 and all(len(prompts) == 3 for prompts in sampled)
    assert len({p for prompts in sampled for p in prompts}) == 6  # never the same prompt twice in one step
    assert filler.metrics()["dapo/extra_batches"] == 2


def test_fill_update_stops_at_the_cap_or_when_the_dataset_is_used_up():
    rows = [{"prompt": f"p{i}"} for i in range(4)]
    constant = [[1.0, 1.0], [0.0, 0.0]]
    calls = []

    def sample(batch_rows):
        calls.append(len(batch_rows))
        return selection_for(constant[: len(batch_rows)])

    first = selection_for(constant)
    with pytest.raises(BatchExhaustedError, match="dapo_max_refills"):
        fill_update(first, ["a", "b"], sample, walk_over(rows), max_refills=1, keep_partial=False)
    assert calls == [2]  # one refill batch: the cap
    calls.clear()
    # Four prompts, none of them "a" or "b": two refill batches of two, then nothing is left to draw.
    filler = fill_update(first, ["a", "b"], sample, walk_over(rows), max_refills=10, keep_partial=True)
    assert calls == [2, 2]
    assert filler.taken == [(0, 0), (0, 1)]  # padded with dropped groups
