"""What a new user reads on a first run: `--help` texts that say what each flag does, and no notice or warning about
something the user did not choose (accelerate's launch defaults, TRL's own `gradient_checkpointing` default)."""

import logging
import shlex
import warnings
from pathlib import Path

import pytest
from conftest import tiny_args
from test_docs import section, shell_commands

ROOT = Path(__file__).resolve().parents[1]


def test_prepare_data_usage_shows_the_band_ends_flag_readably():
    from trl_ada.cli.prepare_data import build_parser

    usage = " ".join(build_parser("trl-ada prepare-data").format_usage().split())
    assert "[--band_ends ENDS]" in usage and "{,,,}" not in usage
    help_text = " ".join(build_parser("trl-ada prepare-data").format_help().split())
    assert "one of '(]', '[]', '[)', '()'" in help_text


def test_prepare_data_report_help_names_the_file_it_writes():
    from trl_ada.cli.prepare_data import build_parser, default_report_path

    (action,) = [a for a in build_parser()._actions if "--report" in a.option_strings]
    output = Path("data/train.parquet")
    assert default_report_path(output) == Path("data/train.report.json")
    assert f"e.g. {default_report_path(output)} for {output}" in action.help


def test_a_negative_flag_says_what_it_sets_and_shows_no_default_of_its_own():
    from trl_ada.cli.train import make_parser

    parser = make_parser(["--help"])
    help_text = parser.format_help()
    block = help_text.split("  --no_normalize_weights, --no-normalize-weights\n", 1)[1].split("\n  --", 1)[0]
    assert " ".join(block.split()) == "Same as --normalize_weights false."
    for action in parser._actions:
        if action.option_strings[0].startswith("--no_"):
            assert action.help == f"Same as --{action.dest} false.", action.option_strings
    # the flags still work, and the default is the positive flag's
    for argv, expected in (([], True), (["--no_normalize_weights"], False), (["--normalize_weights", "false"], False)):
        training_args = make_parser(argv).parse_args_and_config([*argv, "--use_cpu", "true", "--bf16", "false"])[1]
        assert training_args.normalize_weights is expected, argv


def readme_main_job() -> list[str]:
    """The README's `accelerate launch ...` command, as argv after `accelerate launch`."""
    (command,) = [c for c in shell_commands(section((ROOT / "README.md").read_text(), "Set-up")) if "accelerate" in c]
    launch = command.split("&&")[-1].strip()
    assert launch.startswith("accelerate launch "), launch
    return shlex.split(launch)[2:]


def test_the_readmes_main_job_gives_accelerate_launch_every_value_it_would_fill_in(monkeypatch, caplog, tmp_path):
    from accelerate.commands import launch

    # No `accelerate config` default file on a new user's machine.
    monkeypatch.setattr(launch, "default_config_file", str(tmp_path / "no-default-config.yaml"))
    monkeypatch.chdir(ROOT)
    args = launch.launch_command_parser().parse_args(readme_main_job())
    assert args.training_script == "scripts/train_ada.py"
    caplog.set_level(logging.WARNING)
    args, _, _ = launch._validate_launch_command(args)
    assert "were not passed to `accelerate launch`" not in caplog.text
    assert args.num_processes == 1 and not args.multi_gpu and not args.use_cpu  # one process, on whatever device


def test_the_config_does_not_warn_about_trls_own_gradient_checkpointing_default(tmp_path):
    from trl_ada import AdaGRPOConfig

    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        args = AdaGRPOConfig(**tiny_args(tmp_path))
    assert args.gradient_checkpointing is True  # TRL's default, kept
    assert [str(r.message) for r in records if issubclass(r.category, FutureWarning)] == []
    # A value the user set under the deprecated name is theirs to rename: that warning stays.
    with pytest.warns(FutureWarning, match="`gradient_checkpointing` is deprecated"):
        AdaGRPOConfig(**tiny_args(tmp_path), gradient_checkpointing=False)
