"""Launched by tests/test_sharded.py on two CPU processes (gloo): as DDP, as FSDP2 and, where deepspeed is installed,
as DeepSpeed ZeRO-2 and ZeRO-3, each from its config in configs/accelerate/.

    python -m accelerate.commands.launch --config_file configs/accelerate/<config>.yaml --main_process_port 0 \
        tests/sharded_run.py OUT_DIR MODEL_DIR [SCENARIO,...]

runs the same short seq_balance trainings (full fine-tuning with TRL's reference model, and LoRA) and writes, per
rank, what the sampler decided at every step, the completions of every round, the logged per-step losses and grad
norms, and how the model was distributed; rank 0 also writes the final (full, gathered) weights of each scenario.
`tests/sharded_run.py --probe OUT_DIR` only builds an `Accelerator` (unpatched) and writes its distributed type.

accelerate 1.15 switches to FSDP only on accelerator devices (its `AcceleratorState` lists MULTI_GPU, MULTI_XPU, ...
but not MULTI_CPU), so on CPU an FSDP config silently trains as plain DDP. torch's FSDP2 (`fully_shard`) itself runs
on CPU with gloo, so `allow_fsdp_on_cpu()` below (test-only) makes the state take its FSDP branch on CPU too;
everything after that (accelerate's `fsdp2_prepare_model`, TRL's `prepare_fsdp`, generation and loss, trl_ada's
rounds) is the unpatched code that runs on GPUs.
"""

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed

sys.path.insert(0, str(Path(__file__).parent))
from conftest import shut_down_distributed, tiny_args  # noqa: E402
from multiprocess_run import Recording as DecisionRecording  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from trl_ada import AdaGRPOConfig  # noqa: E402
from trl_ada.tasks.arithmetic import make_dataset  # noqa: E402


def allow_fsdp_on_cpu() -> None:
    """Let accelerate's `AcceleratorState` take its FSDP branch on CPU processes (test-only patch).

    `AcceleratorState.__init__` (accelerate 1.15, state.py) sets `distributed_type = FSDP` and keeps the plugin only
    when the process group runs on an accelerator (`distributed_type in [MULTI_GPU, MULTI_XPU, ...]`); MULTI_CPU falls
    through and the FSDP plugin is dropped. After the original initialisation this does what that branch does, for
    MULTI_CPU: FSDP as distributed type (also in the shared `PartialState`, as accelerate does), the plugin kept, its
    mixed precision set. The gloo process group, the CPU device and the rank layout stay what accelerate set up.
    """
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    original_init = AcceleratorState.__init__
    if getattr(original_init, "_fsdp_on_cpu", False):
        return

    def __init__(self, *args, fsdp_plugin=None, **kwargs):
        original_init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        # `Accelerator` passes the plugin it built from the launcher's FSDP_* variables on the first initialisation.
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = fsdp_plugin
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    __init__._fsdp_on_cpu = True
    AcceleratorState.__init__ = __init__


def first_char_quarter(completions, **kwargs):
    """About one completion in four passes for the random tiny model: enough mixed and unmixed prompts per step that
    seq_balance both retires prompts early and draws more rounds, and that most steps have a non-zero loss."""
    return [1.0 if c and ord(c[0]) % 4 == 0 else 0.0 for c in completions]


ZERO3_GATHERS = [0]
"""`deepspeed.zero.GatheredParameters` contexts entered in this process (counted once `count_zero3_gathers` ran)."""


def count_zero3_gathers() -> None:
    import deepspeed

    original_enter = deepspeed.zero.GatheredParameters.__enter__

    def __enter__(self):
        ZERO3_GATHERS[0] += 1
        return original_enter(self)

    deepspeed.zero.GatheredParameters.__enter__ = __enter__


class Recording(DecisionRecording):
    """Records the sampler's decisions per batch (the parent), and what each generation saw."""

    def _sample(self, inputs):
        # Per generation batch: the rounds generated and the full-parameter gathers (ZeRO-3) made for them.
        rounds, gathers = len(self.__dict__.get("round_completions", [])), ZERO3_GATHERS[0]
        kept_inputs = super()._sample(inputs)
        self.__dict__.setdefault("batch_generation", []).append(
            {"rounds": len(self.round_completions) - rounds, "zero3_gathers": ZERO3_GATHERS[0] - gathers}
        )
        return kept_inputs

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, **kwargs):
        # What the generation saw: under FSDP2 the model TRL unwraps for `generate` is still the sharded FSDPModule,
        # whose forward all-gathers each layer (and `generate` must keep the ranks in step with synced_gpus).
        from torch.distributed.fsdp import FSDPModule

        unwrapped = self.accelerator.unwrap_model(self.model_wrapped)
        self.__dict__.setdefault("generated_with_fsdp_module", []).append(isinstance(unwrapped, FSDPModule))
        start = time.perf_counter()
        completions = super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations, **kwargs)
        self.__dict__.setdefault("generate_seconds", []).append(time.perf_counter() - start)
        self.__dict__.setdefault("round_completions", []).append(completions[0])
        return completions


def zero_stage(trainer) -> int:
    plugin = trainer.accelerator.state.deepspeed_plugin
    return plugin.zero_stage if plugin is not None else 0


def full_weights(trainer) -> dict[str, torch.Tensor]:
    """Every parameter as a full tensor (a collective under FSDP2 and ZeRO-3: all ranks call it, in the same order)."""
    from torch.distributed.tensor import DTensor

    model = trainer.accelerator.unwrap_model(trainer.model_wrapped)
    if zero_stage(trainer) == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(model.parameters())):
            return {name: param.detach().cpu().clone() for name, param in model.named_parameters()}
    return {
        name: (param.full_tensor() if isinstance(param, DTensor) else param).detach().cpu().clone()
        for name, param in model.named_parameters()
    }


def sharding_report(trainer) -> dict:
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    model = trainer.accelerator.unwrap_model(trainer.model_wrapped)
    params = list(model.named_parameters())
    fsdp_plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)
    return {
        "distributed_type": str(trainer.accelerator.distributed_type).split(".")[-1],
        "fsdp_version": getattr(fsdp_plugin, "fsdp_version", None) if fsdp_plugin is not None else None,
        "backend": trainer.accelerator.state.backend,
        "is_fsdp_module": isinstance(model, FSDPModule),
        "wrapped_type": type(trainer.model_wrapped).__name__,
        "fsdp_submodules": sum(isinstance(m, FSDPModule) for m in model.modules()),
        "num_params": len(params),
        "num_dtensor_params": sum(isinstance(p, DTensor) for _, p in params),
        "local_numel": sum((p.to_local() if isinstance(p, DTensor) else p).numel() for _, p in params),
        "full_numel": sum(p.numel() for _, p in params),
        "trainable": sorted(name for name, p in params if p.requires_grad),
        "ref_model": None if trainer.ref_model is None else type(trainer.ref_model).__name__,
        "ref_is_fsdp_module": isinstance(trainer.ref_model, FSDPModule),
        "ref_num_dtensor_params": 0
        if trainer.ref_model is None
        else sum(isinstance(p, DTensor) for p in trainer.ref_model.parameters()),
        "zero_stage": zero_stage(trainer),
        # ZeRO-3 partitions the parameters themselves: each rank holds `ds_tensor`, a 1/world slice.
        "ds_partitioned_numel": sum(p.ds_tensor.numel() for _, p in params if hasattr(p, "ds_tensor")),
        "ds_full_numel": sum(p.ds_numel for _, p in params if hasattr(p, "ds_numel")),
        "optimizer": type(getattr(trainer.model_wrapped, "optimizer", None) or trainer.optimizer).__name__,
    }


def run(out_dir: Path, model_dir: Path, name: str, peft: bool, **overrides) -> dict:
    # From a saved checkpoint, as from the hub: TRL then loads its reference model (beta > 0) from the same path.
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    peft_config = None
    if peft:
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        # accelerate takes its DeepSpeed branch only when the process is not forced onto the CPU (`use_cpu`); with
        # DS_ACCELERATOR=cpu, DeepSpeed's CPU accelerator (gloo without oneCCL) then runs on the CPU anyway.
        # accelerate finds no backend for a non-CPU process without an accelerator: name gloo, or it reports one
        # process while DeepSpeed's engine runs on two.
        overrides.update(use_cpu=False, ddp_backend="gloo")
    config = AdaGRPOConfig(**tiny_args(out_dir / name, **overrides))
    trainer = Recording(
        str(model_dir),
        [first_char_quarter],
        args=config,
        train_dataset=make_dataset(64, seed=1),
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    trainer.train()
    report = {
        "num_processes": trainer.accelerator.num_processes,
        "process_index": trainer.accelerator.process_index,
        "sharding": sharding_report(trainer),
        "selections": trainer.selections,
        "generated_with_fsdp_module": trainer.generated_with_fsdp_module,
        "round_completions": trainer.round_completions,
        "generate_seconds": trainer.generate_seconds,
        "batch_generation": trainer.batch_generation,
        "logs": [
            {key: entry[key] for key in ("step", "loss", "grad_norm", "reward") if key in entry}
            for entry in trainer.state.log_history
            if "loss" in entry
        ],
    }
    weights = full_weights(trainer)
    if trainer.accelerator.is_main_process:
        torch.save(weights, out_dir / f"{name}_weights.pt")
    trainer.accelerator.wait_for_everyone()
    return report


SCENARIOS = {
    # seq_balance, full fine-tuning: 2 prompts x n=4 per step, up to 3 rounds of 4 draws per prompt. beta > 0 adds
    # TRL's reference model, sharded by TRL's own `prepare_fsdp`, and makes the loss depend on the weights (the KL
    # term; on-policy, the policy term is fixed by the advantages alone).
    "full": dict(
        peft=False,
        beta=0.04,
        sampler="seq_balance",
        round_size=4,
        max_rounds=3,
        per_device_train_batch_size=4,
        max_steps=3,
    ),
    # The same with LoRA adapters on q/v (the base weights frozen and sharded too); a larger lr moves the adapters.
    "lora": dict(
        peft=True,
        sampler="seq_balance",
        round_size=4,
        max_rounds=3,
        per_device_train_batch_size=4,
        max_steps=3,
        learning_rate=1e-2,
    ),
}


def probe(out_dir: Path) -> None:
    """What accelerate itself makes of the launched config, without the patch."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    state = {
        "distributed_type": str(accelerator.distributed_type).split(".")[-1],
        "num_processes": accelerator.num_processes,
        "fsdp_plugin": getattr(accelerator.state, "fsdp_plugin", None) is not None,
    }
    (out_dir / f"probe_rank{accelerator.process_index}.json").write_text(json.dumps(state))
    accelerator.wait_for_everyone()


def main() -> None:
    if sys.argv[1] == "--probe":
        probe(Path(sys.argv[2]))
        torch.distributed.destroy_process_group()
        return
    out_dir, model_dir = Path(sys.argv[1]), Path(sys.argv[2])
    scenarios = sys.argv[3].split(",") if len(sys.argv) > 3 else list(SCENARIOS)
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        allow_fsdp_on_cpu()
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        count_zero3_gathers()
    # No PartialState before the trainer: the first one fixes the distributed setup for the whole process.
    report = {}
    for name in scenarios:
        settings = dict(SCENARIOS[name])
        report[name] = run(out_dir, model_dir, name, settings.pop("peft"), **settings)
    (out_dir / f"rank{report[scenarios[0]]['process_index']}.json").write_text(json.dumps(report))
    shut_down_distributed()  # every trainer is gone with `run`


if __name__ == "__main__":
    main()
