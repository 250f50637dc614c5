"""
Train with Reinforce-Ada: `accelerate launch scripts/train_ada.py [flags | --config recipe]`.

A thin entry over `trl_ada.cli.train`, which holds the job's code and documents it; the installed package runs the same
job as `trl-ada train` (one process) or `accelerate launch -m trl_ada.cli.train` (several).

With no model and no dataset (on the command line or in the config) it runs the embedded default: the tiny
arithmetic model shipped with trl-ada learns a verifiable arithmetic task of graded difficulty on CPU, in a few
minutes, and writes the model, its card, plots and metrics to `--output_dir` (default `outputs/trl-ada-arithmetic`).
It saves no checkpoint unless `--save_steps` asks for them.

The real path takes any causal LM (`--model_name_or_path`) and any prompt dataset (`--dataset_name`), with reward
functions by name (`--reward_funcs math_verify`); every flag of TRL's `trl grpo` works, plus the Reinforce-Ada knobs
of `AdaGRPOConfig` and YAML `--config` files: a path, or the name of a shipped recipe (see `recipes/`).

    # embedded default
    accelerate launch scripts/train_ada.py
    # ... with a checkpoint every 50 steps, then continued from the latest one in --output_dir
    accelerate launch scripts/train_ada.py --save_steps 50
    accelerate launch scripts/train_ada.py --save_steps 50 --max_steps 800 --resume_from_checkpoint true
    # the paper's setting on 8 GPUs
    accelerate launch --config_file configs/accelerate/zero2.yaml scripts/train_ada.py --config recipes/qwen2.5-math-1.5b/seq_balance.yaml
"""

import sys

from trl_ada.cli.train import cli_main

if __name__ == "__main__":
    sys.exit(cli_main())
