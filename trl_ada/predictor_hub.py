"""The Hub download behind `pass_rate_predictor=<repo id>`: the predictor (`trl_ada.samplers.predictor`) loads only
local directories, so a Hub repo's `pass_rate_predictor/` is fetched first and `AdaGRPOTrainer` hands the sampler the
local snapshot.
"""

from __future__ import annotations

import os

from .samplers import SamplerSettings
from .samplers.predictor import PREDICTOR_CHOICES, PREDICTOR_DIR, PREDICTOR_FILE


def resolve_pass_rate_predictor(settings: SamplerSettings) -> str | None:
    """
    The local snapshot of `pass_rate_predictor/` of the Hub repo id `settings.pass_rate_predictor` names; `None` for
    "tracker", "learned" and a local directory. Raises `ValueError` naming the repo when it cannot be downloaded.
    """
    source = settings.pass_rate_predictor
    if source in PREDICTOR_CHOICES or os.path.exists(source):
        return None
    from huggingface_hub import snapshot_download

    try:
        local = snapshot_download(source, allow_patterns=[f"{PREDICTOR_DIR}/*", PREDICTOR_FILE])
    except Exception as error:
        raise ValueError(
            f"pass_rate_predictor={source!r} is not a local directory, and downloading it as a Hub repo failed "
            f"({type(error).__name__}: {error}). Fix the path or repo id, or use pass_rate_predictor='learned'."
        ) from error
    return local
