"""
The asynchronous trainer's rules (issue 32, items 11, 12 and 17), on their pure pieces: the generation batch the
batch-level rules act on (`prompts_per_generation_batch`, and the synchronous trainer's one-prompt generation batch),
the objective knobs of samplers whose pool is their group (applied, as the synchronous trainer applies them), and the
weight of a prompt trained on its whole pool (`train_on="pool"`).
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Hashable, Sequence
from typing import Any

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("trl.experimental.async_grpo.async_rollout_worker")

from test_async_rollout import NUM_PROMPTS, by_prompt, drive_one_batch, make_loop, outcome  # noqa: E402

from trl_ada import AdaAsyncGRPOConfig, AdaGRPOConfig  # noqa: E402
from trl_ada.async_grpo.async_grpo_config import MIN_PROMPTS_PER_GENERATION_BATCH  # noqa: E402
from trl_ada.async_grpo.async_grpo_trainer import async_sampling, pool_step_ceiling  # noqa: E402
from trl_ada.async_grpo.rollout import AsyncSampling  # noqa: E402
from trl_ada.samplers import SamplerSettings, build_sampler  # noqa: E402
from trl_ada.samplers.streaming import begin_streaming  # noqa: E402
from trl_ada.schedules import prompt_keys  # noqa: E402


@pytest.fixture(autouse=True)
def accelerate_state():
    # TRL's loop logs through accelerate's logger, which needs the state its child process sets up.
    from accelerate.state import PartialState

    PartialState()


def async_config(tmp_path, **knobs) -> AdaAsyncGRPOConfig:
    """TRL's defaults (8 samples per optimizer step, num_generations 8, one process) unless `knobs` say otherwise."""
    return AdaAsyncGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", **knobs)


class FixedPassRates:
    """A pass-rate estimator that reads each prompt's pass rate from its key: `(name, p̂)`."""

    def estimate(self, keys: Sequence[Hashable]) -> list[float]:
        return [p for _, p in keys]

    def update(self, keys: Sequence[Hashable], totals: Sequence[int], positives: Sequence[int]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def batches(keys: list, size: int) -> list[list]:
    """The prompt stream cut into the worker's generation batches (`_open_batch`: `size` rows each)."""
    return [keys[start : start + size] for start in range(0, len(keys), size)]


# -- item 11: the generation batch the batch-level rules act on ------------------------------------------------------


def test_est_gives_a_hard_and_an_easy_prompt_different_budgets_under_trls_defaults(tmp_path):
    args = async_config(tmp_path, sampler="est")
    sampling = async_sampling(args)
    assert sampling.prompts_per_batch == MIN_PROMPTS_PER_GENERATION_BATCH  # TRL's defaults: one prompt per step
    sampler = build_sampler(sampling.settings, FixedPassRates())
    stream = [("hard", 0.05), ("easy", 0.95)] + [(f"p{i}", 0.5) for i in range(14)]
    budgets = {}
    for batch in batches(stream, sampling.prompts_per_batch):
        step = sampler.begin(len(batch), batch)
        budgets.update({name: budget for (name, _), budget in zip(batch, step.budgets, strict=True)})
    # N ∝ p̂^-1/2 within a batch: the hard prompt draws more than the mean budget, the easy one less. Over a batch of
    # one prompt (before) both drew exactly num_generations = 8.
    assert budgets["hard"] > args.num_generations > budgets["easy"]
    assert sum(budgets.values()) == len(stream) * args.num_generations  # the step's total is unchanged


def test_normalize_weights_reshapes_the_weights_under_trls_defaults(tmp_path):
    sampling = async_sampling(async_config(tmp_path, sampler="seq_balance", objective="log"))
    assert sampling.prompts_per_batch == MIN_PROMPTS_PER_GENERATION_BATCH
    sampler = build_sampler(sampling.settings)
    n = sampling.settings.num_generations
    # Every round of 8 draws holds 1, 7 or 4 positives: pass rates 1/8, 7/8 and 1/2, every weight w = 1/p̂.
    stream = [1, 7] + [4] * 14
    weights = []
    for batch in batches(stream, sampling.prompts_per_batch):
        step = begin_streaming(sampler, len(batch), [f"q{len(weights) + i}" for i in range(len(batch))])
        while pairs := step.to_submit():
            for prompt, draw in pairs:
                step.complete(prompt, draw, float(draw % n < batch[prompt]))
        selection = step.finish()
        weights.extend(result.weight for result in selection.prompts)
        # Normalised to mean 1 over each batch (every pool is mixed).
        assert statistics.fmean(result.weight for result in selection.prompts) == pytest.approx(1.0)
    # The hard prompt weighs 7 times the easy one, not each weight scaled back to 1 (a one-prompt batch, before).
    assert weights[0] == pytest.approx(7 * weights[1]) and weights[0] > 1.0 > weights[1]


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"sampler": "est", "prompts_per_generation_batch": 1}, r"prompts_per_generation_batch=1 with sampler='est'"),
        (
            {"sampler": "seq_pos", "objective": "power", "prompts_per_generation_batch": 1},
            r"=1 with objective='power' with normalize_weights=True .* Use at least 2 prompts",
        ),
        (
            {"sampler": "seq_balance", "prompts_per_generation_batch": 16},
            r"=16 has no effect with sampler='seq_balance', objective='linear'.* Remove prompts_per_generation_batch",
        ),
        (
            {
                "sampler": "seq_balance",
                "objective": "log",
                "normalize_weights": False,
                "prompts_per_generation_batch": 4,
            },
            r"has no effect .*normalize_weights=False",
        ),
        ({"sampler": "est", "prompts_per_generation_batch": 0}, r"must be a positive integer or None, got 0"),
    ],
)
def test_prompts_per_generation_batch_is_checked_at_construction(tmp_path, knobs, message):
    with pytest.raises(ValueError, match=message):
        async_config(tmp_path, **knobs)


def test_prompts_per_generation_batch_is_a_documented_knob_the_worker_reads(tmp_path):
    from transformers import HfArgumentParser

    assert async_sampling(async_config(tmp_path, sampler="est", prompts_per_generation_batch=3)).prompts_per_batch == 3
    # The default follows the optimizer step where it holds more prompts than the floor.
    big = async_config(tmp_path, sampler="est", per_device_train_batch_size=128, num_generations=4)
    assert async_sampling(big).prompts_per_batch == 32
    assert async_sampling(async_config(tmp_path, sampler="seq_balance")).prompts_per_batch == 1  # per-prompt rules
    # The loop's own settings are held to the same rule (an injected worker builds them directly).
    with pytest.raises(ValueError, match="prompts_per_generation_batch=1 with sampler='est'"):
        AsyncSampling(SamplerSettings(sampler="est", num_generations=4).validated(), 1)
    declared = AdaAsyncGRPOConfig.__dataclass_fields__["prompts_per_generation_batch"]
    doc = " ".join(AdaAsyncGRPOConfig.__doc__.split())
    assert "prompts_per_generation_batch (`int` or `None`, *optional*, defaults to `None`):" in doc
    assert " ".join(declared.metadata["help"].split()) in doc
    assert "--prompts_per_generation_batch" in HfArgumentParser(AdaAsyncGRPOConfig).format_help()


def sync_config(tmp_path, **knobs) -> AdaGRPOConfig:
    return AdaGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", **knobs)


@pytest.mark.parametrize(
    ("knobs", "warns"),
    [
        ({"sampler": "est"}, True),  # TRL's defaults: a generation batch of 8 samples, one prompt of 8
        ({"sampler": "seq_balance", "objective": "log"}, True),
        ({"sampler": "est", "per_device_train_batch_size": 16}, False),
        ({"sampler": "est", "steps_per_generation": 2}, False),
        ({"sampler": "seq_balance"}, False),  # every rule per prompt
        ({"sampler": "seq_balance", "scale_rewards": "batch"}, False),  # TRL's own rule, as GRPOTrainer has it
    ],
)
def test_the_synchronous_config_warns_of_a_one_prompt_generation_batch(tmp_path, caplog, knobs, warns):
    with caplog.at_level(logging.WARNING, logger="trl_ada.config"):
        sync_config(tmp_path, **knobs)
    messages = [r.getMessage() for r in caplog.records if "A generation batch holds one prompt" in r.getMessage()]
    assert bool(messages) == warns
    if warns:
        assert "Raise per_device_train_batch_size or steps_per_generation" in messages[0]


# -- item 12: the objective knobs of samplers whose pool is their group -----------------------------------------------


@pytest.mark.parametrize(
    "knobs",
    [
        {"sampler": "uniform", "objective": "log"},
        {"sampler": "dapo", "objective": "power", "normalize_weights": False},
        {"sampler": "seq_balance", "round_size": 8, "max_rounds": 1, "objective": "log"},
        {"sampler": "est", "est_max_samples": 8},  # every budget 8: est's residual weight is its only rule left
        {"sampler": "uniform", "max_weight": 0.5, "normalize_weights": False},  # every weight clipped to 0.5
    ],
)
def test_weights_of_samplers_whose_pool_is_their_group_are_applied_not_ignored(tmp_path, knobs):
    # The synchronous trainer trains on the sampler's advantages wherever a weight is not 1 (`is_plain_grpo`); the
    # asynchronous worker then computes them with the same code rather than queueing TRL's.
    sampling = async_sampling(async_config(tmp_path, **knobs))
    assert sampling.settings.max_pool_size <= sampling.settings.num_generations
    assert not sampling.trl_advantages and sampling.pooled


@pytest.mark.parametrize("sampler_name", ["uniform", "dapo"])
def test_trls_advantages_stay_where_they_are_the_samplers(tmp_path, sampler_name):
    sampling = async_sampling(async_config(tmp_path, sampler=sampler_name))
    assert sampling.trl_advantages and not sampling.pooled and sampling.prompts_per_batch == 1


def test_a_log_objective_with_uniform_trains_on_the_synchronous_advantages(tokenizer):
    settings = SamplerSettings(sampler="uniform", objective="log", num_generations=4, seed=3).validated()
    loop = make_loop(settings, NUM_PROMPTS, tokenizer)
    assert loop.ada_sampling.pooled and loop.num_generations == 1  # every draw scored on its own (before: TRL's)
    samples, _ = drive_one_batch(loop, seed=0)
    rows = [loop.dataset[i] for i in range(NUM_PROMPTS)]
    step = begin_streaming(build_sampler(settings), NUM_PROMPTS, prompt_keys(rows))
    while pairs := step.to_submit():
        for prompt, draw in pairs:
            step.complete(prompt, draw, float(outcome(rows[prompt], draw)))
    want = step.finish()
    got = by_prompt(samples)
    reweighted = False
    for prompt, result in enumerate(want.prompts):
        advantages = [advantage for _, _, advantage, _, _ in sorted(got[prompt])]
        assert advantages == list(result.advantages)  # the synchronous trainer's, weights included
        rewards = [reward for _, reward, _, _, _ in sorted(got[prompt])]
        mean, std = statistics.fmean(rewards), statistics.pstdev(rewards)
        trls = [(r - mean) / (std + 1e-8) for r in rewards]  # what TRL's group would have carried
        reweighted |= result.has_signal and advantages != pytest.approx(trls, rel=1e-2)
    assert reweighted and any(r.weight != 1.0 for r in want.prompts if r.has_signal)


# -- item 17: a prompt trained on its whole pool weighs what its update group would -----------------------------------


@pytest.mark.parametrize("objective", ["linear", "log"])
def test_a_prompts_summed_weight_over_its_trained_pool_is_its_update_groups(tokenizer, objective):
    settings = SamplerSettings(
        sampler="seq_pos", num_generations=4, round_size=2, max_rounds=6, objective=objective, seed=3
    ).validated()
    loop = make_loop(settings, NUM_PROMPTS, tokenizer, train_on="pool")
    samples, _ = drive_one_batch(loop, seed=0)
    rows = [loop.dataset[i] for i in range(NUM_PROMPTS)]
    step = begin_streaming(build_sampler(settings), NUM_PROMPTS, prompt_keys(rows))
    while pairs := step.to_submit():
        for prompt, draw in pairs:
            step.complete(prompt, draw, float(outcome(rows[prompt], draw)))
    want = step.finish()
    outgrew = False
    for prompt, trained in by_prompt(samples).items():
        result = want.prompts[prompt]
        if not result.has_signal:
            continue
        # Each draw's weight in the loss: its advantage over its centred, scaled reward (nonzero: the pool is mixed).
        weights = [
            advantage / ((reward - result.baseline) / (result.scale + 1e-4)) for _, reward, advantage, _, _ in trained
        ]
        # Summed over the pool: the update group's num_generations rows of weight w_x, whatever the pool's size
        # (before: pool size x w_x, about w_x / p̂ for seq_pos).
        assert math.fsum(weights) == pytest.approx(settings.num_generations * result.weight, rel=1e-9)
        outgrew |= len(trained) > settings.num_generations
    assert outgrew


def test_trls_max_steps_ceiling_grows_with_the_pools_trained_on(tmp_path):
    pool = async_sampling(async_config(tmp_path, sampler="seq_pos", num_generations=4, train_on="pool"))
    assert pool_step_ceiling(100, pool) == 100 * 32 // 4  # round_size * max_rounds = 32 draws per prompt at most
    downsample = async_sampling(async_config(tmp_path, sampler="seq_pos", num_generations=4))
    assert pool_step_ceiling(100, downsample) == 100


# -- the trainer: which worker it builds, and TRL's step ceiling -------------------------------------------------------


def test_the_trainer_builds_the_ada_worker_for_a_weighted_uniform_and_raises_trls_step_ceiling_for_pools(
    tmp_path, monkeypatch
):
    import torch
    from async_fixtures import (
        FakeCompletionsServer,
        InProcessWeightTransfer,
        ThreadRolloutWorker,
        chat_tokenizer,
        conversational,
        cpu_config,
        save_chat_model,
    )
    from transformers import AutoModelForCausalLM

    from trl_ada import AdaAsyncGRPOTrainer
    from trl_ada.async_grpo.rollout import AdaRolloutLoop
    from trl_ada.tasks.arithmetic import exact_match_reward, make_dataset
    from trl_ada.tiny import load_tiny_arith_model
    from trl_ada.trl_seam import async_grpo_private

    if not async_grpo_private.has_tree_packing():
        pytest.skip("TRL's async trainer builds on CPU from TRL 1.16 (tree packing)")

    class ThreadAdaWorker(ThreadRolloutWorker):
        _loop_cls = AdaRolloutLoop

    class CPUTrainer(AdaAsyncGRPOTrainer):
        rollout_worker_class = ThreadAdaWorker
        uniform_worker_class = ThreadRolloutWorker

    model_dir = save_chat_model(tmp_path / "model")
    tokenizer = chat_tokenizer(load_tiny_arith_model()[1])
    dataset = conversational(make_dataset(16, seed=0, levels=[0, 1]))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with FakeCompletionsServer(model, tokenizer) as server:

        def build(**knobs):
            return CPUTrainer(
                model=str(model_dir),
                reward_funcs=exact_match_reward,
                args=cpu_config(AdaAsyncGRPOConfig, tmp_path, server, **knobs),
                train_dataset=dataset,
                processing_class=tokenizer,
                weight_transfer=InProcessWeightTransfer(server),
            )

        # uniform with a weighting objective: the worker that applies the weights, not TRL's loop (before: TRL's).
        weighted = build(sampler="uniform", objective="log")
        assert isinstance(weighted.rollout_worker, ThreadAdaWorker)
        assert weighted.rollout_worker._loop_kwargs["ada_sampling"].pooled
        assert type(build(sampler="uniform").rollout_worker) is ThreadRolloutWorker  # TRL's loop, TRL's advantages
        # train_on="pool" with max_steps unset: TRL's ceiling (16 prompts x num_generations 4 x 32 rows per
        # conversation over 8 samples a step) times round_size * max_rounds / num_generations = 32 / 4.
        pools = build(sampler="seq_pos", train_on="pool", max_steps=-1, num_train_epochs=1)
        assert pools._epoch_stop_groups == 16
        assert pools.args.max_steps == math.ceil(16 * 4 * 32 / 8) * 8
