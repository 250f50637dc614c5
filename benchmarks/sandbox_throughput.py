"""
Throughput of the code sandbox (`trl_ada.rewards.sandbox`), as ratios against a plain subprocess measured in the same run.

For two programs, a trivial one (two asserts) and a typical reward run (the assert harness of `trl_ada.rewards.code`
loading a solution that sieves primes and answering four `f(x) == literal` tests), at 1 and 2 workers (threads
each starting one program at a time), it measures programs per second of:

- ``plain``: `subprocess.run([python, "-I", "-B", "main.py"])` in a temporary directory, the same interpreter the
  sandbox uses: the baseline;
- ``limits_only``: `Sandbox(isolation="none")` (the baseline plus `prlimit`, a clean environment and the output
  plumbing; not a security boundary);
- ``bwrap``: `Sandbox()`, the bubblewrap sandbox (its private filesystem: a copy of the interpreter's files on a tmpfs);
- ``bwrap_host_fs``: `Sandbox(filesystem="host")`, the same binding the host's ``/usr`` read-only instead;
- ``bwrap_no_cgroup``: the same without its per-run memory and cpu cgroups (where the machine gives them), to tell
  what moving the sandbox into them costs;
- ``reference``: with ``--reference FILE`` (repeatable: ``reference_<file stem>``), the bubblewrap sandbox of another version of
  ``trl_ada/rewards/sandbox.py`` (``git show REV:trl_ada/rewards/sandbox.py > FILE``), to price a change.

Per mode: programs/s, ms per program (wall / programs, per worker), the overhead per program against ``plain``
(ms) and the throughput ratio ``plain / mode``. Modes alternate in small blocks (``--programs`` each, every mode in
turn, ``--blocks`` rounds, the median reported), so a load that comes and goes on a shared machine hits them alike.

Last, what the private filesystem costs once per process: the seconds to make the copy and the memory it holds.

    python benchmarks/sandbox_throughput.py [--programs 10] [--blocks 9] [--reference FILE] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

logger = logging.getLogger("sandbox_throughput")

TRIVIAL = "assert 1 + 1 == 2\nassert 'a' * 2 == 'aa'\n"
SOLUTION = """
def primes_below(n):
    sieve = bytearray([1]) * n
    sieve[:2] = b"\\x00\\x00"
    for i in range(2, int(n ** 0.5) + 1):
        if sieve[i]:
            sieve[i * i :: i] = bytearray(len(range(i * i, n, i)))
    return [i for i, flag in enumerate(sieve) if flag]
"""
TESTS = (
    "assert len(primes_below(10)) == 4\nassert primes_below(20)[-1] == 19\n"
    "assert len(primes_below(100000)) == 9592\nassert primes_below(3) == [2]\n"
)


def typical_files() -> dict[str, str]:
    from trl_ada.rewards.code import HARNESS, build_assert_plan

    plan = build_assert_plan(TESTS)
    return {"main.py": HARNESS, "solution.py": SOLUTION, "plan.json": json.dumps([list(step) for step in plan.steps])}


def plain_runner(python: str, files: dict[str, str], channel: bool):
    def run() -> None:
        with tempfile.TemporaryDirectory(prefix="bench-plain-") as workdir:
            for name, content in files.items():
                Path(workdir, name).write_text(content)
            env = {"PATH": "/usr/bin:/bin", "HOME": workdir}
            read_fd = write_fd = None
            if channel:  # the harness writes its records to a pipe, as in the sandbox
                read_fd, write_fd = os.pipe()
                env["SANDBOX_CHANNEL_FD"] = str(write_fd)
            try:
                out = subprocess.run(
                    [python, "-I", "-B", "main.py"],
                    cwd=workdir,
                    env=env,
                    capture_output=True,
                    pass_fds=[write_fd] if write_fd is not None else [],
                    timeout=30,
                )
            finally:
                if write_fd is not None:
                    os.close(write_fd)
                    os.close(read_fd)
            if out.returncode != 0:
                raise RuntimeError(f"baseline program failed: {out.stderr.decode()[-500:]}")

    return run


def sandbox_runner(sandbox, files: dict[str, str], channel: bool):
    def run() -> None:
        result = sandbox.run(files=files, channel=channel)
        if result.status != "ok":
            raise RuntimeError(f"sandboxed program failed: {result.status} {result.stderr[-500:]}")

    return run


def throughput(run, programs: int, workers: int) -> float:
    """Programs per second running ``programs`` programs on ``workers`` threads."""
    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        for future in [pool.submit(run) for _ in range(programs)]:
            future.result()
    return programs / (time.perf_counter() - start)


# Standard-library modules a trainer seldom imports itself; those this process has loaded are left out.
def private_root_cost(sandbox, builds: int) -> dict[str, object]:
    """What the sandbox's private filesystem costs once per process: seconds to make the copy (median of ``builds``)
    and the memory it holds."""
    import shutil as shutil_module

    from trl_ada.rewards import sandbox_root

    directory = sandbox_root.find_tmpfs(needed_bytes=sandbox_root.ROOT_ROOM_BYTES)
    tools = sandbox.root_tools()
    seconds, size = [], 0
    for _ in range(builds):
        start = time.perf_counter()
        root = sandbox_root.build_root(sandbox.python, tools, directory)
        seconds.append(time.perf_counter() - start)
        size = root.size_bytes
        shutil_module.rmtree(root.path)
    row = {"private_root_build_s": round(statistics.median(seconds), 3), "private_root_mib": round(size / 2**20, 1)}
    logger.info("private filesystem: %.1f MiB, made in %.2f s", row["private_root_mib"], row["private_root_build_s"])
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--programs", type=int, default=10, help="programs per block")
    parser.add_argument("--blocks", type=int, default=9, help="alternating blocks per mode (median reported)")
    parser.add_argument(
        "--reference", type=Path, action="append", default=[], help="another version's sandbox.py (repeatable)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.programs < 1 or args.blocks < 1:
        parser.error("--programs and --blocks must be positive")

    from trl_ada.rewards.sandbox import Sandbox

    sandbox = Sandbox()
    unisolated = Sandbox(isolation="none", python=sandbox.python)
    no_cgroup = Sandbox(python=sandbox.python)
    no_cgroup.memory_cgroup = no_cgroup.cpu_cgroup = None
    host_filesystem = Sandbox(python=sandbox.python, filesystem="host")
    references = {}
    for index, path in enumerate(args.reference):
        # Loaded inside the package, so the version's relative imports (``.sandbox_root``) resolve.
        spec = importlib.util.spec_from_file_location(f"trl_ada.rewards._reference_sandbox_{index}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
        references["reference" if len(args.reference) == 1 else f"reference_{path.stem}"] = module.Sandbox(
            python=sandbox.python
        )
    programs = {"trivial": ({"main.py": TRIVIAL}, False), "typical": (typical_files(), True)}
    results: dict[str, object] = {
        "python": sandbox.python,
        "cpus": os.cpu_count(),
        "programs_per_block": args.programs,
        "references": [str(path) for path in args.reference],
        "blocks": args.blocks,
        "runs": [],
    }
    for program, (files, channel) in programs.items():
        runners = {
            "plain": plain_runner(sandbox.python, files, channel),
            "limits_only": sandbox_runner(unisolated, files, channel),
            "bwrap": sandbox_runner(sandbox, files, channel),
            "bwrap_host_fs": sandbox_runner(host_filesystem, files, channel),
        }
        if sandbox.memory_cgroup is not None or sandbox.cpu_cgroup is not None:
            runners["bwrap_no_cgroup"] = sandbox_runner(no_cgroup, files, channel)
        for mode, reference in references.items():
            runners[mode] = sandbox_runner(reference, files, channel)
        for run in runners.values():  # warm-up: page cache, imports
            run()
        for workers in (1, 2):
            rates: dict[str, list[float]] = {mode: [] for mode in runners}
            for _ in range(args.blocks):
                for mode, run in runners.items():
                    rates[mode].append(throughput(run, args.programs, workers))
            baseline = statistics.median(rates["plain"])
            for mode in runners:
                rate = statistics.median(rates[mode])
                row = {
                    "program": program,
                    "workers": workers,
                    "mode": mode,
                    "programs_per_s": round(rate, 1),
                    "ms_per_program_per_worker": round(1000 * workers / rate, 2),
                    "overhead_ms_per_program": round(1000 * workers * (1 / rate - 1 / baseline), 2),
                    "throughput_ratio_plain_over_mode": round(baseline / rate, 2),
                }
                results["runs"].append(row)
                logger.info(
                    "%-8s workers=%d %-12s %7.1f programs/s  %6.2f ms/program  overhead %+6.2f ms  ratio %.2fx",
                    program,
                    workers,
                    mode,
                    row["programs_per_s"],
                    row["ms_per_program_per_worker"],
                    row["overhead_ms_per_program"],
                    row["throughput_ratio_plain_over_mode"],
                )
    if sandbox.filesystem == "private":
        results.update(private_root_cost(sandbox, 3))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    sys.stdout.write(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
