"""
Round-free sampling for the sequential samplers (`seq_pos`, `seq_balance`): no prompt waits for another.

In rounds, every round waits for its slowest completion. An engine that batches continuously and can abort requests
(vLLM) serves a different schedule, driven by [`ContinuousStep`]:

```python
step = sampler.begin_continuous(num_prompts, keys)
submit(step.to_submit())                          # (prompt, draw) pairs
while not step.done:
    prompt, draw, reward, truncated = next_result()  # in whatever order the engine finishes them
    if step.is_aborted(prompt, draw):               # aborted, but it finished first: forget it
        step.discard(prompt, draw)
        continue
    abort(step.complete(prompt, draw, reward, truncated))
    submit(step.to_submit())
selection = step.finish()                         # the same Selection code path as in rounds
```

Unbiased pools. Completions that finish first are shorter, and length correlates with correctness, so a pool filled
in arrival order would be biased (and so would p̂, the baseline and the weight). A completion therefore enters its
prompt's pool in SUBMISSION order only: draw `k` is admitted once draws `0..k-1` of that prompt have been admitted; a
later draw that finished early waits. After every admission the exit rule (`SequentialSampler.has_exited`) and the cap
(`max_pool_size`) are checked, exactly as rounds of one draw would; once a prompt exits, its draws still in flight are
returned for abort and those finished but waiting are dropped: neither ever enters the pool or the reward statistics.
The admitted pool is thus a prefix of an i.i.d. sequence whose length is a stopping time: it is the pool that
sequential sampling with rounds of size 1 and the same cap draws from the same sequence, whatever the arrival order
and however many draws were in flight.

How many draws a prompt keeps outstanding (submitted, not yet admitted) is the round policy
(`SequentialSampler.demand`) applied to the admitted pool, recomputed at each admission: `fixed` keeps `round_size`,
`predictive` `round_size` while nothing is admitted and then the predictive request, `tracked` the predictive request
from the start. It decides the cost only (what is drawn and thrown away), never which draws form the pool. As in
rounds, `predictive` and `tracked` buy fewer sequential waits with draws: on easy prompts they keep fewer than
`round_size` in flight, on hard ones (or with `seq_balance` quotas) their request can exceed it.

Results of aborted draws may still arrive, even after `done` or `finish()`: `discard` them (`is_aborted` tells).

Pure Python: no torch and no TRL.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from .base import Sampler, SamplingStep, Selection, SequentialSampler


@dataclass
class ContinuousStats:
    """Where the draws of one generation batch went. `submitted == admitted + finished_but_discarded + aborted`."""

    submitted: int = 0
    admitted: int = 0
    finished_but_discarded: int = 0
    """Finished, but their prompt exited while they waited for an earlier draw: never admitted."""
    aborted: int = 0
    """Still in flight when their prompt exited: returned by `complete` for abort."""


class _Prompt:
    """The round-free state of one prompt. Its admitted pool lives in the shared `SamplingStep`."""

    __slots__ = ("submitted", "target", "running", "waiting", "aborted", "done")

    def __init__(self, target: int) -> None:
        self.submitted = 0  # the next draw index
        self.target = target  # draws to keep outstanding (submitted, not admitted)
        self.running: set[int] = set()  # submitted, result not back yet
        self.waiting: dict[int, tuple[float, bool]] = {}  # finished, waiting for an earlier draw
        self.aborted: set[int] = set()
        self.done = target == 0


class ContinuousStep:
    """
    Round-free sampling of one generation batch for a sequential sampler (see the module docstring for the rules).

    Draws are admitted to a prompt's pool in submission order only, the exit rule is checked after every admission,
    and whatever an exited prompt still has in flight or waiting is discarded, so the pools (hence p̂, baselines,
    weights and the downsampling) are exactly those of rounds of size 1 with the same cap on the same draws. Pool
    index `k` is draw `k`.
    """

    def __init__(self, sampler: Sampler, num_prompts: int, prompt_keys: Sequence[Hashable] | None = None) -> None:
        if not isinstance(sampler, SequentialSampler):
            raise ValueError(
                f"the round-free (continuous) schedule runs an exit rule draw by draw, and sampler={sampler.name!r} "
                "has none. Use sampler='seq_pos' or sampler='seq_balance', or sample in rounds with begin()."
            )
        self.sampler: SequentialSampler = sampler
        # The rounds path's own step (keys, tracker priors): finish() then runs its code unchanged.
        self.step: SamplingStep = sampler.begin(num_prompts, prompt_keys)
        self.prompts = [_Prompt(sampler.demand(self.step, index)) for index in range(num_prompts)]
        self.stats = ContinuousStats()
        self._finished = False
        # Bookkeeping that keeps every call O(draws it touches), not O(prompts): a completion per call on a batch of
        # thousands of prompts must not rescan the batch. Only an admission changes a prompt's target or outstanding
        # count, so only prompts admitted to since the last `to_submit` can need more draws.
        self._to_top_up: set[int] = {index for index, state in enumerate(self.prompts) if not state.done}
        self._open = len(self._to_top_up)
        self._in_flight = 0

    @property
    def num_prompts(self) -> int:
        return len(self.prompts)

    def to_submit(self) -> list[tuple[int, int]]:
        """(prompt, draw) pairs to submit now; draw = the prompt's submission index 0, 1, 2, ... Each pair is returned once."""
        self._check_open()
        cap = self.sampler.settings.max_pool_size
        pairs = []
        for index in sorted(self._to_top_up):
            state = self.prompts[index]
            if state.done:
                continue
            outstanding = state.submitted - len(self.step.pools[index])
            # demand() never exceeds the room under the cap, so this min() is a guard, not a policy.
            count = min(state.target - outstanding, cap - state.submitted)
            for _ in range(max(count, 0)):
                pairs.append((index, state.submitted))
                state.running.add(state.submitted)
                state.submitted += 1
        self._to_top_up.clear()
        self._in_flight += len(pairs)
        self.stats.submitted += len(pairs)
        return pairs

    def complete(self, prompt: int, draw: int, reward: float, masked: bool = False) -> list[tuple[int, int]]:
        """
        A submitted draw finished with this reward (`masked`: truncated, as `SamplingStep.observe`'s `masked`). Admits
        draws in submission order; returns the (prompt, draw) pairs to abort now (still in flight when the prompt
        exited). Completing a draw that was aborted or is unknown raises.
        """
        self._check_open()
        state = self._state(prompt)
        if draw in state.aborted:
            raise ValueError(f"draw {draw} of prompt {prompt} was aborted; discard() its result instead")
        if draw not in state.running:
            raise ValueError(
                f"draw {draw} of prompt {prompt} is not in flight (never submitted, or already completed)"
            )
        # A running draw belongs to a prompt still sampling: exiting moves every running draw to `aborted`.
        state.running.remove(draw)
        self._in_flight -= 1
        state.waiting[draw] = (float(reward), bool(masked))
        return self._admit(prompt, state)

    def discard(self, prompt: int, draw: int) -> None:
        """An aborted draw's result arrived anyway, or the engine confirms its abort: forget it. Raises otherwise."""
        state = self._state(prompt)
        if draw not in state.aborted:
            raise ValueError(f"draw {draw} of prompt {prompt} was not aborted; complete() it instead")

    def is_aborted(self, prompt: int, draw: int) -> bool:
        """Whether `complete` returned this draw for abort (its late result must go to `discard`)."""
        return draw in self._state(prompt).aborted

    def in_flight_target(self, prompt: int) -> int:
        """How many draws the prompt keeps outstanding (submitted, not admitted) now; 0 once it is done."""
        state = self._state(prompt)
        return 0 if state.done else state.target

    @property
    def done(self) -> bool:
        """No prompt needs more draws and nothing admitted is pending: `finish()` may run."""
        return self._open == 0

    @property
    def in_flight(self) -> int:
        """Draws submitted whose result has not come back and that were not aborted."""
        return self._in_flight

    def finish(self) -> Selection:
        """
        Exactly `SamplingStep.finish` on the admitted pools (pool index k == draw k): downsampling, baselines, weights
        and the tracker update (`end_step`) are those of rounds. The round statistics are those of the equivalent
        schedule in rounds of one draw: a prompt's "rounds" are its admitted draws.
        """
        self._check_open()
        if not self.done:
            raise RuntimeError(f"{self.in_flight} draws are still in flight; finish() once `done` is true")
        step = self.step
        sizes = [len(pool) for pool in step.pools]
        step.rounds = max(sizes)
        step.rounds_per_prompt = sizes
        step.active_after_round = [sum(size > depth for size in sizes) for depth in range(1, step.rounds + 1)]
        selection = step.finish()
        stats = self.stats
        selection.metrics.update(
            {
                "continuous/submitted_per_prompt": stats.submitted / self.num_prompts,
                "continuous/wasted_share": (stats.finished_but_discarded + stats.aborted) / max(stats.submitted, 1),
                "continuous/aborted_share": stats.aborted / max(stats.submitted, 1),
            }
        )
        self._finished = True
        return selection

    def _admit(self, prompt: int, state: _Prompt) -> list[tuple[int, int]]:
        """Admit the waiting draws that are next in submission order, checking the exit rule after each one."""
        pool = self.step.pools[prompt]
        while not state.done and len(pool) in state.waiting:
            reward, masked = state.waiting.pop(len(pool))
            self.step.add(prompt, [reward], [masked])
            self.stats.admitted += 1
            state.target = self.sampler.demand(self.step, prompt)
            state.done = state.target == 0
        if not state.done:
            self._to_top_up.add(prompt)
            return []
        self._open -= 1
        # Exited (or at the cap): nothing else of this prompt may enter the pool.
        self.stats.finished_but_discarded += len(state.waiting)
        state.waiting.clear()
        aborts = sorted(state.running)
        state.aborted.update(aborts)
        state.running.clear()
        self._in_flight -= len(aborts)
        self.stats.aborted += len(aborts)
        return [(prompt, draw) for draw in aborts]

    def _state(self, prompt: int) -> _Prompt:
        if not 0 <= prompt < len(self.prompts):
            raise ValueError(f"unknown prompt {prompt}: this step has {len(self.prompts)} prompts")
        return self.prompts[prompt]

    def _check_open(self) -> None:
        if self._finished:
            raise RuntimeError("this step is finished; begin a new one")
