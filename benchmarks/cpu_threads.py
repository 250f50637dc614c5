"""
The CPU thread default of `trl_ada.runtime.cpu_threads`, as ratios against torch's own count measured in the same run.

1. Quick start: the README's Python quick start, as written except for its step count and output directory, run in
   a fresh process with the package's default (no thread setting) and with torch's own count (`OMP_NUM_THREADS` set
   to the count torch picks in a fresh process, which the package leaves alone); the two alternate, on a free
   machine and with `--busy` processes spinning on other cores (a shared CPU).
2. Model sizes: one training step (forward, backward, AdamW) and one sampled generation (128 sequences of 8 tokens)
   at one thread and at torch's count, for models around `SMALL_MODEL_PARAMETERS`, free and busy.

    python benchmarks/cpu_threads.py [--steps 20] [--repeats 2] [--busy 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

logger = logging.getLogger("cpu_threads")

ROOT = Path(__file__).resolve().parents[1]

TORCH_COUNT = "torch's count"

SIZES = {
    "0.6M (shipped)": {},
    "3.2M": dict(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, intermediate_size=768
    ),
    "6.3M": dict(
        hidden_size=384, num_hidden_layers=4, num_attention_heads=6, num_key_value_heads=2, intermediate_size=1024
    ),
    "38M": dict(
        hidden_size=768, num_hidden_layers=6, num_attention_heads=12, num_key_value_heads=4, intermediate_size=2048
    ),
}
"""Model shapes of part 2 (`trl_ada.tiny.build_tiny_model` arguments), by their parameter count."""


def readme_quick_start(steps: int, output_dir: str) -> str:
    """The README's quick start block with `steps` steps and `output_dir`, timed; prints `WALL <s> THREADS <n>`."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"^```python\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)
    assert block.count("max_steps=50,") == 1 and block.count('"outputs/quickstart"') == 1
    block = block.replace("max_steps=50,", f"max_steps={steps},").replace('"outputs/quickstart"', repr(output_dir))
    return (
        "import time\n_start = time.perf_counter()\n"
        + block
        + "import torch\nprint('WALL', time.perf_counter() - _start, 'THREADS', torch.get_num_threads())\n"
    )


def torch_default_threads() -> int:
    """The thread count torch picks by itself in a fresh process."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    code = "import torch; print(torch.get_num_threads())"
    return int(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout)


@contextlib.contextmanager
def busy_cores(count: int) -> Iterator[None]:
    """`count` processes spinning at normal priority, as other users' jobs on a shared machine."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def run_quick_start(steps: int, threads: int | None) -> tuple[float, int]:
    """Wall time of the quick start in a fresh process, and the thread count it trained with; `threads=None` leaves
    the count to the package."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    with tempfile.TemporaryDirectory() as tmp:
        code = readme_quick_start(steps, os.path.join(tmp, "out"))
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp)
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("WALL ")]
    _, wall, _, used = line.split()
    return float(wall), int(used)


def quick_start(steps: int, repeats: int, busy: int, default_threads: int) -> dict:
    """Part 1 under `busy` spinning processes: median walls of the package default and of torch's count."""
    walls: dict[str, list[float]] = {"package default": [], TORCH_COUNT: []}
    used: dict[str, int] = {}
    with busy_cores(busy):
        for _ in range(repeats):
            for name, threads in (("package default", None), (TORCH_COUNT, default_threads)):
                wall, used[name] = run_quick_start(steps, threads)
                walls[name].append(wall)
                logger.info("quick start, %d busy: %s (%d threads) %.1f s", busy, name, used[name], wall)
    medians = {name: statistics.median(values) for name, values in walls.items()}
    return {
        "busy_processes": busy,
        "steps": steps,
        "walls_s": walls,
        "threads": used,
        "median_s": medians,
        "torch_count_over_default": medians[TORCH_COUNT] / medians["package default"],
    }


def train_step(model: Any, optimizer: Any, batch: Any) -> None:
    """One forward, backward and AdamW step on `batch` as its own labels."""
    model(batch, labels=batch).loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def generate(model: Any, prompts: Any) -> None:
    """One sampled generation of 8 new tokens for every prompt."""
    import torch

    with torch.no_grad():
        model.generate(**prompts, max_new_tokens=8, do_sample=True)


def per_size(busy: int, default_threads: int, seconds: float = 3.0) -> list[dict]:
    """Part 2 under `busy` spinning processes: seconds per training step and per generation, one thread against
    torch's count."""
    import torch

    from trl_ada.tiny import build_char_tokenizer, build_tiny_model

    tokenizer = build_char_tokenizer()
    batch = torch.randint(4, 60, (64, 16))
    prompts = tokenizer(["  3+  5="] * 128, return_tensors="pt")
    rows = []
    with busy_cores(busy):
        for name, shape in SIZES.items():
            model = build_tiny_model(tokenizer, **shape)
            optimizer = torch.optim.AdamW(model.parameters())

            row = {"model": name, "parameters": sum(p.numel() for p in model.parameters())}
            works = {
                "train_step": functools.partial(train_step, model, optimizer, batch),
                "generate": functools.partial(generate, model, prompts),
            }
            for what, work in works.items():
                for threads in (1, default_threads):
                    torch.set_num_threads(threads)
                    work()  # warm-up
                    start, count = time.perf_counter(), 0
                    while count < 3 or time.perf_counter() - start < seconds:
                        work()
                        count += 1
                    row[f"{what}_s@{threads}"] = (time.perf_counter() - start) / count
                row[f"{what}_torch_count_over_one"] = row[f"{what}_s@{default_threads}"] / row[f"{what}_s@1"]
            logger.info("sizes, %d busy: %s", busy, row)
            rows.append(row)
    torch.set_num_threads(default_threads)
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="Quick start steps (the README's: 50).")
    parser.add_argument("--repeats", type=int, default=2, help="Alternated runs of each quick-start setting.")
    parser.add_argument("--busy", type=int, default=1, help="Spinning processes for the shared-CPU measurements.")
    parser.add_argument("--skip_sizes", action="store_true", help="Only the quick start.")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    default_threads = torch_default_threads()
    results = {"torch_default_threads": default_threads, "cpus": os.cpu_count(), "quick_start": [], "sizes": []}
    for busy in (0, args.busy):
        results["quick_start"].append(quick_start(args.steps, args.repeats, busy, default_threads))
        if not args.skip_sizes:
            results["sizes"].append({"busy_processes": busy, "rows": per_size(busy, default_threads)})
    print(f"torch's own count here: {default_threads} threads ({os.cpu_count()} CPUs)")
    for entry in results["quick_start"]:
        print(
            f"quick start ({entry['steps']} steps, {entry['busy_processes']} busy): package default "
            f"{entry['median_s']['package default']:.1f} s at {entry['threads']['package default']} thread(s), "
            f"torch's count {entry['median_s'][TORCH_COUNT]:.1f} s: "
            f"{entry['torch_count_over_default']:.2f}x the default's time"
        )
    for block in results["sizes"]:
        for row in block["rows"]:
            print(
                f"{row['model']:>15} ({block['busy_processes']} busy): {default_threads} threads / 1 thread: "
                f"train step {row['train_step_torch_count_over_one']:.2f}x, "
                f"generation {row['generate_torch_count_over_one']:.2f}x"
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
