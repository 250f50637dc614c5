"""
[`LearnedPassRatePredictor`], the paper's value network `V_φ(x)` (Section 3.1), in pure Python. Every process computes
the same predictions from the same gathered outcomes: features come from a stable hash (CRC-32, not Python's salted
`hash()`), and the updates run in the order of the keys, in plain Python floats.
"""

from __future__ import annotations

import json
import logging
import math
import os
import zlib
from collections.abc import Hashable, Sequence
from typing import Any

from .tracker import DecayedBetaTracker, PassRateEstimator

logger = logging.getLogger(__name__)

PREDICTOR_DIR = "pass_rate_predictor"
"""Sub-folder of a saved model directory that holds the learned predictor (pushed to the Hub with the model)."""

PREDICTOR_FILE = "predictor.json"
"""The learned predictor's file inside [`PREDICTOR_DIR`]: its hashing settings, weights and optimizer state."""

PREDICTOR_CHOICES: tuple[str, ...] = ("tracker", "learned")
"""Named values of `pass_rate_predictor`; anything else is a local directory or a Hub repo id to warm-start from."""

_FORMAT = "trl-ada/learned-pass-rate-predictor"
_VERSION = 1
_MAX_LOGIT = 12.0
"""Logits are clipped to ±12, so a prediction lies in [6e-6, 1 - 6e-6], strictly inside (0, 1)."""
_FEATURE_CACHE_SIZE = 8192


class PromptKey(str):
    """A stable prompt id (compares and hashes as the id string) that carries the prompt's text as `text`; `str(key)`
    is the plain id, so trackers and checkpoints never store the text."""

    text: str

    def __new__(cls, key: str, text: str) -> PromptKey:
        self = super().__new__(cls, key)
        self.text = text
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (PromptKey, (str(self), self.text))


def prompt_text(prompt: Any) -> str:
    """The text a predictor reads from a `prompt` column value: the string itself, or for a conversation each message's
    role and text content, one message a line (image parts are skipped)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence):
        lines = []
        for message in prompt:
            if not isinstance(message, dict):
                lines.append(str(message))
                continue
            content = message.get("content", "")
            if isinstance(content, list):  # multimodal parts: keep the text ones
                content = " ".join(
                    str(part["text"]) for part in content if isinstance(part, dict) and part.get("text") is not None
                )
            lines.append(f"{message.get('role', '')}: {content}")
        return "\n".join(lines)
    return str(prompt)


def key_text(key: Hashable) -> str:
    """The text an estimator reads for `key`: `key.text` for a [`PromptKey`], else the key itself."""
    text = getattr(key, "text", None)
    return text if isinstance(text, str) else str(key)


def calibration(estimates: Sequence[float], totals: Sequence[int], positives: Sequence[int]) -> dict[str, float]:
    """How well estimates made before a step predicted its draws: the mean per-draw log-loss and Brier score (`{}`:
    no draw scored)."""
    draws = sum(totals)
    if draws == 0:
        return {}
    log_loss = brier = 0.0
    for p, n, k in zip(estimates, totals, positives, strict=True):
        log_loss -= k * math.log(p) + (n - k) * math.log1p(-p)
        brier += k * (1.0 - p) ** 2 + (n - k) * p**2
    return {"log_loss": log_loss / draws, "brier": brier / draws}


CALIBRATION_BINS = 10
"""Equal-width bins of predicted pass rate in the reliability diagram (`bin_0` is [0, 0.1), `bin_9` [0.9, 1])."""


def calibration_bins(
    estimates: Sequence[float], totals: Sequence[int], positives: Sequence[int], bins: int = CALIBRATION_BINS
) -> dict[str, float]:
    """
    The reliability diagram's counts for one step, per equal-width bin `K` of the estimate `p` (the last includes 1):
    `bin_K/draws` (scored draws), `bin_K/positives` and `bin_K/predicted` (the sum of `p` over those draws). Every bin
    is reported, zeros included, so sums over any steps give each bin's `predicted / draws` against
    `positives / draws`. Empty when no draw was scored.
    """
    if sum(totals) == 0:
        return {}
    draws, hits, predicted = [0] * bins, [0] * bins, [0.0] * bins
    for p, n, k in zip(estimates, totals, positives, strict=True):
        if n == 0:
            continue
        b = min(int(p * bins), bins - 1)
        draws[b] += n
        hits[b] += k
        predicted[b] += n * p
    metrics: dict[str, float] = {}
    for b in range(bins):
        metrics[f"bin_{b}/draws"] = float(draws[b])
        metrics[f"bin_{b}/positives"] = float(hits[b])
        metrics[f"bin_{b}/predicted"] = predicted[b]
    return metrics


class LearnedPassRatePredictor:
    """Online logistic regression on hashed character n-grams of the prompt text, trained by Adagrad on every scored
    draw (`k` positives of `n` draws are `n` Bernoulli labels). A prompt's prediction `m` is the mean of a Beta prior
    of strength `s = prior_alpha + prior_beta` that its decayed counts update: `p̂ = (K + s·m) / (N + s)`. Implements
    [`~trl_ada.samplers.PassRateEstimator`] plus `beta_parameters` (prior and counts: `round_policy="tracked"`) and
    `prior_parameters` (the prediction alone: `round_policy="predictive"`). `α / (α + β)` is the prediction before any
    training; `num_features` is the size of the hashed (sparse) weight vector; `track_counts=False` keeps no counts."""

    def __init__(
        self,
        decay: float = 0.9,
        prior_alpha: float = 1.0,
        prior_beta: float = 1.0,
        learning_rate: float = 0.1,
        num_features: int = 2**18,
        ngram_range: tuple[int, int] = (1, 4),
        track_counts: bool = True,
    ) -> None:
        if not learning_rate > 0.0 or not math.isfinite(learning_rate):
            raise ValueError(f"learning_rate must be a positive finite number, got {learning_rate}.")
        if num_features < 1:
            raise ValueError(f"num_features must be at least 1, got {num_features}.")
        low, high = ngram_range
        if not 1 <= low <= high:
            raise ValueError(f"ngram_range must be (low, high) with 1 <= low <= high, got {ngram_range}.")
        self.learning_rate = float(learning_rate)
        self.num_features = int(num_features)
        self.ngram_range = (int(low), int(high))
        self.prior_strength = float(prior_alpha + prior_beta)
        self.counts = DecayedBetaTracker(decay, prior_alpha, prior_beta) if track_counts else None
        # Sparse weights and Adagrad accumulators; the bias is `self.bias` (it has no hashed index).
        self.weights: dict[int, float] = {}
        self.accumulators: dict[int, float] = {}
        self.bias = _logit(prior_alpha / (prior_alpha + prior_beta))
        self.bias_accumulator = 0.0
        self.updates = 0
        self.last_metrics: dict[str, float] = {}
        self._features: dict[str, list[tuple[int, float]]] = {}

    def features(self, text: str) -> list[tuple[int, float]]:
        """Hashed n-gram features of `text` as `(index, value)` pairs in first-seen order, scaled to unit L2 norm."""
        cached = self._features.get(text)
        if cached is not None:
            return cached
        framed = f"\x02{text}\x03"
        counts: dict[int, int] = {}
        low, high = self.ngram_range
        for n in range(low, high + 1):
            seed = zlib.crc32(f"{n}\x00".encode())  # a different hash per n-gram length
            for start in range(len(framed) - n + 1):
                index = zlib.crc32(framed[start : start + n].encode(), seed) % self.num_features
                counts[index] = counts.get(index, 0) + 1
        norm = math.sqrt(sum(c * c for c in counts.values())) or 1.0
        features = [(index, c / norm) for index, c in counts.items()]
        if len(self._features) >= _FEATURE_CACHE_SIZE:
            self._features.pop(next(iter(self._features)))
        self._features[text] = features
        return features

    def _logit(self, features: list[tuple[int, float]]) -> float:
        z = self.bias
        weights = self.weights
        for index, value in features:
            z += weights.get(index, 0.0) * value
        return min(max(z, -_MAX_LOGIT), _MAX_LOGIT)

    def predict(self, keys: Sequence[Hashable]) -> list[float]:
        """The model's pass-rate prediction for each key (no per-prompt counts), strictly inside (0, 1)."""
        return [_sigmoid(self._logit(self.features(key_text(key)))) for key in keys]

    def prior_parameters(self, keys: Sequence[Hashable]) -> list[tuple[float, float]]:
        """The Beta prior `(s·m, s·(1-m))` of each key: its prediction `m` with strength `s`."""
        s = self.prior_strength
        return [(s * m, s * (1.0 - m)) for m in self.predict(keys)]

    def beta_parameters(self, keys: Sequence[Hashable]) -> list[tuple[float, float]]:
        """The Beta posterior `(K + s·m, N - K + s·(1-m))` of each key: the prior updated by its decayed counts."""
        priors = self.prior_parameters(keys)
        if self.counts is None:
            return priors
        posterior = []
        for key, (alpha, beta) in zip(keys, priors, strict=True):
            total, hits = self.counts.counts.get(str(key), (0.0, 0.0))
            posterior.append((alpha + hits, beta + total - hits))
        return posterior

    def estimate(self, keys: Sequence[Hashable]) -> list[float]:
        return [alpha / (alpha + beta) for alpha, beta in self.beta_parameters(keys)]

    def update(self, keys: Sequence[Hashable], totals: Sequence[int], positives: Sequence[int]) -> None:
        """One Adagrad step per prompt, in the order of `keys`, on the binomial log-likelihood of its `positives` of
        `totals` scored draws, then the decayed counts. `last_metrics`: the calibration of the predictions made before
        it (`model_log_loss`, `model_brier`) and, with counts, the share of first visits (`first_visit_share`)."""
        keys = list(keys)
        first_visits = (
            sum(str(key) not in self.counts.counts for key in keys) / len(keys) if self.counts and keys else None
        )
        features = [self.features(key_text(key)) for key in keys]
        before = [_sigmoid(self._logit(f)) for f in features]
        metrics = {f"model_{name}": value for name, value in calibration(before, totals, positives).items()}
        if first_visits is not None:
            metrics["first_visit_share"] = first_visits
        lr = self.learning_rate
        for feature, n, k in zip(features, totals, positives, strict=True):
            gradient = n * _sigmoid(self._logit(feature)) - k  # d(-log-likelihood) / d(logit)
            if n == 0 or gradient == 0.0:
                continue
            self.bias_accumulator += gradient * gradient
            self.bias -= lr * gradient / math.sqrt(self.bias_accumulator)
            for index, value in feature:
                g = gradient * value
                accumulated = self.accumulators.get(index, 0.0) + g * g
                if accumulated == 0.0:  # g underflowed to 0
                    continue
                self.accumulators[index] = accumulated
                self.weights[index] = self.weights.get(index, 0.0) - lr * g / math.sqrt(accumulated)
        if self.counts is not None:
            self.counts.update(keys, totals, positives)
        self.updates += 1
        self.last_metrics = metrics

    def model_state(self) -> dict[str, Any]:
        """The model alone (hashing settings, weights, Adagrad state): what [`save_pretrained`] writes. JSON-safe."""
        indices = sorted(self.weights)
        return {
            "format": _FORMAT,
            "version": _VERSION,
            "num_features": self.num_features,
            "ngram_range": list(self.ngram_range),
            "learning_rate": self.learning_rate,
            "bias": self.bias,
            "bias_accumulator": self.bias_accumulator,
            "updates": self.updates,
            "indices": indices,
            "weights": [self.weights[i] for i in indices],
            "accumulators": [self.accumulators[i] for i in indices],
        }

    def load_model_state(self, state: dict[str, Any], *, keep_learning_rate: bool = False) -> None:
        """Load what [`model_state`] returned (`keep_learning_rate`: keep this object's step size)."""
        if state.get("format") != _FORMAT or state.get("version") != _VERSION:
            raise ValueError(
                f"not a learned pass-rate predictor of this version (format {state.get('format')!r}, version "
                f"{state.get('version')!r}; expected {_FORMAT!r}, version {_VERSION})"
            )
        self.num_features = int(state["num_features"])
        self.ngram_range = (int(state["ngram_range"][0]), int(state["ngram_range"][1]))
        if not keep_learning_rate:
            self.learning_rate = float(state["learning_rate"])
        self.bias = float(state["bias"])
        self.bias_accumulator = float(state["bias_accumulator"])
        self.updates = int(state["updates"])
        indices = [int(i) for i in state["indices"]]
        self.weights = dict(zip(indices, map(float, state["weights"]), strict=True))
        self.accumulators = dict(zip(indices, map(float, state["accumulators"]), strict=True))
        self._features = {}

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"model": self.model_state()}
        if self.counts is not None:
            state["counts"] = self.counts.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from what [`state_dict`] returned, keeping this object's learning rate (the run's)."""
        saved = float(state["model"].get("learning_rate", self.learning_rate))
        if saved != self.learning_rate:
            logger.info(
                "Resuming the learned pass-rate predictor with learning rate %g (pass_rate_predictor_learning_rate); "
                "the checkpoint was trained with %g.",
                self.learning_rate,
                saved,
            )
        self.load_model_state(state["model"], keep_learning_rate=True)
        if self.counts is not None:
            self.counts.load_state_dict(state.get("counts", {"counts": {}}))

    def save_pretrained(self, directory: str | os.PathLike[str]) -> str:
        """Write the model to `directory/predictor.json` (the per-prompt counts are training state, not the model)."""
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, PREDICTOR_FILE)
        with open(path, "w") as f:
            json.dump(self.model_state(), f)
        return path

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike[str], **kwargs: Any) -> LearnedPassRatePredictor:
        """A predictor warm-started from a saved model directory (or its `pass_rate_predictor/` sub-folder): its
        weights, Adagrad state and hashing settings, with this run's `kwargs` and empty per-prompt counts."""
        path = find_predictor_file(directory)
        if path is None:
            raise ValueError(
                f"{os.fspath(directory)!r} holds no learned pass-rate predictor ({PREDICTOR_DIR}/{PREDICTOR_FILE} or "
                f"{PREDICTOR_FILE}). Point pass_rate_predictor at a model saved by a run with "
                "pass_rate_predictor='learned', or use 'learned' to start from scratch."
            )
        try:
            with open(path) as f:
                state = json.load(f)
            predictor = cls(**kwargs)
            predictor.load_model_state(state, keep_learning_rate="learning_rate" in kwargs)
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise ValueError(f"cannot load the learned pass-rate predictor {path}: {error}") from error
        return predictor


def find_predictor_file(directory: str | os.PathLike[str]) -> str | None:
    """`directory/pass_rate_predictor/predictor.json` or `directory/predictor.json`, whichever exists, else `None`."""
    for path in (os.path.join(directory, PREDICTOR_DIR, PREDICTOR_FILE), os.path.join(directory, PREDICTOR_FILE)):
        if os.path.isfile(path):
            return path
    return None


def build_pass_rate_estimator(settings: Any, source: str | None = None) -> PassRateEstimator:
    """The estimator `settings.pass_rate_predictor` names: `"tracker"` a [`DecayedBetaTracker`], `"learned"` a fresh
    [`LearnedPassRatePredictor`], a local directory a predictor warm-started from it. `source`: the local directory to
    load instead (the snapshot of a Hub id)."""
    choice = settings.pass_rate_predictor
    decay, alpha, beta = settings.pass_rate_decay, settings.pass_rate_prior_alpha, settings.pass_rate_prior_beta
    if choice == "tracker":
        return DecayedBetaTracker(decay, alpha, beta)
    kwargs: dict[str, Any] = {
        "decay": decay,
        "prior_alpha": alpha,
        "prior_beta": beta,
        "learning_rate": settings.pass_rate_predictor_learning_rate,
        # The predictive round policy has no memory of prompts: it reads the prediction alone.
        "track_counts": not (settings.reads("round_policy") and settings.round_policy == "predictive"),
    }
    if choice == "learned":
        return LearnedPassRatePredictor(**kwargs)
    directory = source if source is not None else choice
    if not os.path.isdir(directory):
        raise ValueError(
            f"pass_rate_predictor={choice!r} is not a local directory. A Hub repo id is downloaded by AdaGRPOTrainer "
            "(trl_ada.predictor_hub.resolve_pass_rate_predictor); outside the trainer pass a local directory."
        )
    return LearnedPassRatePredictor.from_pretrained(directory, **kwargs)


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


def _logit(p: float) -> float:
    p = min(max(p, 1e-6), 1.0 - 1e-6)
    return math.log(p / (1.0 - p))
