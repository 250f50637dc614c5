"""What a person reads of each log line: transformers prints the whole metrics dict at every logging step, trl-ada's
accounting included. The console keeps TRL's metrics and a few of trl-ada's; every metric still goes to `log_history`
(the checkpoints' `trainer_state.json`) and to `report_to`."""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback

CONSOLE_ADA_METRICS: tuple[str, ...] = (
    "ada/samples_per_prompt/mean",
    "ada/zero_variance_share/kept",
    "ada/advantages/abs_max",
    "ada/dapo/dropped_share",
)
"""The trl-ada metrics a log line shows (when logged): draws per prompt, the update's share without a signal, the
largest trained advantage and DAPO's drops."""


def console_view(logs: dict[str, Any]) -> dict[str, Any]:
    """`logs` as a log line shows it: every metric but trl-ada's, and those of [`CONSOLE_ADA_METRICS`]."""
    return {key: value for key, value in logs.items() if not key.startswith("ada/") or key in CONSOLE_ADA_METRICS}


class ConciseProgressCallback(ProgressCallback):
    """transformers' progress bar, writing [`console_view`] of each metrics dict."""

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().on_log(args, state, control, logs=console_view(logs or {}), **kwargs)


class ConcisePrinterCallback(PrinterCallback):
    """transformers' printer (with `disable_tqdm`), printing [`console_view`] of each metrics dict."""

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().on_log(args, state, control, logs=None if logs is None else console_view(logs), **kwargs)


def use_concise_console(trainer: Any) -> None:
    """Swap transformers' callbacks that print every metrics dict for the concise ones (exact classes only: a
    callback the user put in its place stays)."""
    swaps: dict[type, type[TrainerCallback]] = {
        ProgressCallback: ConciseProgressCallback,
        PrinterCallback: ConcisePrinterCallback,
    }
    for callback in list(trainer.callback_handler.callbacks):
        replacement = swaps.get(type(callback))
        if replacement is not None:
            trainer.pop_callback(callback)
            trainer.add_callback(replacement())
