"""
Train with Reinforce-Ada: `accelerate launch scripts/train_ada.py [flags | --config recipe.yaml]`.

With no model and no dataset it runs the embedded default: the tiny arithmetic model shipped with trl-ada learns a
verifiable arithmetic task of graded difficulty on CPU, in a few minutes, and writes the model, its card, plots and
metrics to `--output_dir` (default `outputs/trl-ada-arithmetic`).

The real path takes any causal LM (`--model_name_or_path`: hub id or local directory) and any prompt dataset
(`--dataset_name`: hub id, or a local parquet/JSONL/JSON/CSV file or saved dataset directory), with reward
functions by name (`--reward_funcs math_verify`); every flag of TRL's `trl grpo` works, plus the Reinforce-Ada knobs
of `AdaGRPOConfig` (`--sampler seq_balance --round_size 8 ...`) and YAML `--config` files (see `recipes/`).

    # embedded default
    accelerate launch scripts/train_ada.py
    # the paper's setting on 8 GPUs
    accelerate launch --config_file configs/accelerate/zero2.yaml scripts/train_ada.py --config recipes/qwen2.5-math-1.5b/seq_balance.yaml
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field

import torch
from trl import ModelConfig, ScriptArguments, TrlParser, get_peft_config, get_quantization_config

from trl_ada import AdaGRPOConfig, AdaGRPOTrainer

logger = logging.getLogger("train_ada")

EMBEDDED_OUTPUT_DIR = "outputs/trl-ada-arithmetic"


@dataclass
class AdaScriptArguments(ScriptArguments):
    """
    Script arguments of `scripts/train_ada.py`.

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


def is_embedded_run(argv: list[str]) -> bool:
    """No model and no dataset named on the command line or in a config file: run the embedded default."""
    named = {"--model_name_or_path", "--dataset_name", "--config"}
    return not any(arg.split("=")[0] in named for arg in argv)


def make_parser(argv: list[str]) -> TrlParser:
    parser = TrlParser((AdaScriptArguments, AdaGRPOConfig, ModelConfig))
    if is_embedded_run(argv):
        # Defaults only: any flag the user passes (e.g. --max_steps 5) still wins.
        parser.set_defaults(**embedded_defaults())
    return parser


def load_model_and_data(script_args: AdaScriptArguments, training_args: AdaGRPOConfig, model_args: ModelConfig):
    """Resolve model, tokenizer, datasets and reward functions, validating everything before any training."""
    from trl_ada.rewards import get_reward_funcs

    if model_args.model_name_or_path is None and script_args.dataset_name is None:
        from trl_ada.tasks.arithmetic import held_out_problems, make_dataset
        from trl_ada.tiny import load_tiny_arith_model

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

    from trl_ada.data import load_prompt_dataset, to_prompt_format, validate_prompt_dataset
    from trl_ada.rewards import required_reward_columns

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


def heldout_accuracy(trainer: AdaGRPOTrainer, problems: list[dict], temperature: float) -> dict[str, float]:
    from trl_ada.tasks.arithmetic import accuracy_by_level

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


def main(script_args: AdaScriptArguments, training_args: AdaGRPOConfig, model_args: ModelConfig) -> AdaGRPOTrainer:
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
    if heldout and trainer.accelerator.is_main_process:
        before = heldout_accuracy(trainer, heldout, training_args.temperature)
        logger.info("held-out accuracy before training: %.3f", before["eval_heldout_accuracy"])
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    if heldout and trainer.accelerator.is_main_process:
        after = heldout_accuracy(trainer, heldout, training_args.temperature)
        logger.info("held-out accuracy after training: %.3f", after["eval_heldout_accuracy"])
        # Logged together after training: `train()` starts a fresh log history.
        trainer.log({"eval_heldout_accuracy_start": before["eval_heldout_accuracy"], **after})
    trainer.save_model(training_args.output_dir)
    dataset_name = (
        script_args.dataset_name if script_args.dataset_name and not os.path.exists(script_args.dataset_name) else None
    )
    trainer.create_model_card(
        model_name=os.path.basename(os.path.normpath(training_args.output_dir)), dataset_name=dataset_name
    )
    if trainer.accelerator.is_main_process:
        logger.info("Model, card, plots and metrics written to %s", training_args.output_dir)
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=dataset_name)
    return trainer


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    argv = sys.argv[1:]
    script_args, training_args, model_args = make_parser(argv).parse_args_and_config(argv)
    main(script_args, training_args, model_args)
