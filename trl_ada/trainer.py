"""`AdaGRPOTrainer`: TRL's GRPOTrainer with Reinforce-Ada adaptive sampling (arXiv 2510.04996)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import inspect
import json
import logging
import os
import textwrap
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from accelerate import PartialState
from accelerate.utils import broadcast_object_list
from datasets import IterableDataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from .checkpoints import SAMPLER_STATE_NAME, CheckpointError, read_sampler_state, resolve_resume_checkpoint
from .config import AdaGRPOConfig
from .data import check_prompt_column
from .generation.weight_sync import one_parameter_gather_per_step, one_weight_sync_per_step
from .predictor_hub import resolve_pass_rate_predictor
from .reporting.card import check_license, describe_rollouts, write_trainer_card
from .reporting.console import use_concise_console
from .reporting.metrics import advantage_metrics, reduce_log_window
from .rewards.reward_registry import resolve_reward_funcs
from .runtime.cpu_threads import apply_cpu_thread_default
from .runtime.model_path import check_model_name
from .samplers import ChoosesPrompts, PassRateEstimator, Selection, build_sampler, rules
from .samplers.dapo import RefillWalk
from .samplers.predictor import PREDICTOR_DIR
from .schedules.driver import PendingBatch, check_memory_can_act, log_selection, refill_walk, sample_step
from .schedules.pools import generate_fields
from .schedules.priority import check_prompt_choice, priority_order
from .schedules.server_draws import ensure_open_files
from .trl_seam.grpo_private import (
    add_pending_extra_logs,
    check_fused_lm_head_runs,
    environment_pool,
    get_config_model_id,
    has_generation_seam,
    is_vlm,
    logged_advantages,
    make_generate_output,
    micro_step,
    set_environment_pool,
    split_generate_output,
    summed_rewards,
    train_metrics,
)

logger = logging.getLogger(__name__)

TRL_HAS_GENERATION_SEAM = has_generation_seam(GRPOTrainer)
"""Whether the installed TRL has `_prepare_and_generate`, which a round then calls (else it raises `_RoundGenerated`)."""


def init_argument_binder(parent: type, trainer_name: str) -> Callable[..., dict[str, Any]]:
    """A function that names the arguments of a call to `parent.__init__` (`self` first), raising a TypeError that says
    the subclass takes the parent's arguments plus `pass_rate_estimator=`. The signature is read once, here, so that a
    test mocking `parent.__init__` still binds by it."""
    signature = inspect.signature(parent.__init__)

    def bind(*arguments: Any, **keywords: Any) -> dict[str, Any]:
        try:
            return signature.bind(*arguments, **keywords).arguments
        except TypeError as error:
            raise TypeError(
                f"{trainer_name} takes {parent.__name__}'s arguments plus pass_rate_estimator=: {error}"
            ) from None

    return bind


_bind_grpo_init_arguments = init_argument_binder(GRPOTrainer, "AdaGRPOTrainer")


@contextlib.contextmanager
def waiting_for_the_vllm_server(args: GRPOConfig, model: Any) -> Iterator[None]:
    """With vLLM in server mode, TRL's set-up waits for the server up to `vllm_server_timeout` without a word, then
    names `vllm serve`: say at once what it waits for, and fail with the command that starts one for this run."""
    if not (args.use_vllm and args.vllm_mode == "server"):
        yield
        return
    url = args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}"
    name = model if isinstance(model, str) else get_config_model_id(model.config)
    command = f"trl vllm-serve --model {name or '<the model this run trains>'}"
    if PartialState().is_main_process:
        logger.info(
            "Waiting up to %s s (vllm_server_timeout) for the vLLM server at %s; start it beside this run with `%s` "
            "(docs: vLLM).",
            args.vllm_server_timeout,
            url,
            command,
        )
    import requests  # TRL's vLLM client raises requests' ConnectionError, not the builtin one

    try:
        yield
    except (ConnectionError, requests.exceptions.ConnectionError) as error:
        raise ConnectionError(
            f"No vLLM server answered at {url} within vllm_server_timeout={args.vllm_server_timeout} s. Start one "
            f"for this run with `{command}` (on GPUs of its own; the vllm extra: pip install 'trl-ada[vllm]'), or "
            "use vllm_mode='colocate'."
        ) from error


def zero_std_row_share(rewards: torch.Tensor, group_sizes: list[int]) -> float:
    """TRL's `frac_reward_zero_std` over groups of `group_sizes` consecutive rows: the share of rows whose group's
    scored rewards have a std `torch.isclose` to 0 (a group with fewer than two does not count)."""
    if sum(group_sizes) != len(rewards):
        raise ValueError(f"{len(rewards)} rewards cannot be split into groups of {group_sizes} rows")
    zero_rows = 0
    for group, size in zip(torch.split(rewards, group_sizes), group_sizes, strict=True):
        scored = group[~torch.isnan(group)]
        if len(scored) > 1 and torch.isclose(scored.std(), torch.zeros_like(scored[0])):
            zero_rows += size
    return zero_rows / len(rewards)


@dataclasses.dataclass
class _RoundCall:
    """A sampling round's generation in progress (`AdaGRPOTrainer._generate_round`), read by the overrides it enters."""

    block: int | None
    """Rows per prompt, the `num_generations` of the round's first `_generate_single_turn` call (then None)."""


class _RoundGenerated(Exception):
    """Carries a round's generation out of `GRPOTrainer._generate_and_score_completions`, which on a TRL without
    `_prepare_and_generate` sets the batch up inline before `_generate`, and whose scoring and log-probs must not run
    for a round."""

    def __init__(self, prompts: list, output: tuple) -> None:
        super().__init__("a sampling round's generation")
        self.prompts = prompts
        self.output = output


class _FinishedEpisode:
    """A kept completion's environment when TRL builds the training batch: the episode already ran in its round."""

    def reset(self, **kwargs: Any) -> None:
        return None


TRL_MODEL_METHOD_DEPRECATIONS = (
    r"`(is_gradient_checkpointing|gradient_checkpointing_enable|gradient_checkpointing_disable)` is deprecated"
)
"""transformers' deprecation messages for the model methods TRL itself calls while training (filtered in `train`)."""


class _RefuseEnvironmentOwnedData(TrainerCallback):
    """Refuses a pooling sampler on data an environment owns, once GRPOTrainer has checked its own arguments (its errors
    come first, as `GRPOTrainer`'s) and before it builds the reference model or starts vLLM."""

    def __init__(self, sampler: str) -> None:
        self.sampler = sampler

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        raise ValueError(
            f"sampler={self.sampler!r} needs a train_dataset with environment_factory: it draws a varying number of "
            "episodes per dataset row and pools them as draws of one task, so each row must name the task its "
            "environment's reset(**row) sets up (e.g. a `seed` column), where GRPOTrainer lets an environment own "
            "the data and invent a task per episode. Pass such a train_dataset, or use sampler='uniform' (plain "
            "GRPO, which trains on environment-owned data as GRPOTrainer does)."
        )


class _ReduceLogWindow(TrainerCallback):
    """After each optimizer step, collapse the logging window's trl-ada counters and extrema into the one value they
    reduce to, so that GRPOTrainer's averaging of every window logs their sums, maxima and minima."""

    def __init__(self, trainer: GRPOTrainer) -> None:
        self.trainer = trainer

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        reduce_log_window(train_metrics(self.trainer))


class AdaModelCard:
    """The model card of both trl-ada trainers (a base placed before TRL's trainer class)."""

    def create_model_card(
        self,
        model_name: str | None = None,
        dataset_name: str | None = None,
        tags: str | list[str] | None = None,
        license: str | None = None,
    ) -> None:
        """Overridden to describe the Reinforce-Ada run: TRL writes the card's metadata (base model, tags, dataset),
        then `README.md` is rewritten from trl-ada's template, with the plots and logged metrics it shows, into
        `output_dir` (so `push_to_hub` uploads them together). `license` is the model's Hub license id, which
        `push_to_hub(license=...)` passes on."""
        check_license(license)
        super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
        if self.is_world_process_zero():
            write_trainer_card(self, model_name=model_name, license=license, **self._card_contents())

    def _card_contents(self) -> dict[str, Any]:
        """`write_trainer_card`'s `settings` and the trainer's own arguments to it."""
        raise NotImplementedError


class AdaGRPOTrainer(AdaModelCard, GRPOTrainer):
    """Trainer for Reinforce-Ada ([arXiv 2510.04996](https://huggingface.co/papers/2510.04996)), a drop-in replacement
    for [`~trl.GRPOTrainer`].

    GRPO draws a fixed `num_generations` completions per prompt; when they all succeed or all fail the group has no
    signal. `AdaGRPOTrainer` generates in rounds, spending more completions on prompts whose pool is still unmixed,
    then downsamples every pool to exactly `num_generations` completions, so TRL's loss, log-prob, reference-model and
    importance-sampling path runs unchanged on static shapes. Advantages use the whole pool's mean reward as baseline
    and may carry a per-prompt objective weight (see [`AdaGRPOConfig`]). Each override wraps its parent (docs:
    "How it works").

    It takes `model`, `reward_funcs`, `args`, `train_dataset` and the rest as [`~trl.GRPOTrainer`] does, in the same
    positions. A reward function may also be named by a key of `trl_ada.rewards.REWARD_FUNCS` (e.g. `"math_verify"`)
    or a dotted import path. A plain `GRPOConfig` is upgraded to an `AdaGRPOConfig` with the default Reinforce-Ada
    settings.

    Args:
        pass_rate_estimator ([`~trl_ada.samplers.PassRateEstimator`], *optional*, keyword-only):
            A pass-rate estimator object for `sampler="est"` and the predictive/tracked round policies, in place of
            the one `pass_rate_predictor` names (default: a decayed Beta tracker). Its keys are
            [`~trl_ada.samplers.PromptKey`]s (the prompt id, with the prompt's text as `key.text`); its `state_dict`
            must be JSON-serialisable (checked here). One with `save_pretrained(directory)` is also written to
            `pass_rate_predictor/` whenever the model is saved.
    """

    _tag_names = ["trl", "grpo", "reinforce-ada"]
    _name = "Reinforce-Ada"
    _paper = {
        "title": "Reinforce-Ada: An Adaptive Sampling Framework under Non-linear RL Objectives",
        "id": "2510.04996",
        # docstyle-ignore
        "citation": textwrap.dedent("""\
            @article{xiong2025reinforceada,
                title        = {{Reinforce-Ada: An Adaptive Sampling Framework under Non-linear RL Objectives}},
                author       = {Wei Xiong and Chenlu Ye and Baohao Liao and Hanze Dong and Xinxing Xu and Christof Monz and Jiang Bian and Nan Jiang and Tong Zhang},
                year         = 2025,
                eprint       = {arXiv:2510.04996},
            }"""),
    }

    # What the overrides are handed while TRL builds the training batch or a round generates; None otherwise.
    # Class-level defaults, so the overrides also work on a trainer built without `__init__`.
    _ada_pending: PendingBatch | None = None
    _ada_round: _RoundCall | None = None

    def __init__(
        self,
        model,
        reward_funcs=None,
        args: AdaGRPOConfig | GRPOConfig | None = None,
        *positional: Any,
        pass_rate_estimator: PassRateEstimator | None = None,
        **kwargs: Any,
    ) -> None:
        """Overridden to build the sampler (a plain `GRPOConfig` upgraded) and refuse what it cannot train, before set-up."""
        # Same signature as GRPOTrainer (positional arguments included); our own parameters are keyword-only.
        named = _bind_grpo_init_arguments(self, model, reward_funcs, args, *positional, **kwargs)
        if isinstance(model, str):
            check_model_name(model)  # before anything loads it: a missing directory fails in one line
        check_fused_lm_head_runs("cpu" if getattr(args, "use_cpu", False) else None)
        train_dataset = named.get("train_dataset")
        environment_factory = named.get("environment_factory")
        environment_owns_data = environment_factory is not None and train_dataset is None
        self._ada_warned: set[str] = set()
        # The sampler's state at the start of the current generation block, saved by a checkpoint inside the block.
        self._ada_state_before_block: dict[str, Any] | None = None
        if args is None:
            model_name = model if isinstance(model, str) else get_config_model_id(model.config)
            args = AdaGRPOConfig(f"{model_name.split('/')[-1]}-Ada")
        elif not isinstance(args, AdaGRPOConfig):
            args = AdaGRPOConfig.from_grpo_config(args, environment_owns_data=environment_owns_data)
        if environment_factory is None:
            check_prompt_column(train_dataset)  # with environments, GRPOTrainer lets reset() supply the prompt
        if args.generation_schedule == "continuous":
            agentic = [
                name for name in ("tools", "environment_factory", "rollout_func") if named.get(name) is not None
            ]
            if agentic:
                raise ValueError(
                    f"generation_schedule='continuous' draws single-turn completions straight from the vLLM server, "
                    f"so {', '.join(agentic)} (multi-turn or custom rollouts, run by TRL's generation) cannot take "
                    "part. Use generation_schedule='rounds'."
                )
            ensure_open_files(args.continuous_max_in_flight)
        settings = args.sampler_settings()
        if settings.refills and isinstance(train_dataset, IterableDataset):
            raise ValueError(
                "DAPO refilling draws extra prompts by index, which an IterableDataset does not allow. Pass a "
                "map-style datasets.Dataset, or use sampler='seq_balance'."
            )
        if issubclass(settings.sampler_class, ChoosesPrompts):
            check_prompt_choice(settings.sampler, args, train_dataset)
        reward_funcs = resolve_reward_funcs(reward_funcs)
        self.ada_sampler = build_sampler(
            settings, pass_rate_estimator, resolve_pass_rate_predictor(settings), train_on=args.train_on
        )
        if environment_owns_data and settings.sampler != "uniform":
            # Only plain GRPO can let an environment own the data; refused through the callbacks GRPOTrainer runs.
            named["callbacks"] = [*(named.get("callbacks") or []), _RefuseEnvironmentOwnedData(settings.sampler)]
            positional = ()
            kwargs = {
                name: value for name, value in named.items() if name not in ("self", "model", "reward_funcs", "args")
            }
        with waiting_for_the_vllm_server(args, model):
            super().__init__(model, reward_funcs, args, *positional, **kwargs)
        use_concise_console(self)
        self.add_callback(_ReduceLogWindow(self))
        apply_cpu_thread_default(self.model, self.accelerator.device)
        if args.generation_schedule == "continuous" and is_vlm(self):
            raise ValueError(
                "generation_schedule='continuous' sends token ids only; a vision-language model's prompts carry "
                "images. Use generation_schedule='rounds'."
            )

    def _get_train_sampler(self, dataset=None):
        """Overridden so that a sampler that chooses its prompts (`sampler="spo"`) draws each generation batch's."""
        data_order = super()._get_train_sampler(dataset)
        if not isinstance(self.ada_sampler, ChoosesPrompts):
            return data_order
        return priority_order(self, data_order, self.train_dataset if dataset is None else dataset, self.ada_sampler)

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any):
        """Overridden so that a resume never starts from a checkpoint it cannot load; otherwise it is
        [`~transformers.Trainer.train`]. `resume_from_checkpoint=True` picks the newest *loadable* checkpoint in
        `output_dir`, and a path that cannot be resumed from fails before any step, on every process
        (`trl_ada.checkpoints.resolve_resume_checkpoint`)."""
        resume_from_checkpoint = resolve_resume_checkpoint(
            resume_from_checkpoint, self.args.output_dir, is_main_process=self.accelerator.is_main_process
        )
        if self.accelerator.is_main_process:
            check_memory_can_act(self)
        with warnings.catch_warnings():
            # TRL calls model methods transformers deprecates: nothing a user of this trainer can change.
            warnings.filterwarnings("ignore", message=TRL_MODEL_METHOD_DEPRECATIONS, category=FutureWarning)
            return super().train(resume_from_checkpoint, *args, **kwargs)

    # -- Overrides of GRPOTrainer's private methods (each calls its parent) --------------------------------------------

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """Overridden to sample the step's rounds first, then let TRL build the batch from the kept rows only."""
        if not self.model.training:
            return super()._generate_and_score_completions(inputs)  # evaluation stays plain GRPO
        if self._blocks_span_steps:
            # TRL regenerates a generation block on resume; a checkpoint inside one saves the state from here.
            self._ada_state_before_block = copy.deepcopy(self._sampler_training_state())
        try:
            # Sample first, then let TRL build the batch from the kept rows: its prompts, logs and reward kwargs then
            # line up with the completions even when the kept prompts differ from `inputs` (DAPO refills, est).
            kept_inputs = self._sample(inputs)
            with self._finished_episodes(len(kept_inputs)):
                output = super()._generate_and_score_completions(kept_inputs)
            pending = self._ada_pending
        finally:
            # Whatever happened, nothing of this batch may leak into the next one.
            self._ada_pending = None
        self._correct_frac_reward_zero_std(pending.rewards, pending.group_sizes)
        advantages = pending.advantages
        if not pending.trl_stands_in:
            local = len(kept_inputs)  # `train_on="pool"` trains on more rows than TRL's batch holds
            start = self.accelerator.process_index * local
            output["advantages"] = advantages[start : start + local].to(output["advantages"])
            if pending.draw_shares is not None:
                shares = pending.draw_shares[start : start + local].to(output["advantages"])
                output["advantages"] = output["advantages"] * self._pool_step_scale(output, shares)
            # TRL logged its own group-normalised advantages for the completions table; show the trained ones.
            logged = logged_advantages(self)
            for _ in range(min(len(advantages), len(logged))):
                logged.pop()
            logged.extend(self.accelerator.gather(output["advantages"]).tolist())
        self._log_trained_advantages(output["advantages"])
        return output

    def _pool_step_scale(self, output: dict[str, Any], shares: torch.Tensor) -> torch.Tensor:
        """`train_on="pool"`'s factor on every advantage: TRL's loss divides by the rows (or tokens) it trains, which
        the pool's draws outnumber, so the factor `sum c_i / sum share_i c_i` over the update's rows (`c_i` 1 or the
        row's loss tokens, by `loss_type`) gives the step the downsampled rule's size ([`rules.pool_step_scale`])."""
        if rules.loss_normaliser(self.loss_type) == "tokens":
            mask = output["completion_mask"]
            if "tool_mask" in output:
                mask = mask * output["tool_mask"]
            sizes = mask.sum(dim=1).to(shares)
        else:
            sizes = torch.ones_like(shares)
        totals = self.accelerator.reduce(torch.stack([sizes.sum(), (shares * sizes).sum()]), reduction="sum")
        return rules.pool_step_scale(totals[0], totals[1])

    def _log_trained_advantages(self, local: torch.Tensor) -> None:
        """`ada/advantages/{abs_max,mean,std}` of the advantages TRL trains on this step, over every process's rows:
        a blow-up shows on the first step."""
        metrics = train_metrics(self)
        for name, value in advantage_metrics(self.accelerator.gather(local.detach().float()).tolist()).items():
            metrics[name].append(value)

    def _generate(self, prompts: list):
        """Overridden to end a round's batch set-up at its generation, and to hand TRL the kept rows, not new ones."""
        if self._ada_round is not None:
            output = super()._generate(prompts)
            if TRL_HAS_GENERATION_SEAM:
                return output  # `_prepare_and_generate` hands it to the round
            raise _RoundGenerated(prompts, output)
        if self._ada_pending is None:
            return super()._generate(prompts)
        rows = self._ada_pending.rows
        for column in {column for row in rows for column in row.extra_logs}:
            add_pending_extra_logs(self, column, [row.extra_logs.get(column) for row in rows])
        # Everything `_generate` returned for each kept row (tool/env masks, a rollout's extra fields, images) comes back.
        return make_generate_output(**generate_fields(rows))

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list) -> torch.Tensor:
        """Overridden so that the kept completions, scored in their rounds, are never scored twice."""
        if self._ada_pending is not None:
            return self._ada_pending.rewards
        return super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, **kwargs):
        """Overridden because vLLM server mode dedupes prompts by `num_generations`, where a round repeats its block."""
        # Only the round's first call is the one `_generate` makes with `num_generations`; TRL's tool loop then calls
        # again with its own count (one continuation per row), which must stand.
        round_call = self._ada_round
        if round_call is not None and round_call.block is not None:
            num_generations, round_call.block = round_call.block, None
        return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations, **kwargs)

    # -- Overrides of public and checkpoint methods --------------------------------------------------------------------

    def _card_contents(self) -> dict[str, Any]:
        rollouts = describe_rollouts(
            tools=self.tools,
            environment_factories=self.environment_factories,
            rollout_func=self.rollout_func,
            vision=is_vlm(self),
        )
        return {"settings": self.ada_sampler.settings, "rollouts": rollouts}

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Overridden to save the learned pass-rate predictor with the model, in `pass_rate_predictor/` of the model
        directory (first, so that a push uploads it too); otherwise it is [`~transformers.Trainer.save_model`]."""
        sampler = self.ada_sampler
        # The sampler's own predictor, else the one `baseline="predicted"` reads.
        save = getattr(sampler.estimator, "save_pretrained", None) or getattr(
            sampler.baseline_history, "save_pretrained", None
        )
        if save is not None and self.args.should_save:
            save(os.path.join(output_dir if output_dir is not None else self.args.output_dir, PREDICTOR_DIR))
        super().save_model(output_dir, _internal_call)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        """Overridden to write the sampler's state into each checkpoint, before its `trainer_state.json` and push."""
        super()._save_optimizer_and_scheduler(output_dir)
        inside_block = self._blocks_span_steps and micro_step(self) % self._generate_every != 0
        if not self.args.should_save:
            return
        state = self._sampler_training_state()
        if inside_block:
            # TRL regenerates the whole block on resume: save the state from before it, so nothing is counted twice.
            state = self._ada_state_before_block or state
            self._warn_once(
                "checkpoint_in_block",
                "Checkpoint at step %d falls inside a generation block (steps_per_generation x num_iterations = %d "
                "micro-steps). TRL regenerates that block on resume, so a resumed run re-samples it (the sampler state "
                "saved is the one from before the block) and does not repeat the uninterrupted run exactly. Choose "
                "save_steps so checkpoints fall on block boundaries for exact resumes.",
                self.state.global_step,
                self._generate_every,
            )
        with open(os.path.join(output_dir, SAMPLER_STATE_NAME), "w") as f:
            json.dump(state, f)

    def _load_optimizer_and_scheduler(self, checkpoint) -> None:
        """Overridden to restore the sampler's state where a resume loads the checkpoint's other training state."""
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        # The main process reads the state and sends it (or why it cannot) to all: every process decides the same.
        state = error = None
        if self.accelerator.is_main_process:
            try:
                state = read_sampler_state(checkpoint)
            except CheckpointError as unreadable:
                error = str(unreadable)
        [state, error] = broadcast_object_list([state, error])
        if error is not None:
            raise CheckpointError(
                f"Cannot resume the sampler from {checkpoint}: {error}. Resume from another checkpoint "
                "(resume_from_checkpoint=True takes the newest loadable one)."
            )
        if state is None:
            logger.warning("%s has no %s; the sampler starts fresh.", checkpoint, SAMPLER_STATE_NAME)
            return
        self.ada_sampler.load_state_dict(state["sampler"])
        self.ada_refills.load_state_dict(state["refill"])

    # -- Sampling ------------------------------------------------------------------------------------------------------

    @property
    def _generate_every(self) -> int:
        """Micro-steps between two generations (TRL's `_prepare_inputs` regenerates on this period)."""
        return self.args.steps_per_generation * self.num_iterations

    @property
    def _blocks_span_steps(self) -> bool:
        """Whether one generation block feeds several optimizer steps, so a checkpoint can fall inside one."""
        return self.args.gradient_accumulation_steps % self._generate_every != 0

    def _sampler_training_state(self) -> dict[str, Any]:
        return {"sampler": self.ada_sampler.state_dict(), "refill": self.ada_refills.state_dict()}

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._ada_warned:
            self._ada_warned.add(key)
            logger.warning(message, *args)

    def _sample(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Sample this generation batch (`trl_ada.schedules.driver.sample_step`, which sets `_ada_pending`); return
        this process's kept dataset rows."""
        # The weights do not change between a step's rounds: push them to vLLM (or gather ZeRO-3's) once per step.
        with one_weight_sync_per_step(self), one_parameter_gather_per_step(self):
            return sample_step(self, inputs)

    @functools.cached_property
    def ada_refills(self) -> RefillWalk:
        """DAPO's refill walk over `train_dataset` (its own seeded order per epoch): training state, as the sampler."""
        return refill_walk(self)

    def _log_selection(self, selection: Selection) -> None:
        """Log one sampled generation batch's selection (`ada/*`, once-only warnings); subclasses override it to watch
        every batch's selection."""
        log_selection(self, selection)

    def _correct_frac_reward_zero_std(self, rewards_per_func: torch.Tensor, group_sizes: list[int]) -> None:
        """Replace the `frac_reward_zero_std` TRL just logged by the value over the update's true groups when they are
        not TRL's chunks of `num_generations` rows (TRL's reshape then mixes prompts); with `scale_rewards="batch"`
        TRL's value reads the whole batch's std, which no grouping changes."""
        if not group_sizes or all(size == self.num_generations for size in group_sizes):
            return
        if self.args.scale_rewards == "batch":
            return
        rewards = summed_rewards(self, rewards_per_func)
        train_metrics(self)["frac_reward_zero_std"][-1] = zero_std_row_share(rewards, group_sizes)

    def _generate_round(self, inputs: list[dict[str, Any]], block: int | None = None) -> tuple[list, dict[str, Any]]:
        """Generate one completion per row of `inputs` the way GRPOTrainer does for a generation batch, with the batch
        set up first (environments, tools, images): by TRL's `_prepare_and_generate` where it has one, else by TRL's
        `_generate_and_score_completions` stopped at its `_generate` call. Returns the prompts as generated and
        `_generate`'s output fields; `block` is the rows per prompt vLLM server mode dedupes by (see
        `_generate_single_turn`)."""
        self._ada_round = _RoundCall(block)
        try:
            if TRL_HAS_GENERATION_SEAM:
                prompts, *output = super()._prepare_and_generate(inputs)
                return prompts, split_generate_output(tuple(output))
            super()._generate_and_score_completions(inputs)
        except _RoundGenerated as generated:
            return generated.prompts, split_generate_output(generated.output)
        finally:
            self._ada_round = None
        raise RuntimeError(
            "GRPOTrainer._generate_and_score_completions returned without calling _generate; this TRL release is not "
            "supported by trl-ada."
        )

    @contextlib.contextmanager
    def _finished_episodes(self, num_rows: int) -> Iterator[None]:
        """While TRL builds the training batch from the kept rows, hand its environment set-up stand-ins: the kept
        episodes ran in their rounds, and resetting them again could change a stochastic environment's observation."""
        pool = environment_pool(self)
        if pool is None:
            yield
            return
        set_environment_pool(self, {name: [_FinishedEpisode()] * num_rows for name in pool})
        try:
            yield
        finally:
            set_environment_pool(self, pool)
