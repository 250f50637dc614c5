"""The completions behind `replay="successes"` (what the sampler's [`~trl_ada.samplers.replay.SuccessReplay`] index
points to): each prompt's latest correct completion, kept as the `PoolEntry` of its draw, so a replayed row is
routed like any kept row."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import Any

import torch
from accelerate.utils import gather_object

from ..checkpoints import CheckpointError
from ..samplers import PromptKey, Selection
from ..trl_seam.grpo_private import completion_logprobs
from .pools import LocalRow, PoolEntry

REPLAY_ROWS_NAME = "ada_replay_rows_{rank}.json"
"""Each process's stored successes in a checkpoint (its own completions; the others' rewards and holders), as JSON:
a checkpoint is data, and loading one runs no code."""

LEGACY_REPLAY_ROWS_NAME = "ada_replay_rows_{rank}.pkl"
"""What trl-ada wrote before: a pickle, which it no longer loads."""


def take_replayed(
    store: dict[str, PoolEntry], keys: Sequence[PromptKey], pools: Sequence[Sequence[PoolEntry]], selection: Selection
) -> dict[int, PoolEntry]:
    """The stored successes one generation batch's `selection` replays, by prompt index, read before the batch's own
    successes are stored in `store` (`Selection.replay_stored`)."""
    replayed = {}
    for index, result in enumerate(selection.prompts):
        if result.replayed is not None:
            entry = store.get(str(keys[index]))
            if entry is None:
                raise RuntimeError(
                    f"replay='successes' chose prompt {str(keys[index])!r}'s stored success, which this process does "
                    "not hold: the sampler's index and the stored completions disagree."
                )
            replayed[index] = entry
    for index, draw in enumerate(selection.replay_stored):
        if draw is not None:
            store[str(keys[index])] = pools[index][draw]
    return replayed


def replay_weights(trainer: Any, batches: Sequence[Any]) -> dict[tuple[int, int], float]:
    """The correction of every replayed row of one step, by `(batch, prompt)`, the same on every process: a replayed
    success was drawn by an earlier policy, so its advantage is weighted by the truncated importance ratio of the
    whole completion, `min(1, pi_now(y) / pi_then(y))`. Both are the trainer's model's own log-probabilities, whoever
    generated the row (vLLM or transformers): `pi_then` is computed when the success is stored, in the step that drew
    it (`LocalRow.behaviour_logprob`), `pi_now` when it is replayed. `batches`: the step's `SampledBatch`es."""
    stored = [
        entry
        for batch in batches
        for index, draw in enumerate(batch.selection.replay_stored)
        if draw is not None
        for entry in (batch.pools[index][draw],)
        if entry.row is not None and entry.row.behaviour_logprob is None
    ]
    replayed = [
        ((b, g), entry)
        for b, batch in enumerate(batches)
        for g, entry in batch.replayed.items()
        if entry.row is not None
    ]
    logprobs = sequence_logprobs(trainer, [entry.row for entry in stored] + [entry.row for _, entry in replayed])
    for entry, logprob in zip(stored, logprobs, strict=False):
        entry.row.behaviour_logprob = logprob
    local = {
        key: min(1.0, math.exp(now - entry.row.behaviour_logprob))
        for (key, entry), now in zip(replayed, logprobs[len(stored) :], strict=True)
    }
    weights: dict[tuple[int, int], float] = {}
    for part in gather_object([local]):
        weights.update(part)
    return weights


def sequence_logprobs(trainer: Any, rows: Sequence[LocalRow]) -> list[float]:
    """Each row's completion log-probability under the trainer's model (the model-written tokens, by its tool mask).
    Every process runs the model the same number of times (sharded models gather their weights in a forward pass),
    padding its rows with copies of a one-token row; no process runs it when none has a row."""
    counts = gather_object([len(rows)])
    if max(counts) == 0:
        return []
    pad = trainer.processing_class.pad_token_id if hasattr(trainer.processing_class, "pad_token_id") else None
    pad = pad if pad is not None else 0
    padding = max(counts) - len(rows)
    filler = LocalRow.from_lists([pad], [pad], "", None, {})
    batch = list(rows) + [filler] * padding
    prompt_length = max(len(row.prompt_ids) for row in batch)
    completion_length = max(len(row.completion_ids) for row in batch)
    device = trainer.accelerator.device
    input_ids = torch.full((len(batch), prompt_length + completion_length), pad, dtype=torch.long, device=device)
    attention_mask = torch.zeros_like(input_ids)
    completion_mask = torch.zeros((len(batch), completion_length), dtype=torch.float32, device=device)
    for i, row in enumerate(batch):
        prompt, completion = torch.as_tensor(row.prompt_ids), torch.as_tensor(row.completion_ids)
        # TRL's layout: prompts left-padded, completions right-padded.
        input_ids[i, prompt_length - len(prompt) : prompt_length] = prompt
        input_ids[i, prompt_length : prompt_length + len(completion)] = completion
        attention_mask[i, prompt_length - len(prompt) : prompt_length + len(completion)] = 1
        written = torch.ones(len(completion)) if row.tool_mask is None else torch.as_tensor(row.tool_mask).float()
        completion_mask[i, : len(completion)] = written
    logprobs = completion_logprobs(trainer, input_ids, attention_mask, completion_length)
    return (logprobs.float() * completion_mask).sum(dim=1)[: len(rows)].tolist()


def forget_unindexed(store: dict[str, PoolEntry], indexed: Any) -> None:
    """Drop from `store` the prompts the sampler's index no longer holds (`indexed`: a container of keys)."""
    for key in [key for key in store if key not in indexed]:
        del store[key]


def save_replay_rows(store: dict[str, PoolEntry], checkpoint: str, rank: int) -> None:
    """Write this process's `store` into `checkpoint` as JSON (every process writes its own file, as TRL's RNG
    states)."""
    entries = {
        key: {
            "rewards": entry.rewards_per_func.cpu().tolist(),
            "truncated": entry.truncated,
            "holder": entry.holder,
            "row": None if entry.row is None else _row_to_json(entry.row),
        }
        for key, entry in store.items()
    }
    os.makedirs(checkpoint, exist_ok=True)  # another process may not have made the checkpoint's folder yet
    with open(os.path.join(checkpoint, REPLAY_ROWS_NAME.format(rank=rank)), "w") as f:
        json.dump(entries, f, default=_plain)


def load_replay_rows(checkpoint: str, rank: int, device: torch.device | str) -> dict[str, PoolEntry] | None:
    """This process's stored successes from `checkpoint`, or None when it has no file for this process. A pickle
    written by an older trl-ada is refused, never loaded: it could run code."""
    path = os.path.join(checkpoint, REPLAY_ROWS_NAME.format(rank=rank))
    if not os.path.isfile(path):
        legacy = os.path.join(checkpoint, LEGACY_REPLAY_ROWS_NAME.format(rank=rank))
        if os.path.isfile(legacy):
            raise CheckpointError(
                f"{legacy} stores replayed completions as a pickle, which trl-ada no longer loads (loading a pickle "
                "can run code, and checkpoints are shared). Resume from a checkpoint written by this version, or "
                "delete that file and resume with replay='none'."
            )
        return None
    with open(path) as f:
        entries = json.load(f)
    return {
        key: PoolEntry(
            torch.tensor(entry["rewards"], dtype=torch.float32, device=device),
            bool(entry["truncated"]),
            int(entry["holder"]),
            None if entry["row"] is None else _row_from_json(entry["row"]),
        )
        for key, entry in entries.items()
    }


def _row_to_json(row: LocalRow) -> dict[str, Any]:
    if row.images is not None or row.tool_images:
        raise ValueError(
            "replay='successes' saves each stored completion in the checkpoint as JSON, and this one holds images, "
            "which it does not save. Use replay='none' with image prompts."
        )
    return {
        "prompt_ids": row.prompt_ids.tolist(),
        "completion_ids": row.completion_ids.tolist(),
        "logprobs": None if row.logprobs is None else row.logprobs.tolist(),
        "completion": row.completion,
        "extra_logs": row.extra_logs,
        "tool_mask": None if row.tool_mask is None else row.tool_mask.tolist(),
        "extra_fields": row.extra_fields,
        "prompt": row.prompt,
        "behaviour_logprob": row.behaviour_logprob,
    }


def _row_from_json(fields: dict[str, Any]) -> LocalRow:
    row = LocalRow.from_lists(
        fields["prompt_ids"],
        fields["completion_ids"],
        fields["completion"],
        fields["logprobs"],
        fields["extra_logs"],
        tool_mask=fields["tool_mask"],
        extra_fields=fields["extra_fields"],
        prompt=fields["prompt"],
    )
    row.behaviour_logprob = fields.get("behaviour_logprob")
    return row


def _plain(value: Any) -> Any:
    """numpy and torch values in a row's logs and fields, as the JSON values they hold."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(
        f"replay='successes' saves each stored completion's fields as JSON, and one holds a {type(value).__name__}. "
        "Return JSON values (numbers, strings, lists, dicts) from reward log_extra and rollout extra fields, or use "
        "replay='none'."
    )
