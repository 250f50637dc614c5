"""`sampler="spo"` (SPO, arXiv 2509.13232): the tracked baseline, and prompts drawn by priority from the same memory."""

import math

import pytest
import torch
from conftest import TINY_MODEL_KWARGS, starts_low_digit, tiny_args
from datasets import Dataset
from test_trainer import recording

from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
from trl_ada.experimental.spo import SpoOptions, SpoSampler, spo_priority
from trl_ada.samplers import ChoosesPrompts, GatesRefills, Sampler, SamplerSettings, build_sampler
from trl_ada.schedules.priority import PriorityRepeatSampler, weighted_sample
from trl_ada.tiny import build_tiny_model

SPO = dict(sampler="spo", baseline="tracked", scale_rewards="none", normalize_advantages=True)


def spo_sampler(**overrides):
    return build_sampler(SamplerSettings(**(SPO | {"num_generations": 2} | overrides)))


def step(sampler, keys, rewards):
    current = sampler.begin(len(keys), keys)
    requests = current.requests()
    assert requests == [(index, len(r)) for index, r in enumerate(rewards)]
    current.observe(requests, [reward for group in rewards for reward in group])
    assert current.requests() == []  # one generate call per prompt: no second round
    return current.finish()


def test_an_unmixed_group_with_history_is_centred_on_its_remembered_pass_rate_and_batch_normalised():
    sampler = spo_sampler()
    first = step(sampler, ["a", "b"], [[1, 0], [1, 1]])
    # First visits fall back to the pool: "a" centred on 0.5, "b" (constant, no history) has no signal. SPO's batch
    # normalisation, (A - mean A) / (std A + 1e-4) over the rows with a signal, [0.5, -0.5]: mean 0, std sqrt(0.5).
    spread = math.sqrt(0.5) + 1e-4
    assert first.prompts[0].advantages == pytest.approx((0.5 / spread, -0.5 / spread))
    assert first.prompts[1].advantages == (0.0, 0.0)
    second = step(sampler, ["a", "b"], [[0, 0], [0, 0]])
    # Beta(1, 1) prior and the first visit's counts, read before this step's: a 1 of 2, b 2 of 2.
    p_a, p_b = 2 / 4, 3 / 4
    centred = [-p_a, -p_a, -p_b, -p_b]
    mean = sum(centred) / 4
    std = math.sqrt(sum((c - mean) ** 2 for c in centred) / 3) + 1e-4
    assert second.prompts[0].advantages == pytest.approx(((-p_a - mean) / std,) * 2)
    assert second.prompts[1].advantages == pytest.approx(((-p_b - mean) / std,) * 2)


def test_priorities_are_spo_weights_of_the_remembered_pass_rates():
    sampler = spo_sampler(sampler_kwargs={"priority_floor": 0.1})
    # Never drawn: the prior's mean 0.5, the largest weight.
    assert sampler.prompt_priorities(["a"]) == [pytest.approx(0.5 + 0.1)]
    step(sampler, ["a", "b"], [[1, 0], [1, 1]])
    p_a, p_b = 2 / 4, 3 / 4
    assert sampler.prompt_priorities(["a", "b", "c"]) == pytest.approx(
        [math.sqrt(p_a * (1 - p_a)) + 0.1, math.sqrt(p_b * (1 - p_b)) + 0.1, 0.6]
    )
    assert spo_priority(0.0, 0.05) == 0.05 and spo_priority(0.5, 0.0) == 0.5


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"baseline": "group", "normalize_advantages": False, "scale_rewards": "group"}, "Set baseline='tracked'"),
        ({"sampler_kwargs": {"priority_floor": -0.1}}, "priority_floor must be a finite, non-negative number"),
        ({"sampler_kwargs": {"priority_floor": math.inf}}, "priority_floor must be a finite, non-negative number"),
    ],
)
def test_spo_refuses_what_it_cannot_draw_with(overrides, message):
    with pytest.raises(ValueError, match=message):
        spo_sampler(**overrides)


def test_the_asynchronous_trainer_takes_spo_with_its_recipe(tmp_path):
    from trl_ada.async_grpo import AdaAsyncGRPOConfig
    from trl_ada.async_grpo.async_grpo_trainer import async_sampling

    common = dict(output_dir=str(tmp_path), sampler="spo", num_generations=2, use_cpu=True, bf16=False)
    # Alone, spo runs its recipe; a remembered baseline with another sampler names the scaling it needs.
    recipe = AdaAsyncGRPOConfig(**common)
    assert (recipe.baseline, recipe.scale_rewards, recipe.normalize_advantages) == ("tracked", "none", True)
    with pytest.raises(ValueError, match="needs scale_rewards='none'"):
        AdaAsyncGRPOConfig(**{**common, "sampler": "dapo"}, baseline="tracked")
    sampling = async_sampling(AdaAsyncGRPOConfig(**common, **SpoOptions.recipe))
    assert sampling.pooled and not sampling.trl_advantages


def test_a_sampler_that_declares_it_chooses_prompts_must_name_its_largest_weight():
    # Both trainers read the capability from the declaration; the asynchronous worker draws each row with its weight
    # over `max_priority()`, so a chooser without one cannot be built (before any config or model uses it).
    class UnboundedPriority(ChoosesPrompts, Sampler):
        def prompt_priorities(self, keys):
            return [1.0] * len(keys)

        def request_size(self, step, index):
            return 2

    with pytest.raises(TypeError, match="abstract method '?max_priority"):
        UnboundedPriority(SamplerSettings(sampler="uniform", num_generations=2))

    class UngatedRefill(GatesRefills, Sampler):
        pass

    with pytest.raises(TypeError, match="abstract method '?refill_passes_over"):
        UngatedRefill(SamplerSettings(sampler="uniform", num_generations=2))

    class Undeclared(Sampler):  # methods without the declaration are no capability
        def prompt_priorities(self, keys):
            return [1.0] * len(keys)

        def max_priority(self):
            return 1.0

    assert not issubclass(Undeclared, ChoosesPrompts) and issubclass(SpoSampler, ChoosesPrompts)


def test_weighted_draws_follow_the_weights():
    weights = [1.0, 2.0, 3.0, 4.0]
    generator = torch.Generator().manual_seed(0)
    draws = 8000
    counts = [0] * 4
    for _ in range(draws):
        counts[weighted_sample(weights, 1, generator)[0]] += 1
    for count, weight in zip(counts, weights, strict=True):
        p = weight / sum(weights)
        # A binomial count: 4 standard deviations either side (a false alarm about once in 16,000 per index).
        assert abs(count - draws * p) <= 4 * math.sqrt(draws * p * (1 - p))


def test_weighted_draws_are_distinct_and_advance_the_generator_the_same_whatever_the_weights():
    first, second = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    chosen = weighted_sample([1.0, 1e-6, 5.0, 2.0, 0.5], 3, first)
    assert len(set(chosen)) == 3 and 1 not in chosen
    weighted_sample([0.2, 0.2, 0.2, 0.2, 0.2], 3, second)
    # The generator moved the same whatever the weights, so a replay of the draws stays in step.
    assert torch.equal(first.get_state(), second.get_state())
    with pytest.raises(ValueError, match="priorities must be positive"):
        weighted_sample([1.0, 0.0], 1, first)
    with pytest.raises(ValueError, match="cannot draw 3 distinct prompts from 2"):
        weighted_sample([1.0, 1.0], 3, first)


def test_the_priority_order_has_trls_layout_and_reads_the_priorities_per_batch():
    reads = []

    def priorities():
        reads.append(len(reads))
        # Batch k strongly favours rows 2k and 2k + 1.
        batch = len(reads) - 1
        return [1e9 if index in (2 * batch, 2 * batch + 1) else 1e-9 for index in range(6)]

    order = PriorityRepeatSampler(6, priorities, mini_repeat_count=2, batch_size=2, repeat_count=2, seed=0)
    indices = list(order)
    assert len(indices) == len(order) == 3 * 2 * 2 * 2 and len(reads) == 3
    for batch in range(3):
        block = indices[batch * 8 : (batch + 1) * 8]
        assert block[:4] == block[4:]  # the batch repeated `repeat_count` times
        assert block[0] == block[1] and block[2] == block[3]  # each prompt `mini_repeat_count` times in a row
        assert {block[0], block[2]} == {2 * batch, 2 * batch + 1}


def test_two_processes_with_the_same_priorities_draw_the_same_prompts():
    weights = [0.3, 0.9, 0.1, 0.5, 0.55, 0.2, 0.05, 0.7]

    def order():
        return PriorityRepeatSampler(8, lambda: weights, mini_repeat_count=4, batch_size=3, repeat_count=1, seed=42)

    assert list(order()) == list(order())


def spo_trainer(tmp_path, tokenizer, dataset, **overrides):
    config = AdaGRPOConfig(**tiny_args(tmp_path, **{"num_generations": 2, **overrides}), **SPO)
    model = build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS)
    return recording(AdaGRPOTrainer)(
        model, [starts_low_digit], args=config, train_dataset=dataset, processing_class=tokenizer
    )


def test_the_trainer_draws_each_generation_batch_by_the_samplers_priorities(tmp_path, tokenizer, arithmetic_dataset):
    trainer = spo_trainer(tmp_path, tokenizer, arithmetic_dataset, max_steps=3)
    favoured = {arithmetic_dataset[index]["prompt"] for index in (5, 17, 40, 71)}
    # Four prompts per generation batch (8 rows, 2 each): a priority that dwarfs every other one picks these four.
    trainer.ada_sampler.prompt_priorities = lambda keys: [1e9 if key.text in favoured else 1e-9 for key in keys]
    drawn = []
    sample = trainer._sample

    def recording_sample(inputs):
        drawn.append({row["prompt"] for row in inputs})
        return sample(inputs)

    trainer._sample = recording_sample
    trainer.train()
    assert drawn == [favoured] * 3
    # The tracker remembered the four prompts' draws: 3 visits of 2 draws, decayed.
    counts = trainer.ada_sampler.baseline_history.counts
    assert len(counts) == 4 and all(total == pytest.approx(2 + 2 * 0.9 + 2 * 0.81) for total, _ in counts.values())


def test_the_trainer_trains_spo_from_its_own_priorities(tmp_path, tokenizer, arithmetic_dataset):
    trainer = spo_trainer(tmp_path, tokenizer, arithmetic_dataset, max_steps=4)
    trainer.train()
    assert [len(selection.prompts) for selection in trainer.selections] == [4] * 4
    assert all(len(pool) == 2 for selection in trainer.selections for pool in selection.pools)
    assert len(trainer.ada_sampler.baseline_history.counts) >= 4
    assert "ada/baseline/tracked_share" in trainer.state.log_history[-2] or any(
        "ada/baseline/tracked_share" in entry for entry in trainer.state.log_history
    )


@pytest.mark.parametrize(
    ("dataset_kind", "overrides", "message"),
    [
        ("iterable", {}, "by index, which an IterableDataset does not allow"),
        ("map", {"shuffle_dataset": False}, "shuffle_dataset=False asks for the dataset's order"),
    ],
)
def test_the_trainer_refuses_data_it_cannot_draw_by_priority(
    tmp_path, tokenizer, arithmetic_dataset, dataset_kind, overrides, message
):
    dataset = arithmetic_dataset.to_iterable_dataset() if dataset_kind == "iterable" else arithmetic_dataset
    with pytest.raises(ValueError, match=message):
        spo_trainer(tmp_path, tokenizer, dataset, **overrides)


def test_a_dataset_smaller_than_a_generation_batch_is_refused_at_construction(tmp_path, tokenizer):
    dataset = Dataset.from_list([{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}])
    with pytest.raises(ValueError, match="draws 4 distinct prompts per generation batch, and train_dataset has 2"):
        spo_trainer(tmp_path, tokenizer, dataset)


def test_the_card_describes_spo_and_simulate_runs_it_with_its_recipe(tmp_path, capsys):
    from conftest import write_jsonl

    from trl_ada import cli
    from trl_ada.samplers.base import describe

    text = describe(spo_sampler().settings)
    assert "SPO's single stream" in text and "sqrt(p̂(1-p̂)) + 0.05" in text
    path = write_jsonl(tmp_path / "p.jsonl", [{"pass_rate": 0.3}, {"pass_rate": 0.7}])
    # Not given a baseline, simulate compares spo with its recipe (the defaults would be refused).
    assert cli.main(["simulate", "--pass-rates-from", str(path), "--sampler", "spo", "--trials", "20"]) == 0
    assert capsys.readouterr().out.splitlines()[4].split()[0] == "spo"
    assert AdaGRPOConfig(**tiny_args(tmp_path), sampler="spo").baseline == "tracked"  # its recipe, not an error


def test_spo_alone_runs_its_recipe(tmp_path):
    """`sampler="spo"` with nothing else set trains SPO's recipe: a tracked baseline, no reward scaling and SPO's batch
    normalisation; a value the recipe would need to replace is refused, not changed."""
    config = AdaGRPOConfig(output_dir=str(tmp_path), sampler="spo", num_generations=2, use_cpu=True, bf16=False)
    assert (config.baseline, config.scale_rewards, config.normalize_advantages) == ("tracked", "none", True)
    assert SamplerSettings(sampler="spo", num_generations=2).validated().normalize_advantages is True
    off = AdaGRPOConfig(
        output_dir=str(tmp_path), sampler="spo", num_generations=2, use_cpu=True, bf16=False,
        normalize_advantages=False,
    )  # fmt: skip
    assert off.normalize_advantages is False  # an explicit False stands
    assert AdaGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False).normalize_advantages is False
    with pytest.raises(ValueError, match="Set baseline='tracked'"):
        AdaGRPOConfig(
            output_dir=str(tmp_path), sampler="spo", baseline="group", num_generations=2, use_cpu=True, bf16=False
        )
