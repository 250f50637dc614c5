"""
A sampler defined outside the package (`examples/knapsack_sampler.py`, docs/custom-sampler.md) is
selectable by name in AdaGRPOConfig, trains, resumes its state, runs in `trl-ada simulate` (by name, and by import path
in a fresh process) and appears on the model card, with no file of trl_ada touched.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY_MODEL_KWARGS, starts_low_digit, tiny_args

from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
from trl_ada.reporting.card import sampler_rows
from trl_ada.samplers import SamplerSettings, build_sampler, sampler_names
from trl_ada.tiny import build_tiny_model

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))
import knapsack_sampler  # noqa: E402 - registers "greedy_mixed_chance"


def test_the_plug_in_is_registered_by_importing_it():
    assert "greedy_mixed_chance" in sampler_names()
    settings = SamplerSettings(sampler="greedy_mixed_chance", num_generations=4, sampler_kwargs={"max_draws": 9})
    sampler = build_sampler(settings)
    assert isinstance(sampler, knapsack_sampler.MixedChanceSampler)
    assert sampler.options == knapsack_sampler.MixedChanceOptions(num_generations=4, max_draws=9, pass_rate_decay=0.9)
    assert sampler.settings.max_pool_size == 9


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"objective": "log"}, "objective='log' has no effect with sampler='greedy_mixed_chance'"),
        ({"round_size": 4}, "round_size=4 has no effect with sampler='greedy_mixed_chance'"),
        ({"sampler_kwargs": {"budget": 3}}, r"sampler_kwargs has \['budget'\].*options are"),
        ({"sampler_kwargs": {"min_draws": 1}}, "need 2 <= min_draws"),
        ({"sampler_kwargs": {"max_draws": 3}}, r"outside \[min_draws, max_draws\] = \[2, 3\]"),
        ({"sampler_kwargs": "{not json"}, "not valid JSON"),
    ],
)
def test_the_plug_in_brings_its_own_validation(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        AdaGRPOConfig(**tiny_args(tmp_path), sampler="greedy_mixed_chance", **kwargs)


def test_built_in_samplers_take_no_sampler_kwargs(tmp_path):
    with pytest.raises(ValueError, match="sampler='seq_balance' has no options of its own"):
        AdaGRPOConfig(**tiny_args(tmp_path), sampler_kwargs={"max_draws": 3})


def test_a_plug_in_sampler_trains_resumes_and_is_on_the_card(tmp_path, tokenizer, arithmetic_dataset):
    config = AdaGRPOConfig(
        **tiny_args(tmp_path, max_steps=4, save_strategy="steps", save_steps=2),
        sampler="greedy_mixed_chance",
        sampler_kwargs='{"max_draws": 7}',  # as the command line gives it
    )
    assert config.sampler_kwargs == {"max_draws": 7}  # parsed once, at construction
    model = build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS)
    trainer = AdaGRPOTrainer(
        model, [starts_low_digit], args=config, train_dataset=arithmetic_dataset, processing_class=tokenizer
    )
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "ada/samples_per_prompt/mean" in entry]
    assert len(logged) == 4
    for entry in logged:
        # the whole budget (B * n = 2 * 4 per step, the batch TRL trains on) is spent, no prompt above max_draws
        assert entry["ada/samples_per_prompt/mean"] == pytest.approx(4.0)
        assert entry["ada/samples_per_prompt/max"] <= 7 and entry["ada/samples_per_prompt/min"] >= 2
        assert "ada/greedy_mixed_chance/budget_max" in entry
    # its tracker is training state: saved in every checkpoint, and a resumed run ends where the uninterrupted one did
    state = json.loads((tmp_path / "checkpoint-2" / "ada_sampler_state.json").read_text())
    assert len(state["sampler"]["estimator"]["counts"]) == 4  # 2 prompts per step (8 rows of 4), 2 steps
    resumed = AdaGRPOTrainer(
        build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS),
        [starts_low_digit],
        args=config,
        train_dataset=arithmetic_dataset,
        processing_class=tokenizer,
    )
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert resumed.ada_sampler.estimator.state_dict() == trainer.ada_sampler.estimator.state_dict()

    rows = dict(sampler_rows(trainer.ada_sampler.settings))
    assert rows["sampler"] == "greedy_mixed_chance" and rows["sampler_kwargs.max_draws"] == 7
    assert "objective" not in rows and "round_size" not in rows  # it reads neither
    trainer.create_model_card()
    card = (tmp_path / "README.md").read_text()
    assert "greedy_mixed_chance" in card and "sampler_kwargs.max_draws" in card


def test_simulate_runs_the_plug_in_by_name_and_by_import_path(capsys):
    from trl_ada.cli import main

    argv = ["simulate", "--num-generations", "4", "--pass-rates", "0.05", "0.5", "--trials", "200", "--steps", "3"]
    assert main([*argv, "--sampler", "greedy_mixed_chance", "--sampler-kwargs", '{"max_draws": 12}']) == 0
    by_name = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    # the greedy budget favours the prompt whose group most often comes back mixed once its rate is tracked
    assert by_name[1]["mean_samples"] > 4.0 > by_name[0]["mean_samples"]
    # a fresh process knows nothing of the plug-in until the import path names it
    completed = subprocess.run(
        [sys.executable, "-m", "trl_ada.cli", *argv, "--sampler", "knapsack_sampler:MixedChanceSampler"]
        + ["--sampler-kwargs", '{"max_draws": 12}'],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(EXAMPLES), os.environ.get("PYTHONPATH", "")])},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    assert [json.loads(line) for line in completed.stdout.splitlines()] == by_name
    completed = subprocess.run(
        [sys.executable, "-m", "trl_ada.cli", *argv, "--sampler", "greedy_mixed_chance"],
        capture_output=True,
        text=True,
    )
    assert completed.returncode == 2 and "sampler='greedy_mixed_chance' is not supported" in completed.stderr
    # ... and its error says how a fresh process finds it, and where the docs are (a page that exists)
    assert "pass its import path 'module:Class'" in completed.stderr
    (page,) = re.findall(r"See (docs/[\w-]+\.md) \('([^']+)'\)", completed.stderr)
    assert (EXAMPLES.parent / page[0]).read_text().startswith(f"# {page[1]}\n")
    assert "README" not in completed.stderr


def test_the_readme_shows_the_example_file_verbatim():
    readme = (EXAMPLES.parent / "docs" / "custom-sampler.md").read_text()
    section = readme.split("# Write your own sampler", 1)[1].split("\n## ", 1)[0]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert block == (EXAMPLES / "knapsack_sampler.py").read_text()


# ---------------------------------------------------------------------------------------------------------------------
# The registry: a taken name is never silently replaced by another class (issue 32, item 19)
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture
def registry_snapshot():
    """Whatever a test registers is gone afterwards (and anything it replaced is back)."""
    from trl_ada.samplers import registry

    saved, imported = dict(registry.SAMPLERS), dict(registry._IMPORTED)
    yield registry
    registry.SAMPLERS.clear()
    registry.SAMPLERS.update(saved)
    registry._IMPORTED.clear()
    registry._IMPORTED.update(imported)


PLUG_IN_SOURCE = """
from trl_ada.samplers import register_sampler
from trl_ada.samplers.uniform import UniformSampler


@register_sampler("my_uniform")
class MyUniform(UniformSampler):
    pass
"""


def load_file_as(monkeypatch, module_name, path):
    """Import `path` as module `module_name`, as `import` (or running it as `__main__`) would."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, module_name, module)
    spec.loader.exec_module(module)
    return module


def test_a_class_named_like_a_built_in_cannot_take_its_name(registry_snapshot):
    from trl_ada.samplers import register_sampler
    from trl_ada.samplers.est import EstSampler
    from trl_ada.samplers.registry import SAMPLERS
    from trl_ada.samplers.uniform import UniformSampler

    class Impostor(UniformSampler):
        __module__ = "someone_elses_plugins"
        __qualname__ = "EstSampler"  # the built-in's name, in another module

    with pytest.raises(ValueError, match=r"'est' is already registered by trl_ada\.samplers\.est\.EstSampler"):
        register_sampler("est")(Impostor)
    assert SAMPLERS["est"] is EstSampler


def test_the_same_definition_registers_again_and_another_file_does_not(registry_snapshot, tmp_path, monkeypatch):
    path = tmp_path / "my_uniform_plugin.py"
    path.write_text(PLUG_IN_SOURCE)
    first = load_file_as(monkeypatch, "my_uniform_plugin", path).MyUniform
    # The same file run again (importlib.reload, a notebook cell) or under another module name (run as __main__,
    # then imported by its import path): a new class object for the same definition, which replaces the first.
    again = load_file_as(monkeypatch, "my_uniform_plugin", path).MyUniform
    as_main = load_file_as(monkeypatch, "__main_stand_in__", path).MyUniform
    assert first is not again and registry_snapshot.SAMPLERS["my_uniform"] is as_main
    copy = tmp_path / "copied_plugin.py"
    copy.write_text(PLUG_IN_SOURCE)
    with pytest.raises(ValueError, match=r"'my_uniform' is already registered by __main_stand_in__\.MyUniform"):
        load_file_as(monkeypatch, "copied_plugin", copy)


def test_an_import_path_resolves_from_the_working_directory(registry_snapshot, tmp_path, monkeypatch):
    # As `trl-ada train --sampler cwd_only_sampler:CwdOnly` in a directory holding the module: a console script does
    # not have the working directory on sys.path (`python -m` would), `trl grpo` imports --reward_funcs from it.
    from trl_ada.samplers.registry import sampler_class

    (tmp_path / "cwd_only_sampler.py").write_text(
        PLUG_IN_SOURCE.replace("my_uniform", "cwd_only").replace("MyUniform", "CwdOnly")
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "cwd_only_sampler", raising=False)
    with pytest.raises(ValueError, match="nor an importable class .*No module named 'not_here'.* working directory"):
        sampler_class("not_here:Sampler")
    assert str(tmp_path) not in sys.path  # a failed import leaves sys.path as it was
    try:
        cls = sampler_class("cwd_only_sampler:CwdOnly")
        assert cls.__name__ == "CwdOnly" and cls.name == "cwd_only" and sys.path[0] == str(tmp_path)
    finally:
        sys.modules.pop("cwd_only_sampler", None)


def test_a_plugin_that_asks_for_a_second_round_reads_max_rounds_or_is_told_to():
    """A new user's retrying sampler once got one round, silently: now it is an error naming the fix, and declaring
    `max_rounds` in its Options gives it the config's rounds."""
    from dataclasses import dataclass

    from trl_ada.samplers import Sampler, SamplerOptions, SamplerSettings, build_sampler, register_sampler
    from trl_ada.samplers.registry import SAMPLERS

    class RetryUntilRight(Sampler):
        def request_size(self, step, index):
            positives, _ = step.outcomes[index]
            return 0 if positives or len(step.pools[index]) >= 8 else self.settings.num_generations

    @dataclass(kw_only=True)
    class WithRounds(SamplerOptions):
        max_rounds: int

    class RetryWithRounds(RetryUntilRight):
        Options = WithRounds

    register_sampler("retry_test")(RetryUntilRight)
    register_sampler("retry_rounds_test")(RetryWithRounds)
    try:
        for name, rounds in (("retry_test", None), ("retry_rounds_test", 2)):
            sampler = build_sampler(SamplerSettings(sampler=name, num_generations=4, seed=0))
            step = sampler.begin(1)
            if rounds is None:
                with pytest.raises(ValueError, match="Declare `max_rounds: int` in its Options"):
                    step.observe(step.requests(), [0.0] * 4)  # the end of the first round asks for the next
                continue
            step.observe(step.requests(), [0.0] * 4)
            step.observe(step.requests(), [0.0] * 4)
            assert step.requests() == [] and step.rounds == rounds
    finally:
        SAMPLERS.pop("retry_test")
        SAMPLERS.pop("retry_rounds_test")


def test_an_installed_plug_in_that_fails_to_import_is_left_out_of_listings_but_raises_when_named(
    registry_snapshot, monkeypatch, caplog
):
    class BrokenEntryPoint:
        name, value = "broken_plugin_test", "no_such_package.samplers"

        def load(self):
            raise ImportError("No module named 'no_such_package'")

    installed = registry_snapshot._entry_points()
    monkeypatch.setattr(registry_snapshot, "_entry_points", lambda: [*installed, BrokenEntryPoint()])
    assert "broken_plugin_test" in sampler_names()  # listed by name without importing it
    with caplog.at_level("WARNING", logger="trl_ada.samplers.registry"):
        loaded = registry_snapshot.load_plugins()
    assert "broken_plugin_test" not in loaded and {"spo", "knapsack", "dapo_gated"} <= set(loaded)
    assert any("broken_plugin_test" in record.getMessage() for record in caplog.records)
    with pytest.raises(ImportError, match="no_such_package"):
        registry_snapshot.sampler_class("broken_plugin_test")
