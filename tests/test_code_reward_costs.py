"""What a hostile completion can cost the trainer through the code reward: time on the event loop (huge output to
normalise), memory held per case result, and sandbox time per row (passing, then idling to just under the wall).
Each bound is derived from the limits, with generous slack for a loaded 2-core machine."""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time
import tracemalloc

import pytest

from trl_ada.rewards.code import (
    CASE_OUTPUT_SLACK_BYTES,
    ROW_WALL_FACTOR,
    CodeExecutionReward,
    case_output_bytes,
    normalize_output,
)
from trl_ada.rewards.sandbox import INSTALL_HINT, Sandbox, SandboxLimits

CI = os.environ.get("CI", "").lower() == "true"
HAVE_BWRAP = shutil.which("bwrap") is not None
needs_bwrap = pytest.mark.skipif(not HAVE_BWRAP and not CI, reason=f"bubblewrap is not installed: {INSTALL_HINT}")

pytestmark = [
    pytest.mark.usefixtures("wall_clock_guard", "no_sandbox_outlives_the_tests"),
    pytest.mark.wall_clock_limit(120),
]

# Sandbox start-up and tear-down on a loaded machine, per call: slack on top of the wall-derived bounds.
START_SLACK_S = 10.0


def stdio_rows(expected: str, cases: int) -> dict:
    return {"language": "python", "test_cases": [{"type": "stdin_stdout", "input": "", "output": expected}] * cases}


@pytest.fixture(autouse=True)
def _bwrap_present():
    if not HAVE_BWRAP:
        pytest.fail(f"CI=true but bubblewrap is not installed: {INSTALL_HINT}") if CI else pytest.skip(INSTALL_HINT)


# ---------------------------------------------------------------------------------------------------------------------
# Output: bounded in bytes, compared in linear time, off the event loop
# ---------------------------------------------------------------------------------------------------------------------


def test_normalisation_drops_only_outer_blank_lines():
    assert normalize_output("\n \n\t\n3 \r\n\n4\n\n  \n") == ["3", "", "4"]
    assert normalize_output("\n\n\n") == [] == normalize_output("")
    assert normalize_output("\n" * 200_000 + "42" + "\n" * 200_000) == ["42"]


def test_a_case_output_cap_scales_with_the_expected_output():
    assert case_output_bytes("42", 1 << 20) == 8 + CASE_OUTPUT_SLACK_BYTES
    assert case_output_bytes("\U0001f600", 1 << 20) == 16 + CASE_OUTPUT_SLACK_BYTES  # UTF-8 bytes, not characters
    assert case_output_bytes("x" * (1 << 20), 1 << 20) == 1 << 20  # never above the sandbox's own cap


@needs_bwrap
def test_a_million_blank_lines_before_the_answer_end_the_call_within_a_few_walls():
    """The program prints 1M blank lines (under the sandbox's 1 MiB cap) and then the right answer. The case's cap
    (derived from the 2-byte expected output) stops it, the call ends within a few walls, and the event loop keeps
    running meanwhile; a few thousand blank lines before the answer still pass (leading blank lines are dropped)."""
    limits = SandboxLimits(wall_time_s=2, cpu_time_s=2, output_bytes=1 << 20)
    reward = CodeExecutionReward(limits=limits, concurrency=2)
    flood = "import sys\nsys.stdout.write('\\n' * 1_000_000)\nprint(42)"
    few = "import sys\nsys.stdout.write('\\n' * 5_000)\nprint(42)"
    info = stdio_rows("42", 1)

    async def main():
        gaps, done = [], asyncio.Event()

        async def heartbeat():
            last = time.monotonic()
            while not done.is_set():
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        beat = asyncio.create_task(heartbeat())
        try:
            rewards = await reward([flood, few, "print(42)"], verification_info=[info] * 3)
        finally:
            done.set()
            await beat
        return rewards, max(gaps)

    start = time.monotonic()
    rewards, longest_gap = asyncio.run(main())
    elapsed = time.monotonic() - start
    assert elapsed < ROW_WALL_FACTOR * limits.wall_time_s + START_SLACK_S, elapsed  # not 1M lines normalised
    assert rewards == [0.0, 1.0, 1.0]
    assert reward.last_row_outcomes == ["output_limit", "passed", "passed"]
    assert longest_gap < limits.wall_time_s, longest_gap  # the loop was never blocked for a wall


@needs_bwrap
def test_an_honest_long_output_with_trailing_spaces_and_crlf_passes():
    """The cap scales with the expected output: 40k lines printed with a trailing space and CRLF (twice the bytes of
    the expected output) pass."""
    reward = CodeExecutionReward(limits=SandboxLimits(wall_time_s=5, cpu_time_s=5), concurrency=2)
    expected = "\n".join(str(i % 10) for i in range(40_000))
    program = "import sys\nsys.stdout.write(''.join(f'{i % 10} \\r\\n' for i in range(40_000)))"
    assert reward.score([program], verification_info=[stdio_rows(expected, 2)]) == [1.0]


@needs_bwrap
def test_case_results_keep_only_the_verdict():
    """Rows whose cases print the answer and then about 1 MiB of 4-byte characters on stdout and on stderr: the
    trainer's peak Python memory stays within what the cases running at once may hold (two streams at the case cap,
    as bytes and decoded), not what every case printed (about 2 MiB each)."""
    limits = SandboxLimits(wall_time_s=10, cpu_time_s=5, output_bytes=1 << 20)
    concurrency = 2
    reward = CodeExecutionReward(limits=limits, concurrency=concurrency)
    chars = (limits.output_bytes - 64) // 4
    program = (
        f"import sys\nprint(42)\nsys.stdout.write('\\U0001F600' * {chars})\nsys.stderr.write('\\U0001F600' * {chars})"
    )
    completions, cases = 4, 10
    info = stdio_rows("42", cases)
    reward.score(["print(42)"], verification_info=[info])  # the executor's threads exist before the measurement
    tracemalloc.start()
    try:
        rewards = reward.score([program] * completions, verification_info=[info] * completions)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rewards == [0.0] * completions
    per_run = 2 * case_output_bytes("42", limits.output_bytes) * 8  # two streams: buffer, copies, decoded text
    assert peak < concurrency * per_run + (4 << 20), peak / 2**20


# ---------------------------------------------------------------------------------------------------------------------
# Time: a row's cases share one wall budget
# ---------------------------------------------------------------------------------------------------------------------


class _SandboxSeconds:
    """Sums the wall time of every sandboxed run (on the class: copies with other limits count too)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.total_s, self.runs, self.lock = 0.0, 0, threading.Lock()
        original = Sandbox.run

        def run(sandbox, *args, **kwargs):
            result = original(sandbox, *args, **kwargs)
            with self.lock:
                self.total_s += result.wall_time_s
                self.runs += 1
            return result

        monkeypatch.setattr(Sandbox, "run", run)


@needs_bwrap
def test_passing_then_idling_to_the_wall_costs_a_few_walls_per_row_not_one_per_case(monkeypatch):
    """Twelve cases whose program prints the answer and then idles for most of a 2 s wall (0.8 s of it left, so
    that a loaded machine's start-up does not make a case time out on its own): the row's sandbox time stays within
    its shared budget (3 walls, plus the time to stop the last runs), each passing case is charged at least its idle
    time, the cases past the budget fail as timeouts, and an honest program still passes every case under the same
    budget."""
    wall = 2.0
    reward = CodeExecutionReward(limits=SandboxLimits(wall_time_s=wall, cpu_time_s=2), concurrency=2)
    assert reward.row_wall_time_s == ROW_WALL_FACTOR * wall
    cases = 12
    info = stdio_rows("42", cases)
    idle_s = wall - 0.8
    idler = f"import time\nprint(42, flush=True)\ntime.sleep({idle_s})"
    clock = _SandboxSeconds(monkeypatch)
    rewards = reward.score([idler], verification_info=[info])
    assert clock.total_s < reward.row_wall_time_s + 2 * wall, clock.total_s  # not 12 x idle_s
    assert rewards[0] is not None and 0 < rewards[0] <= reward.row_wall_time_s / idle_s / cases
    assert reward.last_row_outcomes == ["timeout"]
    assert reward.score(["print(42)"], verification_info=[info]) == [1.0]


def test_a_bad_row_budget_is_refused_at_construction():
    for bad in (0, -1.0, float("nan"), True, "3"):
        with pytest.raises(ValueError, match="row_wall_time_s must be a positive number"):
            CodeExecutionReward(row_wall_time_s=bad, check_sandbox=False)


@needs_bwrap
def test_with_limits_runs_with_the_new_limits_and_leaves_the_original_alone():
    sandbox = Sandbox(SandboxLimits(wall_time_s=5, cpu_time_s=5))
    small = sandbox.with_limits(SandboxLimits(wall_time_s=5, cpu_time_s=5, output_bytes=1000))
    program = "print('x' * 5000)"
    assert small.run(program=program).status == "output_limit"
    assert sandbox.run(program=program).status == "ok" and sandbox.limits.output_bytes == 1 << 20
    with pytest.raises(TypeError, match="SandboxLimits"):
        sandbox.with_limits({"wall_time_s": 1})
