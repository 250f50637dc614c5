"""
Train with Reinforce-Ada: the main job, shared by `trl-ada train` and `scripts/train_ada.py`.

    trl-ada train [flags | --config recipe]                         # installed package, one process
    accelerate launch -m trl_ada.train [flags | --config recipe]    # installed package, several processes
    accelerate launch scripts/train_ada.py [flags | --config recipe]   # from the repository

With no model and no dataset (on the command line or in the config) it runs the embedded default: the tiny
arithmetic model shipped with trl-ada learns a verifiable arithmetic task of graded difficulty on CPU, in a few
minutes, and writes the model, its card, plots and metrics to `--output_dir` (default `outputs/trl-ada-arithmetic`).
It saves no checkpoint unless `--save_steps` asks for them.

Per-step metrics go to `log_history`, `metrics.json`/`metrics.csv` and `report_to`; the console shows the progress
bar, not each metrics dict (`--log_level debug` logs those), and the run ends with a short summary.

The real path takes any causal LM (`--model_name_or_path`: hub id or local directory) and any prompt dataset
(`--dataset_name`: hub id, or a local parquet/JSONL/JSON/CSV file or saved dataset directory), with reward
functions by name (`--reward_funcs math_verify`); every flag of TRL's `trl grpo` works, plus the Reinforce-Ada knobs
of `AdaGRPOConfig` (`--sampler seq_balance --round_size 8 ...`) and YAML `--config` files.

`--config` takes a YAML file path or the name of a recipe shipped in the package (`recipes/` of the repository,
installed as `trl_ada/recipes/`), with or without `.yaml`: `--config qwen2.5-math-1.5b/seq_balance`. An existing file
wins over a shipped recipe of the same name.

    # embedded default
    trl-ada train
    # ... with a checkpoint every 50 steps, then continued from the latest one in --output_dir
    trl-ada train --save_steps 50
    trl-ada train --save_steps 50 --max_steps 800 --resume_from_checkpoint true
    # the paper's setting on 8 GPUs (configs/accelerate/zero2.yaml in the repository)
    accelerate launch --config_file zero2.yaml -m trl_ada.train --config qwen2.5-math-1.5b/seq_balance
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from trl import ModelConfig, ScriptArguments, TrlParser, get_peft_config, get_quantization_config

from .checkpoints import latest_complete_checkpoint
from .config import AdaGRPOConfig
from .plots import logged_series, training_entries
from .trainer import AdaGRPOTrainer

logger = logging.getLogger("train_ada")

EMBEDDED_OUTPUT_DIR = "outputs/trl-ada-arithmetic"


@dataclass
class AdaScriptArguments(ScriptArguments):
    """
    Script arguments of `trl-ada train` (and `scripts/train_ada.py`).

    Args:
        reward_funcs (`list[str]`, *optional*):
            Reward functions by name (`math_verify`, `exact_match`, TRL's own such as `accuracy_reward`) or dotted
            import path (`my_lib.rewards.custom_reward`). Default: `exact_match` for the embedded arithmetic task,
            `math_verify` otherwise.
        prompt_column (`str`, *optional*, defaults to `"problem"`):
            Column holding the question when the dataset has no `prompt` column (OpenR1-Math style); it is turned
            into TRL's prompt format (conversational when the tokenizer has a chat template, plain text otherwise).
        solution_column (`str`, *optional*, defaults to `"solution"`):
            Column holding the reference answer in that case (OpenR1-Math: `answer`); it becomes `solution`, where
            `math_verify` reads it.
        max_prompt_length (`int`, *optional*):
            Longest prompt in tokens; a longer one stops the run before training. Default: the tokenizer's
            `model_max_length` minus `max_completion_length`.
        system_prompt (`str`, *optional*):
            System message prepended to every prompt when the prompts are built from `prompt_column`.
        arithmetic_train_size (`int`, *optional*, defaults to `20000`):
            Size of the embedded arithmetic training stream (fresh problems, balanced over difficulty levels).
        heldout_size (`int`, *optional*, defaults to `384`):
            Held-out arithmetic problems scored before and after training in the embedded run (0 to skip).
    """

    dataset_name: str | None = field(
        default=None, metadata={"help": "Hub id or local file/directory; empty for the embedded arithmetic task."}
    )
    reward_funcs: list[str] | None = field(
        default=None, metadata={"help": "Reward functions by name or dotted import path."}
    )
    prompt_column: str = field(default="problem", metadata={"help": "Question column when there is no `prompt`."})
    solution_column: str = field(default="solution", metadata={"help": "Reference-answer column in that case."})
    max_prompt_length: int | None = field(default=None, metadata={"help": "Longest allowed prompt, in tokens."})
    system_prompt: str | None = field(default=None, metadata={"help": "System message for prompts built here."})
    arithmetic_train_size: int = field(default=20_000, metadata={"help": "Embedded task: training problems."})
    heldout_size: int = field(default=384, metadata={"help": "Embedded task: held-out problems (0 to skip)."})


def embedded_defaults() -> dict:
    """Settings of the no-argument run: the shipped tiny model on CPU, sized to finish in a few minutes on 2 cores."""
    on_gpu = torch.cuda.is_available()
    return dict(
        output_dir=EMBEDDED_OUTPUT_DIR,
        use_cpu=not on_gpu,
        bf16=False,
        per_device_train_batch_size=64,  # 16 prompts x num_generations 4
        num_generations=4,
        max_completion_length=8,
        temperature=1.0,
        learning_rate=1e-4,
        lr_scheduler_type="constant",
        max_steps=400,
        beta=0.0,
        sampler="seq_balance",  # rounds of 8, at most 4 rounds, quotas 2/2: the paper's Seq-balance
        logging_steps=5,
        save_strategy="no",
        report_to="none",
        seed=0,
    )


def config_file_values(argv: Sequence[str]) -> dict[str, Any]:
    """The settings of the `--config` YAML file named in `argv` (empty without one), as `TrlParser` will read them."""
    if "--config" not in argv or argv.index("--config") + 1 >= len(argv):
        return {}
    with open(argv[argv.index("--config") + 1]) as f:
        values = yaml.safe_load(f)
    return values if isinstance(values, dict) else {}


def explicit_settings(argv: Sequence[str]) -> set[str]:
    """Names of the settings the user set explicitly: flags on the command line (`--save_steps`, `--save-steps=5`)
    and keys of the `--config` file with a value."""
    flags = {arg[2:].split("=", 1)[0].replace("-", "_") for arg in argv if arg.startswith("--")}
    from_config = {key for key, value in config_file_values(argv).items() if value is not None}
    return (flags - {"config"}) | from_config


def is_embedded_run(argv: Sequence[str]) -> bool:
    """No model and no dataset named on the command line or in the config file: run the embedded default."""
    return not explicit_settings(argv) & {"model_name_or_path", "dataset_name"}


def make_parser(argv: Sequence[str]) -> TrlParser:
    """The script's parser; on the embedded run its defaults are [`embedded_defaults`]."""
    parser = TrlParser((AdaScriptArguments, AdaGRPOConfig, ModelConfig))
    if is_embedded_run(argv):
        # Defaults only: any flag or config value the user passes (e.g. --max_steps 5) still wins.
        defaults = embedded_defaults()
        explicit = explicit_settings(argv)
        if "save_steps" in explicit and "save_strategy" not in explicit:
            # The embedded run saves no checkpoint by default; asking for a save interval asks for checkpoints.
            defaults["save_strategy"] = "steps"
        parser.set_defaults(**defaults)
    return parser


_RESUME_LATEST = frozenset({"true", "1", "yes"})
_RESUME_NEVER = frozenset({"false", "0", "no", ""})


def resolve_resume_from_checkpoint(value: str | bool | None, output_dir: str) -> str | bool | None:
    """
    What to pass to `trainer.train(resume_from_checkpoint=...)` for `--resume_from_checkpoint VALUE`, checked before
    any model is loaded.

    `true`/`1`/`yes` (any case) resume from the latest `checkpoint-N` in `output_dir`, as the HF Trainer does for
    `True`; `false`/`0`/`no` start fresh; anything else is a checkpoint directory, passed on unchanged. An existing
    directory of that name always counts as a path.

    Raises:
        ValueError: when there is no checkpoint to resume from, naming `output_dir` or the missing path.
    """
    if value is None or value is False:
        return None
    text = str(value).strip()
    if os.path.isdir(text):
        return text
    if text.lower() in _RESUME_NEVER:
        return None
    if text.lower() in _RESUME_LATEST:
        if latest_complete_checkpoint(output_dir) is None:
            raise ValueError(
                f"--resume_from_checkpoint {text} resumes from the latest complete checkpoint-N directory in output_dir="
                f"{output_dir!r}, but there is none. Save checkpoints with --save_steps N, pass a checkpoint "
                "directory, or drop --resume_from_checkpoint."
            )
        # The trainer picks the checkpoint itself, as it does for `True`.
        return True
    raise ValueError(
        f"--resume_from_checkpoint {text!r} is not a directory. Pass a checkpoint-N directory, or `true` for the "
        f"latest one in output_dir={output_dir!r}."
    )


def load_model_and_data(script_args: AdaScriptArguments, training_args: AdaGRPOConfig, model_args: ModelConfig):
    """Resolve model, tokenizer, datasets and reward functions, validating everything before any training."""
    from .rewards import get_reward_funcs

    if model_args.model_name_or_path is None and script_args.dataset_name is None:
        from .tasks.arithmetic import held_out_problems, make_dataset
        from .tiny import load_tiny_arith_model

        if not torch.cuda.is_available():
            # A 0.6M-parameter model gains nothing from more threads, and extra threads slow it badly when the cores
            # are shared.
            torch.set_num_threads(1)

        model, tokenizer = load_tiny_arith_model()
        train = make_dataset(script_args.arithmetic_train_size, seed=training_args.seed)
        heldout = (
            held_out_problems(script_args.heldout_size, seed=training_args.seed) if script_args.heldout_size else []
        )
        reward_funcs = get_reward_funcs(script_args.reward_funcs or ["exact_match"])
        return model, tokenizer, train, None, reward_funcs, heldout

    if model_args.model_name_or_path is None or script_args.dataset_name is None:
        raise ValueError(
            "Pass both --model_name_or_path and --dataset_name (or neither, for the embedded arithmetic run)."
        )
    from transformers import AutoTokenizer

    from .data import load_prompt_dataset, to_prompt_format, validate_prompt_dataset
    from .rewards import required_reward_columns

    reward_funcs = get_reward_funcs(script_args.reward_funcs or ["math_verify"])
    train = load_prompt_dataset(
        script_args.dataset_name, split=script_args.dataset_train_split, config=script_args.dataset_config
    )
    tokenizer = AutoTokenizer.from_pretrained(
        model_args.model_name_or_path,
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
    )
    if "prompt" not in train.column_names and len(train) > 0:
        conversational = getattr(tokenizer, "chat_template", None) is not None
        logger.info(
            "No `prompt` column: building %s prompts from %r (answers from %r).",
            "conversational" if conversational else "plain-text",
            script_args.prompt_column,
            script_args.solution_column,
        )
        validate_prompt_dataset(
            train, [script_args.prompt_column, script_args.solution_column], prompt_column=script_args.prompt_column
        )
        train = to_prompt_format(
            train,
            problem_column=script_args.prompt_column,
            solution_column=script_args.solution_column,
            system_prompt=script_args.system_prompt,
            conversational=conversational,
        )
    max_prompt_length = script_args.max_prompt_length
    if max_prompt_length is None and tokenizer.model_max_length < 1e9:
        max_prompt_length = tokenizer.model_max_length - (training_args.max_completion_length or 0)
        if max_prompt_length < 1:
            raise ValueError(
                f"max_completion_length={training_args.max_completion_length} leaves no room for a prompt within the "
                f"tokenizer's model_max_length={tokenizer.model_max_length}. Lower --max_completion_length."
            )
    validate_prompt_dataset(
        train,
        ["prompt", *required_reward_columns(reward_funcs)],
        tokenizer=tokenizer,
        max_prompt_length=max_prompt_length,
    )
    model_init_kwargs = dict(
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
        attn_implementation=model_args.attn_implementation,
        dtype=model_args.dtype,
    )
    if training_args.model_init_kwargs is not None:
        model_init_kwargs.update(training_args.model_init_kwargs)
    training_args.model_init_kwargs = model_init_kwargs
    return model_args.model_name_or_path, tokenizer, train, None, reward_funcs, []


def sharded_parameters(trainer: AdaGRPOTrainer) -> bool:
    """Whether the model's parameters are split over processes (FSDP, DeepSpeed ZeRO-3)."""
    if getattr(trainer, "is_fsdp_enabled", False):
        return True
    plugin = getattr(trainer.accelerator.state, "deepspeed_plugin", None)
    return bool(getattr(trainer, "is_deepspeed_enabled", False) and plugin is not None and plugin.zero_stage == 3)


def heldout_accuracy(trainer: AdaGRPOTrainer, problems: list[dict], temperature: float) -> dict[str, float]:
    from .tasks.arithmetic import accuracy_by_level

    model = trainer.accelerator.unwrap_model(trainer.model)
    was_training = model.training
    result = accuracy_by_level(
        model,
        trainer.processing_class,
        problems,
        temperature=temperature,
        num_samples=1,
        max_new_tokens=trainer.args.max_completion_length,
    )
    model.train(was_training)
    return {"eval_heldout_accuracy": result["overall"]}


class LoggingPrinterCallback(TrainerCallback):
    """Stands in for transformers' `PrinterCallback` (used with `--disable_tqdm`): logs each metrics dict at DEBUG
    instead of printing it."""

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if state.is_local_process_zero and logs:
            logger.debug("%s", logs)


class BarOnlyProgressCallback(ProgressCallback):
    """transformers' progress bar without the raw metrics dict it writes to stdout at every logging step.

    The metrics still reach `log_history`, `report_to` and `metrics.json`; here they go to `logging` at DEBUG.
    """

    on_log = LoggingPrinterCallback.on_log


def keep_metric_dicts_off_stdout(trainer: AdaGRPOTrainer) -> None:
    """Swap the callbacks that print every `logs` dict for [`BarOnlyProgressCallback`] / [`LoggingPrinterCallback`].

    Only the training job does it: the trainer itself stays TRL-like, and `logging_steps`/`disable_tqdm` keep their
    meaning.
    """
    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(BarOnlyProgressCallback())
    if trainer.pop_callback(PrinterCallback) is not None:
        trainer.add_callback(LoggingPrinterCallback())


def _logged_mean(entries: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [value for _, value in logged_series(entries, key)]
    return statistics.fmean(values) if values else None


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def log_run_summary(
    trainer: AdaGRPOTrainer,
    train_runtime: float | None,
    heldout: dict[str, float] | None,
) -> None:
    """A few lines a person reads at the end of the run: what the run did and where its outputs are."""
    args = trainer.args
    entries = training_entries(trainer.state.log_history)
    samples = _logged_mean(entries, "ada/samples_per_prompt/mean")
    logger.info("Run summary (%d optimizer steps):", trainer.state.global_step)
    if heldout is not None:
        logger.info(
            "  held-out pass rate (%d problems, temperature %g): %.3f before training, %.3f after",
            heldout["problems"],
            args.temperature,
            heldout["before"],
            heldout["after"],
        )
    logger.info(
        "  completions drawn per prompt: %s on average (plain GRPO: %d)",
        "n/a" if samples is None else f"{samples:.1f}",
        args.num_generations,
    )
    logger.info(
        "  zero-variance groups: %s of the first %d draws (what GRPO would train on), %s of the kept update groups",
        _share(_logged_mean(entries, "ada/zero_variance_share/first_n")),
        args.num_generations,
        _share(_logged_mean(entries, "ada/zero_variance_share/kept")),
    )
    if train_runtime is not None:
        logger.info("  training wall time: %.1f s", train_runtime)
    logger.info(
        "  model: %s; model card: %s (plots in %s)",
        args.output_dir,
        os.path.join(args.output_dir, "README.md"),
        os.path.join(args.output_dir, "plots"),
    )
    if args.push_to_hub:
        logger.info("  pushed to the Hub as %s", trainer.hub_model_id)


def main(script_args: AdaScriptArguments, training_args: AdaGRPOConfig, model_args: ModelConfig) -> AdaGRPOTrainer:
    """Train, evaluate the embedded task before and after, save the model and its card, log a short summary."""
    # Checked before the model loads: a missing checkpoint should not cost a model download.
    resume_from_checkpoint = resolve_resume_from_checkpoint(
        training_args.resume_from_checkpoint, training_args.output_dir
    )
    model, tokenizer, train, evaluation, reward_funcs, heldout = load_model_and_data(
        script_args, training_args, model_args
    )
    trainer = AdaGRPOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=train,
        eval_dataset=evaluation,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        **(
            {"quantization_config": get_quantization_config(model_args)}
            if model_args.load_in_4bit or model_args.load_in_8bit
            else {}
        ),
    )
    keep_metric_dicts_off_stdout(trainer)
    heldout_summary = None
    if heldout and sharded_parameters(trainer):
        # The held-out check generates on the main process alone; with sharded parameters every forward is a
        # collective that the other processes would never join.
        logger.warning(
            "Skipping the held-out accuracy check: the model's parameters are sharded (FSDP / ZeRO-3) and it "
            "generates on the main process only. Evaluate the saved model with scripts/evaluate.py instead."
        )
        heldout = []
    if heldout and trainer.accelerator.is_main_process:
        before = heldout_accuracy(trainer, heldout, training_args.temperature)
        logger.info("held-out accuracy before training: %.3f", before["eval_heldout_accuracy"])
    train_output = trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    if heldout and trainer.accelerator.is_main_process:
        after = heldout_accuracy(trainer, heldout, training_args.temperature)
        logger.info("held-out accuracy after training: %.3f", after["eval_heldout_accuracy"])
        # Logged together after training: `train()` starts a fresh log history.
        trainer.log({"eval_heldout_accuracy_start": before["eval_heldout_accuracy"], **after})
        heldout_summary = {
            "problems": len(heldout),
            "before": before["eval_heldout_accuracy"],
            "after": after["eval_heldout_accuracy"],
        }
    trainer.save_model(training_args.output_dir)
    dataset_name = (
        script_args.dataset_name if script_args.dataset_name and not os.path.exists(script_args.dataset_name) else None
    )
    trainer.create_model_card(
        model_name=os.path.basename(os.path.normpath(training_args.output_dir)), dataset_name=dataset_name
    )
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=dataset_name)
    if trainer.accelerator.is_main_process:
        log_run_summary(trainer, train_output.metrics.get("train_runtime"), heldout_summary)
    return trainer


# ---------------------------------------------------------------------------------------------------------------------
# Recipes shipped with the package, and the command line
# ---------------------------------------------------------------------------------------------------------------------


def recipes_dir() -> Path:
    """The shipped recipes: `trl_ada/recipes/` in an installed wheel, `recipes/` of the repository in a checkout."""
    installed = Path(__file__).resolve().parent / "recipes"
    return installed if installed.is_dir() else Path(__file__).resolve().parents[1] / "recipes"


def shipped_recipes() -> list[str]:
    """Names of the shipped recipes, as `--config` takes them (`qwen2.5-math-1.5b/seq_balance`)."""
    root = recipes_dir()
    return sorted(path.relative_to(root).with_suffix("").as_posix() for path in root.rglob("*.yaml"))


def resolve_config(value: str) -> str:
    """
    The YAML file that `--config VALUE` names: an existing file as given, else a shipped recipe by name, with or
    without `.yaml` (`qwen2.5-math-1.5b/seq_balance`, `models/qwen2.5-math-7b.yaml`).

    Raises:
        ValueError: when VALUE is neither, listing the shipped recipes.
    """
    if os.path.isfile(value):
        return value
    root = recipes_dir().resolve()
    name = value.removesuffix(".yaml")
    candidate = (root / f"{name}.yaml").resolve()
    if candidate.is_relative_to(root) and candidate.is_file():
        return str(candidate)
    raise ValueError(
        f"--config {value!r} is neither a file nor a recipe shipped with trl-ada. Pass a YAML file, or one of: "
        + ", ".join(shipped_recipes())
    )


def with_config_resolved(argv: Sequence[str]) -> list[str]:
    """`argv` with `--config VALUE` (or `--config=VALUE`) turned into `--config PATH`, as `TrlParser` reads it."""
    argv = list(argv)
    for index, arg in enumerate(argv):
        if arg.startswith("--config="):
            argv[index : index + 1] = ["--config", arg.split("=", 1)[1]]
            break
    if "--config" in argv and argv.index("--config") + 1 < len(argv):
        index = argv.index("--config") + 1
        argv[index] = resolve_config(argv[index])
    return argv


def cli_main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Parse `argv` (default: `sys.argv[1:]`) and train: `trl-ada train`, `python -m trl_ada.train` and the script."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        argv = with_config_resolved(argv)
    except ValueError as error:  # a mistyped recipe name: say which exist, no traceback
        print(f"{prog or os.path.basename(sys.argv[0])}: error: {error}", file=sys.stderr)
        return 2
    parser = make_parser(argv)
    if prog is not None:
        parser.prog = prog
    script_args, training_args, model_args = parser.parse_args_and_config(argv)
    if training_args.log_level == "debug":
        logger.setLevel(logging.DEBUG)  # also shows each logging step's metrics dict
    main(script_args, training_args, model_args)
    return 0


if __name__ == "__main__":
    sys.exit(cli_main())
