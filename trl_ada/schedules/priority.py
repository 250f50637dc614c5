"""The training data order of a sampler that chooses its prompts (`sampler="spo"`): drawn by priority, batch by batch."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import datasets
import torch
from torch.utils.data import IterableDataset, Sampler

from ..samplers import ChoosesPrompts
from ..trl_seam.grpo_private import repeat_layout
from .schedule import prompt_keys


def weighted_sample(weights: Sequence[float], count: int, generator: torch.Generator) -> list[int]:
    """`count` distinct indices drawn without replacement, by weight (`torch.multinomial`), advancing `generator` the
    same whatever the weights (so a resume that replays the draws stays in step)."""
    if count > len(weights):
        raise ValueError(f"cannot draw {count} distinct prompts from {len(weights)}")
    for index, weight in enumerate(weights):
        if not 0.0 < weight < math.inf:  # also NaN
            raise ValueError(f"prompt {index}'s priority is {weight}; priorities must be positive and finite.")
    chosen = torch.multinomial(
        torch.tensor(weights, dtype=torch.float64), count, replacement=False, generator=generator
    )
    return chosen.tolist()


class PriorityRepeatSampler(Sampler[int]):
    """TRL's `RepeatSampler` layout, with each batch's prompts drawn by `priorities()` (one weight per dataset row)
    when the data loader reaches it, rather than from a shuffled permutation; the same on every process (same seed,
    same priorities). An epoch is as many batches as `RepeatSampler`'s."""

    def __init__(
        self,
        num_rows: int,
        priorities: Callable[[], Sequence[float]],
        mini_repeat_count: int,
        batch_size: int,
        repeat_count: int,
        seed: int,
    ) -> None:
        if batch_size > num_rows:
            raise ValueError(
                f"a generation batch of {batch_size} distinct prompts cannot be drawn from a dataset of {num_rows}; "
                "use a larger dataset or fewer prompts per generation batch."
            )
        self.num_rows = num_rows
        self.priorities = priorities
        self.mini_repeat_count = mini_repeat_count
        self.batch_size = batch_size
        self.repeat_count = repeat_count
        self.generator = torch.Generator().manual_seed(seed)

    def __iter__(self) -> Iterator[int]:
        for _ in range(self.num_rows // self.batch_size):
            weights = list(self.priorities())
            if len(weights) != self.num_rows:
                raise ValueError(f"got {len(weights)} prompt priorities for a dataset of {self.num_rows} rows")
            chunk = weighted_sample(weights, self.batch_size, self.generator)
            for _ in range(self.repeat_count):
                for index in chunk:
                    yield from [index] * self.mini_repeat_count

    def __len__(self) -> int:
        return (self.num_rows // self.batch_size) * self.batch_size * self.mini_repeat_count * self.repeat_count


def priority_order(trainer: Any, data_order: Any, dataset: Any, sampler: ChoosesPrompts) -> PriorityRepeatSampler:
    """The training data order of an `AdaGRPOTrainer` whose sampler chooses its prompts ([`ChoosesPrompts`]): TRL's `data_order` laid out
    the same, each generation batch's prompts drawn by the sampler's priorities over every row of `dataset` (as they
    stood when the loader fetched the batch before, a batch ahead)."""
    layout = repeat_layout(data_order)
    keys = prompt_keys([dataset[index] for index in range(len(dataset))])
    return PriorityRepeatSampler(len(keys), lambda: sampler.prompt_priorities(keys), seed=trainer.args.seed, **layout)


def check_prompt_choice(sampler_name: str, args: Any, train_dataset: Any) -> None:
    """Refuse, before any set-up, what a prompt-choosing sampler cannot draw from: it reads rows by index, at random."""
    if isinstance(train_dataset, (datasets.IterableDataset, IterableDataset)):
        raise ValueError(
            f"sampler={sampler_name!r} draws each generation batch's prompts by priority, by index, which an "
            "IterableDataset does not allow. Pass a map-style datasets.Dataset, or use another sampler."
        )
    prompts = args.generation_batch_size // args.num_generations
    if train_dataset is not None and len(train_dataset) < prompts:
        raise ValueError(
            f"sampler={sampler_name!r} draws {prompts} distinct prompts per generation batch, and train_dataset has "
            f"{len(train_dataset)}. Use a larger dataset, or fewer prompts per generation batch."
        )
    if not getattr(args, "shuffle_dataset", True):
        raise ValueError(
            f"sampler={sampler_name!r} draws prompts at random by priority, and shuffle_dataset=False asks for the "
            "dataset's order. Remove shuffle_dataset, or use another sampler."
        )
