"""Launched by tests/test_continuous_schedule.py in two gloo processes: a reward that fails on the main process only.

The continuous schedule runs against the stand-in server whose URL is in `out_dir/server_url`. On the main process
the reward function raises in the first scoring batch, while the other process scores its share of that batch and
waits in the batch's reward gather. Each process writes `rank{N}.json` with the error it raised (none: it finished),
then exits normally, so the test reads what every process saw; a process that hangs makes the launch time out.
"""

import json
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from conftest import TINY_MODEL_KWARGS, shut_down_distributed, starts_low_digit, tiny_args  # noqa: E402
from trl.generation import vllm_client as vllm_client_module  # noqa: E402
from trl.generation.vllm_client import VLLMClient  # noqa: E402
from trl.generation.vllm_generation import VLLMGeneration  # noqa: E402

from trl_ada import AdaGRPOConfig, AdaGRPOTrainer  # noqa: E402
from trl_ada.tasks.arithmetic import make_dataset  # noqa: E402
from trl_ada.tiny import build_char_tokenizer, build_tiny_model  # noqa: E402


def fails_on_the_main_process(completions, **kwargs):
    if int(os.environ.get("RANK", "0")) == 0:
        raise ValueError("the main process's verifier is down")
    return starts_low_digit(completions)


def main() -> None:
    out_dir = Path(sys.argv[1])
    base_url = (out_dir / "server_url").read_text().strip()
    rank = int(os.environ.get("RANK", "0"))
    tokenizer = build_char_tokenizer()

    def init_vllm(self: VLLMGeneration) -> None:
        if self.accelerator.is_main_process:
            self.vllm_client = VLLMClient(base_url=base_url, connection_timeout=10)
            self.vllm_client.update_named_params = lambda metadata, params: None  # no NCCL weight push on CPU

    VLLMGeneration._init_vllm = init_vllm
    vllm_client_module.is_vllm_available = lambda: True
    config = AdaGRPOConfig(
        **tiny_args(out_dir / "run", max_steps=2, per_device_train_batch_size=8, max_completion_length=8),
        sampler="seq_balance",
        round_size=4,
        max_rounds=4,
    )
    model = build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS)
    trainer = AdaGRPOTrainer(
        model,
        [fails_on_the_main_process],
        args=config,
        train_dataset=make_dataset(64, seed=0),
        processing_class=tokenizer,
    )
    # What GRPOTrainer.__init__ sets for `use_vllm=True, vllm_mode="server"` (vLLM is not installed here).
    trainer.vllm_generation = VLLMGeneration(
        model=trainer.model,
        accelerator=trainer.accelerator,
        processing_class=tokenizer,
        mode="server",
        server_base_url=base_url,
        temperature=trainer.temperature,
        max_completion_length=trainer.max_completion_length,
        logprobs=0,
    )
    trainer.use_vllm, trainer.vllm_mode, trainer._last_loaded_step = True, "server", -1
    trainer.args.generation_schedule = "continuous"
    report: dict = {"rank": rank, "error": None}
    try:
        trainer.train()
    except Exception as error:
        report["error"] = f"{type(error).__name__}: {error}"
        report["traceback"] = traceback.format_exc()[-3000:]
    (out_dir / f"rank{rank}.json").write_text(json.dumps(report))
    del trainer
    shut_down_distributed()


if __name__ == "__main__":
    main()
