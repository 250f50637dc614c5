"""The TRL seam: every private TRL touchpoint goes through `trl_ada/trl_seam.py`, which refuses unsupported TRLs."""

import ast
import inspect
import logging
import pickle
import re
import textwrap
from pathlib import Path

import pytest
import trl
from packaging.specifiers import SpecifierSet
from trl import GRPOTrainer

from trl_ada import trl_seam
from trl_ada.generation.faults import VLLMServerError

PACKAGE = Path(trl_seam.__file__).parent


def test_the_installed_trl_is_supported():
    assert trl.__version__ in trl_seam.SUPPORTED_TRL
    trl_seam.check_trl_version()
    trl_seam.check_overridable(GRPOTrainer)


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
        trl_seam.check_overridable(type("Fake", (), {k: getattr(Renamed, k) for k in dir(Renamed)}))


def test_generate_output_round_trips_in_trls_layout():
    output = trl_seam.make_generate_output(prompt_ids=[[1]], completion_ids=[[2, 3]], completions=["x"], logprobs=None)
    assert len(output) == len(trl_seam.GENERATE_OUTPUT_FIELDS) == 8
    assert output == ([[1]], [[2, 3]], None, ["x"], None, {}, None, [])  # TRL's order and text-only defaults
    fields = trl_seam.split_generate_output(output)
    assert fields["completion_ids"] == [[2, 3]] and fields["extra_fields"] == {} and fields["tool_images"] == []
    with pytest.raises(TypeError, match="tool_masks"):
        trl_seam.make_generate_output(tool_masks=[[1]])


PRIVATE_TRL = re.compile(
    r"self\._(metrics|logs|pending_extra_logs|is_vlm|step|tokenizer|buffered_inputs|environment_pool)\b"
    r"|from trl\.trainer|trl\.trainer\.|eos_token_ids"
)


def test_no_module_but_the_seam_touches_trl_private_api():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "trl_seam.py" or "samplers" in path.parts:  # samplers import no TRL at all
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if PRIVATE_TRL.search(line):
                offenders.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_the_trl_1_15_cpu_fallback_matches_trl_1_16s_own():
    # TRL 1.15's fused LM head is Triton-only; the seam's plain-torch stand-in must compute what 1.16's fallback does.
    import torch
    import trl.trainer.utils as trl_utils

    chunked_logprob = pytest.importorskip("trl.kernels.chunked_logprob")
    if not hasattr(chunked_logprob, "_use_triton"):
        pytest.skip(f"TRL {trl.__version__} has no CPU fallback of its own to compare with (1.16 has)")
    reference = trl_utils._ChunkedLogProbFunction
    stand_in = trl_seam._torch_chunked_logprob(None)
    generator = torch.Generator().manual_seed(0)
    for softcap, scale, temperature, with_bias in [(None, 1.0, 1.0, False), (30.0, 0.5, 0.7, True)]:
        hidden = torch.randn(6, 16, generator=generator)
        weight = torch.randn(50, 16, generator=generator)
        bias = torch.randn(50, generator=generator) if with_bias else None
        targets = torch.randint(0, 50, (6,), generator=generator)
        results = []
        for function in (reference, stand_in):
            h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
            logprobs, entropy, log_sum_sq, mean_logits, is_top1 = function.apply(
                h, w, bias, targets, temperature, 4, softcap, scale
            )
            (logprobs.sum() + entropy.sum()).backward()
            results.append((logprobs, entropy, log_sum_sq, mean_logits, is_top1.float(), h.grad, w.grad))
        for expected, actual in zip(*results):
            torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_setup_py_declares_the_seams_trl_range():
    setup_py = (PACKAGE.parent / "setup.py").read_text()
    declared = re.search(r'^SUPPORTED_TRL = "([^"]+)"', setup_py, flags=re.MULTILINE).group(1)
    assert SpecifierSet(declared) == trl_seam.SUPPORTED_TRL


def test_the_fallback_is_installed_on_trl_1_15_only():
    installed = trl_seam.install_fused_lm_head_fallback()
    assert installed == (trl.__version__.startswith("1.15.")), trl.__version__


def test_an_error_broadcast_to_the_processes_waiting_for_a_batch_is_raised_where_it_is_received():
    # What `fail_the_processes_waiting_for_a_batch` sends: each receiving process unpickles it, which raises a copy
    # (type, message, attributes) there. tests/test_async_multiprocess.py runs it on two processes.
    error = VLLMServerError("The vLLM server at http://h:8000 stopped answering during generation of training step 3.")
    error.raised_on_every_process = True
    sent = pickle.dumps(trl_seam._RaisedWhenReceived(error))
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
    assert lengths == {trl_seam.DISPATCHED_BATCH_INFO_ITEMS}, lengths
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
    assert lengths == {trl_seam.SERVER_COMPLETIONS_BROADCAST_ITEMS}, lengths
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
    trl_seam.fail_the_processes_waiting_for_completions(error)
    [(items, from_process)] = broadcast
    assert from_process == 0 and len(items) == trl_seam.SERVER_COMPLETIONS_BROADCAST_ITEMS
    with pytest.raises(VLLMServerError) as received:
        pickle.loads(pickle.dumps(items[0]))
    assert str(received.value) == str(error)
