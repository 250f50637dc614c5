"""
The intra-op thread count torch uses when a trainer runs on CPU, unless the user chose one: torch starts with one
thread per physical core, whatever share of the machine the process may use, and a small model's operations are too
short to be worth splitting (`benchmarks/cpu_threads.py` compares against torch's own count).
"""

from __future__ import annotations

import logging
import os

import torch

logger = logging.getLogger(__name__)

SMALL_MODEL_PARAMETERS = 5_000_000
"""Models with fewer parameters than this train on one thread on CPU (see `benchmarks/cpu_threads.py`)."""

THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
"""Environment variables through which a user sets torch's thread count (torch reads them at start-up)."""

THREADS_AT_IMPORT = torch.get_num_threads()
"""torch's thread count when trl-ada first imported this module: a later `torch.set_num_threads` call changes it."""

_applied: int | None = None
"""The count [`apply_cpu_thread_default`] last set: still in place, it is trl-ada's choice, not the user's."""


def user_set_threads() -> bool:
    """Whether the user chose torch's thread count: through [`THREAD_ENV_VARS`], or with `torch.set_num_threads`,
    seen as a count that differs from [`THREADS_AT_IMPORT`] or from torch's default (which its inter-op pool keeps)."""
    if any(os.environ.get(name, "").strip() for name in THREAD_ENV_VARS):
        return True
    current = torch.get_num_threads()
    if _applied is not None and current == _applied:
        return False
    return current != THREADS_AT_IMPORT or current != torch.get_num_interop_threads()


def cpu_training_threads(num_parameters: int, current: int, available: int) -> int:
    """The thread count for training a model of `num_parameters` on CPU: one for a small model (below
    [`SMALL_MODEL_PARAMETERS`]), otherwise torch's `current` count capped at the `available` CPUs."""
    if num_parameters < SMALL_MODEL_PARAMETERS:
        return 1
    return max(1, min(current, available))


def apply_cpu_thread_default(model: torch.nn.Module, device: torch.device) -> int | None:
    """Set torch's thread count for training `model` on `device` by [`cpu_training_threads`], when the device is the
    CPU and the user chose no count ([`user_set_threads`]). Returns the count set, or `None` when it is left alone."""
    global _applied
    if device.type != "cpu" or user_set_threads():
        return None
    from ..rewards.code import available_cpus

    # Not the user's: either torch's own count, or one this function set for an earlier trainer's model.
    threads = cpu_training_threads(sum(p.numel() for p in model.parameters()), THREADS_AT_IMPORT, available_cpus())
    if threads != torch.get_num_threads():
        torch.set_num_threads(threads)
    if threads != THREADS_AT_IMPORT:
        logger.info(
            "Training on CPU with %d torch thread(s) instead of torch's %d (a small model, or fewer CPUs available). "
            "Set OMP_NUM_THREADS or call torch.set_num_threads to choose the count yourself.",
            threads,
            THREADS_AT_IMPORT,
        )
    _applied = threads
    return threads
