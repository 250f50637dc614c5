"""Rank-local sampling pools. Every process needs every completion's rewards, but no process needs another's
completions until the step's kept rows are known: a completion stays, compactly (`LocalRow`), on the process that
generated it, every process keeps a `PoolEntry` per completion of the global pool, and `route_kept_rows` moves each
kept row once, to the process that trains on it (one `all_to_all` of sizes and one of bytes)."""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

_HEADER = np.dtype([("prompt", "<i8"), ("completion", "<i8"), ("logprobs", "<i8"), ("payload", "<i8")])
_PICKLED = ("completion", "extra_logs", "tool_mask", "extra_fields", "images", "tool_images", "prompt")
"""The `LocalRow` fields a packed row carries pickled, after its header and arrays."""


@dataclasses.dataclass
class LocalRow:
    """A completion held by the process that generated it (or, once routed, by the one that trains on it)."""

    prompt_ids: np.ndarray
    """int32 token ids of the prompt, as TRL's `_generate` returned them."""
    completion_ids: np.ndarray
    """int32 token ids of the completion."""
    logprobs: np.ndarray | None
    """float32 sampling log-probs per completion token (vLLM), or None (transformers generation)."""
    completion: Any
    """The decoded completion: text, or a list of messages for conversational prompts."""
    extra_logs: dict[str, Any]
    """`log_extra` values the reward functions wrote for this completion."""
    tool_mask: np.ndarray | None = None
    """int8 per completion token: 1 where the model wrote it, 0 for tool or environment output (TRL's `tool_mask`)."""
    extra_fields: dict[str, Any] = dataclasses.field(default_factory=dict)
    """This completion's values of the extra fields a `rollout_func` returned."""
    images: Any = None
    """The images of this completion's prompt (and tool calls), as `_generate` returned them; None for text."""
    tool_images: list = dataclasses.field(default_factory=list)
    """Images returned by tool calls in this completion."""
    prompt: Any = None
    """The prompt as generated, when it is not the dataset row's (an environment's `reset` appended its observation)."""

    @classmethod
    def from_lists(
        cls,
        prompt_ids: Sequence[int],
        completion_ids: Sequence[int],
        completion: Any,
        logprobs: Sequence[float] | None,
        extra_logs: dict[str, Any],
        tool_mask: Sequence[int] | None = None,
        extra_fields: dict[str, Any] | None = None,
        images: Any = None,
        tool_images: list | None = None,
        prompt: Any = None,
    ) -> LocalRow:
        return cls(
            np.asarray(prompt_ids, dtype=np.int32),
            np.asarray(completion_ids, dtype=np.int32),
            # numpy turns the None vLLM reports for a NaN log-prob into NaN, as TRL does.
            None if logprobs is None else np.asarray(logprobs, dtype=np.float32),
            completion,
            extra_logs,
            None if tool_mask is None else np.asarray(tool_mask, dtype=np.int8),
            extra_fields or {},
            images,
            tool_images or [],
            prompt,
        )

    @classmethod
    def from_generated(
        cls, fields: dict[str, Any], index: int, extra_logs: dict[str, Any], prompt: Any = None
    ) -> LocalRow:
        """Row `index` of a `GRPOTrainer._generate` output (a dict of its fields); `prompt` as the field's."""

        def per_row(values: Any) -> Any:
            return None if values is None else values[index]

        return cls.from_lists(
            fields["prompt_ids"][index],
            fields["completion_ids"][index],
            fields["completions"][index],
            per_row(fields["logprobs"]),
            extra_logs,
            tool_mask=per_row(fields.get("tool_mask")),
            extra_fields=row_extra_fields(fields.get("extra_fields"), index),
            images=per_row(fields.get("images")),
            tool_images=fields["tool_images"][index] if fields.get("tool_images") else [],
            prompt=prompt,
        )

    @property
    def nbytes(self) -> int:
        """Bytes of the token and log-prob arrays (the completion object is not counted)."""
        return (
            self.prompt_ids.nbytes
            + self.completion_ids.nbytes
            + (0 if self.logprobs is None else self.logprobs.nbytes)
        )


def row_extra_fields(extra_fields: dict[str, Any] | None, index: int) -> dict[str, Any]:
    """Row `index`'s values of a `rollout_func`'s extra fields, by GRPOTrainer's rule: a list holds one value per row
    (rows past its end get none), anything else is every row's."""
    return {
        name: values[index] if isinstance(values, list) else values
        for name, values in (extra_fields or {}).items()
        if not isinstance(values, list) or index < len(values)
    }


def generate_fields(rows: Sequence[LocalRow]) -> dict[str, Any]:
    """The `GRPOTrainer._generate` output fields (as lists, one entry per row) of `rows`: the inverse of
    `LocalRow.from_generated`."""
    names = sorted({name for row in rows for name in row.extra_fields})
    return {
        "prompt_ids": [row.prompt_ids.tolist() for row in rows],
        "completion_ids": [row.completion_ids.tolist() for row in rows],
        "completions": [row.completion for row in rows],
        "logprobs": None if any(row.logprobs is None for row in rows) else [row.logprobs.tolist() for row in rows],
        "tool_mask": None if any(row.tool_mask is None for row in rows) else [row.tool_mask.tolist() for row in rows],
        "extra_fields": {name: [row.extra_fields.get(name) for row in rows] for name in names},
        "images": None if all(row.images is None for row in rows) else [row.images for row in rows],
        "tool_images": [row.tool_images for row in rows] if any(row.tool_images for row in rows) else [],
    }


@dataclasses.dataclass
class PoolEntry:
    """One completion of a prompt's pool, as every process sees it; `row` is set only on the process holding it."""

    rewards_per_func: torch.Tensor
    """The completion's reward per reward function (NaN where a function returned None), gathered by TRL."""
    truncated: bool
    """Hit `max_completion_length` (no EOS); meaningful when truncated completions are masked, else False."""
    holder: int
    """Index of the process that holds the completion."""
    row: LocalRow | None = None


def pack_rows(rows: Sequence[LocalRow]) -> np.ndarray:
    """Serialise rows into one uint8 buffer: per row a fixed header, its token and log-prob arrays, then its other
    fields pickled."""
    parts: list[bytes | np.ndarray] = []
    for row in rows:
        payload = pickle.dumps(tuple(getattr(row, name) for name in _PICKLED), protocol=pickle.HIGHEST_PROTOCOL)
        logprobs = -1 if row.logprobs is None else len(row.logprobs)
        header = np.array([(len(row.prompt_ids), len(row.completion_ids), logprobs, len(payload))], dtype=_HEADER)
        parts += [header.tobytes(), row.prompt_ids.astype("<i4").tobytes(), row.completion_ids.astype("<i4").tobytes()]
        if row.logprobs is not None:
            parts.append(row.logprobs.astype("<f4").tobytes())
        parts.append(payload)
    return np.frombuffer(b"".join(parts), dtype=np.uint8) if parts else np.zeros(0, dtype=np.uint8)


def unpack_rows(buffer: np.ndarray) -> list[LocalRow]:
    """The rows `pack_rows` serialised, in order."""
    data = memoryview(np.ascontiguousarray(buffer, dtype=np.uint8)).cast("B")
    rows: list[LocalRow] = []
    offset = 0
    while offset < len(data):
        header = np.frombuffer(data, dtype=_HEADER, count=1, offset=offset)[0]
        offset += _HEADER.itemsize

        def take(count: int, dtype: str) -> np.ndarray:
            nonlocal offset
            array = np.frombuffer(data, dtype=dtype, count=count, offset=offset).copy()
            offset += array.nbytes
            return array

        prompt_ids = take(int(header["prompt"]), "<i4")
        completion_ids = take(int(header["completion"]), "<i4")
        logprobs = None if header["logprobs"] < 0 else take(int(header["logprobs"]), "<f4")
        size = int(header["payload"])
        objects = pickle.loads(data[offset : offset + size])
        offset += size
        rows.append(LocalRow(prompt_ids, completion_ids, logprobs, **dict(zip(_PICKLED, objects, strict=True))))
    return rows


def route_kept_rows(
    kept: Sequence[PoolEntry], rank: int, world_size: int, device: torch.device | str = "cpu"
) -> list[LocalRow]:
    """This process's share of the kept rows, in order (process `r` trains on the `r`-th of `world_size` equal
    slices, as TRL lays them out); each row is sent once, by its holder, to the process that trains on it.
    Collective: every process calls it with the same `kept`."""
    if len(kept) % world_size:
        raise ValueError(f"{len(kept)} kept rows cannot be split evenly over {world_size} processes.")
    per_rank = len(kept) // world_size
    destination = [index // per_rank for index in range(len(kept))]
    mine: list[LocalRow | None] = [None] * per_rank
    outgoing: list[list[LocalRow]] = [[] for _ in range(world_size)]
    for index, entry in enumerate(kept):
        if entry.holder == rank:
            if entry.row is None:
                raise RuntimeError(f"Kept row {index} is held by process {rank}, which has no data for it.")
            if destination[index] == rank:
                mine[index - rank * per_rank] = entry.row
            else:
                outgoing[destination[index]].append(entry.row)
    if world_size > 1:
        # Every process knows what it sends; one all_to_all of sizes tells each what it receives.
        sends = [pack_rows(rows) for rows in outgoing]
        send_sizes = torch.tensor([len(buffer) for buffer in sends], dtype=torch.int64, device=device)
        receive_sizes = torch.empty_like(send_sizes)
        dist.all_to_all_single(receive_sizes, send_sizes)
        send_buffer = torch.from_numpy(np.concatenate(sends)).to(device)
        receive_buffer = torch.empty(int(receive_sizes.sum()), dtype=torch.uint8, device=device)
        dist.all_to_all_single(receive_buffer, send_buffer, receive_sizes.tolist(), send_sizes.tolist())
        received = receive_buffer.cpu().numpy()
        incoming: dict[int, Iterator[LocalRow]] = {}
        start = 0
        for source, size in enumerate(receive_sizes.tolist()):
            incoming[source] = iter(unpack_rows(received[start : start + size]))
            start += size
        # Rows from one holder arrive in the global order in which it packed them.
        for position in range(per_rank):
            if mine[position] is None:
                mine[position] = next(incoming[kept[rank * per_rank + position].holder])
    missing = [position for position, row in enumerate(mine) if row is None]
    if missing:
        raise RuntimeError(f"Process {rank} received no data for kept rows {missing} of its share.")
    return mine  # type: ignore[return-value]


def moved_fraction(kept: Sequence[PoolEntry], world_size: int) -> float:
    """Share of the kept rows trained on by another process than the one that generated them."""
    if not kept:
        return 0.0
    per_rank = len(kept) // world_size
    return sum(entry.holder != index // per_rank for index, entry in enumerate(kept)) / len(kept)
