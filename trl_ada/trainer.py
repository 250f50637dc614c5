"""`AdaGRPOTrainer`: TRL's GRPOTrainer with Reinforce-Ada adaptive sampling (arXiv 2510.04996)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import inspect
import json
import logging
import math
import os
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import broadcast_object_list, gather_object
from datasets import Dataset, IterableDataset
from huggingface_hub import ModelCard
from trl import GRPOConfig, GRPOTrainer

from .card import describe_rollouts, render_model_card
from .checkpoints import (
    SAMPLER_STATE_NAME,
    CheckpointError,
    checkpoint_problem,
    describe_checkpoints,
    latest_complete_checkpoint,
    read_sampler_state,
)
from .code_reward import CodeExecutionReward
from .config import AdaGRPOConfig
from .continuous_schedule import sample_continuously
from .faults import vllm_server_errors
from .plots import write_metrics, write_training_plots
from .pools import (
    LocalRow,
    PoolEntry,
    RoundLayout,
    generate_fields,
    moved_fraction,
    route_kept_rows,
    row_extra_fields,
)
from .samplers import BatchFiller, PassRateEstimator, SamplerSettings, Selection, build_sampler, rules
from .samplers.predictor import PREDICTOR_CHOICES, PREDICTOR_DIR, PREDICTOR_FILE, PromptKey, prompt_text
from .server_draws import ensure_open_files
from .trl_seam import (
    RepeatSampler,
    add_pending_extra_logs,
    end_of_completion_ids,
    environment_pool,
    get_config_model_id,
    is_vlm,
    logged_advantages,
    make_generate_output,
    micro_step,
    set_environment_pool,
    split_generate_output,
    take_pending_extra_logs,
    train_metrics,
)
from .weight_sync import one_parameter_gather_per_step, one_weight_sync_per_step

logger = logging.getLogger(__name__)

_GRPO_INIT_SIGNATURE = inspect.signature(GRPOTrainer.__init__)


class _RoundGenerated(Exception):
    """Carries a round's generation out of `GRPOTrainer._generate_and_score_completions` (see `_generate_round`)."""

    def __init__(self, prompts: list, output: tuple) -> None:
        super().__init__("a sampling round's generation")
        self.prompts = prompts
        self.output = output


class _FinishedEpisode:
    """
    Stands in for a kept completion's environment when TRL builds the training batch: that episode already ran, and
    was scored, in its sampling round, and the kept row's prompt already carries its observation, so nothing is reset.
    """

    def reset(self, **kwargs: Any) -> None:
        return None


@dataclasses.dataclass
class _SampledBatch:
    group_inputs: list[dict[str, Any]]
    keys: list[str]
    pools: list[list[PoolEntry]]
    """Every prompt's pool in draw order; the completions themselves stay on the process that generated them."""
    selection: Selection


class AdaGRPOTrainer(GRPOTrainer):
    """
    Trainer for Reinforce-Ada ([arXiv 2510.04996](https://huggingface.co/papers/2510.04996)), a drop-in replacement
    for [`~trl.GRPOTrainer`].

    GRPO draws a fixed `num_generations` completions per prompt; when they all succeed or all fail the group has no
    signal. `AdaGRPOTrainer` generates in rounds, spending more completions on prompts whose pool is still unmixed,
    then downsamples every pool to exactly `num_generations` completions, so TRL's loss, log-prob, reference-model and
    importance-sampling path runs unchanged on static shapes. Advantages use the whole pool's mean reward as baseline
    and may carry a per-prompt objective weight (see [`AdaGRPOConfig`]).

    The private `GRPOTrainer` methods overridden, each wrapping its parent rather than copying it (every private
    touchpoint goes through `trl_ada/trl_seam.py`): `_generate` (the sampling rounds, via `super()._generate` on each
    round's share), `_calculate_rewards` (returns the rewards already computed during the rounds for the kept
    completions), `_generate_single_turn` (the round's block size for vLLM server mode) and
    `_generate_and_score_completions` (swaps in the Reinforce-Ada advantages); the sampler's state rides in every
    checkpoint (`_save_optimizer_and_scheduler` / `_load_optimizer_and_scheduler`), and transformers'
    `create_accelerator_and_postprocess` rejects environment-owned data (no `train_dataset`) for a pooling sampler
    right after GRPOTrainer's own checks. Every process makes the same decisions from gathered rewards.

    Args:
        model, reward_funcs, args, train_dataset, ...: as for [`~trl.GRPOTrainer`], in the same positions. A reward
            function may also be named by a key of `trl_ada.rewards.REWARD_FUNCS` (e.g. `"math_verify"`) or a dotted
            import path. A plain `GRPOConfig` is upgraded to an `AdaGRPOConfig` with the default Reinforce-Ada settings.
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

    # Per-generation-batch state handed between the overridden methods. Class-level defaults, so the overrides also
    # work on a trainer built without `__init__` (as TRL's own rollout-dispatch tests build one).
    _ada_kept_rows: list[LocalRow] | None = None
    _ada_kept_rewards: torch.Tensor | None = None
    _ada_advantages: torch.Tensor | None = None
    _ada_round_block: int | None = None
    _ada_generating_round: bool = False
    _ada_state_before_block: dict[str, Any] | None = None
    _ada_warned: frozenset[str] = frozenset()
    _ada_environment_owns_data: bool = False

    def __init__(
        self,
        model,
        reward_funcs=None,
        args: AdaGRPOConfig | GRPOConfig | None = None,
        *positional: Any,
        pass_rate_estimator: PassRateEstimator | None = None,
        **kwargs: Any,
    ) -> None:
        # Same signature as GRPOTrainer (positional arguments included); our own parameters are keyword-only.
        try:
            named = _GRPO_INIT_SIGNATURE.bind(self, model, reward_funcs, args, *positional, **kwargs).arguments
        except TypeError as error:
            raise TypeError(
                f"AdaGRPOTrainer takes GRPOTrainer's arguments plus pass_rate_estimator=: {error}"
            ) from None
        train_dataset = named.get("train_dataset")
        environment_factory = named.get("environment_factory")
        # GRPOTrainer lets an environment own the data (no train_dataset; reset() returns the prompt). Only plain GRPO
        # can take that: see `create_accelerator_and_postprocess`.
        self._ada_environment_owns_data = environment_factory is not None and train_dataset is None
        if args is None:
            model_name = model if isinstance(model, str) else get_config_model_id(model.config)
            args = AdaGRPOConfig(f"{model_name.split('/')[-1]}-Ada")
        elif not isinstance(args, AdaGRPOConfig):
            args = _upgrade_config(args, environment_owns_data=self._ada_environment_owns_data)
        if environment_factory is None:
            _check_prompt_column(train_dataset)  # with environments, GRPOTrainer lets reset() supply the prompt
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
        reward_funcs = _resolve_reward_names(reward_funcs)
        self.ada_sampler = build_sampler(settings, pass_rate_estimator, resolve_pass_rate_predictor(settings))
        super().__init__(model, reward_funcs, args, *positional, **kwargs)
        if args.generation_schedule == "continuous" and is_vlm(self):
            raise ValueError(
                "generation_schedule='continuous' sends token ids only; a vision-language model's prompts carry "
                "images. Use generation_schedule='rounds'."
            )
        self._refill_state = {"epoch": 0, "position": 0}
        self._refill_indices: list[int] | None = None

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any):
        """
        [`~transformers.Trainer.train`], except that `resume_from_checkpoint=True` picks the newest *loadable*
        checkpoint in `output_dir` (one whose save was interrupted, or whose model, optimizer or sampler state is
        corrupt, is skipped with a warning saying why) and fails before any step when there is none. A checkpoint path
        that does not exist or cannot be loaded fails before any step too, naming the file and listing the checkpoints
        there are. The main process picks the checkpoint for all processes, and every process must see it (the Trainer
        saves the model on the main process only, so `output_dir` must be shared by every machine); otherwise all
        processes fail together with that message, instead of one failing and the others hanging in a collective.
        """
        if resume_from_checkpoint is True:
            picked = None
            if self.accelerator.is_main_process:
                picked = latest_complete_checkpoint(self.args.output_dir, warn=True)
            [resume_from_checkpoint] = broadcast_object_list([picked])
            if resume_from_checkpoint is None:
                raise ValueError(
                    f"resume_from_checkpoint=True, but {self.args.output_dir!r} holds no complete checkpoint-N "
                    f"directory that can be loaded: {describe_checkpoints(self.args.output_dir)} Pass a checkpoint "
                    "path, or start without resume_from_checkpoint."
                )
        if isinstance(resume_from_checkpoint, str | os.PathLike):
            self._check_resumable(os.fspath(resume_from_checkpoint))
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def create_accelerator_and_postprocess(self) -> None:
        # `Trainer.__init__` calls this first, so here GRPOTrainer has validated its own arguments (its errors about
        # environment-owned data come first, exactly as from GRPOTrainer) and nothing is set up yet: no accelerator,
        # no reference model, no vLLM.
        self._reject_environment_owned_data()
        super().create_accelerator_and_postprocess()

    def _reject_environment_owned_data(self) -> None:
        sampler = self.ada_sampler.settings.sampler
        if self._ada_environment_owns_data and sampler != "uniform":
            raise ValueError(
                f"sampler={sampler!r} needs a train_dataset with environment_factory: it draws a varying number of "
                "episodes per dataset row and pools them as draws of one task, so each row must name the task its "
                "environment's reset(**row) sets up (e.g. a `seed` column), where GRPOTrainer lets an environment "
                "own the data and invent a task per episode. Pass such a train_dataset, or use sampler='uniform' "
                "(plain GRPO, which trains on environment-owned data as GRPOTrainer does)."
            )

    def _check_resumable(self, checkpoint: str) -> None:
        """
        Fail on every process, before anything loads, when `checkpoint` cannot be resumed from: the main process's
        copy decides whether it exists and loads (its message lists the checkpoints there are); otherwise every process
        must see a loadable copy.
        """
        problem = checkpoint_problem(checkpoint)
        listing = None
        if problem is not None and self.accelerator.is_main_process:
            directories = [os.path.dirname(os.path.normpath(checkpoint)) or ".", self.args.output_dir]
            listing = " ".join(
                describe_checkpoints(directory)
                for i, directory in enumerate(directories)
                if os.path.realpath(directory) not in {os.path.realpath(d) for d in directories[:i]}
            )
        statuses = gather_object([(os.path.exists(checkpoint), problem, listing)])
        main_exists, main_problem, main_listing = statuses[0]
        if not main_exists:
            raise ValueError(
                f"resume_from_checkpoint={checkpoint!r} does not exist. {main_listing} Pass one of those checkpoints, "
                "resume_from_checkpoint=True for the newest loadable one, or start without resume_from_checkpoint."
            )
        if main_problem is not None:
            raise ValueError(
                f"Cannot resume from {checkpoint!r}: {main_problem}. {main_listing} Pass another checkpoint, "
                "resume_from_checkpoint=True for the newest loadable one, or start without resume_from_checkpoint."
            )
        blind = [rank for rank, (_, rank_problem, _) in enumerate(statuses) if rank_problem is not None]
        if blind:
            raise ValueError(
                f"Process(es) {blind} of {len(statuses)} cannot read the complete checkpoint {checkpoint!r}. The "
                "Trainer writes the model on the main process only, so resuming needs output_dir on a filesystem every "
                "machine shares (or copy the checkpoint to each machine at the same path)."
            )

    # ------------------------------------------------------------------------------------------------------------
    # Overrides (each calls its parent)
    # ------------------------------------------------------------------------------------------------------------

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
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
            advantages = self._ada_advantages
        finally:
            # Whatever happened, nothing of this batch may leak into the next one.
            self._ada_kept_rows = self._ada_kept_rewards = self._ada_advantages = None
        if advantages is not None:
            local = len(inputs)
            start = self.accelerator.process_index * local
            output["advantages"] = advantages[start : start + local].to(output["advantages"])
            # TRL logged its own group-normalised advantages for the completions table; show the trained ones.
            logged = logged_advantages(self)
            for _ in range(min(len(advantages), len(logged))):
                logged.pop()
            logged.extend(advantages.tolist())
        return output

    def _generate(self, prompts: list):
        if self._ada_generating_round:
            self._ada_generating_round = False
            raise _RoundGenerated(prompts, super()._generate(prompts))
        rows = self._ada_kept_rows
        if rows is None:
            return super()._generate(prompts)
        self._ada_kept_rows = None
        for column in {column for row in rows for column in row.extra_logs}:
            add_pending_extra_logs(self, column, [row.extra_logs.get(column) for row in rows])
        # Everything `_generate` returned for each kept row (tool/env masks, a rollout's extra fields, images) comes back.
        return make_generate_output(**generate_fields(rows))

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list) -> torch.Tensor:
        rewards = self._ada_kept_rewards
        if rewards is not None:
            # Rewards of the kept completions were computed during the rounds; never score a completion twice.
            self._ada_kept_rewards = None
            return rewards
        return super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, **kwargs):
        # vLLM server mode dedupes prompts by `num_generations`; in a round each prompt is repeated by the round's block.
        # Only the round's first call is the one `_generate` makes with `num_generations`; TRL's tool loop then calls
        # again with its own count (one continuation per row), which must stand.
        if self._ada_round_block is not None:
            num_generations, self._ada_round_block = self._ada_round_block, None
        return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations, **kwargs)

    def create_model_card(
        self, model_name: str | None = None, dataset_name: str | None = None, tags: str | list[str] | None = None
    ) -> None:
        """
        Write `README.md` from trl-ada's template (`hub_cards/`) with a Reinforce-Ada section, plus the plots and the
        logged metrics it shows, into `output_dir` (so `push_to_hub` uploads them together).
        """
        # TRL decides the card's metadata (base model, tags, dataset); we only replace the text.
        super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
        if not self.is_world_process_zero():
            return
        output_dir = Path(self.args.output_dir)
        trl_card = ModelCard.load(output_dir / "README.md")
        write_metrics(self.state.log_history, output_dir)
        plots = write_training_plots(self.state.log_history, output_dir)
        example = self.train_dataset[0].get("prompt") if isinstance(self.train_dataset, Dataset) else None
        card = render_model_card(
            trl_card.data,
            settings=self.ada_sampler.settings,
            log_history=self.state.log_history,
            plots=plots,
            output_dir=output_dir,
            model_name=model_name,
            hub_model_id=self.hub_model_id,
            base_model_name_or_path=get_config_model_id(self.accelerator.unwrap_model(self.model).config),
            paper=self._paper,
            **({"example_prompt": example} if isinstance(example, str) else {}),
            example_max_new_tokens=self.args.max_completion_length or 64,
            rollouts=self._describe_rollouts(),
        )
        card.save(output_dir / "README.md")

    def _describe_rollouts(self) -> list[str]:
        factories = self.environment_factories or {}
        return describe_rollouts(
            tool_names=[getattr(tool, "__name__", str(tool)) for tool in self.tools or []],
            environment_names=sorted({getattr(factory, "__name__", str(factory)) for factory in factories.values()}),
            rollout_func_name=getattr(self.rollout_func, "__name__", None) if self.rollout_func else None,
            vision=is_vlm(self),
        )

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """
        [`~transformers.Trainer.save_model`], plus the learned pass-rate predictor (an estimator with
        `save_pretrained`) in `pass_rate_predictor/` of the model directory, written first so that a push of the
        model directory uploads it too; `pass_rate_predictor=<that directory or Hub id>` warm-starts another run.
        """
        save = getattr(self.ada_sampler.pass_rate_estimator, "save_pretrained", None)
        if save is not None and self.args.should_save:
            save(os.path.join(output_dir if output_dir is not None else self.args.output_dir, PREDICTOR_DIR))
        super().save_model(output_dir, _internal_call)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        super()._save_optimizer_and_scheduler(output_dir)
        # The sampler's generator, trackers and refill position are training state, like TRL's RNG. Written here, inside
        # the checkpoint and before `trainer_state.json` and the hub push (`_save_checkpoint` pushes at its end).
        if not self.args.should_save:
            return
        state = self._sampler_training_state()
        if self._blocks_span_steps and micro_step(self) % self._generate_every != 0:
            # Inside a generation block: TRL regenerates the whole block on resume, so save the state from before the
            # block; the resumed run then draws that batch again instead of counting it twice.
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
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        # Every process must make the same decisions: the main process reads the state and sends it to all (or the
        # reason it cannot, so that every process fails rather than the others waiting in the broadcast).
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
        self._refill_state = dict(state["refill"])
        self._refill_indices = None

    # ------------------------------------------------------------------------------------------------------------
    # Sampling
    # ------------------------------------------------------------------------------------------------------------

    @property
    def _generate_every(self) -> int:
        """Micro-steps between two generations (TRL's `_prepare_inputs` regenerates on this period)."""
        return self.args.steps_per_generation * self.num_iterations

    @property
    def _blocks_span_steps(self) -> bool:
        """Whether one generation block feeds several optimizer steps, so a checkpoint can fall inside one."""
        return self.args.gradient_accumulation_steps % self._generate_every != 0

    def _sampler_training_state(self) -> dict[str, Any]:
        return {"sampler": self.ada_sampler.state_dict(), "refill": dict(self._refill_state)}

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._ada_warned:
            self._ada_warned = self._ada_warned | {key}
            logger.warning(message, *args)

    def _sample(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Run the rounds (and DAPO refills); cache the kept rows; return this process's kept dataset rows."""
        # The weights do not change between a step's rounds: push them to vLLM (or gather ZeRO-3's) once per step.
        with one_weight_sync_per_step(self), one_parameter_gather_per_step(self):
            return self._sample_rounds(inputs)

    def _sample_rounds(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        rank = self.accelerator.process_index
        settings = self.ada_sampler.settings
        # TRL's RepeatSampler lays the generation batch out group-major across processes: global rows
        # [g * n, (g + 1) * n) hold prompt g. Gather once so every process sees every prompt.
        batches = [self._sample_batch(self._group_rows(inputs))]
        chosen = [(0, g) for g in range(len(batches[0].group_inputs))]
        if settings.refills:
            filler = BatchFiller(len(chosen))
            filler.add(batches[0].selection)
            in_step = set(batches[0].keys)
            while not filler.is_full and len(batches) <= settings.dapo_max_refills:
                # Every process draws the same global refill batch, so no gather is needed.
                refill = self._next_refill_prompts(len(chosen), exclude=in_step)
                if not refill:
                    break  # every prompt of the dataset is already in this step
                batches.append(self._sample_batch(refill))
                filler.add(batches[-1].selection)
            chosen = filler.take(keep_partial=settings.dapo_on_exhausted == "keep_partial")
            for name, value in filler.metrics().items():
                train_metrics(self)[f"ada/{name}"].append(value)

        kept: list[PoolEntry] = []
        kept_inputs: list[dict[str, Any]] = []
        advantages: list[float] = []
        for b, g in chosen:
            batch = batches[b]
            result = batch.selection.prompts[g]
            kept.extend(batch.pools[g][i] for i in result.kept)
            # One copy per row: TRL merges a rollout's per-row extra fields into these dicts in place.
            kept_inputs.extend(dict(batch.group_inputs[g]) for _ in result.kept)
            advantages.extend(result.advantages)
        self._ada_kept_rewards = torch.stack([entry.rewards_per_func for entry in kept])
        # When the pool is the group and every weight is 1, Reinforce-Ada's advantage *is* GRPO's: keep TRL's own
        # float32 computation so `uniform` (and a one-round seq_* batch) reproduces GRPOTrainer bit for bit.
        identity = chosen == [(0, g) for g in range(len(chosen))]
        if not (identity and batches[0].selection.is_plain_grpo):
            self._ada_advantages = torch.tensor(advantages, dtype=torch.float32, device=self.accelerator.device)
        local = len(inputs)
        num_processes = self.accelerator.num_processes
        # Each kept row moves once, from the process that generated it to the one that trains on it.
        self._ada_kept_rows = route_kept_rows(kept, rank, num_processes, self.accelerator.device)
        if num_processes > 1:
            train_metrics(self)["ada/kept_rows_moved"].append(moved_fraction(kept, num_processes))
        # An environment's observation is part of the prompt each kept completion was generated from.
        return [
            row if kept_row.prompt is None else {**row, "prompt": kept_row.prompt}
            for row, kept_row in zip(kept_inputs[rank * local : (rank + 1) * local], self._ada_kept_rows, strict=True)
        ]

    def _group_rows(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """
        One dataset row per prompt of the whole generation batch, on every process. TRL's RepeatSampler lays the batch
        out group-major across processes (global rows [g * n, (g + 1) * n) hold prompt g), so only each group's first
        row is gathered; every process checks its own rows against it, and all fail together if one layout is wrong.
        """
        n = self.num_generations
        start = self.accelerator.process_index * len(inputs)
        groups = gather_object([row for i, row in enumerate(inputs) if (start + i) % n == 0])
        # Each group's key once (it hashes the prompt and any images), not once per row.
        group_keys = {g: _prompt_key(groups[g]) for g in {(start + i) // n for i in range(len(inputs))}}
        misplaced = sum(_prompt_key(row) != group_keys[(start + i) // n] for i, row in enumerate(inputs))
        if self.accelerator.gather(torch.tensor([misplaced], device=self.accelerator.device)).sum().item():
            raise RuntimeError(
                "AdaGRPOTrainer expects each prompt's num_generations rows to be contiguous (TRL's RepeatSampler "
                "layout). Do not override the train sampler or shuffle the generation batch before generation."
            )
        return groups

    def _sample_batch(self, group_inputs: list[dict[str, Any]]) -> _SampledBatch:
        """All rounds for one batch of prompts: every process runs the same control on gathered rewards."""
        # The keys also carry the prompt's text, for a learned pass-rate predictor (trl_ada.samplers.PromptKey).
        keys = [_prompt_key(row) for row in group_inputs]
        keys = [
            PromptKey(key, prompt_text(row["prompt"]) if "prompt" in row else key)
            for key, row in zip(keys, group_inputs, strict=True)
        ]
        if self.args.generation_schedule == "continuous":
            continuous_pools: list[list[PoolEntry]] = [[] for _ in group_inputs]
            selection, stats = sample_continuously(self, group_inputs, keys, continuous_pools)
            self._log_selection(selection)
            metrics = train_metrics(self)
            for name, value in stats.metrics().items():
                metrics[f"ada/{name}"].append(value)
            return _SampledBatch(group_inputs, keys, continuous_pools, selection)
        step = self.ada_sampler.begin(len(group_inputs), keys)
        pools: list[list[PoolEntry]] = [[] for _ in group_inputs]
        round_seconds: list[float] = []
        while requests := step.requests():
            # A round waits for its slowest completion (or agent episode): its wall time is the price of a round.
            started = time.perf_counter()
            order, entries, rewards = self._run_round(requests, group_inputs, round_index=step.rounds + 1)
            round_seconds.append(time.perf_counter() - started)
            for g, entry in zip(order, entries, strict=True):
                pools[g].append(entry)
            # TRL masks truncated completions out of the loss: they must not satisfy an exit rule or take kept slots.
            masked = [entry.truncated for entry in entries] if self.mask_truncated_completions else None
            step.observe(requests, rewards, masked)
        selection = step.finish()
        self._log_selection(selection)
        metrics = train_metrics(self)
        metrics["ada/round_time/mean"].append(sum(round_seconds) / len(round_seconds))
        metrics["ada/round_time/max"].append(max(round_seconds))
        metrics["ada/round_time/total"].append(sum(round_seconds))
        return _SampledBatch(group_inputs, keys, pools, selection)

    def _next_refill_prompts(self, count: int, exclude: set[str]) -> list[dict[str, Any]]:
        """
        Up to `count` dataset rows (one per prompt) for a DAPO refill, none of whose prompts is in `exclude`; the keys
        of the prompts returned are added to `exclude`.

        Refills walk their own seeded permutation of the dataset (`seed + 1 + epoch`; the main loader, which the Trainer
        owns, uses `seed`), identical on every process, and skip prompts already in the step, so one update never
        holds two groups of the same prompt. Fewer than `count` (or none) come back when the dataset has no more
        prompts outside `exclude`.
        """
        state = self._refill_state
        dataset_size = len(self.train_dataset)
        rows: list[dict[str, Any]] = []
        scanned = 0  # a whole pass over the dataset without a new prompt means there is none left
        while len(rows) < count and scanned < dataset_size:
            if self._refill_indices is None:
                # Rebuilt lazily (also after a checkpoint load): the position may sit at the end of an epoch.
                self._refill_indices = list(
                    RepeatSampler(
                        data_source=self.train_dataset,
                        mini_repeat_count=1,
                        batch_size=1,
                        repeat_count=1,
                        shuffle=True,
                        seed=self.args.seed + 1 + state["epoch"],
                    )
                )
            if state["position"] >= len(self._refill_indices):
                state["epoch"], state["position"] = state["epoch"] + 1, 0
                self._refill_indices = None
                continue
            row = self.train_dataset[self._refill_indices[state["position"]]]
            state["position"] += 1
            scanned += 1
            key = _prompt_key(row)
            if key not in exclude:
                exclude.add(key)
                rows.append(row)
        return rows

    def _run_round(self, requests, group_inputs, round_index: int):
        """
        Generate and score one round on all processes; return each requested row's prompt (index into the batch), pool
        entry and summed reward, in request order.
        Only the rewards (TRL's own gather) and the truncation flags cross processes; each completion stays, compacted,
        on the process that generated it.
        """
        num_processes, rank = self.accelerator.num_processes, self.accelerator.process_index
        layout = RoundLayout.plan(requests, num_processes)
        share = layout.share(rank)
        share_inputs = [group_inputs[g] for g in share]

        self._ada_round_block = layout.block
        try:
            with vllm_server_errors(self, round_index):  # a lost vLLM server: a clear error, not a hang
                prompts, fields = self._generate_round(share_inputs)
        finally:
            self._ada_round_block = None
        completion_ids = fields["completion_ids"]
        scored_inputs = _with_extra_fields(share_inputs, fields["extra_fields"])
        try:
            # Environment-owned rewards read `self.environments`: this round's episodes, one per row.
            rewards_per_func = self._calculate_rewards(scored_inputs, prompts, fields["completions"], completion_ids)
        except Exception as error:
            raise RuntimeError(
                f"{_failing_reward_name(error, self.reward_funcs, self.reward_func_names)} raised during sampling round "
                f"{round_index} of training step {self.state.global_step + 1}: {type(error).__name__}: {error}. "
                "Checkpoints saved so far are intact; fix the reward function and resume with "
                "resume_from_checkpoint."
            ) from error
        extra_logs = self._take_extra_logs(len(share))
        local_truncated = torch.tensor(
            [self._is_truncated(ids) for ids in completion_ids], dtype=torch.uint8, device=self.accelerator.device
        )
        truncated = self.accelerator.gather(local_truncated).bool().tolist()

        rewards = self._sum_rewards(rewards_per_func)[: len(layout.order)].tolist()
        with_environments = environment_pool(self) is not None
        entries = []
        for j in range(len(layout.order)):
            holder, i = layout.holder(j)
            row = None
            if holder == rank:
                row = LocalRow.from_generated(fields, i, extra_logs[i], prompts[i] if with_environments else None)
            entries.append(PoolEntry(rewards_per_func[j], truncated[j], holder, row))
        return layout.order, entries, rewards

    def _generate_round(self, inputs: list[dict[str, Any]]) -> tuple[list, dict[str, Any]]:
        """
        Generate one completion per row of `inputs` the way GRPOTrainer does for a generation batch: its
        `_generate_and_score_completions` first sets the batch up (one environment episode per row, reset with the row
        and its observation appended to the prompt; per-row tool dicts; image columns turned into multimodal messages)
        and then calls `_generate`, where the round stops it (nothing of its scoring and log-prob pass runs). Returns
        the prompts as generated and `_generate`'s output fields; `self.environments` keeps the round's episodes for
        environment-owned rewards.
        """
        self._ada_generating_round = True
        try:
            super()._generate_and_score_completions(inputs)
        except _RoundGenerated as generated:
            return generated.prompts, split_generate_output(generated.output)
        finally:
            self._ada_generating_round = False
        raise RuntimeError(
            "GRPOTrainer._generate_and_score_completions returned without calling _generate; this TRL release is not "
            "supported by trl-ada."
        )

    @contextlib.contextmanager
    def _finished_episodes(self, num_rows: int) -> Iterator[None]:
        """
        While TRL builds the training batch from the kept rows, hand its environment set-up stand-ins: the kept
        episodes ran and were scored in their rounds, and resetting real instances again would cost a reset per row
        and could change a stochastic environment's observation.
        """
        pool = environment_pool(self)
        if pool is None:
            yield
            return
        set_environment_pool(self, {name: [_FinishedEpisode()] * num_rows for name in pool})
        try:
            yield
        finally:
            set_environment_pool(self, pool)

    def _is_truncated(self, completion_ids: list[int]) -> bool:
        """TRL's definition: a completion that does not end with EOS or padding hit `max_completion_length`."""
        return bool(completion_ids) and completion_ids[-1] not in end_of_completion_ids(self)

    def _sum_rewards(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """TRL's `sum_then_normalize` reward: weighted sum over reward functions, NaN when every function said None."""
        weights = self.reward_weights.to(rewards_per_func.device).unsqueeze(0)
        rewards = (rewards_per_func * weights).nansum(dim=1)
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        return rewards

    def _take_extra_logs(self, num_rows: int) -> list[dict[str, Any]]:
        """Move the `log_extra` columns that reward functions wrote this round onto the rows they describe."""
        pending = take_pending_extra_logs(self)
        columns = sorted(set(gather_object(list(pending))))
        per_row: list[dict[str, Any]] = [{} for _ in range(num_rows)]
        for column in columns:
            values = pending.get(column, [])
            for i in range(num_rows):
                per_row[i][column] = values[i] if i < len(values) else None
        return per_row

    def _log_selection(self, selection: Selection) -> None:
        metrics = train_metrics(self)
        for name, value in selection.metrics.items():
            metrics[f"ada/{name}"].append(value)
        self._check_threshold(selection)
        self._check_unscorable(selection)

    def _check_unscorable(self, selection: Selection) -> None:
        """
        Warn once when no reward function scored any draw of a prompt (all returned None): the sampler stops such a
        prompt at `num_generations` draws, and it trains with zero advantages.
        """
        pools = [pool for pool in selection.pools if pool and not any(rules.is_scorable(r) for r in pool)]
        if pools:
            self._warn_once(
                "unscorable",
                "Every reward function (%s) returned None for all draws of %d of %d prompts (%d completions), so they "
                "carry no signal: trl-ada stops drawing for such a prompt once its update group of num_generations=%d "
                "is filled, and it trains with zero advantages (ada/unscorable_share logs their share). Make a reward "
                "function score these prompts, or remove them from the dataset.",
                ", ".join(self.reward_func_names),
                len(pools),
                len(selection.pools),
                sum(len(pool) for pool in pools),
                self.num_generations,
            )

    def _check_threshold(self, selection: Selection) -> None:
        """
        Warn once when a batch's rewards vary yet all fall on one side of `positive_threshold`: the rewards carry a
        signal the threshold cannot see (e.g. 5.0 with 0/1 rewards), so every exit rule waits for the whole cap.
        """
        threshold = self.ada_sampler.settings.positive_threshold
        rewards = [r for pool in selection.pools for r in pool if not math.isnan(r)]
        if not rewards or max(rewards) - min(rewards) <= self.ada_sampler.settings.zero_variance_tolerance:
            return
        positives, negatives = rules.count_outcomes(rewards, threshold)
        side = "positive" if positives == 0 else "negative" if negatives == 0 else None
        if side is not None:
            self._warn_once(
                f"no_{side}",
                "No completion of a whole generation batch (%d prompts, %d completions, rewards %.4g to %.4g) was %s "
                "at positive_threshold=%s, so the exit rule, the balanced downsampling and p̂ cannot tell outcomes "
                "apart and adaptive samplers spend the whole cap. Set positive_threshold between your rewards' failure "
                "and success values.",
                len(selection.pools),
                len(rewards),
                min(rewards),
                max(rewards),
                side,
                threshold,
            )


def resolve_pass_rate_predictor(settings: SamplerSettings) -> str | None:
    """
    The local snapshot (`huggingface_hub.snapshot_download` of `pass_rate_predictor/`) of the Hub repo id that
    `settings.pass_rate_predictor` names; `None` for "tracker", "learned" and a local directory, which need no
    download. Raises `ValueError` naming the repo when it cannot be downloaded.
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


def _prompt_key(row: dict[str, Any]) -> str:
    """
    A stable id for a prompt: the dataset's `prompt_id` column when present, else a hash of the prompt and its images
    (or of the whole row, when an environment supplies the prompt), the same on every process.
    """
    if "prompt_id" in row:
        return str(row["prompt_id"])
    task = {name: row[name] for name in ("prompt", "image", "images") if name in row} if "prompt" in row else row
    text = json.dumps(task, sort_keys=True, default=_stable_repr)
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def _stable_repr(value: Any) -> str:
    """JSON stand-in for a non-JSON value; an image (anything with `tobytes`) by its content, not its address."""
    if hasattr(value, "tobytes"):
        return f"{type(value).__name__}:{getattr(value, 'size', '')}:{hashlib.sha1(value.tobytes()).hexdigest()}"
    return str(value)


def _with_extra_fields(inputs: list[dict[str, Any]], extra_fields: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Copies of a round's dataset rows (which share one dict per prompt) with a `rollout_func`'s extra fields merged
    in, as GRPOTrainer merges them before scoring."""
    if not extra_fields:
        return inputs
    return [{**row, **row_extra_fields(extra_fields, i)} for i, row in enumerate(inputs)]


def _upgrade_config(args: GRPOConfig, environment_owns_data: bool = False) -> AdaGRPOConfig:
    """
    Turn a plain `GRPOConfig` into an `AdaGRPOConfig`, keeping every value the user set. When an environment owns the
    data (no train_dataset), which only plain GRPO can train on, the sampler is `uniform` (with a warning), so every
    config GRPOTrainer accepts is accepted.
    """
    if not isinstance(args, GRPOConfig):
        raise TypeError(f"args must be an AdaGRPOConfig or a trl.GRPOConfig, got {type(args).__name__}.")
    upgraded = AdaGRPOConfig.from_grpo_config(args, environment_owns_data)
    logger.info("Got a GRPOConfig; using AdaGRPOConfig's Reinforce-Ada defaults (sampler=%r).", upgraded.sampler)
    return upgraded


def _check_prompt_column(dataset: Any) -> None:
    """GRPOTrainer reads prompts from a `prompt` column; say so at construction rather than at the first step."""
    columns = getattr(dataset, "column_names", None)
    if dataset is None or columns is None or "prompt" in columns:
        return
    raise ValueError(
        f"train_dataset has no 'prompt' column (columns: {list(columns)}). AdaGRPOTrainer, like GRPOTrainer, reads "
        "each prompt from 'prompt': rename yours, e.g. dataset.rename_column('question', 'prompt')."
    )


def _resolve_reward_names(reward_funcs: Any) -> Any:
    """
    Replace reward-function names of trl-ada's registry (`"math_verify"`, `"exact_match"`, ...) and dotted import paths
    by the functions; hub ids and local paths (reward models) stay for TRL. A bare unknown name would otherwise be
    retried against the Hub as a model id for about a minute.
    """
    from .rewards import REWARD_FUNCS, get_reward_funcs

    if reward_funcs is None:
        return None
    names = reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
    resolved = []
    for func in names:
        if not isinstance(func, str) or os.path.exists(func):
            resolved.append(func)
        elif func in REWARD_FUNCS or ("." in func and "/" not in func):
            resolved.extend(get_reward_funcs([func]))
        elif "/" in func:
            resolved.append(func)  # a Hub reward model, e.g. "org/reward-model"
        else:
            raise ValueError(
                f"Unknown reward function {func!r}: not a trl-ada reward name ({sorted(REWARD_FUNCS)}), a dotted "
                "import path, a local reward-model directory, or a Hub id of the form 'org/model'. Pass a callable, "
                "or one of those."
            )
    for func in resolved:
        if isinstance(func, CodeExecutionReward):
            func.sandbox  # noqa: B018 - builds the sandbox now: a missing bubblewrap fails before the model loads
    return resolved if isinstance(reward_funcs, list) else resolved[0]


def _failing_reward_name(error: BaseException, funcs: list[Any], names: list[str]) -> str:
    """Which reward function raised `error`: the innermost traceback frame that runs one of them."""
    codes = {}
    for func, name in zip(funcs, names, strict=True):
        code = getattr(getattr(func, "__wrapped__", func), "__code__", None) or getattr(func, "__code__", None)
        if code is not None:
            codes[code] = name
    found = None
    traceback = error.__traceback__
    while traceback is not None:
        found = codes.get(traceback.tb_frame.f_code, found)
        traceback = traceback.tb_next
    return f"Reward function {found!r}" if found else f"A reward function (one of {names})"
