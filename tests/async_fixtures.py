"""Test fixtures that let TRL's asynchronous trainer (`trl.experimental.async_grpo.AsyncGRPOTrainer`) train on CPU.

The real setup needs a vLLM server (generation, `--logprobs-mode processed_logprobs`), an NCCL weight transfer into
it (`WeightTransferClient`) and a spawned rollout child (`AsyncRolloutWorker`, which refuses to start without vLLM).
None of them runs on CPU CI, so these fixtures stand in, through the trainer's own seams (`rollout_worker=` and
`weight_transfer=`, which TRL's tests use too):

- [`FakeCompletionsServer`]: a real HTTP server (background thread) that answers `POST /v1/completions` the way vLLM
  does for `_AsyncRolloutLoop._generate_one_turn`, by SAMPLING from a real transformers causal LM it holds (seeded by
  the request's `seed`, stopping at eos; the log-probs are those of the sampled tokens under the processed,
  temperature-scaled and top-k/top-p-filtered distribution). It also serves `GET /health` and `GET /v1/models` (the
  trainer asks them when `token_budget` is unset), `GET /server_info` and `POST /pause`, `/resume`. It records every
  request, can delay an answer per completion token (so short completions return first, as on an engine), and swaps
  its weights with [`FakeCompletionsServer.load_state_dict`] (thread-safe; counted in `weight_version`).
- [`FaultyServer`]: the fake server, able to die, freeze (`/v1/completions` never answers) or stop (nothing
  answers, as a SIGSTOPped server), for the fault tests.
- [`InProcessWeightTransfer`]: TRL's `WeightTransferProtocol`, loading the tensors the trainer streams
  (`_iter_vllm_named_params` names, which are the HF model's own parameter names) into the fake server's model, so
  the served policy really changes at every sync.
- [`ThreadRolloutWorker`]: TRL's `RolloutWorkerProtocol`, running a rollout loop class (default TRL's own
  `_AsyncRolloutLoop`; a subclass may be passed) in a THREAD of the test process instead of a spawned child.
  [`trainer_loop_kwargs`] builds the keyword arguments exactly as `AsyncGRPOTrainer.__init__` passes them to
  `AsyncRolloutWorker(...)`.
- [`chat_tokenizer`], [`conversational`]: `_AsyncRolloutLoop` renders every prompt through the tokenizer's chat
  template and parses every completion with a response template; the character tokenizer of `trl_ada.tiny` has
  neither, so a copy gets the smallest honest pair (the template renders the message contents verbatim, so the model
  sees exactly the plain-text prompts it was trained on).

The model everything runs on is `trl_ada.tiny.load_tiny_arith_model()`; see `tests/test_async_cpu.py` for the
construction that trains.
"""

from __future__ import annotations

import copy
import inspect
import json
import math
import multiprocessing as mp
import os
import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch
from transformers import DynamicCache

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # these fixtures are about trl.experimental; no warning
from trl.experimental.async_grpo.async_rollout_worker import AsyncRolloutWorker

# ---------------------------------------------------------------------------------------------------------------------
# What the trainer needs on CPU
# ---------------------------------------------------------------------------------------------------------------------


def peak_flops_without_cuda(accelerator: Any, dtype: str) -> float | None:
    """`get_peak_flops_per_device` for any device: TRL 1.16's calls `torch.cuda.get_device_name(accelerator.device)`
    unconditionally (from `AsyncGRPOTrainer.__init__`), which raises on a CPU-only torch. Off CUDA the peak is unknown,
    which TRL already handles (`None`: MFU metrics off, throughput and timings still logged)."""
    from trl.trainer.utils import get_peak_flops_per_device

    if getattr(accelerator.device, "type", str(accelerator.device)) != "cuda":
        return None
    return get_peak_flops_per_device(accelerator, dtype)


def allow_cpu_training(monkeypatch: Any) -> None:
    """Everything TRL's `AsyncGRPOTrainer` needs to build and train on CPU, given a pytest `monkeypatch`:

    - `"tree_fa3"` attention is the plain-torch version (`trl_ada.async_grpo.tree_attention`), which also survives the
      `register_tree_attention()` that the trainer's `__init__` calls; it is installed for the process (idempotent)
      since transformers looks the function up at every forward;
    - the trainer module's `get_peak_flops_per_device` is [`peak_flops_without_cuda`] (undone after the test).

    The config should still ask for CPU in float32: `use_cpu=True, bf16=False` and the default `dtype="float32"`.
    (`AsyncGRPOConfig` defaults `bf16` to True; on CPU that trains too, under bf16 autocast, and the trainer's
    log-probs then match the server's float32 ones only to ~1e-4.)
    """
    import trl.experimental.async_grpo.async_grpo_trainer as trainer_module

    from trl_ada.async_grpo.tree_attention import use_cpu_tree_attention_if_no_kernel

    use_cpu_tree_attention_if_no_kernel()
    monkeypatch.setattr(trainer_module, "get_peak_flops_per_device", peak_flops_without_cuda)


# ---------------------------------------------------------------------------------------------------------------------
# Chat template and dataset shape
# ---------------------------------------------------------------------------------------------------------------------

PLAIN_CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
"""Renders a conversation as its message contents, concatenated; no generation prompt. For one user message this is
the plain-text prompt itself, which is the format the tiny arithmetic model was fine-tuned on."""


def plain_response_template(eos_token: str) -> dict[str, Any]:
    """A transformers `response_template` (read by `tokenizer.parse_response`, which TRL's loop calls on every
    completion): everything up to the first `eos_token` is the assistant message's content."""
    return {
        "defaults": {"role": "assistant"},
        "fields": {"content": {"close_pattern": f"{eos_token}\\s*", "content": "text"}},
    }


def chat_tokenizer(tokenizer: Any) -> Any:
    """A deep copy of `tokenizer` with [`PLAIN_CHAT_TEMPLATE`] and [`plain_response_template`] set (the original is
    left unchanged). Without a response template `_AsyncRolloutLoop.__init__` calls TRL's `add_response_schema`, which
    raises on any chat template it does not recognise; without a chat template `apply_chat_template` raises."""
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = PLAIN_CHAT_TEMPLATE
    tokenizer.response_template = plain_response_template(tokenizer.eos_token)
    return tokenizer


def conversational(dataset: Any, column: str = "prompt") -> Any:
    """`dataset` with each plain-text `column` value turned into a one-message conversation
    (`[{"role": "user", "content": text}]`), the prompt shape `_AsyncRolloutLoop` expects (it appends the assistant
    message to it). Other columns are kept and reach the reward functions as keyword arguments."""
    return dataset.map(lambda row: {column: [{"role": "user", "content": row[column]}]})


# ---------------------------------------------------------------------------------------------------------------------
# Fake vLLM completions server
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class CompletionRecord:
    """One `/v1/completions` request, as the server saw and answered it."""

    prompt_ids: list[int]
    seed: int | None
    params: dict[str, Any]
    """The request's sampling fields (`max_tokens`, `temperature`, `top_p`, `top_k`, `min_p`, `model`, ...)."""
    arrived_at: float
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    weight_version: int = -1
    """`FakeCompletionsServer.weight_version` the completion was sampled under (one version per request)."""
    answered_at: float | None = None
    error: str | None = None


class FakeCompletionsServer:
    """A vLLM stand-in over real HTTP that samples from a transformers causal LM (see the module docstring).

    Args:
        model: A causal LM (e.g. the tiny Qwen2). The server owns it from here on: it is put in eval mode with
            gradients off, and [`load_state_dict`] writes into it.
        tokenizer: Optional; only used to fill each choice's `text` field (decoded without special tokens).
        eos_token_ids: Tokens that end a completion (included in `token_ids`, as vLLM returns them). Default: the
            model's `generation_config.eos_token_id` (or its config's).
        seconds_per_token: Each answer is held back `seconds_per_token * len(completion)` after sampling, outside any
            lock, so concurrent requests with shorter completions are answered first.
        max_model_len: Reported by `GET /v1/models`; prompt + completion never exceed it.
        model_name: The served model's id in `GET /v1/models` (requests' `model` field is recorded, not checked).

    Attributes:
        requests: Every completion request, in arrival order ([`CompletionRecord`]).
        weight_version: How many times [`load_state_dict`] swapped the weights (0: as constructed).
        paused: Whether [`pause`] holds new generations back.

    Use as a context manager, or call [`close`].
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any = None,
        *,
        eos_token_ids: Iterable[int] | None = None,
        seconds_per_token: float = 0.0,
        max_model_len: int = 512,
        model_name: str = "fake-tiny",
    ):
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        if eos_token_ids is None:
            eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
            eos = model.config.eos_token_id if eos is None else eos
            eos_token_ids = [eos] if isinstance(eos, int) else list(eos or [])
        self.eos_token_ids = set(eos_token_ids)
        self.seconds_per_token = seconds_per_token
        self.max_model_len = max_model_len
        self.model_name = model_name
        # transformers renamed `past_key_values` to `cache` (5.x; the old name warns, then goes in 5.40)
        self._cache_kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self.requests: list[CompletionRecord] = []
        self.weight_version = 0
        self._weights_lock = threading.Lock()  # one request's sampling, or one weight swap, at a time
        self._records_lock = threading.Lock()
        self._running = threading.Event()  # cleared while paused
        self._running.set()
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True, name="fake-completions-server")
        self._thread.start()

    # -- lifecycle ----------------------------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """`http://127.0.0.1:<port>`: pass it as `AsyncGRPOConfig(vllm_server_base_url=...)`."""
        return f"http://127.0.0.1:{self._http.server_address[1]}"

    def close(self) -> None:
        self._running.set()  # never leave a handler thread parked on a pause
        self._http.shutdown()
        self._http.server_close()

    def __enter__(self) -> FakeCompletionsServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- weights ------------------------------------------------------------------------------------------------------

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    def pause(self) -> None:
        """Hold back generations that have not started yet (running ones finish under the current weights)."""
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Copy `state_dict`'s tensors into the served model (names as in `model.state_dict()`; a subset is fine,
        e.g. without a tied `lm_head.weight`; an unknown name or shape raises before anything is written). Waits for
        the running generation, so every request is sampled under exactly one [`weight_version`]."""
        with self._weights_lock:
            own = self.model.state_dict()
            unknown = sorted(set(state_dict) - set(own))
            if unknown:
                raise KeyError(f"not parameters of the served model: {unknown[:5]}{'...' if len(unknown) > 5 else ''}")
            for name, tensor in state_dict.items():
                if tuple(tensor.shape) != tuple(own[name].shape):
                    raise ValueError(f"{name}: shape {tuple(tensor.shape)} != served {tuple(own[name].shape)}")
            with torch.no_grad():
                for name, tensor in state_dict.items():
                    own[name].copy_(tensor.to(device=own[name].device, dtype=own[name].dtype))
            self.weight_version += 1

    # -- sampling -----------------------------------------------------------------------------------------------------

    @staticmethod
    def processed_logprobs(
        logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0, min_p: float | None = None
    ) -> torch.Tensor:
        """Log-probabilities of the distribution a token is sampled from (vLLM's `processed_logprobs`): logits
        divided by `temperature` (greedy below 1e-5: scaled by 1), then top-k (`<= 0`: off), top-p (`1.0`: off) and
        min-p (`None`/`0`: off) filtering, renormalised."""
        logits = logits.float() / (temperature if temperature >= 1e-5 else 1.0)
        if top_k and top_k > 0 and top_k < logits.shape[-1]:
            kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, -math.inf)
        if top_p is not None and top_p < 1.0:
            sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
            probs = torch.softmax(sorted_logits, dim=-1)
            drop = probs.cumsum(dim=-1) - probs > top_p  # keep the smallest prefix whose mass reaches top_p
            logits = logits.masked_fill(drop.scatter(-1, order, drop), -math.inf)
        if min_p:
            probs = torch.softmax(logits, dim=-1)
            logits = logits.masked_fill(probs < min_p * probs.max(dim=-1, keepdim=True).values, -math.inf)
        return torch.log_softmax(logits, dim=-1)

    def sample(
        self,
        prompt_ids: list[int],
        *,
        max_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float | None = None,
        seed: int | None = None,
    ) -> tuple[list[int], list[float], int]:
        """Sample one completion of `prompt_ids` (with a KV cache), seeded by `seed` (unseeded: a fresh random seed).
        Returns `(token ids, their processed log-probs, weight_version)`; stops after an eos token or `max_tokens`."""
        max_tokens = min(max_tokens, self.max_model_len - len(prompt_ids))
        if max_tokens <= 0:
            raise ValueError(
                f"prompt of {len(prompt_ids)} tokens leaves no room in max_model_len={self.max_model_len}"
            )
        generator = torch.Generator().manual_seed(seed if seed is not None else int(torch.seed()))
        self._running.wait()
        with self._weights_lock, torch.no_grad():
            device = next(self.model.parameters()).device
            inputs = torch.tensor([prompt_ids], device=device)
            cache = {self._cache_kwarg: DynamicCache(config=self.model.config)}  # filled in place at each forward
            tokens, logprobs = [], []
            for _ in range(max_tokens):
                out = self.model(input_ids=inputs, use_cache=True, **cache)
                logp = self.processed_logprobs(out.logits[0, -1], temperature, top_k, top_p, min_p)
                if temperature < 1e-5:
                    token = int(logp.argmax())
                else:
                    token = int(torch.multinomial(logp.exp().cpu(), 1, generator=generator))
                tokens.append(token)
                logprobs.append(float(logp[token]))
                if token in self.eos_token_ids:
                    break
                inputs = torch.tensor([[token]], device=device)
            return tokens, logprobs, self.weight_version

    def score(self, prompt_ids: list[int], completion_ids: list[int], temperature: float = 1.0) -> list[float]:
        """Processed log-probs (no top-k/top-p) of `completion_ids` after `prompt_ids` under the CURRENT weights."""
        with self._weights_lock, torch.no_grad():
            device = next(self.model.parameters()).device
            ids = torch.tensor([list(prompt_ids) + list(completion_ids)], device=device)
            logits = self.model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1]
            logp = self.processed_logprobs(logits, temperature)
            return logp.gather(-1, torch.tensor(completion_ids, device=device)[:, None])[:, 0].tolist()

    # -- HTTP ---------------------------------------------------------------------------------------------------------

    def _complete(self, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        prompt = payload.get("prompt")
        if not (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
            return 400, {"error": "this server takes `prompt` as one list of token ids"}
        if payload.get("n", 1) != 1:
            return 400, {"error": "this server samples n=1 per request"}
        if payload.get("repetition_penalty", 1.0) != 1.0:
            return 400, {"error": "repetition_penalty is not implemented"}
        params = {k: v for k, v in payload.items() if k not in ("prompt", "seed")}
        record = CompletionRecord(list(prompt), payload.get("seed"), params, arrived_at=time.time())
        with self._records_lock:
            self.requests.append(record)
        try:
            tokens, logprobs, version = self.sample(
                record.prompt_ids,
                max_tokens=int(payload.get("max_tokens", 16)),
                temperature=float(payload.get("temperature", 1.0)),
                top_p=float(payload.get("top_p", 1.0)),
                top_k=int(payload.get("top_k", 0) or 0),
                min_p=payload.get("min_p"),
                seed=record.seed,
            )
        except Exception as error:  # noqa: BLE001 - answered as vLLM would, and kept on the record
            record.error = f"{type(error).__name__}: {error}"
            return 400, {"error": record.error}
        record.completion_ids, record.logprobs, record.weight_version = tokens, logprobs, version
        if self.seconds_per_token:
            time.sleep(self.seconds_per_token * len(tokens))
        record.answered_at = time.time()
        text = self.tokenizer.decode(tokens, skip_special_tokens=True) if self.tokenizer is not None else ""
        choice = {
            "index": 0,
            "text": text,
            "token_ids": tokens,
            "finish_reason": "stop" if tokens and tokens[-1] in self.eos_token_ids else "length",
            "logprobs": {
                "tokens": [f"token_id:{t}" for t in tokens],
                "token_logprobs": logprobs,
                "top_logprobs": [None] * len(tokens),
            },
        }
        if payload.get("return_token_ids"):
            choice["prompt_token_ids"] = record.prompt_ids
        return 200, {"id": f"cmpl-{len(self.requests)}", "object": "text_completion", "choices": [choice]}

    def _get(self, path: str) -> tuple[int, dict[str, Any]]:
        if path == "/health":
            return 200, {}
        if path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": self.model_name, "max_model_len": self.max_model_len}]}
        if path == "/server_info":  # what `VLLMClient.get_dtype` / `get_server_info` read
            dtype = str(next(self.model.parameters()).dtype)
            return 200, {
                "vllm_config": {
                    "model_config": {"dtype": dtype},
                    "lora_config": None,
                    "parallel_config": {"data_parallel_size": 1},
                }
            }
        return 404, {"error": f"GET {path} is not served"}

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as aiohttp's pooled connections expect

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                self._reply(*server._get(self.path.split("?", 1)[0].rstrip("/")))

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                path = self.path.split("?", 1)[0].rstrip("/")
                if path == "/v1/completions":
                    self._reply(*server._complete(json.loads(body)))
                elif path == "/pause":
                    server.pause()
                    self._reply(200, {})
                elif path == "/resume":
                    server.resume()
                    self._reply(200, {})
                else:
                    self._reply(404, {"error": f"POST {path} is not served"})

            def _reply(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


# ---------------------------------------------------------------------------------------------------------------------
# Weight transfer into the fake server
# ---------------------------------------------------------------------------------------------------------------------


class FaultyServer(FakeCompletionsServer):
    """The fake server, able to die ([`kill`]: the port refuses connections and open ones are dropped unanswered),
    freeze ([`freeze`]: `/v1/completions` never answers, while `/health` still does, as a stuck engine's) or stop
    ([`stop`]: it accepts connections and answers nothing at all, as a SIGSTOPped server)."""

    def __init__(self, *args, **kwargs):
        self.dead = False
        self._frozen = threading.Event()
        self._stopped = threading.Event()
        self._thaw = threading.Event()
        super().__init__(*args, **kwargs)
        self._http.handle_error = lambda request, client_address: None  # a thawed answer to a closed socket: quiet

    def kill(self) -> None:
        self.dead = True
        self._http.shutdown()
        self._http.server_close()

    def freeze(self) -> None:
        self._frozen.set()

    def stop(self) -> None:
        self._stopped.set()

    def close(self) -> None:
        self._thaw.set()
        super().close()

    def _complete(self, payload):
        if self._frozen.is_set():
            self._thaw.wait()
            return 503, {"error": "frozen"}
        return super()._complete(payload)

    def _handler_class(self):
        server = self

        class Handler(super()._handler_class()):
            def do_GET(self):
                if server._stopped.is_set():
                    server._thaw.wait()
                if server.dead or server._stopped.is_set():  # a keep-alive connection still open: dropped, unanswered
                    self.close_connection = True
                    return
                super().do_GET()

            def do_POST(self):
                if server._stopped.is_set():
                    server._thaw.wait()
                if server.dead or server._stopped.is_set():
                    self.close_connection = True
                    return
                super().do_POST()

        return Handler


class InProcessWeightTransfer:
    """TRL's `WeightTransferProtocol`, writing the trainer's weights into a [`FakeCompletionsServer`]'s model.

    The trainer calls `init_weight_transfer()` once at train begin, then for every sync (the cold one at train begin
    and one every `weight_sync_steps`): `pause()`, `send_weights(iterator)`, `resume()`; `destroy()` at train end.
    The names streamed are `_iter_vllm_named_params`' (`model.named_parameters()` with DDP/PEFT prefixes removed),
    which are the HF state-dict names; a tied `lm_head.weight` is not among them (nor needed: it is the embedding).

    Args:
        server: The server whose model receives the weights.
        rename: Optional `name -> served name` mapping, for a served model whose names differ.

    Attributes:
        syncs: Completed `send_weights` calls.
        last_names: The names of the last sync, in the order sent.
        initialized, destroyed: Whether those calls happened.
    """

    def __init__(self, server: FakeCompletionsServer, rename: Callable[[str], str] | None = None):
        self.server = server
        self.rename = rename or (lambda name: name)
        self.syncs = 0
        self.last_names: list[str] = []
        self.initialized = False
        self.destroyed = False

    def init_weight_transfer(self) -> None:
        self.initialized = True

    def pause(self) -> None:
        self.server.pause()

    def send_weights(self, iterator: Iterator[tuple[str, torch.Tensor]]) -> None:
        state_dict, names = {}, []
        for name, tensor in iterator:
            names.append(name)
            state_dict[self.rename(name)] = tensor.detach().to("cpu", copy=True)
        self.server.load_state_dict(state_dict)
        self.last_names = names
        self.syncs += 1

    def resume(self) -> None:
        self.server.resume()

    def destroy(self) -> None:
        self.server.resume()
        self.destroyed = True


# ---------------------------------------------------------------------------------------------------------------------
# Rollout worker in a thread
# ---------------------------------------------------------------------------------------------------------------------


def trainer_loop_kwargs(
    args: Any,
    *,
    model: str,
    dataset: Any,
    reward_funcs: Callable | list[Callable],
    processing_class: Any,
    tools: list[Callable] | None = None,
    environment_factory: Any = None,
    lora_name: str | None = None,
    num_processes: int = 1,
) -> dict[str, Any]:
    """The keyword arguments `AsyncGRPOTrainer.__init__` (TRL 1.16) passes to `AsyncRolloutWorker(...)`, computed
    the same way from the same inputs, for [`ThreadRolloutWorker`] (which must exist before the trainer does).

    `model` is the path the trainer gets; `model_name` and `eos_token_ids` are derived from its config and
    generation config as the trainer derives them from the loaded model, and an unset `args.max_inflight_tasks`
    (`-1`) is inferred like the trainer does (`max(max_staleness, 1) * batch * grad accumulation * num_processes`).
    `tests/test_async_cpu.py` checks this against the kwargs a real trainer passes.
    """
    from transformers import AutoConfig, GenerationConfig
    from trl.trainer.utils import get_config_model_id

    config = AutoConfig.from_pretrained(model)
    try:
        eos = GenerationConfig.from_pretrained(model).eos_token_id
    except OSError:
        eos = GenerationConfig.from_model_config(config).eos_token_id
    eos_token_ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    if processing_class.eos_token_id not in eos_token_ids:
        eos_token_ids = [processing_class.eos_token_id, *eos_token_ids]
    max_inflight_tasks = args.max_inflight_tasks
    if max_inflight_tasks < 0:
        per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * num_processes
        max_inflight_tasks = max(args.max_staleness, 1) * per_step
    return dict(
        model_name=get_config_model_id(config),
        lora_name=lora_name,
        dataset=dataset,
        reward_funcs=reward_funcs if isinstance(reward_funcs, list) else [reward_funcs],
        processing_class=processing_class,
        eos_token_ids=eos_token_ids,
        tools=tools,
        environment_factory=environment_factory,
        num_generations=args.num_generations,
        max_inflight_tasks=max_inflight_tasks,
        queue_maxsize=args.queue_maxsize,
        vllm_server_url=args.vllm_server_base_url,
        max_tokens=args.max_completion_length,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        request_timeout=args.request_timeout,
        chat_template_kwargs=args.chat_template_kwargs,
        max_tool_calling_iterations=args.max_tool_calling_iterations,
        log_completions=args.log_completions,
        num_completions_to_print=args.num_completions_to_print,
        fork_threshold_tokens=args.fork_threshold_tokens,
    )


class ThreadRolloutWorker(AsyncRolloutWorker):
    """TRL's `RolloutWorkerProtocol`, running a rollout loop in a thread of this process (a TEST FIXTURE).

    TRL's `AsyncRolloutWorker` runs `_AsyncRolloutLoop` in a spawned child process and refuses to be built without
    vLLM, which CPU CI does not have. This runs the same loop class, built with the same keyword arguments and the
    same shared objects (`rollout_buffer`, `metrics_queue`, a version value with `.value`/`get_lock()`, a heartbeat
    value, a failure event and an exception-info queue), in a daemon thread instead. What differs from the child: no
    pickling of the kwargs (closures work here, though they would not with the real worker), and the loop shares the
    trainer's GIL and process (CUDA is not hidden from it).

    It subclasses `AsyncRolloutWorker` (without running its `__init__`), so the trainer's `isinstance` paths apply
    as to the real worker: `rollout_state.json` in checkpoints, and the resume position written into
    `_loop_kwargs["dataset_start_index"]` before [`start`] builds the loop. Two ways to use it:

    - pass `ThreadRolloutWorker(**trainer_loop_kwargs(args, ...))` as `rollout_worker=`;
    - or let the trainer build it with its own kwargs: patch
      `trl.experimental.async_grpo.async_grpo_trainer.AsyncRolloutWorker` with this class (or a subclass, or a
      `functools.partial` adding `loop_cls=` and a loop subclass' extra kwargs).

    Args:
        loop_cls: The loop class to run; default the class attribute `_loop_cls` (TRL's `_AsyncRolloutLoop`), so a
            subclass setting `_loop_cls` works as with `AsyncRolloutWorker`.
        queue_maxsize: Bound of `rollout_buffer` (0: unbounded); forwarded to the loop too, as TRL does.
        child_ready_timeout: Seconds [`start`] waits for the loop's constructor (TRL's name, so this class takes
            the real worker's arguments).
        **loop_kwargs: What `AsyncGRPOTrainer` passes to `AsyncRolloutWorker(...)`: see [`trainer_loop_kwargs`].

    Attributes:
        rollout_buffer (`queue.Queue`): Scored `RolloutSample`s, drained by the trainer.
        metrics_queue (`queue.Queue`): Metric dicts the loop measured, drained by the trainer's `log()`.
        loop: The loop instance once [`start`] has built it (for inspection), else `None`.
        model_version: The policy version the loop tags new groups with (inherited; set by the trainer).
    """

    def __init__(
        self,
        *,
        loop_cls: type | None = None,
        queue_maxsize: int = 0,
        child_ready_timeout: float = 120.0,
        **loop_kwargs: Any,
    ):
        # Deliberately not `super().__init__()`: it requires vLLM and builds spawn-context queues.
        self.loop_cls = loop_cls or self._loop_cls
        self.rollout_buffer: queue.Queue = queue.Queue(maxsize=queue_maxsize)
        self.metrics_queue: queue.Queue = queue.Queue(maxsize=4096)
        self._model_version_value = mp.Value("i", 0)
        self._heartbeat_value = mp.Value("d", 0.0)
        self._failed_event = threading.Event()
        self._exception_info_queue: queue.Queue = queue.Queue(maxsize=1)
        loop_kwargs["queue_maxsize"] = queue_maxsize
        loop_kwargs.setdefault("dataset_start_index", 0)
        self._loop_kwargs = loop_kwargs
        self._child_ready_timeout = child_ready_timeout
        self._ready = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.loop: Any = None

    def _record_failure(self, error: BaseException) -> None:
        try:
            self._exception_info_queue.put_nowait((type(error).__name__, str(error), traceback.format_exc()))
        except queue.Full:
            pass
        self._failed_event.set()

    def _main(self) -> None:  # what `_child_main` does in the spawned child, minus the environment scrubbing
        try:
            self.loop = self.loop_cls(
                **self._loop_kwargs,
                rollout_buffer=self.rollout_buffer,
                model_version_value=self._model_version_value,
                heartbeat_value=self._heartbeat_value,
                failed_event=self._failed_event,
                exception_info_queue=self._exception_info_queue,
                metrics_queue=self.metrics_queue,
            )
        except BaseException as error:  # noqa: BLE001 - surfaced by start()/check_health()
            self._record_failure(error)
            self._ready.set()
            return
        self._ready.set()
        try:
            self.loop.run()  # on failure, run() itself fills the exception-info queue and sets the failed event
        except BaseException as error:  # noqa: BLE001
            if not self._failed_event.is_set():
                self._record_failure(error)

    def start(self) -> None:
        """Build the loop in its thread and start it; raises if the loop's constructor failed."""
        if self._thread is not None:
            return
        self._heartbeat_value.value = time.time()
        self._ready.clear()
        self._stopping = False
        self._thread = threading.Thread(target=self._main, daemon=True, name="thread-rollout-worker")
        self._thread.start()
        if not self._ready.wait(self._child_ready_timeout):
            raise RuntimeError(f"rollout loop not built within {self._child_ready_timeout}s")
        if self._failed_event.is_set():
            self.check_health(float("inf"))

    def check_health(self, stale_after_s: float) -> None:
        """Raise if the loop failed (the loop's exception chained), ended unasked, or its heartbeat is stale."""
        if self._failed_event.is_set():
            try:
                type_name, message, tb = self._exception_info_queue.get_nowait()
                cause = RuntimeError(f"{type_name}: {message}\n{tb}")
            except queue.Empty:
                cause = None
            raise RuntimeError("Rollout worker thread has failed; see chained exception.") from cause
        if self._thread is not None and not self._thread.is_alive() and not self._stopping:
            raise RuntimeError("Rollout worker thread ended without being stopped.")
        age = time.time() - self._heartbeat_value.value
        if age > stale_after_s:
            raise RuntimeError(f"Rollout worker heartbeat stale: {age:.0f}s > {stale_after_s:.0f}s.")

    def stop(self, timeout: float = 15.0) -> None:
        """Ask the loop to stop (as TRL's stop watcher does) and join its thread."""
        if self._thread is None:
            return
        self._stopping = True
        if self.loop is not None:
            try:
                self.loop._loop.call_soon_threadsafe(self.loop._stop_event.set)
            except RuntimeError:  # the event loop already closed
                pass
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError(f"rollout loop thread did not stop within {timeout}s")
        self._thread = None


# ---------------------------------------------------------------------------------------------------------------------
# What the CPU training tests share
# ---------------------------------------------------------------------------------------------------------------------


def save_chat_model(path: Any) -> Any:
    """The shipped warm-started tiny model and its tokenizer (with [`chat_tokenizer`]'s template) saved in `path`:
    the `model: str` that `AsyncGRPOTrainer` takes."""
    from trl_ada.tiny import load_tiny_arith_model

    model, tokenizer = load_tiny_arith_model()
    model.save_pretrained(path)
    chat_tokenizer(tokenizer).save_pretrained(path)
    return path


CPU_TRAINING_ARGS: dict[str, Any] = dict(
    per_device_train_batch_size=8,
    num_generations=4,
    max_completion_length=6,
    max_steps=3,
    learning_rate=1e-3,
    weight_sync_steps=1,
    max_inflight_tasks=8,
    token_budget=0,  # fixed-count micro-batches of per_device_train_batch_size samples
    report_to="none",
    save_strategy="no",
    logging_steps=1,
    disable_tqdm=True,
    seed=0,
    use_cpu=True,
    bf16=False,  # AsyncGRPOConfig defaults it to True
)
"""A short CPU run of the tiny model: what the trainer tests share (each overrides what it varies)."""


def cpu_config(config_class: type, tmp_path: Any, server: FakeCompletionsServer, **overrides: Any) -> Any:
    """`config_class` (TRL's `AsyncGRPOConfig` or `AdaAsyncGRPOConfig`) for a short CPU run against `server`."""
    values = {**CPU_TRAINING_ARGS, "output_dir": str(tmp_path / "out"), "vllm_server_base_url": server.base_url}
    return config_class(**{**values, **overrides})
