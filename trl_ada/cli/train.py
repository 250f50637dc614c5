"""
Train with Reinforce-Ada: the main job of `trl-ada train`, `accelerate launch -m trl_ada.cli.train` and
`scripts/train_ada.py`. With no model and no dataset it runs the embedded default (trl-ada's tiny arithmetic model on
CPU); otherwise every flag of TRL's `trl grpo` works, plus `AdaGRPOConfig`'s knobs and `--config` YAML files or shipped
recipes. Mistakes in the input stop it with one message that lists every one, each with the flag that fixes it,
before any model is loaded.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import torch
import yaml
from datasets import Dataset, IterableDataset
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from transformers.trainer_utils import IntervalStrategy
from trl import (
    DatasetMixtureConfig,
    GRPOConfig,
    ModelConfig,
    ScriptArguments,
    TrlParser,
    get_dataset,
    get_peft_config,
    get_quantization_config,
)

from ..checkpoints import latest_complete_checkpoint
from ..config import ADA_ONLY_FIELDS, AdaGRPOConfig
from ..data import dataset_columns, load_prompt_dataset, to_prompt_format, validate_prompt_dataset
from ..generation.weight_sync import uses_zero3
from ..reporting.card import check_license
from ..reporting.plots import logged_mean, training_entries
from ..rewards.reward_registry import get_reward_funcs, required_reward_columns
from ..runtime.model_path import model_name_error
from ..samplers.settings import SamplerFields
from ..trainer import AdaGRPOTrainer

logger = logging.getLogger("train_ada")

EMBEDDED_OUTPUT_DIR = "outputs/trl-ada-arithmetic"

_T = TypeVar("_T")


def format_problems(problems: Sequence[str]) -> str:
    """One problem as it is; several as a count and a bulleted list, one problem a line."""
    if len(problems) == 1:
        return problems[0]
    listed = "\n".join(f"  - {problem}" for problem in problems)
    return f"{len(problems)} problems with this command line; fix them all, then run again:\n{listed}"


class CommandLineProblems(ValueError):
    """Every problem the checks of a run's input found, each naming the flag that fixes it, raised once after all of
    them ran (a `ValueError`, as each check's own error is); `problems` holds them in the order found."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__(format_problems(self.problems))


def with_flag(flag: str | None, problem: str) -> str:
    """`problem`, led by `flag` when it names no flag."""
    return problem if flag is None or "--" in problem else f"{flag}: {problem}"


def collect(problems: list[str], check: Callable[..., _T], *args: Any, flag: str | None = None) -> _T | None:
    """`check(*args)`, or `None` with the problem(s) of its `ValueError` or `FileNotFoundError` added to `problems`
    (each led by `flag` when it names no flag)."""
    try:
        return check(*args)
    except (ValueError, FileNotFoundError) as error:
        found = error.problems if isinstance(error, CommandLineProblems) else [str(error)]
        problems.extend(with_flag(flag, problem) for problem in found)
        return None


@dataclass
class AdaScriptArguments(ScriptArguments):
    """
    Script arguments of `trl-ada train`: the fields of TRL's `trl grpo` script arguments plus trl-ada's own (with
    `DatasetMixtureConfig`, `AdaGRPOConfig` and `ModelConfig` they make every flag of `trl grpo`). `reward_funcs`
    defaults to `exact_match` for the embedded task, `math_verify` otherwise, and none beside a reward model;
    `max_prompt_length` to the tokenizer's `model_max_length` minus `max_completion_length`.
    """

    dataset_name: str | None = field(
        default=None, metadata={"help": "Hub id or local file/directory; empty for the embedded arithmetic task."}
    )
    reward_model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Reward model: Hub id or local directory saved with `PreTrainedModel.save_pretrained`."},
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
    license: str | None = field(
        default=None,
        metadata={"help": "The model card's Hub license id (apache-2.0, mit, other); default: the base model's."},
    )


def embedded_defaults() -> dict:
    """Settings of the no-argument run: the shipped tiny model on CPU, sized to finish in a few minutes on 2 cores."""
    return dict(
        output_dir=EMBEDDED_OUTPUT_DIR,
        use_cpu=not torch.cuda.is_available(),
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
    return not explicit_settings(argv) & {"model_name_or_path", "dataset_name", "datasets"}


USAGE = "%(prog)s [--config FILE_OR_RECIPE] [--FLAG VALUE ...]"

EMBEDDED_HELP_NOTES = {"use_cpu": "True unless a GPU is available"}
"""How `--help` words an embedded-run default that depends on the machine."""

_TRL_DEFAULTS_NOTE = (
    "Defaults shown are TRL's: they apply when --model_name_or_path or a dataset is given. The embedded run (neither "
    "given) has its own for a few flags, shown as 'embedded run: VALUE'."
)

HELP_GROUPS = {
    "ada": (
        "trl-ada: Reinforce-Ada sampling",
        "AdaGRPOConfig's own knobs (`trl-ada simulate` takes the same). A knob the chosen --sampler does not read "
        "must keep its default.",
    ),
    "script": (
        "script, model and data",
        "The flags of `trl grpo`'s script with trl-ada's, ModelConfig and DatasetMixtureConfig. With no "
        "--model_name_or_path and no dataset, the embedded run trains trl-ada's tiny arithmetic model on CPU.",
    ),
    "trl": ("TRL's GRPOConfig", _TRL_DEFAULTS_NOTE),
    "transformers": ("transformers' TrainingArguments (defaults as GRPOConfig sets them)", _TRL_DEFAULTS_NOTE),
}
"""`--help`'s groups, in the order shown: key -> (title, description)."""


def help_group_of(name: str) -> str:
    """The `--help` group (a key of [`HELP_GROUPS`]) of the field `name` of the script's dataclasses."""
    if name in SamplerFields.__dataclass_fields__ or name in ADA_ONLY_FIELDS:
        return "ada"
    if name in TrainingArguments.__dataclass_fields__:
        return "transformers"
    if name in GRPOConfig.__dataclass_fields__:
        return "trl"
    return "script"


class TrainParser(TrlParser):
    """`TrlParser` with a one-line usage (a mistyped value is reported in two lines, not after every flag), and
    `--help` in groups ([`HELP_GROUPS`]): trl-ada's sampling knobs first, then the script, model and data flags
    (with `--config`), then TRL's `GRPOConfig` and transformers' `TrainingArguments`."""

    def __init__(self, dataclass_types: Sequence[type], **kwargs: Any) -> None:
        self._help_groups: dict[str, argparse._ArgumentGroup] = {}
        self.value_errors: list[str] = []
        """The values of the last parse that did not convert to their flag's type, one message each."""
        super().__init__(dataclass_types, usage=USAGE, **kwargs)
        for action in self._actions:
            if callable(action.type) and action.choices is None:
                action.type = self._recording(action, action.type)

    def _recording(self, action: argparse.Action, convert: Callable[[str], Any]) -> Callable[[str], Any]:
        # argparse stops at the first value that does not convert; recording it and going on with the flag's default
        # lets the other flags be checked too, and every mistake is reported at once.
        def convert_or_record(text: str) -> Any:
            try:
                return convert(text)
            except argparse.ArgumentTypeError as error:
                message = str(error)
            except (TypeError, ValueError):
                message = f"invalid {getattr(convert, '__name__', repr(convert))} value: {text!r}"
            self.value_errors.append(f"argument {'/'.join(action.option_strings)}: {message}")
            return action.default

        return convert_or_record

    def _parse_dataclass_field(self, parser: argparse.ArgumentParser, field: dataclasses.Field) -> None:
        # HfArgumentParser adds every field of one dataclass to one container; the script's AdaGRPOConfig spans
        # three groups, so each field goes to its own.
        super()._parse_dataclass_field(self.help_group(help_group_of(field.name)), field)
        negation = self._option_string_actions.get(f"--no_{field.name}")
        if negation is not None:
            # HfArgumentParser gives `--no_X` the help of `--X` and the default False, which reads as X's own default.
            negation.help = f"Same as --{field.name} false."
            negation.default = argparse.SUPPRESS  # `--X` (added first) sets the default

    def help_group(self, key: str) -> argparse._ArgumentGroup:
        """The argument group `key` of [`HELP_GROUPS`]; all of them are made on first use, in their order."""
        if not self._help_groups:
            for name, (title, description) in HELP_GROUPS.items():
                self._help_groups[name] = self.add_argument_group(title, description)
            # `TrlParser` reads `--config` itself, before argparse runs; listed here so that `--help` shows it.
            self._help_groups["script"].add_argument(
                "--config",
                metavar="FILE_OR_RECIPE",
                default=argparse.SUPPRESS,
                help="YAML file of settings, or the name of a recipe shipped with trl-ada (e.g. "
                "qwen2.5-math-1.5b/seq_balance); flags on the command line override its values.",
            )
        return self._help_groups[key]

    def note_embedded_defaults(self, defaults: dict[str, Any]) -> None:
        """Add the embedded run's default to the help of each flag where it differs from TRL's."""
        for action in self._actions:
            if action.dest not in defaults or action.help in (None, argparse.SUPPRESS):
                continue
            if action.option_strings[0].startswith("--no_") or defaults[action.dest] == action.default:
                continue
            embedded = EMBEDDED_HELP_NOTES.get(action.dest, defaults[action.dest])
            action.help = f"{action.help} (default: %(default)s; embedded run: {embedded})"

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        problems = format_problems([*self.value_errors, message])
        self.exit(2, f"{self.prog}: error: {problems}\n(`{self.prog} --help` lists every flag.)\n")

    def parse_collecting(self, argv: Sequence[str]) -> tuple[tuple[Any, ...] | None, list[str]]:
        """
        The script's dataclasses from `argv` (`None` when a setting stops the parse), and the problems found: values
        of the wrong type, flags and `--config` keys that are no setting, and bf16 on a machine that cannot compute in
        it (then parsed again with bf16 off, so that the checks after it still run).
        """
        argv = list(argv)
        problems: list[str] = []
        while True:
            self.value_errors.clear()
            try:
                *parsed, from_config, from_argv = self.parse_args_and_config(
                    argv, return_remaining_strings=True, separate_remaining_strings=True
                )
            except ValueError as error:
                bf16 = bf16_problem(error)
                if bf16 is None or bf16 in problems:
                    return None, [*problems, *self.value_errors, str(error)]
                problems.append(bf16)
                argv += ["--bf16", "false", "--bf16_full_eval", "false"]
                continue
            problems += self.value_errors
            if from_argv:
                problems.append(
                    f"unrecognized arguments: {' '.join(from_argv)} (`{self.prog} --help` lists every flag)."
                )
            if from_config:
                keys = [item[2:] for item in from_config[::2]]
                problems.append(
                    f"--config: the file's {keys} are not settings of {self.prog}; remove or rename them "
                    f"(`{self.prog} --help` lists every flag)."
                )
            return tuple(parsed), problems


def bf16_problem(error: Exception) -> str | None:
    """The problem, with its flags, when `error` is transformers' refusal of bf16 on a machine without the GPU for it
    (TRL's `GRPOConfig` turns bf16 on by default); else `None`."""
    if "support bf16" not in str(error):
        return None
    if torch.cuda.is_available():
        return (
            "--bf16: this GPU cannot train in bf16 (it needs an Ampere or newer one), and TRL's GRPOConfig turns it on "
            "by default. Pass --bf16 false (with --fp16 for half precision)."
        )
    return (
        "--bf16: this machine has no GPU to train in bf16, which TRL's GRPOConfig turns on by default. Pass --bf16 "
        "false --use_cpu to train on the CPU in float32 (--use_cpu alone trains in bf16 on the CPU)."
    )


def asks_for_help(argv: Sequence[str]) -> bool:
    """Whether `argv` asks for `--help` (argparse then prints it and exits, whatever else is given)."""
    return any(arg in ("-h", "--help") for arg in argv)


def make_parser(argv: Sequence[str]) -> TrlParser:
    """The script's parser: TRL's `trl grpo` dataclasses with trl-ada's; on the embedded run its defaults are
    [`embedded_defaults`]. `--help` shows TRL's defaults, each followed by the embedded run's where it differs."""
    parser = TrainParser((AdaScriptArguments, AdaGRPOConfig, ModelConfig, DatasetMixtureConfig))
    parser.note_embedded_defaults(embedded_defaults())
    if is_embedded_run(argv) and not asks_for_help(argv):
        # Defaults only: any flag or config value the user passes (e.g. --max_steps 5) still wins.
        defaults = embedded_defaults()
        explicit = explicit_settings(argv)
        if "save_steps" in explicit and "save_strategy" not in explicit:
            # The embedded run saves no checkpoint by default; asking for a save interval asks for checkpoints.
            defaults["save_strategy"] = "steps"
        parser.set_defaults(**defaults)
    return parser


def help_text(prog: str) -> str:
    """`trl-ada train --help`'s text (see [`make_parser`])."""
    parser = make_parser(["--help"])
    parser.prog = prog
    return parser.format_help()


_RESUME_LATEST = frozenset({"true", "1", "yes"})
_RESUME_NEVER = frozenset({"false", "0", "no", ""})


def resolve_resume_from_checkpoint(value: str | bool | None, output_dir: str) -> str | bool | None:
    """
    What to pass to `trainer.train(resume_from_checkpoint=...)` for `--resume_from_checkpoint VALUE`: `true`/`1`/`yes`
    (any case) resume from the latest `checkpoint-N` in `output_dir`, `false`/`0`/`no` start fresh, anything else
    names a checkpoint directory (an existing directory always does). Raises `ValueError` when there is none.
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


STREAMED_ROWS_CHECKED = 256
"""Rows of a streamed dataset whose columns and prompt lengths are checked before training (it has no length)."""


def resolve_reward_funcs(script_args: AdaScriptArguments, default: str) -> list[Any]:
    """
    The run's reward functions, as `trl grpo` builds them: the reward model first (its path or Hub id, which TRL's
    `GRPOTrainer` loads), then `--reward_funcs`, a dotted path imported with the working directory on `sys.path`;
    `default` only when neither is given. Raises `ValueError` on an unknown name or a reward model that is neither a
    directory nor a Hub id.
    """
    names = script_args.reward_funcs
    reward_model = script_args.reward_model_name_or_path
    if names is None:
        names = [] if reward_model else [default]
    if any("." in name for name in names) and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    funcs: list[Any] = get_reward_funcs(names) if names else []
    if reward_model:
        looks_local = reward_model.startswith((".", "/", "~")) or reward_model.count("/") != 1
        if looks_local and not os.path.isdir(os.path.expanduser(reward_model)):
            raise ValueError(
                f"--reward_model_name_or_path {reward_model!r} is not a directory. Pass a reward model saved with "
                "save_pretrained (a sequence-classification model), or a Hub id of the form 'org/model'."
            )
        funcs.insert(0, os.path.expanduser(reward_model))
    return funcs


def load_train_and_eval(
    script_args: AdaScriptArguments, dataset_args: DatasetMixtureConfig, training_args: AdaGRPOConfig
) -> tuple[Any, Any]:
    """
    The training and evaluation datasets, as `trl grpo` picks them: a `--datasets` mixture (loaded by TRL's
    `get_dataset`) wins over `--dataset_name`; the evaluation split is used only when `eval_strategy` is not `no`.
    Unlike `trl grpo`, either streaming flag streams either source, and `--test_split_size` also splits a
    `--dataset_name` dataset (seeded with `--seed`, so every process holds the same split). Combinations that cannot
    work raise [`CommandLineProblems`] before anything is loaded.
    """
    streaming = script_args.dataset_streaming or dataset_args.streaming
    evaluating = training_args.eval_strategy != IntervalStrategy.NO
    split_size = dataset_args.test_split_size
    name = script_args.dataset_name
    problems = []
    if streaming and training_args.max_steps <= 0:
        problems.append(
            "A streamed dataset has no length, so the number of steps cannot be derived from epochs: pass "
            "--max_steps N with --streaming/--dataset_streaming."
        )
    if streaming and split_size is not None:
        problems.append(
            "--test_split_size holds out part of a dataset in memory, which a streamed dataset is not: drop "
            "--streaming/--dataset_streaming, or --test_split_size."
        )
    single_file = not dataset_args.datasets and name is not None and Path(name).expanduser().is_file()
    if evaluating and split_size is None and (dataset_args.datasets or single_file):
        source = "a --datasets mixture" if dataset_args.datasets else f"the single file {name}"
        problems.append(
            f"--eval_strategy {training_args.eval_strategy.value} needs an evaluation split, and {source} has only "
            "the training one. Hold part of it out with --test_split_size (e.g. 0.1), or pass --eval_strategy no."
        )
    if problems:
        raise CommandLineProblems(problems)

    evaluation = None
    if dataset_args.datasets:
        if name:
            logger.warning(
                "Both `datasets` and `dataset_name` are provided. The `datasets` argument will be used to load the "
                "dataset and `dataset_name` will be ignored."
            )
        # TRL's own mixture loader; its train/test split is left to the seeded one below.
        mixture = dataclasses.replace(dataset_args, streaming=streaming, test_split_size=None)
        train = get_dataset(mixture)["train"]
    else:
        config = script_args.dataset_config
        train = load_prompt_dataset(name, split=script_args.dataset_train_split, config=config, streaming=streaming)
        if evaluating and split_size is None:
            evaluation = load_prompt_dataset(
                name, split=script_args.dataset_test_split, config=config, streaming=streaming
            )
    if split_size is not None:
        parts = train.train_test_split(test_size=split_size, seed=training_args.seed)
        train = parts["train"]
        if evaluating:
            evaluation = parts["test"]
        else:
            logger.warning(
                "--test_split_size %s holds %d rows out of training, and eval_strategy is 'no', so nothing evaluates "
                "them. Set --eval_strategy steps (with --eval_steps N) to evaluate them, or drop --test_split_size to "
                "train on every row.",
                split_size,
                len(parts["test"]),
            )
    return train, evaluation


QUESTION_COLUMNS = ("question", "problem", "query", "instruction", "input", "prompt_text", "text")
"""Usual names of a dataset's question column, in the order [`column_flags_problem`] suggests them."""
ANSWER_COLUMNS = ("answer", "solution", "final_answer", "ground_truth", "reference", "target", "label", "output")
"""Usual names of a dataset's reference-answer column, in the order [`column_flags_problem`] suggests them."""


def column_flags_problem(columns: Sequence[str], prompt_column: str, solution_column: str) -> str | None:
    """What a dataset without a `prompt` column lacks of `--prompt_column` and `--solution_column`, with those flags
    set to the columns it has that look like a question and an answer; `None` when it has both."""
    wanted = {"--prompt_column": prompt_column, "--solution_column": solution_column}
    usual = {"--prompt_column": QUESTION_COLUMNS, "--solution_column": ANSWER_COLUMNS}
    missing = {flag: column for flag, column in wanted.items() if column not in columns}
    if not missing:
        return None
    fixes = []
    for flag in missing:
        guesses = [name for name in usual[flag] if name in columns and name not in wanted.values()]
        fixes.append(f"{flag} {guesses[0] if guesses else 'COLUMN'}")
    lacking = " or ".join(f"{column!r} ({flag})" for flag, column in missing.items())
    return (
        f"The dataset has no 'prompt' column, so prompts are built from --prompt_column and reference answers read "
        f"from --solution_column, but it has no column {lacking}; its columns are {list(columns)}. Name its own with "
        f"{' '.join(fixes)}, or give it a 'prompt' column."
    )


def prepare_prompt_dataset(
    dataset: Any,
    script_args: AdaScriptArguments,
    tokenizer: Any,
    reward_funcs: Sequence[Any],
    max_prompt_length: int | None,
) -> Any:
    """
    `dataset` in TRL's prompt format (built from `--prompt_column`/`--solution_column` without a `prompt` column), its
    columns and prompt lengths checked before training (a stream's first [`STREAMED_ROWS_CHECKED`] rows; the lengths
    only with a `tokenizer`); a `ValueError` names the fix.
    """
    streamed = isinstance(dataset, IterableDataset)

    def head(rows: Any) -> Any:
        return Dataset.from_list(list(rows.take(STREAMED_ROWS_CHECKED))) if streamed else rows

    columns = dataset_columns(dataset)
    if "prompt" not in columns and (streamed or len(dataset) > 0):
        problem = column_flags_problem(columns, script_args.prompt_column, script_args.solution_column)
        if problem is not None:
            raise ValueError(problem)
        conversational = getattr(tokenizer, "chat_template", None) is not None
        logger.info(
            "No `prompt` column: building %s prompts from %r (answers from %r).",
            "conversational" if conversational else "plain-text",
            script_args.prompt_column,
            script_args.solution_column,
        )
        columns = [script_args.prompt_column, script_args.solution_column]
        validate_prompt_dataset(head(dataset), columns, prompt_column=script_args.prompt_column)
        dataset = to_prompt_format(
            dataset,
            problem_column=script_args.prompt_column,
            solution_column=script_args.solution_column,
            system_prompt=script_args.system_prompt,
            conversational=conversational,
        )
    if streamed:
        logger.info("Streamed dataset: checking its first %d rows before training.", STREAMED_ROWS_CHECKED)
    validate_prompt_dataset(
        head(dataset),
        ["prompt", *required_reward_columns(reward_funcs)],
        tokenizer=tokenizer,
        max_prompt_length=max_prompt_length,
    )
    return dataset


LOCAL_DATA_SUFFIXES = (".parquet", ".jsonl", ".json", ".csv")
"""The file types `--dataset_name` reads from disk (a missing one is reported without asking the Hub)."""
FILE_BUILDERS = ("json", "csv", "parquet", "text", "arrow")
"""`datasets`' builders of local files, which a `--datasets` entry names as its `path`."""


def reads_the_hub(script_args: AdaScriptArguments, dataset_args: DatasetMixtureConfig) -> bool:
    """Whether loading the run's datasets may download from the Hub: a name that is neither an existing path nor a
    local file's (by its type, or a `--datasets` entry's file builder)."""
    names = [entry.path for entry in dataset_args.datasets] if dataset_args.datasets else [script_args.dataset_name]
    return any(
        not (
            Path(name).expanduser().exists()
            or name.lower().endswith(LOCAL_DATA_SUFFIXES)
            or name.startswith((".", "/", "~"))
            or name in FILE_BUILDERS
        )
        for name in names
    )


def load_model_and_data(
    script_args: AdaScriptArguments,
    training_args: AdaGRPOConfig,
    model_args: ModelConfig,
    dataset_args: DatasetMixtureConfig | None = None,
    problems: Sequence[str] = (),
):
    """Resolve model, tokenizer, datasets and reward functions, validating everything before any training. Raises
    [`CommandLineProblems`] with `problems` (found earlier) and every one found here."""
    dataset_args = dataset_args if dataset_args is not None else DatasetMixtureConfig()
    has_data = script_args.dataset_name is not None or bool(dataset_args.datasets)
    problems = list(problems)
    if model_args.model_name_or_path is None and not has_data:
        if problems:
            raise CommandLineProblems(problems)
        from ..tasks.arithmetic import held_out_problems, make_dataset
        from ..tiny import load_tiny_arith_model

        reward_funcs = resolve_reward_funcs(script_args, "exact_match")
        # The thread count on CPU is the trainer's default (`trl_ada.runtime.cpu_threads`).
        model, tokenizer = load_tiny_arith_model()
        train = make_dataset(script_args.arithmetic_train_size, seed=training_args.seed)
        # What the model card says the data was (it names no dataset here).
        train.info.description = (
            f"trl-ada's embedded arithmetic task ({len(train)} fresh problems of graded difficulty from "
            "`trl_ada.tasks.arithmetic`)"
        )
        heldout = (
            held_out_problems(script_args.heldout_size, seed=training_args.seed) if script_args.heldout_size else []
        )
        return model, tokenizer, train, None, reward_funcs, heldout

    model_name = model_args.model_name_or_path
    if model_name is None or not has_data:
        problems.append(
            "Pass both --model_name_or_path and a dataset (--dataset_name, or a --datasets mixture), or neither, for "
            "the embedded arithmetic run."
        )
    model_error = None if model_name is None else model_name_error(model_name, "--model_name_or_path")
    if model_error is not None:
        problems.append(model_error)
    reward_funcs = collect(problems, resolve_reward_funcs, script_args, "math_verify", flag="--reward_funcs")
    train = evaluation = None
    # A Hub dataset or tokenizer is a download: loaded to be checked only once nothing else stands in the way.
    if has_data and not (problems and reads_the_hub(script_args, dataset_args)):
        loaded = collect(problems, load_train_and_eval, script_args, dataset_args, training_args)
        train, evaluation = loaded if loaded is not None else (None, None)
    tokenizer = None
    if model_name is not None and model_error is None and (os.path.isdir(model_name) or not problems):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(
            model_name, revision=model_args.model_revision, trust_remote_code=training_args.trust_remote_code
        )
    max_prompt_length = script_args.max_prompt_length
    if tokenizer is not None and max_prompt_length is None and tokenizer.model_max_length < 1e9:
        max_prompt_length = tokenizer.model_max_length - (training_args.max_completion_length or 0)
        if max_prompt_length < 1:
            problems.append(
                f"max_completion_length={training_args.max_completion_length} leaves no room for a prompt within the "
                f"tokenizer's model_max_length={tokenizer.model_max_length}. Lower --max_completion_length."
            )
            max_prompt_length = None
    reward_funcs_read = reward_funcs if reward_funcs is not None else []
    source = "--datasets" if dataset_args.datasets else "--dataset_name"
    checked = (script_args, tokenizer, reward_funcs_read, max_prompt_length)
    if train is not None:
        train = collect(problems, prepare_prompt_dataset, train, *checked, flag=source)
    if evaluation is not None:
        found: list[str] = []
        evaluation = collect(found, prepare_prompt_dataset, evaluation, *checked, flag=source)
        # The training split's problem, found again in the evaluation split, is listed once.
        problems.extend(f"The evaluation split: {problem}" for problem in found if problem not in problems)
    if problems:
        raise CommandLineProblems(problems)
    training_args.model_init_kwargs = {
        "revision": model_args.model_revision,
        "trust_remote_code": training_args.trust_remote_code,
        "attn_implementation": model_args.attn_implementation,
        "dtype": model_args.dtype,
        **(training_args.model_init_kwargs or {}),
    }
    return model_args.model_name_or_path, tokenizer, train, evaluation, reward_funcs, []


def sharded_parameters(trainer: AdaGRPOTrainer) -> bool:
    """Whether the model's parameters are split over processes (FSDP, DeepSpeed ZeRO-3)."""
    return bool(getattr(trainer, "is_fsdp_enabled", False)) or uses_zero3(trainer)


def heldout_accuracy(trainer: AdaGRPOTrainer, problems: list[dict], temperature: float) -> dict[str, float]:
    from ..tasks.arithmetic import accuracy_by_level

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
    """transformers' progress bar without the raw metrics dict it writes to stdout at every logging step (logged at
    DEBUG instead; `log_history`, `report_to` and `metrics.json` still get them)."""

    on_log = LoggingPrinterCallback.on_log


class LogFinalStepCallback(TrainerCallback):
    """Logs the last optimizer step when `logging_steps` does not land on it, so the run's card, plots and summary
    cover every step (TRL averages the steps since the previous log into it). Only for `logging_strategy="steps"`."""

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        if args.logging_strategy == IntervalStrategy.STEPS and state.global_step >= state.max_steps:
            control.should_log = True
        return control


def keep_metric_dicts_off_stdout(trainer: AdaGRPOTrainer) -> None:
    """Swap the callbacks that print every `logs` dict for [`BarOnlyProgressCallback`] / [`LoggingPrinterCallback`]
    (in the training job only: the trainer itself stays TRL-like)."""
    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(BarOnlyProgressCallback())
    if trainer.pop_callback(PrinterCallback) is not None:
        trainer.add_callback(LoggingPrinterCallback())


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
    samples = logged_mean(entries, "ada/samples_per_prompt/mean")
    logger.info("Run summary (%d optimizer steps):", trainer.state.global_step)
    if heldout is not None:
        logger.info(
            "  held-out pass rate (%d problems, temperature %g): %.3f before training, %.3f after",
            heldout["problems"],
            args.temperature,
            heldout["before"],
            heldout["after"],
        )
    if not entries:
        logger.info(
            "  no training step was logged (logging_strategy=%s), so there are no sampling statistics",
            IntervalStrategy(args.logging_strategy).value,
        )
    else:
        logger.info(
            "  completions drawn per prompt: %s on average (plain GRPO: %d)",
            "n/a" if samples is None else f"{samples:.1f}",
            args.num_generations,
        )
        logger.info(
            "  zero-variance groups: %s of the first %d draws (what GRPO would train on), %s of the kept update "
            "groups",
            _share(logged_mean(entries, "ada/zero_variance_share/first_n")),
            args.num_generations,
            _share(logged_mean(entries, "ada/zero_variance_share/kept")),
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


@dataclass
class PreparedRun:
    """What [`prepare_run`] checked and loaded: the arguments of [`AdaGRPOTrainer`] (`model` is the embedded run's tiny
    model, or the name the trainer loads), the embedded run's held-out problems, and the checkpoint to resume from."""

    model: Any
    tokenizer: Any
    train_dataset: Any
    eval_dataset: Any
    reward_funcs: list[Any]
    heldout: list[dict]
    resume_from_checkpoint: str | bool | None


def prepare_run(
    script_args: AdaScriptArguments,
    training_args: AdaGRPOConfig,
    model_args: ModelConfig,
    dataset_args: DatasetMixtureConfig | None = None,
    problems: Sequence[str] = (),
) -> PreparedRun:
    """The checks of the run's input, and its data and tokenizer: everything that can fail on a user's mistake,
    before any compute is spent. Raises [`CommandLineProblems`] (a `ValueError`) listing `problems` (found earlier, e.g.
    by the parse) and every one found here, each naming the flag that fixes it."""
    problems = list(problems)
    collect(problems, check_license, script_args.license, flag="--license")
    # Checked before the model loads: a missing checkpoint should not cost a model download.
    resume_from_checkpoint = collect(
        problems, resolve_resume_from_checkpoint, training_args.resume_from_checkpoint, training_args.output_dir
    )
    length = training_args.max_completion_length
    if length is not None and length < 1:
        problems.append(f"--max_completion_length {length}: a completion needs at least 1 token; pass N >= 1.")
    mixture = dataset_args is not None and bool(dataset_args.datasets)
    if problems and model_args.model_name_or_path is None and script_args.dataset_name is None and not mixture:
        # The embedded run has nothing more to check: what is left is loading its model.
        raise CommandLineProblems(problems)
    loaded = load_model_and_data(script_args, training_args, model_args, dataset_args, problems)
    return PreparedRun(*loaded, resume_from_checkpoint)


def main(
    script_args: AdaScriptArguments,
    training_args: AdaGRPOConfig,
    model_args: ModelConfig,
    dataset_args: DatasetMixtureConfig | None = None,
    prepared: PreparedRun | None = None,
) -> AdaGRPOTrainer:
    """Train, evaluate the embedded task before and after, save the model and its card, log a short summary
    (`prepared`: [`prepare_run`]'s result when the caller already has it)."""
    if prepared is None:
        prepared = prepare_run(script_args, training_args, model_args, dataset_args)
    heldout = prepared.heldout
    trainer = AdaGRPOTrainer(
        model=prepared.model,
        reward_funcs=prepared.reward_funcs,
        args=training_args,
        train_dataset=prepared.train_dataset,
        eval_dataset=prepared.eval_dataset,
        processing_class=prepared.tokenizer,
        peft_config=get_peft_config(model_args),
        **(
            {"quantization_config": get_quantization_config(model_args)}
            if model_args.load_in_4bit or model_args.load_in_8bit
            else {}
        ),
    )
    keep_metric_dicts_off_stdout(trainer)
    trainer.add_callback(LogFinalStepCallback())
    heldout_summary = None
    if heldout and sharded_parameters(trainer):
        # The held-out check generates on the main process alone; with sharded parameters every forward is a
        # collective that the other processes would never join.
        logger.warning(
            "Skipping the held-out accuracy check: the model's parameters are sharded (FSDP / ZeRO-3) and it "
            "generates on the main process only. Evaluate the saved model with `trl-ada evaluate` instead."
        )
        heldout = []
    if heldout and trainer.accelerator.is_main_process:
        before = heldout_accuracy(trainer, heldout, training_args.temperature)
        logger.info("held-out accuracy before training: %.3f", before["eval_heldout_accuracy"])
    train_output = trainer.train(resume_from_checkpoint=prepared.resume_from_checkpoint)
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
    # Every dataset the run read, as named: the card puts Hub ids in its metadata and names local files in its text.
    mixture = dataset_args.datasets if dataset_args is not None else None
    dataset_name = [dataset.path for dataset in mixture] if mixture else script_args.dataset_name
    trainer.create_model_card(
        model_name=os.path.basename(os.path.normpath(training_args.output_dir)),
        dataset_name=dataset_name,
        license=script_args.license,
    )
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=dataset_name, license=script_args.license)
    if trainer.accelerator.is_main_process:
        log_run_summary(trainer, train_output.metrics.get("train_runtime"), heldout_summary)
    return trainer


def recipes_dir() -> Path:
    """The shipped recipes: `trl_ada/recipes/` in an installed wheel, `recipes/` of the repository in a checkout."""
    package = Path(__file__).resolve().parents[1]  # trl_ada/ (this file is trl_ada/cli/train.py)
    installed = package / "recipes"
    return installed if installed.is_dir() else package.parent / "recipes"


def shipped_recipes() -> list[str]:
    """Names of the shipped recipes, as `--config` takes them (`qwen2.5-math-1.5b/seq_balance`)."""
    root = recipes_dir()
    return sorted(path.relative_to(root).with_suffix("").as_posix() for path in root.rglob("*.yaml"))


def resolve_config(value: str) -> str:
    """The YAML file that `--config VALUE` names: an existing file as given, else a shipped recipe by name, with or
    without `.yaml`. Raises `ValueError` when VALUE is neither, listing the shipped recipes."""
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


# transformers' deprecation warnings for TRL's own use of `gradient_checkpointing` (GRPOConfig turns it on by default,
# and TRL calls the model's `gradient_checkpointing_*` methods): nothing a user of the command line can act on.
_TRL_INTERNAL_DEPRECATIONS = (
    r"`(is_gradient_checkpointing|gradient_checkpointing_enable|gradient_checkpointing_disable)` is deprecated"
)
_ARGUMENT_DEPRECATION = r"`(gradient_checkpointing|gradient_checkpointing_kwargs)` is deprecated"


def silence_unactionable_warnings(argv: Sequence[str]) -> None:
    """Ignore the deprecation warnings the user cannot act on, in the current `warnings.catch_warnings()` scope (the
    one about the `gradient_checkpointing` argument stays when the user set it: renaming it is theirs to do)."""
    warnings.filterwarnings("ignore", message=_TRL_INTERNAL_DEPRECATIONS, category=FutureWarning)
    if not explicit_settings(argv) & {"gradient_checkpointing", "gradient_checkpointing_kwargs"}:
        warnings.filterwarnings("ignore", message=_ARGUMENT_DEPRECATION, category=FutureWarning)


def model_name_in_argv(argv: Sequence[str]) -> str | None:
    """The `--model_name_or_path` that `argv` gives (its last one, as argparse takes it), else the `--config` file's,
    else `None`; read before the full parse, whose checks of the other settings must not hide a missing model."""
    reader = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    reader.add_argument("--model_name_or_path", "--model-name-or-path")
    try:
        known, _ = reader.parse_known_args(argv)
    except argparse.ArgumentError:  # no value after the flag: the full parse says so
        return None
    if known.model_name_or_path is not None:
        return known.model_name_or_path
    value = config_file_values(argv).get("model_name_or_path")
    return str(value) if value is not None else None


def cli_main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Parse `argv` (default: `sys.argv[1:]`) and train: `trl-ada train`, `python -m trl_ada.cli.train` and the script.
    Mistakes in the input are reported together, each with the flag that fixes it, with exit status 2, before any
    model is loaded (one mistake in one line)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = prog or os.path.basename(sys.argv[0])

    def fail(problems: Sequence[str]) -> int:
        print(f"{prog}: error: {format_problems(problems)}", file=sys.stderr)
        return 2

    with warnings.catch_warnings():
        try:
            argv = with_config_resolved(argv)
        except ValueError as error:  # a mistyped recipe name: every other setting may be in the file it meant
            return fail([str(error)])
        silence_unactionable_warnings(argv)
        parser = make_parser(argv)
        parser.prog = prog
        parsed, problems = parser.parse_collecting(argv)
        if parsed is None:  # a knob AdaGRPOConfig rejects: the model, read from argv, is the one thing left to check
            model_name = model_name_in_argv(argv)
            if model_name is not None and (model_error := model_name_error(model_name, "--model_name_or_path")):
                problems.insert(0, model_error)
            return fail(problems)
        script_args, training_args, model_args, dataset_args = parsed
        if training_args.log_level == "debug":
            logger.setLevel(logging.DEBUG)  # also shows each logging step's metrics dict
        try:
            prepared = prepare_run(script_args, training_args, model_args, dataset_args, problems)
        except (ValueError, FileNotFoundError) as error:
            return fail(error.problems if isinstance(error, CommandLineProblems) else [str(error)])
        trainer = main(script_args, training_args, model_args, dataset_args, prepared=prepared)
    # Every process waits for the main one's card and summary, then leaves the process group. The model's references
    # go first: a DDP reducer freed at interpreter exit joins gloo's worker thread with the GIL held, and hangs.
    accelerator = trainer.accelerator
    accelerator.wait_for_everyone()
    del trainer
    accelerator.free_memory()  # drops the prepared model, optimizer and dataloaders, then collects the garbage
    accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(cli_main())
