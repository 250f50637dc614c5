"""
The check of a model's name before anything loads it: a local directory, or a well-formed Hub id (not looked up),
so a missing local path is one line instead of huggingface_hub's chained tracebacks about a repo id's form.
"""

from __future__ import annotations

import os

from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id


def model_name_error(name: str, what: str = "model") -> str | None:
    """Why `name` can name no model (`what` says which one, e.g. `--model_name_or_path`), or `None` when it is an
    existing directory or has the form of a Hub id."""
    if os.path.isdir(name):
        return None
    try:
        validate_repo_id(name)
    except HFValidationError:
        kind = "a file, not a model directory" if os.path.exists(name) else f"no directory {name}"
        return (
            f"{what} {name!r}: {kind}, and it is not a Hub id ('org/name'). Pass a directory saved with "
            "save_pretrained, or the id of a model on the Hub."
        )
    return None


def check_model_name(name: str, what: str = "model") -> None:
    """Raise `ValueError` with [`model_name_error`]'s one line when `name` can name no model."""
    if (error := model_name_error(name, what)) is not None:
        raise ValueError(error)
