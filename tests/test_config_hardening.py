"""Config-level hardening: seeded vLLM generation, the pass-rate prior's checks (and its old names, now refused), and the
rule for knobs that the chosen sampler does not read. Everything here fails at construction, before any model is
loaded."""

import json
import math
from dataclasses import fields

import pytest
from trl import GRPOConfig

from trl_ada import AdaGRPOConfig
from trl_ada.config import ADA_ONLY_FIELDS
from trl_ada.samplers import SamplerSettings, build_sampler
from trl_ada.samplers.settings import (
    KNOB_FIELDS,
    SETTINGS_DEFAULTS,
    TRL_OWNED_KNOBS,
    UNIVERSAL_KNOBS,
    option_fields,
)


def config(tmp_path, **kwargs):
    return AdaGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", bf16=False, **kwargs)


# ---------------------------------------------------------------------------------------------------------------------
# Item 5: a seed in generation_kwargs under vLLM
# ---------------------------------------------------------------------------------------------------------------------

SEEDED = {"use_vllm": True, "generation_kwargs": {"seed": 7}}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"vllm_mode": "server", "sampler": "seq_balance"}, "sends each prompt again in every round"),
        ({"vllm_mode": "server", "sampler": "seq_pos", "round_policy": "predictive"}, "in every round"),
        ({"vllm_mode": "server", "sampler": "est"}, "one per request"),
        (
            {"vllm_mode": "server", "sampler": "seq_balance", "max_rounds": 1, "generation_schedule": "continuous"},
            "sends every draw as its own request",
        ),
        ({"vllm_mode": "colocate", "sampler": "seq_balance", "max_rounds": 1}, "vllm_mode='colocate'"),
    ],
)
def test_a_generation_seed_is_rejected_where_a_prompt_is_requested_more_than_once(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message) as error:
        config(tmp_path, **SEEDED, **kwargs)
    assert "Remove 'seed' from generation_kwargs" in str(error.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"vllm_mode": "server", "sampler": "uniform"},
        {"vllm_mode": "colocate", "sampler": "dapo"},
        {"vllm_mode": "server", "sampler": "seq_balance", "max_rounds": 1},  # one round: one request of n per prompt
    ],
)
def test_a_generation_seed_is_kept_where_each_prompt_is_one_request(tmp_path, kwargs):
    args = config(tmp_path, **SEEDED, **kwargs)
    assert args.generation_kwargs == {"seed": 7}  # nothing the user gave is changed


def test_a_generation_seed_without_vllm_is_accepted(tmp_path):
    # transformers generation does not read a seed from generation_kwargs: nothing repeats
    assert config(tmp_path, generation_kwargs={"seed": 7}).sampler == "seq_balance"


def test_an_upgraded_grpo_config_with_a_generation_seed_falls_back_to_uniform(tmp_path, caplog):
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", bf16=False, **SEEDED)
    upgraded = AdaGRPOConfig.from_grpo_config(args)  # never rejects what GRPOTrainer accepts
    assert upgraded.sampler == "uniform" and upgraded.generation_kwargs == {"seed": 7}
    assert "Remove the seed from generation_kwargs" in caplog.text


# ---------------------------------------------------------------------------------------------------------------------
# Item 6: the pass-rate prior and decay, validated wherever they are read, under their own names
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"round_policy": "predictive", "pass_rate_prior_alpha": 0.0}, "pass_rate_prior_alpha must be a positive"),
        ({"round_policy": "tracked", "pass_rate_prior_beta": math.nan}, "pass_rate_prior_beta must be a positive"),
        ({"round_policy": "tracked", "pass_rate_prior_alpha": math.inf}, "pass_rate_prior_alpha must be a positive"),
        ({"round_policy": "tracked", "pass_rate_decay": 5.0}, "pass_rate_decay must lie in"),
        ({"round_policy": "tracked", "pass_rate_decay": math.nan}, "pass_rate_decay must lie in"),
        ({"sampler": "est", "pass_rate_decay": 0.0}, "pass_rate_decay must lie in"),
        # where nothing reads the prior, any other value is an error too (the knob rule)
        ({"pass_rate_prior_alpha": 0.0}, "has no effect with sampler='seq_balance', round_policy='fixed'"),
        ({"round_policy": "predictive", "pass_rate_decay": 5.0}, "has no effect"),
    ],
)
def test_the_pass_rate_prior_is_checked_wherever_it_is_read(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        config(tmp_path, **kwargs)


@pytest.mark.parametrize("tolerance", [math.inf, math.nan, -1e-6])
def test_the_zero_variance_tolerance_is_a_finite_non_negative_number(tmp_path, tolerance):
    # inf once passed: every group then counted as constant, so nothing trained and DAPO dropped every prompt.
    with pytest.raises(ValueError, match="zero_variance_tolerance must be a finite, non-negative number"):
        config(tmp_path, zero_variance_tolerance=tolerance)
    assert config(tmp_path, zero_variance_tolerance=0.0).zero_variance_tolerance == 0.0


def test_every_default_meets_its_knob_requirement():
    # Every knob's value is checked after the unread-knob rule, which holds an unread knob at its default: so every
    # default passes its own check, and checking all of them checks the ones read.
    SamplerSettings().check_values()
    assert AdaGRPOConfig.__dataclass_fields__["continuous_max_in_flight"].default >= 1  # the trainer's own check


OLD_NAMES = ("est_decay", "est_prior_alpha", "est_prior_beta")
"""The first names of pass_rate_decay, pass_rate_prior_alpha and pass_rate_prior_beta, once accepted with a warning."""


@pytest.mark.parametrize("old", OLD_NAMES)
def test_an_old_name_is_an_unknown_keyword(tmp_path, old):
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{old}'"):
        AdaGRPOConfig(output_dir=str(tmp_path), **{old: 0.9})
    assert old not in {f.name for f in fields(AdaGRPOConfig)} and f" {old} (" not in AdaGRPOConfig.__doc__


def test_the_command_lines_refuse_the_old_decay_flag(tmp_path, capsys, monkeypatch):
    import transformers

    from trl_ada.cli import main

    with pytest.raises(SystemExit) as refused:
        main(["simulate", "--sampler", "est", "--pass-rates", "0.5", "--est-decay", "0.5"])
    assert refused.value.code == 2 and "unrecognized arguments: --est-decay 0.5" in capsys.readouterr().err

    def loaded(*args, **kwargs):
        raise AssertionError("a model was loaded before the command line was checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", loaded)
    try:
        code = main(["train", "--est_decay", "0.9", "--output_dir", str(tmp_path)])
    except SystemExit as exit:  # argparse stops the parse at its first mistake
        code = exit.code
    assert code == 2 and "unrecognized arguments: --est_decay 0.9" in capsys.readouterr().err


def test_sampler_state_written_before_the_rename_still_loads():
    # `ada_sampler_state.json` of the previous release: the tracker's counts carry no knob name.
    settings = SamplerSettings(
        scale_rewards="none", seed=0, sampler="seq_balance", num_generations=4, round_policy="tracked"
    )
    old_state = json.loads(json.dumps(build_sampler(settings).state_dict()))
    old_state["tracker"] = {"counts": {"prompt-a": [8.0, 2.0]}}
    sampler = build_sampler(settings)
    sampler.load_state_dict(old_state)
    assert sampler.estimator.beta_parameters(["prompt-a"]) == [(3.0, 7.0)]
    est = build_sampler(SamplerSettings(scale_rewards="none", seed=0, sampler="est", num_generations=4))
    est.load_state_dict({**json.loads(json.dumps(est.state_dict())), "estimator": {"counts": {"p": [4.0, 1.0]}}})
    assert est.estimator.estimate(["p"]) == [pytest.approx(2 / 6)]


# ---------------------------------------------------------------------------------------------------------------------
# Item 7: one rule for knobs the chosen sampler does not read
# ---------------------------------------------------------------------------------------------------------------------

# For every knob of the table: a configuration that does not read it, one that does, and a value other than its
# default (valid where it is read).
UNREAD_READ_VALUE = {
    "round_size": ({"sampler": "uniform"}, {"sampler": "seq_balance"}, 16),
    "max_rounds": ({"sampler": "dapo"}, {"sampler": "seq_pos"}, 2),
    "positive_quota": ({"sampler": "est"}, {"sampler": "seq_pos"}, 1),
    "negative_quota": ({"sampler": "seq_pos"}, {"sampler": "seq_balance"}, 2),
    "objective": ({"sampler": "est"}, {"sampler": "seq_balance"}, "log"),
    "power_alpha": ({"objective": "log"}, {"objective": "power"}, 0.3),
    "downsample": ({"sampler": "est"}, {"sampler": "est", "est_train_on": "downsample"}, "random"),
    "round_policy": ({"sampler": "uniform"}, {"sampler": "seq_pos"}, "predictive"),
    "round_confidence": ({"sampler": "seq_balance"}, {"round_policy": "predictive"}, 0.9),
    "pass_rate_decay": ({"round_policy": "predictive"}, {"round_policy": "tracked"}, 0.5),
    "pass_rate_prior_alpha": ({"sampler": "seq_balance"}, {"round_policy": "predictive"}, 2.0),
    "pass_rate_prior_beta": ({"sampler": "dapo"}, {"sampler": "est"}, 2.0),
    "pass_rate_predictor": ({"sampler": "seq_balance"}, {"sampler": "est"}, "learned"),
    "pass_rate_predictor_learning_rate": (
        {"sampler": "est"},
        {"sampler": "est", "pass_rate_predictor": "learned"},
        0.3,
    ),
    "skip_unmixed_above": ({"sampler": "seq_balance"}, {"round_policy": "tracked"}, 0.9),
    "est_sample_power": ({"sampler": "seq_pos"}, {"sampler": "est"}, 1.0),
    "est_min_samples": ({"sampler": "seq_balance"}, {"sampler": "est"}, 3),
    "est_max_samples": ({"sampler": "uniform"}, {"sampler": "est"}, 16),
    "est_mean_samples": ({"sampler": "seq_balance"}, {"sampler": "est", "est_train_on": "downsample"}, 9),
    "est_epsilon": ({"sampler": "dapo"}, {"sampler": "est"}, 0.1),
    "est_train_on": ({"sampler": "seq_balance"}, {"sampler": "est"}, "downsample"),
    "dapo_refill": ({"sampler": "uniform"}, {"sampler": "seq_balance"}, True),
    "dapo_max_refills": ({"sampler": "seq_balance"}, {"sampler": "dapo"}, 3),
    "dapo_on_exhausted": ({"sampler": "uniform"}, {"sampler": "seq_pos", "dapo_refill": True}, "keep_partial"),
    "continuous_max_in_flight": (
        {},
        {"use_vllm": True, "vllm_mode": "server", "generation_schedule": "continuous"},
        64,
    ),
}


def test_every_knob_is_either_read_by_every_sampler_or_in_the_table():
    # The knobs only some configurations read: every declared knob but the universal ones (sampler classes say which
    # they read), plus the trainer-level ones.
    only_some = set(KNOB_FIELDS) - UNIVERSAL_KNOBS
    conditional = set(ADA_ONLY_FIELDS) - {"generation_schedule", "train_on"}  # those two: read by every configuration
    assert set(UNREAD_READ_VALUE) == only_some | conditional  # a knob added needs a case here
    assert {f.name for f in fields(SamplerSettings)} == set(KNOB_FIELDS)
    config_fields = {f.name: f for f in fields(AdaGRPOConfig)}
    grpo_fields = {f.name: f for f in fields(GRPOConfig)}
    for name in KNOB_FIELDS:  # one set of defaults: the configs' (TRL's for the knobs TRL owns) are the settings'
        declared = grpo_fields[name] if name in TRL_OWNED_KNOBS else config_fields[name]
        assert declared.default == SETTINGS_DEFAULTS[name], name


@pytest.mark.parametrize("name", sorted(UNREAD_READ_VALUE))
def test_a_knob_the_sampler_does_not_read_raises_and_is_accepted_where_read(tmp_path, name):
    unread, read, value = UNREAD_READ_VALUE[name]
    with pytest.raises(ValueError, match=rf"\b{name}=") as error:
        config(tmp_path, **{**unread, name: value})
    if name != "dapo_refill":  # dapo_refill=True with uniform contradicts it, and says so with its own message
        assert "has no effect with" in str(error.value) and f"Remove {name}" in str(error.value)
    args = config(tmp_path, **{**read, name: value})
    assert getattr(args, name) == value


def test_the_config_docstring_and_help_are_the_knob_declarations():
    # The hand-written docstring documents every knob with its default and its --help text, so the two cannot drift.
    from transformers import HfArgumentParser

    from trl_ada.samplers.settings import SamplerFields

    doc = " ".join(AdaGRPOConfig.__doc__.split())
    parser_help = " ".join(HfArgumentParser(AdaGRPOConfig).format_help().split())
    for declared in fields(SamplerFields):
        help_text = " ".join(declared.metadata["help"].split())
        shown = f'"{declared.default}"' if isinstance(declared.default, str) else repr(declared.default)
        assert f"{declared.name} (" in doc and f"defaults to `{shown}`" in doc, declared.name
        assert help_text in doc, declared.name
        assert help_text.split("`")[0][:40] in parser_help, declared.name
    # the config's own knobs too, and nothing is documented twice
    for name in ADA_ONLY_FIELDS:
        assert doc.count(f" {name} (") == 1, name


def test_the_schedule_choices_are_the_schedules_there_are():
    from trl_ada.samplers.simulate import GENERATION_SCHEDULES
    from trl_ada.schedules import SCHEDULES

    declared = AdaGRPOConfig.__dataclass_fields__["generation_schedule"].metadata
    assert tuple(SCHEDULES) == GENERATION_SCHEDULES == tuple(declared["choices"])


def test_the_sampler_help_names_every_built_in_sampler_and_every_one_that_takes_sampler_kwargs():
    from trl_ada.samplers.registry import load_plugins

    # The core's samplers and trl-ada's experimental plug-ins.
    built_in = {name: cls for name, cls in load_plugins().items() if cls.__module__.startswith("trl_ada.")}
    assert {"uniform", "dapo", "knapsack", "dapo_gated", "spo"} <= set(built_in)
    sampler_help = KNOB_FIELDS["sampler"].metadata["help"]
    kwargs_help = KNOB_FIELDS["sampler_kwargs"].metadata["help"]
    for name, cls in built_in.items():
        assert f'`"{name}"`' in sampler_help, name
        if set(option_fields(cls.Options)) - set(KNOB_FIELDS):
            assert f'`"{name}"`' in kwargs_help and f"{cls.Options.__module__}.{cls.Options.__name__}" in kwargs_help


@pytest.mark.parametrize("learning_rate", [-1e-4, float("nan"), float("inf")])
def test_a_learning_rate_that_cannot_train_is_refused_in_the_config(tmp_path, learning_rate):
    with pytest.raises(ValueError, match="positive, finite learning rate"):
        AdaGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, learning_rate=learning_rate)
    assert AdaGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, learning_rate=0.0).learning_rate == 0.0
