"""One weight sync per optimizer step across all of a step's sampling rounds (placeholder; see issue 11 item 3)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def one_weight_sync_per_step(trainer: Any) -> Iterator[None]:
    """Wraps every generate call of one training step's sampling rounds."""
    yield
