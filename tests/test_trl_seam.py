"""The TRL seam: every private TRL touchpoint goes through a module of `trl_ada/trl_seam/`, which refuses unsupported
TRLs at import."""

import ast
import inspect
import logging
import pickle
import re
import sys
import textwrap
import types
from pathlib import Path

import pytest
import trl
from packaging.specifiers import SpecifierSet
from trl import GRPOTrainer

import trl_ada
from trl_ada import trl_seam
from trl_ada.generation.faults import VLLMServerError
from trl_ada.trl_seam import batch_dispatch, grpo_private, vllm_generation

PACKAGE = Path(trl_ada.__file__).parent


def test_the_installed_trl_is_supported():
    assert trl.__version__ in trl_seam.SUPPORTED_TRL
    trl_seam.check_trl_version()
    grpo_private.check_overridable(GRPOTrainer)


@pytest.mark.parametrize("version", ["1.17.0", "2.0.0", "1.13.0", "1.17.0.dev0"])
def test_an_unsupported_trl_fails_with_the_range_and_the_opt_out(monkeypatch, version):
    monkeypatch.delenv(trl_seam.ALLOW_UNSUPPORTED_ENV, raising=False)
    with pytest.raises(ImportError) as error:
        trl_seam.check_trl_version(version)
    message = str(error.value)
    assert f"TRL {version} is installed" in message
    assert str(trl_seam.SUPPORTED_TRL) in message and trl_seam.ALLOW_UNSUPPORTED_ENV in message


def test_the_opt_out_warns_instead(monkeypatch, caplog):
    monkeypatch.setenv(trl_seam.ALLOW_UNSUPPORTED_ENV, "1")
    with caplog.at_level(logging.WARNING, logger="trl_ada.trl_seam"):
        trl_seam.check_trl_version("1.17.0")
    assert any("TRL 1.17.0 is installed" in r.getMessage() for r in caplog.records)


def test_a_renamed_or_reshaped_private_method_is_caught():
    class Renamed(GRPOTrainer):
        pass

    Renamed._generate = None  # as if TRL had renamed it
    Renamed._calculate_rewards = lambda self, inputs, prompts, completions: None  # lost a parameter
    with pytest.raises(ImportError, match=r"_generate is missing.*_calculate_rewards has no parameter"):
        grpo_private.check_overridable(type("Fake", (), {k: getattr(Renamed, k) for k in dir(Renamed)}))


def test_generate_output_round_trips_in_trls_layout():
    output = grpo_private.make_generate_output(
        prompt_ids=[[1]], completion_ids=[[2, 3]], completions=["x"], logprobs=None
    )
    assert len(output) == len(grpo_private.GENERATE_OUTPUT_FIELDS) == 8
    assert output == ([[1]], [[2, 3]], None, ["x"], None, {}, None, [])  # TRL's order and text-only defaults
    fields = grpo_private.split_generate_output(output)
    assert fields["completion_ids"] == [[2, 3]] and fields["extra_fields"] == {} and fields["tool_images"] == []
    with pytest.raises(TypeError, match="tool_masks"):
        grpo_private.make_generate_output(tool_masks=[[1]])


PRIVATE_TRL = re.compile(
    r"self\._(metrics|logs|pending_extra_logs|is_vlm|step|tokenizer|buffered_inputs|environment_pool)\b"
    r"|from trl\.trainer|trl\.trainer\.|eos_token_ids"
)


def test_no_module_but_the_seam_touches_trl_private_api():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if "trl_seam" in path.parts or "samplers" in path.parts:  # samplers import no TRL at all
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if PRIVATE_TRL.search(line):
                offenders.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_setup_py_declares_the_seams_trl_range():
    setup_py = (PACKAGE.parent / "setup.py").read_text()
    declared = re.search(r'^SUPPORTED_TRL = "([^"]+)"', setup_py, flags=re.MULTILINE).group(1)
    assert SpecifierSet(declared) == trl_seam.SUPPORTED_TRL


def _as_if_trl(monkeypatch, release: str) -> None:
    """Make `trl.trainer.utils` and `trl.kernels` look, to `trl_seam.grpo_private.fused_lm_head_is_triton_only`, like
    `release`'s."""
    import trl.trainer.utils as trl_utils

    if release == "1.14":  # no fused LM head
        monkeypatch.delattr(trl_utils, "add_fused_lm_head", raising=False)
        return
    monkeypatch.setattr(trl_utils, "add_fused_lm_head", lambda *args, **kwargs: None, raising=False)
    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", object(), raising=False)
    if release == "1.15 without Triton":  # `from trl.kernels import ...` fails
        monkeypatch.setitem(sys.modules, "trl.kernels", None)
        return
    chunked_logprob = types.ModuleType("trl.kernels.chunked_logprob")
    if release == "1.16":  # its own torch fallback off CUDA/XPU
        chunked_logprob._use_triton = lambda *args: False
    kernels = types.ModuleType("trl.kernels")
    kernels.chunked_logprob = chunked_logprob
    monkeypatch.setitem(sys.modules, "trl.kernels", kernels)
    monkeypatch.setitem(sys.modules, "trl.kernels.chunked_logprob", chunked_logprob)


@pytest.mark.parametrize("device_type", ["cpu", "mps", "cuda", "xpu"])
@pytest.mark.parametrize("release", ["1.14", "1.15", "1.15 without Triton", "1.16"])
def test_only_trl_1_15_off_cuda_and_xpu_is_refused_with_the_fix(monkeypatch, release, device_type):
    # TRL 1.15's GRPOTrainer computes log-probabilities with a Triton kernel only: on a CPU it cannot train at all.
    _as_if_trl(monkeypatch, release)
    refused = release.startswith("1.15") and device_type not in ("cuda", "xpu")
    assert grpo_private.fused_lm_head_is_triton_only() == release.startswith("1.15")
    if not refused:
        grpo_private.check_fused_lm_head_runs(device_type)
        return
    with pytest.raises(RuntimeError) as error:
        grpo_private.check_fused_lm_head_runs(device_type)
    assert isinstance(error.value, grpo_private.FusedLMHeadNeedsGPUError)
    message = str(error.value)
    assert "Triton kernel that runs only on CUDA/XPU" in message and f"device is {device_type!r}" in message
    assert 'pip install "trl>=1.16,<1.17"' in message and "1.14" in message and "GPU" in message


@pytest.mark.parametrize("accelerator", [None, "cuda", "xpu"])
def test_without_a_device_type_the_check_asks_torch_for_cuda_then_xpu(monkeypatch, accelerator):
    import torch

    _as_if_trl(monkeypatch, "1.15")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: accelerator == "cuda")
    monkeypatch.setattr(torch, "xpu", types.SimpleNamespace(is_available=lambda: accelerator == "xpu"), raising=False)
    if accelerator is not None:
        grpo_private.check_fused_lm_head_runs()
        return
    with pytest.raises(grpo_private.FusedLMHeadNeedsGPUError, match="device is 'cpu'"):
        grpo_private.check_fused_lm_head_runs()
    monkeypatch.delattr(torch, "xpu")  # a torch build without `torch.xpu`
    with pytest.raises(grpo_private.FusedLMHeadNeedsGPUError, match="device is 'cpu'"):
        grpo_private.check_fused_lm_head_runs()


@pytest.mark.parametrize("trainer", ["sync", "async"])
def test_both_trainers_refuse_a_triton_only_trl_on_the_cpu_before_anything_loads(tmp_path, monkeypatch, trainer):
    # As on TRL 1.15: the trainers call the check first, so the error names the fix before a model or server is touched.
    from trl_ada import AdaAsyncGRPOConfig, AdaAsyncGRPOTrainer, AdaGRPOConfig, AdaGRPOTrainer

    monkeypatch.setattr(grpo_private, "fused_lm_head_is_triton_only", lambda: True)
    common = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")
    if trainer == "sync":
        trainer_class, args = AdaGRPOTrainer, AdaGRPOConfig(**common, num_generations=2)
    else:
        trainer_class, args = AdaAsyncGRPOTrainer, AdaAsyncGRPOConfig(**common)
    loaded = []
    parent = next(klass for klass in trainer_class.__mro__ if klass.__module__.startswith("trl."))
    monkeypatch.setattr(parent, "__init__", lambda *args, **kwargs: loaded.append(args))

    def build():
        return trainer_class("no/such-model", lambda completions, **kwargs: [0.0] * len(completions), args)

    with pytest.raises(grpo_private.FusedLMHeadNeedsGPUError, match="device is 'cpu'"):
        build()
    assert not loaded


def test_the_installed_trl_is_refused_on_a_cpu_only_if_it_is_1_15():
    # No stand-ins: the installed TRL as it is (1.16 in the main environment, 1.15 and 1.14 in their CI stages).
    on_1_15 = trl.__version__.startswith("1.15.")
    assert grpo_private.fused_lm_head_is_triton_only() == on_1_15, trl.__version__
    grpo_private.check_fused_lm_head_runs("cuda")
    if on_1_15:
        with pytest.raises(
            grpo_private.FusedLMHeadNeedsGPUError, match=f"TRL {re.escape(trl.__version__)}'s GRPOTrainer"
        ):
            grpo_private.check_fused_lm_head_runs("cpu")
    else:
        grpo_private.check_fused_lm_head_runs("cpu")


def test_an_error_broadcast_to_the_processes_waiting_for_a_batch_is_raised_where_it_is_received():
    # What `fail_the_processes_waiting_for_a_batch` sends: each receiving process unpickles it, which raises a copy
    # (type, message, attributes) there. tests/test_async_multiprocess.py runs it on two processes.
    error = VLLMServerError("The vLLM server at http://h:8000 stopped answering during generation of training step 3.")
    error.raised_on_every_process = True
    sent = pickle.dumps(batch_dispatch._RaisedWhenReceived(error))
    with pytest.raises(VLLMServerError) as received:
        pickle.loads(sent)
    assert str(received.value) == str(error) and received.value.raised_on_every_process is True


def test_accelerates_dispatcher_broadcasts_the_number_of_objects_the_seam_sends_in_their_place():
    # The other processes wait in `broadcast_object_list(batch_info)`: a list of another length would not match.
    from accelerate.data_loader import DataLoaderDispatcher

    source = textwrap.dedent(inspect.getsource(DataLoaderDispatcher._fetch_batches))
    lengths = {
        len(node.value.elts)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Assign)
        and any(isinstance(target, ast.Name) and target.id == "batch_info" for target in node.targets)
        and isinstance(node.value, ast.List)
    }
    assert lengths == {batch_dispatch.DISPATCHED_BATCH_INFO_ITEMS}, lengths
    assert "broadcast_object_list(batch_info)" in source


def test_trls_server_generation_broadcasts_the_number_of_objects_the_seam_sends_in_their_place():
    # While the main process's request is in flight, the other processes wait in `VLLMGeneration.generate`'s broadcast
    # of the completions; `fail_the_processes_waiting_for_completions` answers it with a list of the same length, and
    # only the client calls `trl_ada.generation.faults` watches come between the prompts' gathers and that broadcast.
    from trl.generation.vllm_generation import VLLMGeneration

    from trl_ada.generation.faults import _CLIENT_REQUESTS

    source = textwrap.dedent(inspect.getsource(VLLMGeneration.generate))
    tree = ast.parse(source)
    broadcasts = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "broadcast_object_list"
    ]
    assert len(broadcasts) == 1 and [keyword.arg for keyword in broadcasts[0].keywords] == ["from_process"]
    assert ast.literal_eval(broadcasts[0].keywords[0].value) == 0
    sent = broadcasts[0].args[0].id
    lengths = {
        len(node.value.elts)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and any(isinstance(target, ast.Name) and target.id == sent for target in node.targets)
        and isinstance(node.value, ast.List)
    }
    assert lengths == {vllm_generation.SERVER_COMPLETIONS_BROADCAST_ITEMS}, lengths
    requests = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and ast.unparse(node.func.value) == "self.vllm_client"
    ]
    assert sorted({node.func.attr for node in requests}) == sorted(_CLIENT_REQUESTS)
    gathers = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "gather_object"
    ]
    assert max(gathers) < min(node.lineno for node in requests) < broadcasts[0].lineno


def test_completions_the_main_process_could_not_get_are_raised_where_the_others_wait_for_them(monkeypatch):
    # What `fail_the_processes_waiting_for_completions` broadcasts raises, once unpickled, on each receiving process.
    import accelerate.utils

    broadcast: list = []
    monkeypatch.setattr(
        accelerate.utils, "broadcast_object_list", lambda items, from_process: broadcast.append((items, from_process))
    )
    error = VLLMServerError("The vLLM server at http://h:8000 stopped answering during sampling round 2.")
    vllm_generation.fail_the_processes_waiting_for_completions(error)
    [(items, from_process)] = broadcast
    assert from_process == 0 and len(items) == vllm_generation.SERVER_COMPLETIONS_BROADCAST_ITEMS
    with pytest.raises(VLLMServerError) as received:
        pickle.loads(pickle.dumps(items[0]))
    assert str(received.value) == str(error)
