"""
`AdaAsyncGRPOTrainer` leaves TRL as it found it: building and training it changes no module global of TRL's
asynchronous trainer for good, and no method of its rollout worker instance. What the trainer adds to the worker's
lifecycle (the sampler state kept when training ends, failures explained with the step and the checkpoint) goes
through TRL's own parameters and the callbacks instead.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("aiohttp")
pytest.importorskip("trl.experimental.async_grpo")
from trl_ada.trl_seam import async_grpo_private  # noqa: E402

if not async_grpo_private.has_tree_packing():
    pytest.skip("TRL's async trainer trains on CPU from TRL 1.16 (tree packing)", allow_module_level=True)

from async_fixtures import (  # noqa: E402
    FakeCompletionsServer,
    InProcessWeightTransfer,
    ThreadRolloutWorker,
    chat_tokenizer,
    conversational,
    cpu_config,
    peak_flops_without_cuda,
    save_chat_model,
)
from transformers import AttentionInterface, AutoModelForCausalLM  # noqa: E402
from trl.experimental.async_grpo import async_grpo_trainer as trainer_module  # noqa: E402
from trl.experimental.async_grpo import packing  # noqa: E402

from trl_ada import AdaAsyncGRPOConfig, AdaAsyncGRPOTrainer  # noqa: E402
from trl_ada.async_grpo import tree_attention  # noqa: E402
from trl_ada.async_grpo.rollout import AdaRolloutLoop  # noqa: E402
from trl_ada.samplers.predictor import PREDICTOR_DIR, PREDICTOR_FILE  # noqa: E402
from trl_ada.tasks.arithmetic import exact_match_reward, make_dataset  # noqa: E402
from trl_ada.tiny import load_tiny_arith_model  # noqa: E402

WORKER_METHODS = ("start", "stop", "check_health", "update_model_version")


class ThreadAdaWorker(ThreadRolloutWorker):
    """The test stand-in for `AdaAsyncRolloutWorker`: the same loop, in a thread (TRL's spawned worker needs vLLM)."""

    _loop_cls = AdaRolloutLoop


class CPUAdaAsyncGRPOTrainer(AdaAsyncGRPOTrainer):
    rollout_worker_class = ThreadAdaWorker


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_chat_model(tmp_path_factory.mktemp("tiny-arith-chat"))


@pytest.fixture(scope="module")
def tokenizer():
    return chat_tokenizer(load_tiny_arith_model()[1])


@pytest.fixture
def server(model_dir, tokenizer):
    with FakeCompletionsServer(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), tokenizer) as srv:
        yield srv


def build(tmp_path, server, model_dir, tokenizer, **overrides):
    args = cpu_config(AdaAsyncGRPOConfig, tmp_path, server, **overrides)
    return CPUAdaAsyncGRPOTrainer(
        model=str(model_dir),
        reward_funcs=exact_match_reward,
        args=args,
        train_dataset=conversational(make_dataset(32, seed=0, levels=[0, 1, 2, 3])),
        processing_class=tokenizer,
        weight_transfer=InProcessWeightTransfer(server),
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="the peak-FLOPs fallback is only used off CUDA")
def test_building_the_trainer_leaves_trls_module_globals_as_they_were(
    tmp_path, monkeypatch, server, model_dir, tokenizer
):
    # A function of the test's own in TRL's module, so that a wrapper left behind cannot pass for TRL's function.
    monkeypatch.setattr(trainer_module, "get_peak_flops_per_device", peak_flops_without_cuda)
    # TRL's own tree attention, whatever a fixture of another test installed for the process.
    monkeypatch.setattr(packing, "tree_attention", tree_attention.KERNEL_TREE_ATTENTION)
    worker_class = trainer_module.AsyncRolloutWorker
    trainer = build(tmp_path, server, model_dir, tokenizer, sampler="seq_balance")
    assert type(trainer.rollout_worker) is ThreadAdaWorker  # TRL built the trainer's worker class...
    assert trainer_module.AsyncRolloutWorker is worker_class  # ...and its module's name for it is TRL's again
    assert trainer_module.get_peak_flops_per_device is peak_flops_without_cuda
    assert trainer._peak_flops_per_device is None  # built off CUDA: TRL's value for an unknown peak
    assert packing.tree_attention is tree_attention.KERNEL_TREE_ATTENTION
    # The model's attention is the plain-torch one: registered under TRL's name in transformers' interface.
    assert AttentionInterface()[packing.TREE_ATTENTION] is tree_attention.tree_attention_torch


@pytest.mark.wall_clock_limit(180)
def test_the_worker_keeps_its_own_methods_and_the_state_of_its_last_moment_is_saved(
    tmp_path, server, model_dir, tokenizer, wall_clock_guard
):
    # No checkpoint during training: what `save_model` writes afterwards is the state the worker answered with when
    # training ended, before TRL stopped it.
    trainer = build(tmp_path, server, model_dir, tokenizer, sampler="est", pass_rate_predictor="learned", max_steps=1)
    worker = trainer.rollout_worker
    assert not set(WORKER_METHODS) & set(vars(worker)), "a method of the worker instance was replaced"
    trainer.train()
    assert not set(WORKER_METHODS) & set(vars(worker))
    assert worker._thread is None  # TRL stopped it
    trainer.save_model()
    assert (tmp_path / "out" / PREDICTOR_DIR / PREDICTOR_FILE).is_file()
