"""[`AdaAsyncGRPOTrainer`]: TRL's `AsyncGRPOTrainer` whose rollout worker draws Reinforce-Ada pools."""

from __future__ import annotations

import functools
import inspect
from typing import Any

from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

from .. import trl_seam
from ..predictor_hub import resolve_pass_rate_predictor
from ..samplers import PassRateEstimator, build_sampler
from .config import AdaAsyncGRPOConfig
from .rollout import AdaAsyncRolloutWorker, AsyncSampling

_ASYNC_INIT_SIGNATURE = inspect.signature(AsyncGRPOTrainer.__init__)


def async_sampling(args: AdaAsyncGRPOConfig, pass_rate_estimator: PassRateEstimator | None = None) -> AsyncSampling:
    """
    What the rollout worker needs of `args`: the validated sampler settings and the generation batch size, one
    optimizer step's samples (`per_device_train_batch_size * gradient_accumulation_steps * world_size`) over
    `num_generations`. The sampler is built here once, so a bad estimator or predictor fails before any compute.
    """
    settings = args.sampler_settings()
    predictor_source = resolve_pass_rate_predictor(settings)
    build_sampler(settings, pass_rate_estimator, predictor_source)  # raises what the worker would, here and now
    samples_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
    return AsyncSampling(
        settings=settings,
        prompts_per_batch=max(1, samples_per_step // settings.num_generations),
        predictor_source=predictor_source,
        estimator=pass_rate_estimator,
    )


def allow_cpu() -> None:
    """
    What TRL's asynchronous trainer needs to build and train without CUDA: its tree attention is a GPU-only Hub
    kernel (TRL 1.16; the plain-torch equivalent with the same semantics takes its place when the kernel is not
    available), and `__init__` asks CUDA for the device's peak FLOPs (`trl_seam.install_peak_flops_fallback`).
    """
    import torch

    if trl_seam.has_tree_packing():
        from .tree_attention import use_cpu_tree_attention_if_no_kernel

        use_cpu_tree_attention_if_no_kernel()
    if not torch.cuda.is_available():
        trl_seam.install_peak_flops_fallback()


class AdaAsyncGRPOTrainer(AsyncGRPOTrainer):
    """
    Reinforce-Ada ([arXiv 2510.04996](https://huggingface.co/papers/2510.04996)) in TRL's asynchronous GRPO trainer.

    Takes every `AsyncGRPOTrainer` argument in the same positions (plus a keyword-only `pass_rate_estimator`); `args`
    may be an [`AdaAsyncGRPOConfig`] or TRL's `AsyncGRPOConfig` (then the Reinforce-Ada defaults apply). The trainer
    itself is TRL's: what changes is the rollout worker's loop ([`~trl_ada.async_grpo.rollout.AdaRolloutLoop`]),
    which keeps a prompt's pool open until its exit rule holds, computes the pool baseline and weights with the
    synchronous trainer's code, and queues the kept samples with those advantages. `sampler="uniform"` runs TRL's own
    worker unchanged. An injected `rollout_worker` is used as given (TRL's contract); to pool with one, build its loop
    as `AdaRolloutLoop(ada_sampling=async_sampling(args), **TRL's loop arguments)`.
    """

    rollout_worker_class: type = AdaAsyncRolloutWorker
    """The worker built (with TRL's arguments plus `ada_sampling`) when the sampler pools and none is injected."""

    def __init__(
        self,
        model: str,
        reward_funcs: Any = None,
        args: AdaAsyncGRPOConfig | AsyncGRPOConfig | None = None,
        *positional: Any,
        pass_rate_estimator: PassRateEstimator | None = None,
        **kwargs: Any,
    ) -> None:
        try:
            named = _ASYNC_INIT_SIGNATURE.bind(self, model, reward_funcs, args, *positional, **kwargs).arguments
        except TypeError as error:
            raise TypeError(
                f"AdaAsyncGRPOTrainer takes AsyncGRPOTrainer's arguments plus pass_rate_estimator=: {error}"
            ) from None
        if args is None:
            args = AdaAsyncGRPOConfig(f"{model.split('/')[-1]}-AdaAsync")
        elif not isinstance(args, AdaAsyncGRPOConfig):
            args = AdaAsyncGRPOConfig.from_async_config(args)
        self.ada_sampling = async_sampling(args, pass_rate_estimator)
        allow_cpu()
        if args.sampler == "uniform" or named.get("rollout_worker") is not None:
            super().__init__(model, reward_funcs, args, *positional, **kwargs)
            return
        worker = functools.partial(self.rollout_worker_class, ada_sampling=self.ada_sampling)
        with trl_seam.async_rollout_worker_class(worker):
            super().__init__(model, reward_funcs, args, *positional, **kwargs)
