"""Rank-local pools: compact rows, their serialisation, and routing kept rows to the process that trains on them."""

import os
import random
import socket

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trl_ada.schedules.pools import (
    LocalRow,
    PoolEntry,
    generate_fields,
    moved_fraction,
    pack_rows,
    route_kept_rows,
    unpack_rows,
)
from trl_ada.schedules.rounds import RoundLayout


def make_row(seed: int, logprobs: bool = True) -> LocalRow:
    rng = random.Random(seed)
    completion_ids = [rng.randrange(150_000) for _ in range(rng.randrange(0, 9))]
    return LocalRow.from_lists(
        [rng.randrange(150_000) for _ in range(rng.randrange(1, 6))],
        completion_ids,
        [{"role": "assistant", "content": f"answer {seed}"}] if seed % 2 else f"text {seed} é",
        [-rng.random() for _ in completion_ids] if logprobs else None,
        {"judge": f"note {seed}", "score": seed / 7} if seed % 3 else {},
        tool_mask=[seed % 2] * len(completion_ids) if seed % 4 else None,
        extra_fields={"feedback": f"episode {seed}", "turns": seed % 5} if seed % 2 else {},
        tool_images=[f"image-{seed}"] if seed % 5 == 0 else [],
    )


def assert_same_row(a: LocalRow, b: LocalRow) -> None:
    assert a.prompt_ids.tolist() == b.prompt_ids.tolist()
    assert a.completion_ids.tolist() == b.completion_ids.tolist()
    assert (a.logprobs is None) == (b.logprobs is None)
    if a.logprobs is not None:
        assert a.logprobs.tolist() == b.logprobs.tolist()  # float32 both ways: exact
    assert a.completion == b.completion
    assert a.extra_logs == b.extra_logs
    assert (a.tool_mask is None) == (b.tool_mask is None)
    if a.tool_mask is not None:
        assert a.tool_mask.tolist() == b.tool_mask.tolist()
    assert (a.extra_fields, a.images, a.tool_images) == (b.extra_fields, b.images, b.tool_images)


def test_rows_are_stored_compactly():
    row = LocalRow.from_lists(list(range(300, 310)), list(range(1000, 1500)), "x", [-0.5] * 500, {})
    assert row.completion_ids.dtype == np.int32 and row.logprobs.dtype == np.float32
    assert row.nbytes == 4 * (10 + 500 + 500)
    # The lists TRL returns cost ~36 bytes per token id and ~32 per float (object plus pointer), 8x more.
    assert row.completion_ids.tolist() == list(range(1000, 1500))


def test_a_log_prob_vllm_reported_as_none_becomes_nan():
    # vLLM replaces a NaN token log-prob by None; TRL maps it back to NaN when it builds its tensor, and so does the
    # float32 storage (numpy's conversion).
    row = LocalRow.from_lists([1], [5, 6, 7], "x", [-0.5, None, -1.25], {})
    assert row.logprobs.dtype == np.float32
    assert row.logprobs[0] == -0.5 and np.isnan(row.logprobs[1]) and row.logprobs[2] == -1.25


@pytest.mark.parametrize("logprobs", [True, False])
def test_pack_then_unpack_gives_the_rows_back(logprobs):
    rows = [make_row(seed, logprobs) for seed in range(12)]
    buffer = pack_rows(rows)
    assert buffer.dtype == np.uint8
    unpacked = unpack_rows(buffer)
    assert len(unpacked) == len(rows)
    for a, b in zip(rows, unpacked):
        assert_same_row(a, b)
    assert unpack_rows(pack_rows([])) == []


def test_single_process_routing_keeps_the_rows_in_order():
    rows = [make_row(seed) for seed in range(4)]
    kept = [PoolEntry(torch.zeros(1), False, 0, row) for row in rows]
    assert route_kept_rows(kept, rank=0, world_size=1) == rows
    assert moved_fraction(kept, 1) == 0.0


def test_routing_rejects_a_split_that_is_not_even():
    kept = [PoolEntry(torch.zeros(1), False, 0, make_row(0)) for _ in range(3)]
    with pytest.raises(ValueError, match="cannot be split evenly over 2 processes"):
        route_kept_rows(kept, rank=0, world_size=2)


def _layout(world_size: int, per_rank: int, seed: int) -> list[int]:
    """Holders of the global kept rows: a random process for each (as rounds scatter a prompt's draws)."""
    rng = random.Random(seed)
    return [rng.randrange(world_size) for _ in range(world_size * per_rank)]


def _route_worker(rank: int, world_size: int, port: int, per_rank: int, result_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        holders = _layout(world_size, per_rank, seed=3)
        # Every process knows every entry's holder; only the holder has the row (seeded by its global index).
        kept = [
            PoolEntry(torch.zeros(1), False, holder, make_row(index) if holder == rank else None)
            for index, holder in enumerate(holders)
        ]
        mine = route_kept_rows(kept, rank, world_size)
        expected = [make_row(index) for index in range(rank * per_rank, (rank + 1) * per_rank)]
        assert len(mine) == per_rank
        for a, b in zip(mine, expected):
            assert_same_row(a, b)
        with open(os.path.join(result_dir, f"ok{rank}"), "w") as f:
            f.write(str(moved_fraction(kept, world_size)))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world_size", [2, 3])
def test_routing_over_gloo_delivers_each_kept_row_to_its_trainer(tmp_path, world_size):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    per_rank = 5
    mp.spawn(_route_worker, args=(world_size, port, per_rank, str(tmp_path)), nprocs=world_size, join=True)
    holders = _layout(world_size, per_rank, seed=3)
    moved = sum(holder != index // per_rank for index, holder in enumerate(holders)) / len(holders)
    assert moved > 0  # the layout really moves rows
    for rank in range(world_size):
        assert float((tmp_path / f"ok{rank}").read_text()) == pytest.approx(moved)


def test_round_layout_gives_every_process_whole_blocks_of_equal_size():
    # Three prompts asking 4 rows each on 8 processes: padded with whole blocks of the first prompt to lcm(4, 8) = 8.
    layout = RoundLayout.plan([(2, 4), (5, 4), (7, 4)], num_processes=8)
    assert layout.block == 4
    assert layout.order == [2] * 4 + [5] * 4 + [7] * 4
    assert layout.padded == layout.order + [2] * 4
    assert layout.share_size == 2
    assert [layout.share(rank) for rank in range(8)] == [layout.padded[i : i + 2] for i in range(0, 16, 2)]
    assert layout.holder(5) == (2, 1)
    # Mixed counts: blocks of one row, padded to the process count.
    mixed = RoundLayout.plan([(0, 3), (1, 2)], num_processes=2)
    assert mixed.block == 1 and mixed.padded == [0, 0, 0, 1, 1, 0] and mixed.share(1) == [1, 1, 0]


def test_rows_from_a_generate_output_give_the_same_output_back():
    # TRL's `_generate` output for three rows: per-row lists, a shared extra field, a tool mask; one row at a time into
    # the pool and back must give what TRL returned (the shared field as one value per row, as TRL merges it).
    fields = {
        "prompt_ids": [[1, 2], [1, 2], [3]],
        "completion_ids": [[5, 6], [7], [8, 9, 10]],
        "tool_mask": [[1, 0], [1], [1, 1, 0]],
        "completions": ["a", "b", "c"],
        "logprobs": [[-0.5, -0.25], [-1.0], [-0.125, -2.0, -0.5]],
        "extra_fields": {"feedback": ["x", "y", "z"], "env_name": "calc"},
        "images": None,
        "tool_images": [],
    }
    rows = [LocalRow.from_generated(fields, i, {}) for i in range(3)]
    assert rows[1].extra_fields == {"feedback": "y", "env_name": "calc"}
    back = generate_fields(unpack_rows(pack_rows(rows)))
    assert back == {**fields, "extra_fields": {"env_name": ["calc"] * 3, "feedback": ["x", "y", "z"]}}
