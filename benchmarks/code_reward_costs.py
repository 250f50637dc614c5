"""
What a hostile completion costs the trainer through the code reward (`trl_ada.rewards.code`), against an honest
completion of the same row measured in the same run.

Three costs, each for the hostile program and for an honest one (``print(42)``, the baseline):

- ``stall``: seconds of one ``score()`` call on a one-case stdin/stdout row whose program prints ``--blank-lines``
  blank lines and then the right answer (``SandboxLimits(wall_time_s=5)``, the default output cap);
- ``memory``: the peak of the trainer's Python allocations (``tracemalloc``) while scoring ``--completions`` rows of
  ``--cases`` cases whose program prints the answer and then about 1 MiB of 4-byte characters on stdout and on
  stderr (default limits: each stream capped at 1 MiB);
- ``row_cost``: sandbox seconds (the sum of every run's wall time) of one ``--cases``-case row whose program prints
  the answer and then sleeps to 90% of the wall (``wall_time_s=2``), and the reward it gets.

``--reference FILE`` measures another version of ``trl_ada/rewards/code.py`` too (``git show
REV:trl_ada/rewards/code.py > FILE``), with this checkout's sandbox, so a change is priced in one run.

    python benchmarks/code_reward_costs.py [--blank-lines 1000000] [--completions 8] [--cases 20]
        [--reference FILE] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import sys
import time
import tracemalloc
from pathlib import Path
from types import ModuleType
from typing import Any

from trl_ada.rewards import code as current_code
from trl_ada.rewards.sandbox import Sandbox, SandboxLimits

logger = logging.getLogger("code_reward_costs")

HONEST = "print(42)"


def load_reference(path: str) -> ModuleType:
    """Another version of the reward module, imported as a sibling of ``trl_ada.rewards.code`` (same sandbox)."""
    spec = importlib.util.spec_from_file_location("trl_ada.rewards._code_reference", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def info(cases: int) -> dict[str, Any]:
    return {"language": "python", "test_cases": [{"type": "stdin_stdout", "input": "", "output": "42"}] * cases}


class SandboxClock:
    """Sums the wall time of every sandboxed run (patched onto the class, so copies with other limits count too)."""

    def __init__(self) -> None:
        self.total_s = 0.0
        self.runs = 0
        self._original = Sandbox.run

    def __enter__(self) -> SandboxClock:
        clock, original = self, self._original

        def run(sandbox: Sandbox, *args: Any, **kwargs: Any) -> Any:
            result = original(sandbox, *args, **kwargs)
            clock.total_s += result.wall_time_s
            clock.runs += 1
            return result

        Sandbox.run = run  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        Sandbox.run = self._original  # type: ignore[method-assign]


def stall(module: ModuleType, blank_lines: int) -> dict[str, float]:
    reward = module.CodeExecutionReward(limits=SandboxLimits(wall_time_s=5), concurrency=1)
    hostile = f"import sys\nsys.stdout.write('\\n' * {blank_lines})\nprint(42)"
    out = {}
    for name, program in (("honest", HONEST), ("hostile", hostile)):
        start = time.monotonic()
        rewards = reward.score([program], verification_info=[info(1)])
        out[f"{name}_s"] = time.monotonic() - start
        out[f"{name}_reward"] = rewards[0]
    out["ratio"] = out["hostile_s"] / out["honest_s"]
    return out


def memory(module: ModuleType, completions: int, cases: int) -> dict[str, float]:
    reward = module.CodeExecutionReward(limits=SandboxLimits(wall_time_s=10), concurrency=2)
    chars = (SandboxLimits().output_bytes - 64) // 4
    hostile = (
        f"import sys\nprint(42)\nsys.stdout.write('\\U0001F600' * {chars})\nsys.stderr.write('\\U0001F600' * {chars})"
    )
    out = {}
    for name, program in (("honest", HONEST), ("hostile", hostile)):
        tracemalloc.start()
        try:
            reward.score([program] * completions, verification_info=[info(cases)] * completions)
            out[f"{name}_peak_mib"] = tracemalloc.get_traced_memory()[1] / 2**20
        finally:
            tracemalloc.stop()
        out[f"{name}_outcomes"] = dict(reward.last_outcomes)
    out["ratio"] = out["hostile_peak_mib"] / out["honest_peak_mib"]
    return out


def row_cost(module: ModuleType, cases: int) -> dict[str, float]:
    wall = 2.0
    reward = module.CodeExecutionReward(limits=SandboxLimits(wall_time_s=wall, cpu_time_s=wall), concurrency=2)
    hostile = f"import time\nprint(42, flush=True)\ntime.sleep({0.9 * wall})"
    out: dict[str, Any] = {"wall_time_s": wall}
    for name, program in (("honest", HONEST), ("hostile", hostile)):
        start = time.monotonic()
        with SandboxClock() as clock:
            rewards = reward.score([program], verification_info=[info(cases)])
        out[f"{name}_sandbox_s"] = clock.total_s
        out[f"{name}_runs"] = clock.runs
        out[f"{name}_elapsed_s"] = time.monotonic() - start
        out[f"{name}_reward"] = rewards[0]
    out["ratio"] = out["hostile_sandbox_s"] / out["honest_sandbox_s"]
    return out


def measure(module: ModuleType, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "stall": stall(module, args.blank_lines),
        "memory": memory(module, args.completions, args.cases),
        "row_cost": row_cost(module, args.cases),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blank-lines", type=int, default=1_000_000)
    parser.add_argument("--completions", type=int, default=8)
    parser.add_argument("--cases", type=int, default=20)
    parser.add_argument("--reference", help="another version of trl_ada/rewards/code.py to measure too")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    results = {}
    if args.reference:
        results["reference"] = measure(load_reference(args.reference), args)
        logger.info("reference: %s", json.dumps(results["reference"], indent=1))
    results["current"] = measure(current_code, args)
    logger.info("current: %s", json.dumps(results["current"], indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
