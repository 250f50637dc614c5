"""`AdaGRPOTrainer`: TRL's GRPOTrainer with Reinforce-Ada adaptive sampling (arXiv 2510.04996)."""

from __future__ import annotations

import dataclasses
import logging
import math
import textwrap
from collections import defaultdict
from typing import Any

import torch
from accelerate.utils import gather_object
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import get_config_model_id

from .config import AdaGRPOConfig
from .samplers import Selection, build_sampler

logger = logging.getLogger(__name__)

_REJECTED_FEATURES = {
    "tools": "tool calling",
    "rollout_func": "a custom rollout_func",
    "environment_factory": "environments",
}


@dataclasses.dataclass
class _PoolRow:
    """One completion in a prompt's pool, with everything needed to hand it to TRL's update if it is kept."""

    prompt_ids: list[int]
    completion_ids: list[int]
    completion: Any
    logprobs: list[float] | None
    rewards_per_func: torch.Tensor
    extra_logs: dict[str, Any]


class AdaGRPOTrainer(GRPOTrainer):
    """
    Trainer for Reinforce-Ada ([arXiv 2510.04996](https://huggingface.co/papers/2510.04996)), a drop-in replacement
    for [`~trl.GRPOTrainer`].

    GRPO draws a fixed `num_generations` completions per prompt; when they all succeed or all fail the group has no
    signal. `AdaGRPOTrainer` generates in rounds, spending more completions on prompts whose pool is still unmixed,
    then downsamples every pool to exactly `num_generations` completions, so TRL's loss, log-prob, reference-model and
    importance-sampling path runs unchanged on static shapes. Advantages use the whole pool's mean reward as baseline
    and may carry a per-prompt objective weight (see [`AdaGRPOConfig`]).

    Only three methods of `GRPOTrainer` are overridden, each wrapping its parent rather than copying it:
    `_generate` (the sampling rounds, via `super()._generate` on each round's share), `_calculate_rewards` (returns
    the rewards already computed during the rounds for the kept completions) and `_generate_and_score_completions`
    (swaps in the Reinforce-Ada advantages). Every process makes the same decisions from gathered rewards.

    Args:
        model, reward_funcs, train_dataset, ...: as for [`~trl.GRPOTrainer`].
        args ([`AdaGRPOConfig`] or [`~trl.GRPOConfig`], *optional*):
            A plain `GRPOConfig` is upgraded to an `AdaGRPOConfig` with the default Reinforce-Ada settings.
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

    def __init__(self, model, reward_funcs=None, args: AdaGRPOConfig | GRPOConfig | None = None, **kwargs) -> None:
        if args is None:
            model_name = model if isinstance(model, str) else get_config_model_id(model.config)
            args = AdaGRPOConfig(f"{model_name.split('/')[-1]}-Ada")
        elif not isinstance(args, AdaGRPOConfig):
            args = _upgrade_config(args)
        for name, feature in _REJECTED_FEATURES.items():
            if kwargs.get(name) is not None:
                raise ValueError(
                    f"AdaGRPOTrainer does not support {feature} yet: the sampling rounds regenerate completions per "
                    f"prompt, which {name} does not allow. Remove `{name}`, or train with trl.GRPOTrainer."
                )
        super().__init__(model, reward_funcs, args=args, **kwargs)
        if self._is_vlm:
            raise ValueError(
                "AdaGRPOTrainer does not support vision-language models yet. Train with trl.GRPOTrainer instead."
            )
        self.ada_sampler = build_sampler(args.sampler_settings())
        self._ada_inputs: list[dict[str, Any]] | None = None
        self._ada_kept_rewards: torch.Tensor | None = None
        self._ada_advantages: torch.Tensor | None = None
        self._ada_round_block: int | None = None

    # ------------------------------------------------------------------------------------------------------------
    # Overrides (each calls its parent)
    # ------------------------------------------------------------------------------------------------------------

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        # `_generate` only receives prompts; the reward functions also need the dataset rows.
        self._ada_inputs = inputs
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            self._ada_inputs = None
        if self._ada_advantages is not None:
            advantages, self._ada_advantages = self._ada_advantages, None
            local = len(inputs)
            start = self.accelerator.process_index * local
            output["advantages"] = advantages[start : start + local].to(output["advantages"])
            # TRL logged its own group-normalised advantages for the completions table; show the trained ones.
            logged = self._logs["advantages"]
            for _ in range(min(len(advantages), len(logged))):
                logged.pop()
            logged.extend(advantages.tolist())
        return output

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list) -> torch.Tensor:
        if self._ada_kept_rewards is not None:
            # Rewards of the kept completions were computed during the rounds; never score a completion twice.
            rewards, self._ada_kept_rewards = self._ada_kept_rewards, None
            return rewards
        return super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, **kwargs):
        # vLLM server mode dedupes prompts by `num_generations`; in a round each prompt is repeated by the round's block.
        if self._ada_round_block is not None:
            num_generations = self._ada_round_block
        return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations, **kwargs)

    def _generate(self, prompts: list):
        if not self.model.training or self._ada_inputs is None:
            return super()._generate(prompts)  # evaluation stays plain GRPO
        return self._generate_adaptive(prompts, self._ada_inputs)

    # ------------------------------------------------------------------------------------------------------------
    # The sampling rounds
    # ------------------------------------------------------------------------------------------------------------

    def _generate_adaptive(self, prompts: list, inputs: list[dict[str, Any]]):
        n = self.num_generations
        num_processes, rank = self.accelerator.num_processes, self.accelerator.process_index
        local_rows = len(prompts)
        # TRL's RepeatSampler lays the generation batch out group-major across processes: global rows
        # [g * n, (g + 1) * n) hold prompt g. Gather once so every process sees every prompt and row.
        all_prompts = gather_object(prompts)
        all_inputs = gather_object(inputs)
        num_prompts = len(all_prompts) // n
        for g in range(num_prompts):
            if any(all_prompts[g * n + j] != all_prompts[g * n] for j in range(1, n)):
                raise RuntimeError(
                    "AdaGRPOTrainer expects each prompt's num_generations rows to be contiguous (TRL's RepeatSampler "
                    "layout). Do not override the train sampler or shuffle the generation batch before generation."
                )
        group_prompts = [all_prompts[g * n] for g in range(num_prompts)]
        group_inputs = [all_inputs[g * n] for g in range(num_prompts)]

        step = self.ada_sampler.begin(num_prompts)
        pools: list[list[_PoolRow]] = [[] for _ in range(num_prompts)]
        while requests := step.requests():
            rows, rewards = self._run_round(requests, group_prompts, group_inputs, num_processes, rank)
            order = [g for g, count in requests for _ in range(count)]
            for g, row in zip(order, rows, strict=True):
                pools[g].append(row)
            step.observe(requests, rewards)
        selection = step.finish()
        self._log_selection(selection)

        kept_rows: list[_PoolRow] = []
        kept_advantages: list[float] = []
        for pool, result in zip(pools, selection.prompts, strict=True):
            kept_rows.extend(pool[i] for i in result.kept)
            kept_advantages.extend(result.advantages)
        self._ada_kept_rewards = torch.stack([row.rewards_per_func for row in kept_rows])
        # When the pool is the group and every weight is 1, Reinforce-Ada's advantage *is* GRPO's: keep TRL's own
        # float32 computation so `uniform` (and a one-round seq_* batch) reproduces GRPOTrainer bit for bit.
        if not selection.is_plain_grpo:
            self._ada_advantages = torch.tensor(kept_advantages, dtype=torch.float32, device=self.accelerator.device)

        mine = kept_rows[rank * local_rows : (rank + 1) * local_rows]
        for row in mine:
            for column, value in row.extra_logs.items():
                self._pending_extra_logs[column].append(value)
        logprobs = None if any(row.logprobs is None for row in mine) else [row.logprobs for row in mine]
        # `_generate`'s own return layout: prompt_ids, completion_ids, tool_mask, completions, logprobs,
        # extra_fields, images, tool_images.
        return (
            [row.prompt_ids for row in mine],
            [row.completion_ids for row in mine],
            None,
            [row.completion for row in mine],
            logprobs,
            {},
            None,
            [],
        )

    def _run_round(self, requests, group_prompts, group_inputs, num_processes: int, rank: int):
        """Generate and score one round on all processes; return the pool rows and summed rewards, in request order."""
        order = [g for g, count in requests for _ in range(count)]
        counts = {count for _, count in requests}
        # Same count for every prompt: keep whole blocks so vLLM server mode can dedupe by it. Pad with whole blocks
        # of the first requested prompt until every process gets the same number of rows; padding is dropped below.
        block = counts.pop() if len(counts) == 1 else 1
        unit = math.lcm(block, num_processes)
        padded = order + [order[0]] * (-len(order) % unit)
        share_size = len(padded) // num_processes
        share = padded[rank * share_size : (rank + 1) * share_size]
        share_prompts = [group_prompts[g] for g in share]
        share_inputs = [group_inputs[g] for g in share]

        self._ada_round_block = block
        try:
            prompt_ids, completion_ids, _, completions, logprobs, _, _, _ = super()._generate(share_prompts)
        finally:
            self._ada_round_block = None
        rewards_per_func = self._calculate_rewards(share_inputs, share_prompts, completions, completion_ids)
        extra_logs = self._take_extra_logs(len(share))
        if logprobs is None:
            logprobs = [None] * len(share)
        gathered = gather_object(list(zip(prompt_ids, completion_ids, completions, logprobs, extra_logs, strict=True)))

        rewards = self._sum_rewards(rewards_per_func)
        rows = [
            _PoolRow(p_ids, c_ids, completion, lps, rewards_per_func[i], extra)
            for i, (p_ids, c_ids, completion, lps, extra) in enumerate(gathered[: len(order)])
        ]
        return rows, rewards[: len(order)].tolist()

    def _sum_rewards(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """TRL's `sum_then_normalize` reward: weighted sum over reward functions, NaN when every function said None."""
        weights = self.reward_weights.to(rewards_per_func.device).unsqueeze(0)
        rewards = (rewards_per_func * weights).nansum(dim=1)
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        return rewards

    def _take_extra_logs(self, num_rows: int) -> list[dict[str, Any]]:
        """Move the `log_extra` columns that reward functions wrote this round onto the rows they describe."""
        columns = sorted(set(gather_object(list(self._pending_extra_logs))))
        per_row: list[dict[str, Any]] = [{} for _ in range(num_rows)]
        for column in columns:
            values = self._pending_extra_logs.get(column, [])
            for i in range(num_rows):
                per_row[i][column] = values[i] if i < len(values) else None
        self._pending_extra_logs = defaultdict(list)
        return per_row

    def _log_selection(self, selection: Selection) -> None:
        metrics = self._metrics["train"]
        for name, value in selection.metrics.items():
            metrics[f"ada/{name}"].append(value)


def _upgrade_config(args: GRPOConfig) -> AdaGRPOConfig:
    """Turn a plain `GRPOConfig` into an `AdaGRPOConfig`, keeping every value the user set."""
    if not isinstance(args, GRPOConfig):
        raise TypeError(f"args must be an AdaGRPOConfig or a trl.GRPOConfig, got {type(args).__name__}.")
    logger.info("Got a GRPOConfig; using AdaGRPOConfig's Reinforce-Ada defaults (sampler='seq_balance').")
    return AdaGRPOConfig.from_grpo_config(args)
