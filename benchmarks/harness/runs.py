"""A benchmark's runs: each one a child process that writes `OUT/runs/METHOD-seedN.json` with the settings it ran with.
A later invocation keeps (`--reuse_runs`) or reports (`--report_only`) only the runs whose recorded settings are its
own, so an older run in the folder never slips into a table."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def run_path(runs_dir: Path, method: str, seed: int) -> Path:
    """Where a run of `method` at `seed` writes its JSON."""
    return runs_dir / f"{method}-seed{seed}.json"


def reusable(path: Path, settings: dict[str, Any]) -> bool:
    """Whether the run at ``path`` finished with exactly ``settings`` (a run without recorded settings is not)."""
    return path.exists() and json.loads(path.read_text()).get("settings") == settings


def matching_runs(
    runs_dir: Path, methods: Iterable[str], seeds: Sequence[int], settings_of: Callable[[str], dict[str, Any]]
) -> list[dict]:
    """The runs in `runs_dir` of each method and seed asked for whose recorded settings are `settings_of(method)`."""
    runs = []
    for method in methods:
        for seed in seeds:
            path = run_path(runs_dir, method, seed)
            if reusable(path, settings_of(method)):
                runs.append(json.loads(path.read_text()))
    return runs


def missing_runs(results: Sequence[dict], methods: Sequence[str], seeds: Sequence[int]) -> list[str]:
    """The `METHOD-seedN` runs asked for that `results` lack."""
    have = {(run["method"], run["seed"]) for run in results}
    return [f"{method}-seed{seed}" for method in methods for seed in seeds if (method, seed) not in have]


def group_by_method(runs: Iterable[dict]) -> dict[str, list[dict]]:
    """The runs of each method, in the order they come."""
    by_method: dict[str, list[dict]] = {}
    for run in runs:
        by_method.setdefault(run["method"], []).append(run)
    return by_method


@dataclass(frozen=True)
class Child:
    """One run's child process: its method and seed, its command line and the file that takes its output (None: the
    parent's own)."""

    method: str
    seed: int
    argv: list[str]
    log: Path | None = None


def run_processes(
    children: Sequence[Child],
    *,
    jobs: int = 1,
    env: dict[str, str] | None = None,
    before: Callable[[Child], None] | None = None,
) -> list[str]:
    """Runs `children` in order, `jobs` at a time, in `env` (default: one CPU thread each, as `jobs` of them share the
    machine), calling `before(child)` just before each starts; logs each one's outcome and time, and returns the
    `METHOD-seedN` of those that failed."""
    if env is None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    pending = list(children)
    running: list[tuple[subprocess.Popen, Child, Any, float]] = []
    failed = []
    try:
        while pending or running:
            while pending and len(running) < jobs:
                child = pending.pop(0)
                if before is not None:
                    before(child)
                log = None if child.log is None else open(child.log, "w")  # noqa: SIM115 (closed when the child ends)
                stderr = None if log is None else subprocess.STDOUT
                process = subprocess.Popen(child.argv, env=env, stdout=log, stderr=stderr)
                running.append((process, child, log, time.time()))
            time.sleep(1)
            for entry in list(running):
                process, child, log, started = entry
                if process.poll() is None:
                    continue
                running.remove(entry)
                if log is not None:
                    log.close()
                status = "ok" if process.returncode == 0 else f"FAILED ({process.returncode})"
                if process.returncode != 0:
                    failed.append(f"{child.method}-seed{child.seed}")
                logger.info("%s seed %d: %s in %.0f s", child.method, child.seed, status, time.time() - started)
    except BaseException:  # an interrupted parent (Ctrl-C, a timeout's SIGTERM) leaves no run behind
        for process, *_ in running:
            process.kill()
            process.wait()
        raise
    return failed
