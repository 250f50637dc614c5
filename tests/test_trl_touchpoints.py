"""
The synchronous trainer's TRL touchpoints, one named test each.

Every private name, signature and inline behaviour of TRL that `AdaGRPOTrainer` (through `trl_ada/trl_seam/`) relies on
is a row of [`TOUCHPOINTS`]: what it is, what trl-ada relies on, and a check against the installed TRL, so that an
upstream change fails `test_trl_still_has[<touchpoint>]` instead of training silently wrong. The rows were checked
against TRL 1.14.2, 1.15.0 and 1.16.0 (installed sources diffed method by method; each release runs this file on CI).
The asynchronous trainer's touchpoints are `ASYNC_TOUCHPOINTS` in `tests/test_trl_async_touchpoints.py`.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import transformers
import trl.trainer.utils as trl_utils
from trl import GRPOTrainer
from trl.generation.vllm_client import VLLMClient
from trl.generation.vllm_generation import VLLMGeneration
from trl.models import unwrap_model_for_generation
from trl.trainer import grpo_trainer
from trl.trainer.utils import RepeatSampler, get_config_model_id

import trl_ada
from trl_ada.trl_seam import grpo_private

PACKAGE = Path(trl_ada.__file__).parent

SEAM_MODULES = ("__init__.py", "grpo_private.py", "vllm_generation.py")
"""The modules of `trl_ada/trl_seam/` that hold the synchronous trainer's touchpoints (the asynchronous trainer's:
`ASYNC_SEAM_MODULES` in `tests/test_trl_async_touchpoints.py`)."""


def _function(owner: object, name: str) -> ast.FunctionDef:
    """The AST of `owner.name` (a method or a function), from its installed source."""
    function = getattr(owner, name) if name else owner
    return ast.parse(textwrap.dedent(inspect.getsource(function))).body[0]


def _class_sources(owner: type) -> str:
    """The installed source of `owner` and of every base class of it defined in TRL."""
    return "\n".join(
        inspect.getsource(base) for base in owner.__mro__ if base.__module__.startswith(("trl.", owner.__module__))
    )


def parameters(owner: object, name: str, expected: tuple[str, ...]) -> Callable[[], None]:
    """`owner.name` exists and its parameters (after `self`) begin with `expected`, in that order."""

    def check() -> None:
        function = getattr(owner, name, None) if name else owner
        assert function is not None, f"{name} is missing"
        have = [p for p in inspect.signature(function).parameters if p != "self"]
        assert tuple(have[: len(expected)]) == expected, f"parameters {have}, expected to begin with {list(expected)}"

    return check


def assigned(owner: type, names: tuple[str, ...]) -> Callable[[], None]:
    """Every `self.<name>` of `names` is assigned somewhere in `owner`'s (or a TRL base class's) source."""

    def check() -> None:
        tree = ast.parse(textwrap.dedent(_class_sources(owner)))
        targets = {
            node.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and ast.unparse(node.value) == "self"
        }
        missing = [name for name in names if name not in targets]
        assert not missing, f"{owner.__name__} never sets {missing}"

    return check


def returns(owner: object, name: str, fields: tuple[str, ...]) -> Callable[[], None]:
    """Every `return` of `owner.name` (outside nested functions) returns the tuple of names `fields`."""

    def check() -> None:
        function = _function(owner, name)
        found = []
        for node in ast.walk(function):
            if isinstance(node, ast.Return) and node.value is not None:
                found.append(ast.unparse(node.value))
        assert found and set(found) == {f"({', '.join(fields)})"}, found

    return check


def calls(owner: object, name: str, call: str, times: int | None = None) -> Callable[[], None]:
    """`owner.name`'s source makes the call `call` (as `ast.unparse` writes it), `times` times when given."""

    def check() -> None:
        made = [ast.unparse(node) for node in ast.walk(_function(owner, name)) if isinstance(node, ast.Call)]
        count = made.count(call)
        assert count and (times is None or count == times), f"{call} is made {count} times"

    return check


def contains(owner: object, name: str, *snippets: str) -> Callable[[], None]:
    """`owner.name`'s source (or, with `name=""`, the module's) holds every one of `snippets`, whitespace aside."""

    def check() -> None:
        source = inspect.getsource(getattr(owner, name) if name else owner)
        flat = re.sub(r"\s+", "", source)
        missing = [snippet for snippet in snippets if re.sub(r"\s+", "", snippet) not in flat]
        assert not missing, f"not in the source: {missing}"

    return check


def all_of(*checks: Callable[[], None]) -> Callable[[], None]:
    def check() -> None:
        for each in checks:
            each()

    return check


def _fused_lm_head_is_read_as_the_seam_reads_it() -> None:
    """`trl_seam.grpo_private.fused_lm_head_is_triton_only` says "Triton only" exactly when the installed
    `add_fused_lm_head` calls `_ChunkedLogProbFunction` without asking `_use_triton` first."""
    if not hasattr(trl_utils, "add_fused_lm_head"):
        assert not grpo_private.fused_lm_head_is_triton_only()
        return  # TRL 1.14: no fused LM head
    if trl_utils._ChunkedLogProbFunction is not None:  # TRL 1.15 sets it to None where Triton is not installed
        parameters(trl_utils._ChunkedLogProbFunction, "apply", ())()
    contains(GRPOTrainer, "__init__", "add_fused_lm_head(self.model")()
    contains(trl_utils, "add_fused_lm_head", "_ChunkedLogProbFunction.apply(")()
    dispatches = "_use_triton(" in inspect.getsource(trl_utils.add_fused_lm_head)
    assert grpo_private.fused_lm_head_is_triton_only() is not dispatches, f"asks _use_triton: {dispatches}"


SETS_UP = (
    grpo_private.GENERATION_SEAM
    if grpo_private.has_generation_seam(GRPOTrainer)
    else "_generate_and_score_completions"
)
"""The GRPOTrainer method that sets a batch up and calls `_generate`: the generation seam where TRL has it."""


def _generation_seam_if_present() -> None:
    if not grpo_private.has_generation_seam(GRPOTrainer):
        return  # TRL 1.14 to 1.16: a round raises `_RoundGenerated` instead (the row above)
    calls(GRPOTrainer, grpo_private.GENERATION_SEAM, "self._generate(prompts)", times=1)()
    calls(GRPOTrainer, "_generate_and_score_completions", f"self.{grpo_private.GENERATION_SEAM}(inputs)", times=1)()
    seam = _function(GRPOTrainer, grpo_private.GENERATION_SEAM)
    found = {ast.unparse(node.value) for node in ast.walk(seam) if isinstance(node, ast.Return)}
    assert len(found) == 1 and found.pop().startswith("(prompts, prompt_ids_list,"), found


def _set_up_precedes_generate() -> None:
    function = _function(GRPOTrainer, SETS_UP)
    lines = {}
    for node in ast.walk(function):
        if isinstance(node, ast.Call):
            lines.setdefault(ast.unparse(node.func), node.lineno)
    generate = lines.get("self._generate")
    set_up = [lines.get(call) for call in ("environment.reset", "prepare_multimodal_messages", "inspect.getmembers")]
    assert generate is not None and None not in set_up and max(set_up) < generate, (set_up, generate)


@dataclasses.dataclass(frozen=True)
class Touchpoint:
    """One TRL name or behaviour trl-ada relies on (see the module docstring)."""

    name: str
    kind: str
    """override, call, attribute, behaviour, class or function."""
    relied_on: str
    check: Callable[[], None] = dataclasses.field(repr=False)


GENERATE = "GRPOTrainer._generate"

TOUCHPOINTS = [
    Touchpoint(
        "GRPOTrainer._generate_and_score_completions",
        "override, call",
        "called once per generation batch in training with `inputs`; returns a dict with a per-row `advantages` "
        "tensor (this process's rows); before its one `self._generate(prompts)` call (made in `_prepare_and_generate` "
        "where TRL has that seam) it sets the batch up (per row: "
        "an environment instance from `_environment_pool` into `environments`, `reset(**row)` with its observation "
        "appended to the prompt, the row's tool dicts, image columns into multimodal messages) and passes the "
        "prompts so built to `_generate` and then to `_calculate_rewards`",
        all_of(
            parameters(GRPOTrainer, "_generate_and_score_completions", ("inputs",)),
            calls(GRPOTrainer, SETS_UP, "self._generate(prompts)", times=1),
            calls(
                GRPOTrainer,
                "_generate_and_score_completions",
                "self._calculate_rewards(inputs, prompts, completions, completion_ids_list)",
                times=1,
            ),
            contains(GRPOTrainer, SETS_UP, "self._environment_pool[name]"),
            contains(GRPOTrainer, "_generate_and_score_completions", '"advantages":'),
        ),
    ),
    Touchpoint(
        "GRPOTrainer._generate_and_score_completions.inline_set_up",
        "behaviour",
        "the batch set-up (environment resets, per-row tools, multimodal prompts) is written inline before the "
        "`_generate` call, with no method of its own: why a round leaves the method by raising `_RoundGenerated` "
        "from `_generate` (when this fails, TRL may have factored it out: call that instead); with the seam below, "
        "the set-up precedes `_generate` in that method",
        _set_up_precedes_generate,
    ),
    Touchpoint(
        f"GRPOTrainer.{grpo_private.GENERATION_SEAM}",
        "call (when present)",
        "the generation seam proposed upstream (`docs/upstream/grpo-generation-seam.patch`; TRL 1.14 to 1.16 lack it): "
        "`_prepare_and_generate(inputs)` sets the batch up, calls `self._generate(prompts)` once and returns the "
        "prompts followed by `_generate`'s tuple; `_generate_and_score_completions` calls it once; a round calls it "
        "instead of raising `_RoundGenerated`",
        _generation_seam_if_present,
    ),
    Touchpoint(
        GENERATE,
        "override, call",
        "`_generate(prompts)` returns the tuple named by `trl_seam.grpo_private.GENERATE_OUTPUT_FIELDS`; calls "
        "`rollout_func(prompts, self)` when one is set (its `env_mask` comes back as `tool_mask`, its other keys "
        "as `extra_fields`)",
        all_of(
            parameters(GRPOTrainer, "_generate", ("prompts",)),
            returns(GRPOTrainer, "_generate", grpo_private.GENERATE_OUTPUT_FIELDS),
            calls(GRPOTrainer, "_generate", "self.rollout_func(prompts, self)"),
            contains(GRPOTrainer, "_generate", 'extra_fields.pop("env_mask", None)'),
        ),
    ),
    Touchpoint(
        "GRPOTrainer._generate_single_turn",
        "override",
        "called by `_generate` with `num_generations`, which vLLM server mode dedupes prompts by; syncs the vLLM "
        "weights when `state.global_step != _last_loaded_step`",
        all_of(
            parameters(
                GRPOTrainer, "_generate_single_turn", ("prompt_ids", "images", "multimodal_fields", "num_generations")
            ),
            contains(GRPOTrainer, "_generate_single_turn", "self.state.global_step != self._last_loaded_step"),
            contains(VLLMGeneration, "generate", "all_prompts[::num_generations]"),
        ),
    ),
    Touchpoint(
        "GRPOTrainer._calculate_rewards",
        "override, call",
        "returns the gathered `(rows of all processes) x (reward functions)` tensor, NaN where a function said None; "
        "environment-owned rewards read `self.environments`",
        all_of(
            parameters(GRPOTrainer, "_calculate_rewards", ("inputs", "prompts", "completions", "completion_ids_list")),
            contains(
                GRPOTrainer, "_calculate_rewards", "gather(", 'reward_kwargs["environments"] = self.environments'
            ),
        ),
    ),
    Touchpoint(
        "GRPOTrainer._tokenize_prompts",
        "call",
        "returns `(prompt_ids, images, multimodal_fields)`: the ids `_generate` sends to vLLM",
        all_of(
            parameters(GRPOTrainer, "_tokenize_prompts", ("prompts",)),
            returns(GRPOTrainer, "_tokenize_prompts", ("prompt_ids", "images", "multimodal_fields")),
        ),
    ),
    Touchpoint(
        "GRPOTrainer._metrics._logs._pending_extra_logs",
        "attribute",
        "`_metrics[mode][name]` lists averaged into each log; `_logs['advantages']` the completions table's column; "
        "`_pending_extra_logs` the `defaultdict(list)` of `log_extra` columns",
        all_of(
            assigned(GRPOTrainer, ("_metrics", "_logs", "_pending_extra_logs")),
            contains(GRPOTrainer, "__init__", "self._pending_extra_logs = defaultdict(list)", '"advantages":'),
        ),
    ),
    Touchpoint(
        "GRPOTrainer._environment_pool",
        "attribute",
        "`{environment name (None for a single factory): [instances]}` when `environment_factories` is set",
        assigned(GRPOTrainer, ("_environment_pool", "environment_factories", "environments")),
    ),
    Touchpoint(
        "GRPOTrainer._is_vlm._step._tokenizer._last_loaded_step",
        "attribute",
        "VLM flag (the model card); micro-step counter (`_prepare_inputs` regenerates on it); the tokenizer whose "
        "pad id ends a completion; the step whose weights vLLM last received",
        assigned(GRPOTrainer, ("_is_vlm", "_step", "_tokenizer", "_last_loaded_step")),
    ),
    Touchpoint(
        "GRPOTrainer.truncation",
        "behaviour",
        "a completion not ending with `eos_token_ids` or the pad id hit `max_completion_length` "
        "(`trl_seam.grpo_private.is_truncated`, TRL's inline test); `mask_truncated_completions` masks it",
        all_of(
            assigned(GRPOTrainer, ("eos_token_ids", "mask_truncated_completions")),
            contains(
                grpo_trainer,
                "",
                "eos_and_pad = [*self.eos_token_ids, self._tokenizer.pad_token_id]",
                "ids[-1] not in eos_and_pad",
            ),
        ),
    ),
    Touchpoint(
        "GRPOTrainer.sum_then_normalize",
        "behaviour",
        "`trl_seam.grpo_private.summed_rewards` is TRL's inline `sum_then_normalize` sum: `reward_weights`, NaN "
        "skipped",
        all_of(
            assigned(GRPOTrainer, ("reward_weights", "multi_objective_aggregation")),
            contains(
                GRPOTrainer,
                "_generate_and_score_completions",
                "(rewards_per_func * self.reward_weights.to(device).unsqueeze(0)).nansum(dim=1)",
            ),
        ),
    ),
    Touchpoint(
        "GRPOTrainer.vllm",
        "attribute",
        "`use_vllm`, `vllm_mode` and `vllm_generation` (server mode's `vllm_client`, colocate mode's engine)",
        assigned(GRPOTrainer, ("use_vllm", "vllm_mode", "vllm_generation")),
    ),
    Touchpoint(
        "VLLMGeneration.enable_sleep_mode.llm._llm_weights_sleeping",
        "attribute",
        "colocate mode: `enable_sleep_mode` (read at each call), the engine `llm`, `_llm_weights_sleeping`; "
        "`trl_ada/generation/weight_sync.py` keeps the engine awake between a step's rounds with them",
        assigned(VLLMGeneration, ("enable_sleep_mode", "llm", "_llm_weights_sleeping", "vllm_client")),
    ),
    Touchpoint(
        "VLLMGeneration.generate",
        "call, attribute",
        "server mode calls `vllm_client.generate` with its sampling attributes "
        "(`trl_seam.vllm_generation.server_sampling_params`)",
        all_of(
            parameters(VLLMGeneration, "generate", ("prompts", "images", "num_generations")),
            assigned(
                VLLMGeneration,
                (
                    "repetition_penalty",
                    "temperature",
                    "top_p",
                    "top_k",
                    "min_p",
                    "max_completion_length",
                    "logprobs",
                    "structured_outputs_regex",
                    "generation_kwargs",
                ),
            ),
        ),
    ),
    Touchpoint(
        "VLLMClient.generate._post",
        "call",
        "`generate` posts one `/v1/completions` body through `_post(url, json=...)` (the continuous schedule "
        "replays its draws there)",
        all_of(
            parameters(
                VLLMClient,
                "generate",
                ("prompts", "features", "n", "repetition_penalty", "temperature", "top_p", "top_k", "min_p"),
            ),
            parameters(VLLMClient, "_post", ("url",)),
            contains(VLLMClient, "generate", "self._post(", "/v1/completions", "json="),
        ),
    ),
    Touchpoint(
        "VLLMGeneration.generate.server_broadcast",
        "behaviour",
        "server mode: every process gathers its prompts to the main process, which alone calls the server and then "
        "broadcasts the completions; `trl_ada/generation/faults.py` answers that broadcast with a lost server's error "
        "(the object count: `tests/test_trl_seam.py`)",
        contains(VLLMGeneration, "generate", "gather_object(", "self.vllm_client.generate(", "broadcast_object_list("),
    ),
    Touchpoint(
        "trl.trainer.utils.add_fused_lm_head._ChunkedLogProbFunction",
        "behaviour, module variable",
        "`GRPOTrainer.__init__` puts `add_fused_lm_head` on the model, whose forward computes log-probabilities with "
        "`_ChunkedLogProbFunction`: a Triton kernel only in TRL 1.15, which "
        "`trl_seam.grpo_private.check_fused_lm_head_runs` therefore refuses off CUDA/XPU; a release that falls back "
        "to torch there dispatches on `trl.kernels.chunked_logprob._use_triton` (1.16), which the check reads; 1.14 "
        "has no fused head",
        _fused_lm_head_is_read_as_the_seam_reads_it,
    ),
    Touchpoint(
        "unwrap_model_for_generation",
        "function",
        "`trl.models.unwrap_model_for_generation(model, accelerator, gather_deepspeed3_params, ...)`, entered once "
        "around a step's rounds (`trl_seam.grpo_private.unwrap_for_generation`)",
        parameters(unwrap_model_for_generation, "", ("model", "accelerator", "gather_deepspeed3_params")),
    ),
    Touchpoint(
        "RepeatSampler",
        "class",
        "`RepeatSampler(data_source, mini_repeat_count, batch_size, repeat_count, shuffle, seed)`: DAPO's refill order",
        parameters(
            RepeatSampler,
            "__init__",
            ("data_source", "mini_repeat_count", "batch_size", "repeat_count", "shuffle", "seed"),
        ),
    ),
    Touchpoint(
        "GRPOTrainer._get_train_sampler",
        "override, call",
        "`_get_train_sampler(dataset)` returns a `RepeatSampler` whose `mini_repeat_count`, `batch_size` and "
        '`repeat_count` lay out the training data: a prompt-choosing sampler (`sampler="spo"`) draws in that layout',
        all_of(
            parameters(GRPOTrainer, "_get_train_sampler", ("dataset",)),
            contains(GRPOTrainer, "_get_train_sampler", "return RepeatSampler("),
            assigned(RepeatSampler, ("mini_repeat_count", "batch_size", "repeat_count")),
        ),
    ),
    Touchpoint(
        "get_config_model_id",
        "function",
        "`get_config_model_id(config)`: the default output name",
        parameters(get_config_model_id, "", ("config",)),
    ),
    Touchpoint(
        "Trainer._save_optimizer_and_scheduler._load_optimizer_and_scheduler",
        "override (transformers)",
        "called inside each checkpoint save (before `trainer_state.json` and the hub push) and on resume",
        all_of(
            parameters(GRPOTrainer, "_save_optimizer_and_scheduler", ("output_dir",)),
            parameters(GRPOTrainer, "_load_optimizer_and_scheduler", ("checkpoint",)),
            calls(transformers.Trainer, "_save_checkpoint", "self._save_optimizer_and_scheduler(output_dir)"),
        ),
    ),
    Touchpoint(
        "Trainer.__init__.on_init_end",
        "callback (transformers)",
        "`Trainer.__init__` ends with its callbacks' `on_init_end`, and `GRPOTrainer.__init__` validates its arguments "
        "before it calls `Trainer.__init__` and sets up its reference model and vLLM after: where trl-ada refuses a "
        "pooling sampler on environment-owned data",
        all_of(
            contains(transformers.Trainer, "__init__", "self.callback_handler.on_init_end("),
            contains(GRPOTrainer, "__init__", "args.max_steps <= 0", "super().__init__(", "self.ref_model ="),
        ),
    ),
    Touchpoint(
        "GRPOTrainer.create_model_card",
        "override",
        "`create_model_card(model_name, dataset_name, tags)` writes TRL's card, whose text trl-ada replaces",
        parameters(GRPOTrainer, "create_model_card", ("model_name", "dataset_name", "tags")),
    ),
]


@pytest.mark.parametrize("touchpoint", TOUCHPOINTS, ids=lambda touchpoint: touchpoint.name)
def test_trl_still_has(touchpoint):
    touchpoint.check()


def test_the_touchpoints_cover_every_method_the_seam_checks_at_import():
    # `trl_seam.grpo_private.check_overridable` refuses, at import, a TRL without these; each must be a row of the
    # table too.
    names = " ".join(touchpoint.name for touchpoint in TOUCHPOINTS)
    assert [name for name in grpo_private.OVERRIDDEN_METHODS if name not in names] == []


TRL_ACCESS = re.compile(r"\b(?:trainer|self|generation|client|super\(\))\.(_[a-z][a-z0-9_]*)")


def test_every_private_trl_name_the_synchronous_trainer_touches_is_a_touchpoint():
    # A private name of TRL's GRPOTrainer or vLLM classes that the trainer, its schedules, its generation helpers or
    # the seam reads, calls or overrides must be checked above; the asynchronous trainer's are in
    # tests/test_trl_async_touchpoints.py.
    trl_private = set()
    for owner in (GRPOTrainer, VLLMGeneration, VLLMClient, transformers.Trainer):
        trl_private |= set(re.findall(r"(?:\bdef |self\.)(_[a-z][a-z0-9_]*)", _class_sources(owner)))
    sources = [(PACKAGE / "trl_seam" / name).read_text() for name in SEAM_MODULES]
    for pattern in ("trainer.py", "schedules/*.py", "generation/*.py"):
        sources += [path.read_text() for path in sorted(PACKAGE.glob(pattern))]
    ours = "\n".join(sources)
    own = set(re.findall(r"\bdef (_[a-z][a-z0-9_]*)", ours)) - set(re.findall(r"super\(\)\.(_\w+)", ours))
    own |= set(re.findall(r"self\.(_[a-z][a-z0-9_]*)(?:: [^=]+)? = ", ours)) - set(
        re.findall(r"super\(\)\.(_\w+)", ours)
    )
    touched = {name for name in TRL_ACCESS.findall(ours) if name in trl_private and name not in own}
    covered = " ".join(touchpoint.name for touchpoint in TOUCHPOINTS)
    assert sorted(name for name in touched if not re.search(rf"\b{name}\b", covered)) == []


def test_a_changed_touchpoint_fails_its_check():
    # The checks can fail: a signature, a return tuple or a call TRL no longer makes.
    class Changed:
        def _generate(self, prompt_list):
            return prompt_list, None

    with pytest.raises(AssertionError, match="expected to begin with"):
        parameters(Changed, "_generate", ("prompts",))()
    with pytest.raises(AssertionError):
        returns(Changed, "_generate", grpo_private.GENERATE_OUTPUT_FIELDS)()
    with pytest.raises(AssertionError, match="is made 0 times"):
        calls(Changed, "_generate", "self.rollout_func(prompts, self)")()
    with pytest.raises(AssertionError, match="never sets"):
        assigned(Changed, ("_metrics",))()
