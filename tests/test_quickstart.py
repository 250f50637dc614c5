"""The README's Python quick start (`examples/quickstart.py`) runs on CPU as written, and the Migrating snippet says
what to add on CPU: a new user's first two snippets (issue 32)."""

import re
import warnings
from pathlib import Path

import pytest
import torch
from test_docs import code_blocks, section

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "docs" / "getting-started.md").read_text()  # the quick start moved to the docs site
MIGRATING = (ROOT / "docs" / "migrating.md").read_text()
QUICKSTART = ROOT / "examples" / "quickstart.py"


def readme_quickstart() -> str:
    (block,) = code_blocks(section(README, "Quick start (Python, CPU)"))
    return block


def test_readme_quickstart_is_examples_quickstart_verbatim():
    assert readme_quickstart() == QUICKSTART.read_text()


@pytest.fixture
def restore_torch_threads():
    """The quick start sets torch to one thread for the whole process; give later tests their threads back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_readme_quickstart_trains_on_cpu_with_no_deprecation_warning_from_trls_internals(
    tmp_path, monkeypatch, restore_torch_threads
):
    # The README's block itself, with 2 steps instead of 50 (the only change).
    code = readme_quickstart()
    assert code.count("max_steps=50,") == 1
    code = code.replace("max_steps=50,", "max_steps=2,")
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__main__"}
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        exec(compile(code, str(QUICKSTART), "exec"), namespace)
    assert namespace["trainer"].state.global_step == 2
    saved = tmp_path / "outputs" / "quickstart"
    assert (saved / "model.safetensors").is_file() and (saved / "tokenizer.json").is_file()
    future = {str(r.message) for r in records if issubclass(r.category, FutureWarning)}
    # TRL's calls of the model's deprecated `gradient_checkpointing_*` methods are filtered in `AdaGRPOTrainer.train`,
    # and transformers' deprecation of TRL's default `gradient_checkpointing=True` in `AdaGRPOConfig`.
    assert not future, future


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what the snippet needs on a machine without a GPU")
def test_migrating_snippet_names_what_to_add_on_cpu(tmp_path, monkeypatch):
    from trl_ada import AdaGRPOConfig

    (block,) = code_blocks(section(MIGRATING, "Migrating from `GRPOTrainer`"))
    arguments = re.search(r"^args = AdaGRPOConfig\((.*?)^\)", block, flags=re.MULTILINE | re.DOTALL).group(1)
    # The block runs on CPU (tests/test_docs_snippets.py runs it); the two lines its comment says to drop on a GPU are
    # exactly what a machine without one needs: without them TRL's default bf16=True stops, naming use_cpu.
    cpu_lines = [line for line in arguments.splitlines() if re.match(r"\s*(use_cpu|bf16)=", line)]
    assert len(cpu_lines) == 2 and "drop both lines on a GPU" in cpu_lines[0], cpu_lines
    monkeypatch.chdir(tmp_path)
    on_gpu = "\n".join(line for line in arguments.splitlines() if line not in cpu_lines)
    with pytest.raises(ValueError, match="use_cpu"):
        eval(f"AdaGRPOConfig({on_gpu})", {"AdaGRPOConfig": AdaGRPOConfig})
    args = eval(f"AdaGRPOConfig({arguments})", {"AdaGRPOConfig": AdaGRPOConfig})
    assert args.use_cpu and not args.bf16 and args.sampler == "seq_balance"
