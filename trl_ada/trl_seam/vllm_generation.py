"""TRL's vLLM client (`VLLMClient`) and generation (`VLLMGeneration`): the `/v1/completions` request server-mode
generation sends (built without sending, or answered with completions already drawn), the broadcast by which the main
process hands the completions to the other processes, and a colocated engine's sleep mode. Rows of `TOUCHPOINTS` in
`tests/test_trl_touchpoints.py`."""

from __future__ import annotations

import contextlib
from typing import Any

from .batch_dispatch import _raise_where_waiting


def server_sampling_params(generation: Any) -> dict[str, Any]:
    """The sampling parameters `VLLMGeneration.generate` passes to `VLLMClient.generate` in server mode."""
    return {
        "repetition_penalty": generation.repetition_penalty,
        "temperature": generation.temperature,
        "top_p": generation.top_p,
        "top_k": generation.top_k,
        "min_p": 0.0 if generation.min_p is None else generation.min_p,
        "max_tokens": generation.max_completion_length,
        "logprobs": generation.logprobs,
        "structured_outputs_regex": generation.structured_outputs_regex,
        "generation_kwargs": generation.generation_kwargs,
    }


class _Captured(Exception):
    def __init__(self, payload: dict[str, Any]) -> None:
        super().__init__("captured")
        self.payload = payload


def completions_payload(client: Any, sampling_params: dict[str, Any], prompt_ids: list[int]) -> dict[str, Any]:
    """The `/v1/completions` body `VLLMClient.generate` builds for one prompt and `n=1` (nothing is sent)."""

    def capture(url: str, **kwargs: Any) -> dict:
        raise _Captured(kwargs["json"])

    client._post = capture  # an instance attribute shadows the method for this call only
    try:
        client.generate(prompts=[prompt_ids], n=1, **sampling_params)
    except _Captured as captured:
        return captured.payload
    finally:
        del client._post
    raise RuntimeError("VLLMClient.generate sent no /v1/completions request; this TRL release is not supported.")


@contextlib.contextmanager
def replayed_completions(
    client: Any,
    payload: dict[str, Any],
    prompt_ids: list[list[int]],
    choices: list[dict],
    mismatches: list[BaseException] | None = None,
):
    """Inside the block, the client's next `/v1/completions` request (TRL's server-mode generation) is answered with
    `choices` (already generated) instead of being sent. The request must ask for exactly `prompt_ids` with `n=1`
    and `payload`'s sampling parameters, or it raises; with `mismatches`, the error is appended there instead and
    `choices` are answered anyway, so the other processes' completions broadcast completes."""
    original = client._post
    expected = {key: value for key, value in payload.items() if key != "prompt"}

    def replay(url: str, **kwargs: Any) -> dict:
        if not url.endswith("/v1/completions"):
            return original(url, **kwargs)
        sent = kwargs["json"]
        differing = sorted(k for k in {*sent, *expected} - {"prompt"} if sent.get(k) != expected.get(k))
        error = None
        if sent.get("prompt") != prompt_ids:
            error = RuntimeError("TRL asked the server for other prompts than the draws being replayed.")
        elif differing:
            error = RuntimeError(f"TRL's request differs from the continuous draws' in {differing}.")
        if error is not None:
            if mismatches is None:
                raise error
            mismatches.append(error)
            # One placeholder per row asked for: what the other processes receive must have the request's shape.
            return {"choices": [choices[i % len(choices)] for i in range(len(sent.get("prompt") or ()))]}
        return {"choices": choices}

    client._post = replay
    try:
        yield
    finally:
        del client._post


def colocated_sleep_mode_vllm(trainer: Any) -> Any | None:
    """The trainer's `VLLMGeneration` when it runs vLLM in this process (`vllm_mode="colocate"`) with sleep mode on."""
    if not getattr(trainer, "use_vllm", False) or getattr(trainer, "vllm_mode", None) != "colocate":
        return None
    generation = trainer.vllm_generation
    return generation if generation.enable_sleep_mode else None


def vllm_engine(generation: Any) -> Any:
    """The in-process vLLM `LLM` of a colocated `VLLMGeneration` (whose `sleep`/`wake_up` TRL calls)."""
    return generation.llm


def set_vllm_sleep_mode(generation: Any, enabled: bool) -> None:
    """Switch `VLLMGeneration`'s sleep handling (waking, re-syncing and putting the engine to sleep) on or off."""
    generation.enable_sleep_mode = enabled


def set_vllm_weights_sleeping(generation: Any, sleeping: bool) -> None:
    """Record whether the engine's weights were discarded (the next `generate` re-syncs them first when True)."""
    generation._llm_weights_sleeping = sleeping


SERVER_COMPLETIONS_BROADCAST_ITEMS = 1
"""How many objects TRL's `VLLMGeneration.generate` (server mode) broadcasts from the main process with the completions
(one payload tuple), which every other process waits to receive while the main process's request is in flight."""


def fail_the_processes_waiting_for_completions(error: BaseException) -> None:
    """On the main process, when a request of TRL's server-mode `VLLMGeneration.generate` failed: make every other
    process raise `error` where it waits for that request's completions."""
    _raise_where_waiting(error, SERVER_COMPLETIONS_BROADCAST_ITEMS, None)


__all__ = [
    "colocated_sleep_mode_vllm",
    "completions_payload",
    "replayed_completions",
    "server_sampling_params",
    "set_vllm_sleep_mode",
    "set_vllm_weights_sleeping",
    "vllm_engine",
]
