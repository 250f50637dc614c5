"""
The sampler contract and the knob mechanism: a small `Sampler` base class, one `Options` dataclass per sampler that
names the knobs it reads, one unread-knob rule for both configs, and knob help a TRL maintainer would merge.
"""

from __future__ import annotations

import inspect
import re
import textwrap
from dataclasses import dataclass, fields
from pathlib import Path

import pytest

from trl_ada import AdaGRPOConfig
from trl_ada.samplers import Sampler, SamplerOptions, SamplerSettings, build_sampler, register_sampler
from trl_ada.samplers.base import draw_memories
from trl_ada.samplers.registry import SAMPLERS
from trl_ada.samplers.settings import UNIVERSAL_KNOBS

PACKAGE = Path(__file__).resolve().parents[1] / "trl_ada"


def config(tmp_path, **knobs) -> AdaGRPOConfig:
    return AdaGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", **knobs)


def async_args(tmp_path) -> dict:
    return {"output_dir": str(tmp_path), "use_cpu": True, "bf16": False, "report_to": "none"}


def test_the_sampler_base_class_defines_at_most_ten_names():
    own = {name for name in vars(Sampler) if not name.startswith("__") or name == "__init__"}
    own |= set(Sampler.__annotations__)
    assert own == {
        "name",
        "Options",
        "__init__",
        "begin",
        "request_size",
        "keep",
        "weight",
        "end_step",
        "state_dict",
        "load_state_dict",
    }


def test_every_built_in_sampler_is_written_against_the_same_contract():
    for name, cls in SAMPLERS.items():
        if not cls.__module__.startswith("trl_ada."):
            continue
        assert issubclass(cls.Options, SamplerOptions), name
        # the old class-level knob declarations are gone: the Options dataclass is the one place
        extra = {
            attribute
            for klass in cls.__mro__
            if klass.__module__.startswith("trl_ada.samplers.") and klass is not Sampler
            for attribute in vars(klass)
            if attribute
            in {"knobs", "knob_conditions", "knob_hints", "reads", "resolve", "options_class", "refills_batches"}
        }
        assert not extra, (name, extra)


@pytest.mark.parametrize("trainer_config", ["sync", "async"])
def test_dapo_gated_reads_pass_rate_decay_in_both_configs(tmp_path, trainer_config):
    # The gate's draw history decays with pass_rate_decay: both configs accept it, and the sampler uses it.
    if trainer_config == "sync":
        args = config(tmp_path, sampler="dapo_gated", pass_rate_decay=0.8, per_device_train_batch_size=8)
    else:
        from trl_ada.async_grpo.async_grpo_config import AdaAsyncGRPOConfig

        args = AdaAsyncGRPOConfig(**async_args(tmp_path), sampler="dapo_gated", pass_rate_decay=0.8)
    sampler = build_sampler(args.sampler_settings())
    assert sampler.history.decay == 0.8
    assert sampler.history in draw_memories(sampler)


def test_a_read_when_option_is_read_only_under_its_setting():
    settings = SamplerSettings(sampler="seq_balance", num_generations=4)
    assert not settings.reads("pass_rate_decay") and settings.reads("round_size")
    assert SamplerSettings(sampler="seq_balance", num_generations=4, round_policy="tracked").reads("pass_rate_decay")
    with pytest.raises(ValueError, match=r"pass_rate_decay=0.5 has no effect with sampler='seq_balance', "):
        SamplerSettings(sampler="seq_balance", num_generations=4, pass_rate_decay=0.5).validated()
    # the condition can be on a sampler's own option (knapsack's train_on): read before the options are built
    knapsack = SamplerSettings(sampler="knapsack", num_generations=4, downsample="random")
    with pytest.raises(ValueError, match="downsample='random' has no effect with sampler='knapsack'"):
        knapsack.validated()
    assert SamplerSettings(
        sampler="knapsack",
        num_generations=2,
        downsample="random",
        sampler_kwargs={"train_on": "downsample"},
    ).validated()


def test_a_plug_in_needs_only_request_size_and_its_options(tmp_path):
    @dataclass(kw_only=True)
    class FixedOptions(SamplerOptions):
        round_size: int  # named like a config knob: read from the config
        extra_draws: int = 0

        def __post_init__(self) -> None:
            if self.extra_draws < 0:
                raise ValueError("extra_draws must be non-negative")

        @property
        def max_pool_size(self) -> int:
            return self.round_size + self.extra_draws

    @register_sampler("contract_fixed")
    class FixedSampler(Sampler):
        Options = FixedOptions

        def request_size(self, step, index):
            return self.options.round_size + self.options.extra_draws if step.rounds == 0 else 0

    try:
        settings = SamplerSettings(
            sampler="contract_fixed", num_generations=4, round_size=6, sampler_kwargs={"extra_draws": 2}
        ).validated()
        assert settings.max_pool_size == 8 and settings.reads("round_size") and not settings.reads("objective")
        assert settings.one_request_per_prompt and not settings.has_exit_rule and settings.rules_are_per_prompt
        sampler = build_sampler(settings)
        step = sampler.begin(2)
        requests = step.requests()
        assert requests == [(0, 8), (1, 8)]
        step.observe(requests, [1.0, 0.0] * 8)
        selection = step.finish()
        assert [len(result.kept) for result in selection.prompts] == [4, 4]
        with pytest.raises(ValueError, match="extra_draws must be non-negative"):
            config(tmp_path, sampler="contract_fixed", sampler_kwargs={"extra_draws": -1})
        with pytest.raises(ValueError, match="objective='log' has no effect with sampler='contract_fixed'"):
            config(tmp_path, sampler="contract_fixed", objective="log")
    finally:
        SAMPLERS.pop("contract_fixed")


def test_the_unread_knob_rule_is_one_function_for_both_configs(tmp_path):
    from trl_ada.async_grpo.async_grpo_config import AdaAsyncGRPOConfig

    message = r"round_size=3 has no effect with sampler='uniform'"
    with pytest.raises(ValueError, match=message):
        config(tmp_path, sampler="uniform", round_size=3)
    with pytest.raises(ValueError, match=message):
        AdaAsyncGRPOConfig(**async_args(tmp_path), sampler="uniform", round_size=3)
    with pytest.raises(ValueError, match="dapo_on_exhausted='keep_partial': the asynchronous worker"):
        AdaAsyncGRPOConfig(**async_args(tmp_path), sampler="dapo", dapo_on_exhausted="keep_partial")
    # where no rule would tell the user, the hint names what to use instead
    with pytest.raises(ValueError, match="use sampler='dapo' instead"):
        config(tmp_path, sampler="uniform", dapo_refill=True)


def _declared_knobs() -> list:
    """Every field trl-ada declares (on the settings and both configs); TRL's own fields keep TRL's text."""
    from trl_ada.async_grpo.async_grpo_config import AdaAsyncGRPOConfig

    declared = []
    for cls in (SamplerSettings, AdaGRPOConfig, AdaAsyncGRPOConfig):
        for owner in cls.__mro__:
            if owner.__module__.startswith("trl_ada."):
                own = inspect.get_annotations(owner)
                declared += [f for f in fields(owner) if f.name in own]
    return declared


def _declared_helps() -> dict[str, str]:
    return {declared.name: declared.metadata["help"] for declared in _declared_knobs()}


def test_every_knob_is_declared_as_trl_declares_its_own():
    # A dataclass field whose metadata is what HfArgumentParser hands argparse: the help, and a list of choices.
    from transformers import HfArgumentParser

    from trl_ada.async_grpo.async_grpo_config import AdaAsyncGRPOConfig

    for declared in _declared_knobs():
        assert set(declared.metadata) <= {"help", "choices"}, declared.name
        assert isinstance(declared.metadata.get("choices", []), list), declared.name
    for cls in (AdaGRPOConfig, AdaAsyncGRPOConfig):
        HfArgumentParser(cls).format_help()


def test_knob_help_reads_like_trl_at_most_four_lines_and_no_measurements():
    helps = _declared_helps()
    assert {"sampler", "round_size", "generation_schedule", "train_on", "prompts_per_generation_batch"} <= set(helps)
    for name, text in helps.items():
        assert len(textwrap.wrap(text, 112, break_long_words=False)) <= 4, name
        assert not re.search(r"\d\.\d+x|\bissue \d|BENCHMARKS", text), name


def test_no_comment_or_docstring_in_the_package_cites_an_issue():
    cited = []
    for path in PACKAGE.rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if re.search(r"\b[Ii]ssues? \d+", line):
                cited.append(f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}")
    assert not cited, "\n".join(cited)


def test_every_universal_knob_is_read_by_every_sampler():
    for name in SAMPLERS:
        settings = SamplerSettings(sampler=name)
        assert all(settings.reads(knob) for knob in UNIVERSAL_KNOBS), name
