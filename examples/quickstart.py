# python examples/quickstart.py: the tiny arithmetic model shipped in trl-ada learns its task on CPU, 50 steps.
import torch

from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
from trl_ada.tasks.arithmetic import exact_match_reward, make_dataset
from trl_ada.tiny import load_tiny_arith_model

torch.set_num_threads(1)  # a 0.6 M-parameter model gains nothing from more threads, and loses on shared cores
model, tokenizer = load_tiny_arith_model()  # shipped in the package: nothing is downloaded
args = AdaGRPOConfig(
    output_dir="outputs/quickstart",
    use_cpu=True,  # CPU only: TRL's default bf16=True needs a GPU
    bf16=False,
    per_device_train_batch_size=64,  # 16 prompts x num_generations 4 per step
    num_generations=4,  # the update group size n, as in TRL
    sampler="seq_balance",  # rounds of 8 draws until 2 right and 2 wrong, at most 4 rounds
    max_completion_length=8,
    learning_rate=1e-4,
    max_steps=50,
    logging_steps=10,
    report_to="none",
)
trainer = AdaGRPOTrainer(
    model=model,
    processing_class=tokenizer,
    reward_funcs=exact_match_reward,  # 1.0 when the completion is the `answer` column, else 0.0
    args=args,
    train_dataset=make_dataset(2_000, seed=0),  # columns prompt ("  3+  5="), answer ("8"), level (0-5)
)
trainer.train()
trainer.save_model()  # the model, tokenizer and model card (README.md), in outputs/quickstart
