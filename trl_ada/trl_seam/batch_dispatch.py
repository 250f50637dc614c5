"""accelerate's batch dispatch (`DataLoaderDispatcher`), on which TRL's asynchronous trainer relies: whether a data
loader dispatches, and the broadcast by which the main process makes every process waiting for a batch (or, through
`vllm_generation`, for completions) raise its error. Rows of `ASYNC_TOUCHPOINTS` in
`tests/test_trl_async_touchpoints.py`; the broadcast's object count: `tests/test_trl_seam.py`."""

from __future__ import annotations

from typing import Any

DISPATCHED_BATCH_INFO_ITEMS = 2
"""How many objects accelerate's `DataLoaderDispatcher._fetch_batches` broadcasts from the main process per batch (the
batch's structure and the stop flag), which every other process waits to receive."""


def batches_are_dispatched(dataloader: Any) -> bool:
    """Whether `dataloader` (prepared by accelerate) hands every process its slice of batches the main process
    fetches (`DataLoaderDispatcher`), as TRL's asynchronous trainer needs: its other processes have no data."""
    from accelerate.data_loader import DataLoaderDispatcher

    return isinstance(dataloader, DataLoaderDispatcher)


def _raise_received(error_type: type[BaseException], args: tuple, attributes: dict[str, Any]) -> None:
    error = error_type(*args)
    error.__dict__.update(attributes)
    raise error


class _RaisedWhenReceived:
    """An error sent in a broadcast: unpickling it (in each receiving process) raises a copy of it there."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __reduce__(self) -> tuple:
        return _raise_received, (type(self.error), self.error.args, dict(vars(self.error)))


def _raise_where_waiting(error: BaseException, items: int, filler: Any) -> None:
    """Send, in a broadcast of `items` objects from the main process, the one whose unpickling raises `error`."""
    from accelerate.utils import broadcast_object_list

    broadcast_object_list([_RaisedWhenReceived(error)] + [filler] * (items - 1), from_process=0)


def fail_the_processes_waiting_for_a_batch(error: BaseException) -> None:
    """On the main process, while it fetches a batch from TRL's rollout queue: make every other process raise
    `error` (its type, arguments and attributes) where it waits for that batch, in the dispatcher's broadcast of the
    batch's structure. The main process raises `error` itself after this."""
    _raise_where_waiting(error, DISPATCHED_BATCH_INFO_ITEMS, True)
