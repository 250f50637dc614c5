"""
Round-free sampling for the sequential samplers, for engines that batch continuously (docs/samplers.md,
`generation_schedule`). Each prompt runs its rounds as blocks without waiting for the others, and the exit rule is
checked when a block is complete, so its pool is the rounds pool on the same draws, in submission order (never arrival
order: shorter completions finish first, and length correlates with correctness). Pure Python: no torch and no TRL.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from .base import Sampler, SamplingStep, Selection


@dataclass
class ScheduleStats:
    """What one generation batch cost under its schedule, rounds or continuous (the pools' metrics are elsewhere)."""

    submitted: int = 0
    """Draws submitted (rounds: rows requested); each is submitted once."""
    admitted: int = 0
    """Draws that entered a pool (continuous: once their block was complete; rounds: every row of a round)."""
    round_seconds: list[float] = field(default_factory=list)
    """Rounds: the wall time of each round (empty on the continuous schedule)."""
    scoring_batches: int = 0
    """Continuous: the scoring batches (every draw back since the previous one) the batch was scored in."""
    seconds: float = 0.0
    """Wall time of the whole batch: continuous, from the first draw submitted to the last one scored."""

    def metrics(self) -> dict[str, float]:
        """The schedule's metrics: rounds `round_time/mean|max|total` (seconds per round), or `continuous/*`."""
        if self.round_seconds:
            return {
                "round_time/mean": sum(self.round_seconds) / len(self.round_seconds),
                "round_time/max": max(self.round_seconds),
                "round_time/total": sum(self.round_seconds),
            }
        return {
            "continuous/scoring_batches": float(self.scoring_batches),
            "continuous/draws_per_scoring_batch": self.submitted / max(self.scoring_batches, 1),
            "continuous/seconds": self.seconds,
        }


class _Prompt:
    """The round-free state of one prompt. Its admitted pool lives in the shared `SamplingStep`."""

    __slots__ = ("submitted", "boundary", "blocks", "block_results", "done")

    def __init__(self, request: int) -> None:
        self.submitted = 0  # the next draw index
        self.boundary = request  # the pool size at the next exit check: the end of the current block
        self.blocks = 1 if request else 0  # blocks begun (the prompt's rounds)
        self.block_results: dict[int, tuple[float, bool]] = {}  # back, the current block not complete yet
        self.done = request == 0


class ContinuousStep:
    """Round-free sampling of one generation batch for a sequential sampler (the module docstring gives the rules): the
    pools, hence the selection, are those of rounds with the same settings on the same draws. Pool index `k` is draw
    `k`."""

    def __init__(self, sampler: Sampler, num_prompts: int, prompt_keys: Sequence[Hashable] | None = None) -> None:
        if not sampler.settings.has_exit_rule:
            raise ValueError(
                f"the round-free (continuous) schedule runs an exit rule prompt by prompt, and sampler={sampler.name!r} "
                "has none. Use sampler='seq_pos' or sampler='seq_balance', or sample in rounds with begin()."
            )
        self.sampler = sampler  # a SequentialSampler (`block_request`); not imported: `sequential` imports this module
        # The rounds path's own step (keys, tracker priors): finish() then runs its code unchanged.
        self.step: SamplingStep = sampler.begin(num_prompts, prompt_keys)
        self.prompts = [_Prompt(sampler.block_request(self.step, index, 0)) for index in range(num_prompts)]
        self.stats = ScheduleStats()
        self._finished = False
        # Only a completed block opens a new one, so `to_submit` never rescans a batch of thousands of prompts.
        self._to_top_up: set[int] = {index for index, state in enumerate(self.prompts) if not state.done}
        self._open = len(self._to_top_up)
        self._in_flight = 0

    @property
    def num_prompts(self) -> int:
        return len(self.prompts)

    def to_submit(self) -> list[tuple[int, int]]:
        """(prompt, draw) pairs to submit now (the draws of newly begun blocks), ascending. Each pair is returned once."""
        self._check_open()
        pairs = []
        for index in sorted(self._to_top_up):
            state = self.prompts[index]
            pairs.extend((index, draw) for draw in range(state.submitted, state.boundary))
            state.submitted = state.boundary
        self._to_top_up.clear()
        self._in_flight += len(pairs)
        self.stats.submitted += len(pairs)
        return pairs

    def complete(self, prompt: int, draw: int, reward: float, masked: bool = False) -> None:
        """A submitted draw came back (`masked`: as `SamplingStep.observe`'s). When it completes its prompt's block,
        the block enters the pool in draw order and the exit rule decides whether another begins. A draw not in flight
        raises."""
        self._check_open()
        state = self._state(prompt)
        pool_size = len(self.step.pools[prompt])
        if not pool_size <= draw < state.submitted or draw in state.block_results:
            raise ValueError(
                f"draw {draw} of prompt {prompt} is not in flight (never submitted, or already completed)"
            )
        state.block_results[draw] = (float(reward), bool(masked))
        self._in_flight -= 1
        if len(state.block_results) < state.boundary - pool_size:
            return
        block = [state.block_results[d] for d in range(pool_size, state.boundary)]
        state.block_results.clear()
        self.step.add(prompt, [reward for reward, _ in block], [flag for _, flag in block])
        self.stats.admitted += len(block)
        request = self.sampler.block_request(self.step, prompt, state.blocks)
        if request == 0:
            state.done = True
            self._open -= 1
            return
        state.blocks += 1
        state.boundary += request
        self._to_top_up.add(prompt)

    def current_request(self, prompt: int) -> int:
        """The size of the prompt's current block (the request its current round makes in rounds); 0 once it is done."""
        state = self._state(prompt)
        if state.done:
            return 0
        return state.boundary - len(self.step.pools[prompt])

    @property
    def done(self) -> bool:
        """Every prompt has exited (or reached the cap) and nothing is in flight: `finish()` may run."""
        return self._open == 0

    @property
    def in_flight(self) -> int:
        """Draws submitted whose result has not come back."""
        return self._in_flight

    def finish(self) -> Selection:
        """`SamplingStep.finish` on the admitted pools, a prompt's blocks counted as its rounds."""
        self._check_open()
        if not self.done:
            raise RuntimeError(f"{self.in_flight} draws are still in flight; finish() once `done` is true")
        step = self.step
        blocks = [state.blocks for state in self.prompts]
        step.rounds = max(blocks)
        step.rounds_per_prompt = blocks
        step.active_after_round = [sum(count > depth for count in blocks) for depth in range(1, step.rounds + 1)]
        selection = step.finish()
        self._finished = True
        return selection

    def _state(self, prompt: int) -> _Prompt:
        if not 0 <= prompt < len(self.prompts):
            raise ValueError(f"unknown prompt {prompt}: this step has {len(self.prompts)} prompts")
        return self.prompts[prompt]

    def _check_open(self) -> None:
        if self._finished:
            raise RuntimeError("this step is finished; begin a new one")


class SingleRequestStep:
    """[`ContinuousStep`]'s interface for a sampler without an exit rule (one request per prompt): every request goes
    out at once, draws come back in any order, and once all are back they are one round of `SamplingStep` (pool index
    `k` is draw `k`). Lets an asynchronous worker stream any sampler's draws."""

    def __init__(self, sampler: Sampler, num_prompts: int, prompt_keys: Sequence[Hashable] | None = None) -> None:
        self.sampler = sampler
        self.step: SamplingStep = sampler.begin(num_prompts, prompt_keys)
        self.requests = self.step.requests()
        self.stats = ScheduleStats()
        self._results: dict[tuple[int, int], tuple[float, bool]] = {}
        self._sizes = dict(self.requests)
        self._submitted = False
        self._finished = False

    @property
    def num_prompts(self) -> int:
        return self.step.num_prompts

    def to_submit(self) -> list[tuple[int, int]]:
        """Every (prompt, draw) pair of the step's one request, on the first call; nothing afterwards."""
        if self._submitted:
            return []
        self._submitted = True
        pairs = [(index, draw) for index, count in self.requests for draw in range(count)]
        self.stats.submitted += len(pairs)
        return pairs

    def complete(self, prompt: int, draw: int, reward: float, masked: bool = False) -> None:
        """A submitted draw came back (`masked`: as `SamplingStep.observe`'s); completing one twice raises."""
        if not (self._submitted and 0 <= draw < self._sizes.get(prompt, 0)) or (prompt, draw) in self._results:
            raise ValueError(
                f"draw {draw} of prompt {prompt} is not in flight (never submitted, or already completed)"
            )
        self._results[(prompt, draw)] = (float(reward), bool(masked))
        self.stats.admitted += 1

    @property
    def in_flight(self) -> int:
        return sum(self._sizes.values()) - len(self._results) if self._submitted else 0

    @property
    def done(self) -> bool:
        return self._submitted and self.in_flight == 0

    def finish(self) -> Selection:
        """`SamplingStep.observe` of the one round, in request order and draw order, then `SamplingStep.finish`."""
        if self._finished or not self.done:
            raise RuntimeError("finish() once every draw is back, once per step")
        ordered = [self._results[(index, draw)] for index, count in self.requests for draw in range(count)]
        if self.requests:
            self.step.observe(self.requests, [r for r, _ in ordered], [m for _, m in ordered])
        self._finished = True
        return self.step.finish()


def begin_streaming(
    sampler: Sampler, num_prompts: int, prompt_keys: Sequence[Hashable] | None = None
) -> ContinuousStep | SingleRequestStep:
    """One streamed generation batch: a [`ContinuousStep`] with an exit rule, else a [`SingleRequestStep`]."""
    if sampler.settings.has_exit_rule:
        return ContinuousStep(sampler, num_prompts, prompt_keys)
    return SingleRequestStep(sampler, num_prompts, prompt_keys)
