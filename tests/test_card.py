"""The Reinforce-Ada model card, plots and metrics files, and what push_to_hub uploads (no network)."""

import contextlib
import re
from pathlib import Path
from unittest import mock

import pytest
from conftest import TINY_MODEL_KWARGS, starts_low_digit, tiny_args
from huggingface_hub import ModelCard

from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
from trl_ada.samplers.base import describe
from trl_ada.tiny import build_tiny_model


@pytest.fixture
def trained(tmp_path, tokenizer, arithmetic_dataset):
    config = AdaGRPOConfig(
        **tiny_args(tmp_path / "out", max_steps=3), sampler="seq_balance", round_size=4, max_rounds=3
    )
    model = build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS)
    trainer = AdaGRPOTrainer(
        model, [starts_low_digit], args=config, train_dataset=arithmetic_dataset, processing_class=tokenizer
    )
    trainer.train()
    return trainer


def test_card_renders_real_numbers_and_parses(trained):
    trained.create_model_card(model_name="tiny-ada", dataset_name="local/arithmetic")
    out = Path(trained.args.output_dir)
    card = ModelCard.load(out / "README.md")
    assert set(card.data.tags) >= {"trl", "grpo", "reinforce-ada", "generated_from_trainer"}
    assert card.data.datasets == ["local/arithmetic"] and card.data.library_name == "transformers"
    assert "licence" not in card.data.to_dict()  # TRL's `licence: license` placeholder
    text = card.text
    flat = " ".join(text.split())
    assert "on the dataset [local/arithmetic](https://huggingface.co/datasets/local/arithmetic), rewarded by " in flat
    assert "`starts_low_digit`." in flat
    assert "## Reinforce-Ada" in text and "| `sampler` | seq_balance |" in text and "| `round_size` | 4 |" in text
    assert "| `train_on` | downsample |" in text  # the trainer's knob, shown after the sampler's
    logged = [e for e in trained.state.log_history if "loss" in e]
    mean_samples = sum(e["ada/samples_per_prompt/mean"] for e in logged) / len(logged)
    row = re.search(r"completions drawn per prompt \(mean\) \| ([0-9.]+) \|", text)
    assert row and float(row.group(1)) == pytest.approx(mean_samples, rel=1e-3)
    assert "arXiv:2510.04996" in text and "vonwerra2020trl" in text
    for stem in ("reward", "samples_per_prompt", "zero_variance_share"):
        assert (out / "plots" / f"{stem}.png").stat().st_size > 1000
        assert f"(plots/{stem}.png)" in text
    assert (out / "metrics.csv").read_text().splitlines()[0].startswith("step,")
    assert len((out / "metrics.csv").read_text().splitlines()) == 1 + len(logged)
    # seq_balance with round_policy="fixed" reads no pass-rate estimate: no reliability diagram
    assert not any("pass_rate_predictor/bin_" in key for entry in logged for key in entry)
    assert not (out / "plots" / "pass_rate_calibration.png").exists() and "pass_rate_calibration" not in text


def test_push_to_hub_uploads_model_card_and_plots(trained):
    uploads = []

    class FakeApi:
        def create_repo(self, repo_id, **kwargs):
            return mock.Mock(repo_id=f"someone/{repo_id}")

        def upload_folder(self, repo_id, folder_path, ignore_patterns=(), **kwargs):
            files = sorted(p.relative_to(folder_path).as_posix() for p in Path(folder_path).rglob("*") if p.is_file())
            uploads.append({"repo_id": repo_id, "files": files, "ignore": ignore_patterns})
            return "https://example.invalid/commit"

    trained.args.hub_model_id = "tiny-ada"
    import transformers.trainer

    if hasattr(transformers.trainer, "hf_api"):  # transformers >= 5.10.1
        patches = [mock.patch("transformers.trainer.hf_api", return_value=FakeApi())]
    else:  # older releases import huggingface_hub's functions by name
        api = FakeApi()
        patches = [
            mock.patch(f"transformers.trainer.{name}", getattr(api, name)) for name in ("create_repo", "upload_folder")
        ]
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        trained.push_to_hub(blocking=True, license="apache-2.0")  # transformers passes it to create_model_card
    (upload,) = uploads
    assert upload["repo_id"] == "someone/tiny-ada"
    assert {"README.md", "model.safetensors", "config.json", "plots/reward.png", "metrics.json"} <= set(
        upload["files"]
    )
    card = ModelCard.load(Path(trained.args.output_dir) / "README.md")
    assert "someone/tiny-ada" in card.text  # the quick start points at the pushed repo
    assert card.data.license == "apache-2.0" and card.data.pipeline_tag == "text-generation"
    with pytest.raises(ValueError, match="not a Hub license id.*'apache-2.0'"):
        trained.push_to_hub(blocking=True, license="Apache 2.0")  # refused before anything is written or pushed
    assert len(uploads) == 1


# ---------------------------------------------------------------------------------------------------------------------
# Metrics logged as None (or NaN) are skipped by every reader of log_history
# ---------------------------------------------------------------------------------------------------------------------

NONE_HISTORY = [
    {
        "step": 1,
        "loss": 0.1,
        "reward": None,
        "ada/pool_reward/mean": None,
        "ada/samples_per_prompt/mean": 8.0,
        "ada/samples_per_prompt/max": None,
        "ada/zero_variance_share/first_n": None,
        "ada/zero_variance_share/kept": 0.5,
    },
    {
        "step": 2,
        "loss": 0.2,
        "reward": 0.5,
        "ada/pool_reward/mean": float("nan"),
        "ada/samples_per_prompt/mean": None,
        "ada/samples_per_prompt/max": 16,
        "ada/zero_variance_share/first_n": 0.25,
        "ada/zero_variance_share/kept": None,
    },
    {"step": 3, "loss": 0.3, "reward": None, "ada/samples_per_prompt/mean": 12.0},
    {"step": 3, "eval_heldout_accuracy": None},
]


def render(tmp_path, log_history=(), **overrides):
    """The card `AdaGRPOTrainer.create_model_card` would render, without a training run."""
    from huggingface_hub import ModelCardData

    from trl_ada.reporting.card import render_model_card
    from trl_ada.samplers import SamplerSettings

    kwargs = dict(
        settings=SamplerSettings(num_generations=4, scale_rewards="none", seed=0),
        log_history=list(log_history),
        plots=[],
        output_dir=tmp_path,
        model_name="tiny-ada",
        hub_model_id=None,
        paper=AdaGRPOTrainer._paper,
    )
    kwargs.update(overrides)
    return render_model_card(kwargs.pop("card_data", ModelCardData()), **kwargs)


def test_none_metrics_are_skipped_by_plots_metrics_and_card(tmp_path):
    from trl_ada.reporting.plots import training_entries, write_metrics, write_training_plots

    json_path, csv_path = write_metrics(NONE_HISTORY, tmp_path)
    assert json_path.is_file() and len(csv_path.read_text().splitlines()) == 1 + 3
    plots = write_training_plots(NONE_HISTORY, tmp_path)  # crashed on math.isnan(None) at a checkpoint save
    assert {Path(path).stem for _, path in plots} == {"reward", "samples_per_prompt", "zero_variance_share"}
    from trl_ada.reporting.plots import logged_series

    entries = training_entries(NONE_HISTORY)
    assert logged_series(entries, "reward") == [(2, 0.5)]  # None at steps 1 and 3 skipped
    assert logged_series(entries, "ada/pool_reward/mean") == []  # None and NaN alike

    # A plot whose every point is None is not drawn at all.
    all_none = [{**entry, "reward": None} for entry in NONE_HISTORY]
    assert "reward" not in {Path(path).stem for _, path in write_training_plots(all_none, tmp_path / "none")}

    text = render(tmp_path, NONE_HISTORY).text
    assert "| completions drawn per prompt (mean) | 10 |" in text  # mean of 8 and 12; step 2's None skipped
    assert "| completions drawn per prompt (largest) | 16 |" in text
    assert "(what GRPO would train on) | 0.25 |" in text
    assert "| zero-variance groups in the kept update groups | 0.5 |" in text
    assert "| `reward` | n/a |" in text and "| `eval_heldout_accuracy` | n/a |" in text
    assert "None" not in text


def calibration_history():
    """Two logged steps of reliability bins: bin 1 has 10 + 30 draws predicted 0.15, 8 of them positive."""
    bins = [
        {"step": 1, "loss": 0.1, "bin_1": (10, 1, 1.5), "bin_8": (6, 6, 5.1)},
        {"step": 2, "loss": 0.2, "bin_1": (30, 7, 4.5), "bin_8": (0, 0, 0.0)},
    ]
    history = []
    for entry in bins:
        logged = {"step": entry["step"], "loss": entry["loss"]}
        for b in range(10):
            draws, positives, predicted = entry.get(f"bin_{b}", (0, 0, 0.0))
            logged |= {
                f"ada/pass_rate_predictor/bin_{b}/draws": float(draws),
                f"ada/pass_rate_predictor/bin_{b}/positives": float(positives),
                f"ada/pass_rate_predictor/bin_{b}/predicted": predicted,
            }
        history.append(logged)
    return history


def test_the_reliability_diagram_sums_the_bins_over_the_run_and_the_card_shows_it(tmp_path):
    from trl_ada.reporting.plots import CALIBRATION_TITLE, calibration_table, training_entries, write_training_plots

    history = calibration_history()
    assert calibration_table(training_entries(history)) == [
        (1, pytest.approx(0.15), pytest.approx(8 / 40), 40.0),
        (8, pytest.approx(0.85), 1.0, 6.0),
    ]
    plots = write_training_plots(history, tmp_path)
    path = tmp_path / "plots" / "pass_rate_calibration.png"
    assert (CALIBRATION_TITLE, path) in plots and path.stat().st_size > 1000
    text = render(tmp_path, history, plots=plots).text
    assert "(plots/pass_rate_calibration.png)" in text and "on the diagonal the estimates are calibrated" in text
    # without the bins (NONE_HISTORY): neither the file nor the link
    bare = write_training_plots(NONE_HISTORY, tmp_path / "bare")
    assert not (tmp_path / "bare" / "plots" / "pass_rate_calibration.png").exists()
    assert "pass_rate_calibration" not in render(tmp_path / "bare", NONE_HISTORY, plots=bare).text


# ---------------------------------------------------------------------------------------------------------------------
# Base model and quick start
# ---------------------------------------------------------------------------------------------------------------------

QUICK_START = re.compile(r'pipeline\("text-generation", model="([^"]+)"\)')


def test_card_from_a_local_base_model_names_it_and_quick_starts_from_the_local_copy(tmp_path, tiny_model_dir):
    out = tmp_path / "out"
    out.mkdir()
    card = render(tmp_path, output_dir=out, base_model_name_or_path=str(tiny_model_dir))
    assert f"fine-tuned version of the local model `{tiny_model_dir.resolve().as_posix()}`" in card.text
    assert card.data.base_model is None  # the Hub's metadata only takes Hub ids, as in TRL's own card
    (local,) = QUICK_START.findall(card.text)  # no Hub id: the output folder by its name, no placeholder
    assert local == "out" and "path/to/model" not in card.text


def test_card_with_a_hub_id_quick_starts_from_the_hub_and_the_local_copy(tmp_path):
    from huggingface_hub import ModelCardData

    card = render(
        tmp_path,
        card_data=ModelCardData(base_model="Qwen/Qwen2.5-0.5B"),
        hub_model_id="someone/tiny-ada",
        base_model_name_or_path="Qwen/Qwen2.5-0.5B",
    )
    assert "fine-tuned version of [Qwen/Qwen2.5-0.5B](https://huggingface.co/Qwen/Qwen2.5-0.5B)" in card.text
    assert QUICK_START.findall(card.text) == ["someone/tiny-ada"]
    assert tmp_path.resolve().as_posix() not in card.text  # no absolute local path


def test_card_of_the_embedded_run_names_the_shipped_tiny_model(tmp_path):
    from trl_ada.tiny import TINY_ARITH_ASSETS, TINY_ARITH_VERSION

    card = render(tmp_path, base_model_name_or_path=str(TINY_ARITH_ASSETS))
    assert f"fine-tuned version of trl-ada's shipped tiny arithmetic model `{TINY_ARITH_VERSION}`" in card.text


def test_quick_start_of_a_trained_card_runs_from_the_output_directory(trained, monkeypatch):
    trained.save_model()
    trained.create_model_card(model_name="tiny-ada")
    out = Path(trained.args.output_dir)
    text = ModelCard.load(out / "README.md").text
    snippet = text.split("## Quick start", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    assert QUICK_START.findall(snippet) == [out.name]  # was the absolute path of the machine that trained it
    monkeypatch.chdir(out.parent)
    exec(compile(snippet, "quick_start", "exec"), {})  # the snippet as a reader would paste it


# ---------------------------------------------------------------------------------------------------------------------
# What the card links, and a run that logged no step
# ---------------------------------------------------------------------------------------------------------------------

LINK = re.compile(r"\]\((https?://[^)\s]+)\)")


def test_card_links_only_addresses_that_exist(tmp_path, monkeypatch):
    from trl_ada.reporting import card as card_module

    # trl-ada's metadata names no home page: the card names the package and its version, and links nothing for it.
    monkeypatch.setattr(card_module, "package_url", lambda distribution="trl-ada": None)
    text = render(tmp_path).text
    assert "github.com/trl-ada" not in text
    assert {url.split("/")[2] for url in LINK.findall(text)} <= {"github.com", "huggingface.co"}
    assert [url for url in LINK.findall(text) if "github.com" in url] == ["https://github.com/huggingface/trl"]
    assert "using [TRL](https://github.com/huggingface/trl) and trl-ada 0.1.0, with" in text
    # A home page the package's metadata declares is linked.
    monkeypatch.setattr(card_module, "package_url", lambda distribution="trl-ada": "https://example.org/trl-ada")
    assert "and [trl-ada](https://example.org/trl-ada), with" in render(tmp_path).text


def test_package_url_reads_the_distribution_metadata():
    from importlib.metadata import metadata

    from trl_ada.reporting.card import package_url

    assert package_url("trl") == "https://github.com/huggingface/trl"  # TRL's Project-URL
    assert package_url("no-such-distribution-here") is None
    declared = metadata("trl-ada").get("Home-page") or metadata("trl-ada").get_all("Project-URL")
    assert (package_url("trl-ada") is None) == (not declared)


def test_card_of_a_run_that_logged_no_step_says_so(tmp_path):
    text = render(tmp_path, []).text
    assert "No training step was logged" in text
    assert "statistic over 0 training steps" not in text and "completions drawn per prompt" not in text
    one = [{"step": 3, "loss": 0.1, "ada/samples_per_prompt/mean": 6.0}]
    assert "statistic over 3 training steps (mean of 1 logged value) |" in render(tmp_path, one).text


# ---------------------------------------------------------------------------------------------------------------------
# What the sampler did, what the data were, and the Hub metadata
# ---------------------------------------------------------------------------------------------------------------------


def procedure(text: str) -> str:
    return text.split("## Training procedure", 1)[1].split("## Reinforce-Ada", 1)[0]


@pytest.mark.parametrize(
    "sampler, says",
    [
        ("uniform", ["plain GRPO: 4 completions per prompt in one generate call, all trained on", "group's mean"]),
        ("seq_pos", ["drawn in rounds", "until its pool holds 1 positive or reaches 32", "(its whole pool)"]),
        ("seq_balance", ["drawn in rounds", "until its pool holds 2 positives and 2 negatives", "(its whole pool)"]),
        ("est", ["Reinforce-Ada-Est", "proportional to p̂^-0.5", "clipped to [2, 16]", "every completion drawn"]),
        ("dapo", ["DAPO's dynamic sampling: 4 completions per prompt", "refilled", "at most 10 extra generation"]),
    ],
)
def test_the_card_describes_the_sampler_the_run_used(tmp_path, sampler, says):
    from trl_ada.samplers import SamplerSettings

    settings = SamplerSettings(sampler=sampler, num_generations=4, seed=0).validated()
    text = procedure(render(tmp_path, settings=settings).text)
    assert describe(settings) in text and f"Sampler `{sampler}`" in text
    for phrase in says:
        assert phrase in text, phrase
    if sampler in ("uniform", "dapo", "est"):
        # The old card said "draws completions in rounds ... whole pool's mean reward as baseline" for every sampler.
        assert "round" not in text and "pool's mean" not in text
    if sampler in ("uniform", "dapo"):
        assert "pool" not in text


def test_a_plug_in_sampler_is_named_by_its_class_unless_it_describes_itself(tmp_path, monkeypatch):
    from dataclasses import dataclass

    from trl_ada.samplers import SamplerSettings
    from trl_ada.samplers.registry import SAMPLERS
    from trl_ada.samplers.sequential import SeqBalanceOptions, SeqBalanceSampler

    class CardPlugin(SeqBalanceSampler):  # draws as it likes; inherits seq_balance's description
        name = "card_plugin"

    @dataclass(kw_only=True)
    class DescribedOptions(SeqBalanceOptions):
        def describe(self, settings):
            return "Completions drawn by a rule of its own."

    class DescribedPlugin(SeqBalanceSampler):
        name = "described_plugin"
        Options = DescribedOptions

    monkeypatch.setitem(SAMPLERS, "card_plugin", CardPlugin)
    monkeypatch.setitem(SAMPLERS, "described_plugin", DescribedPlugin)
    text = procedure(render(tmp_path, settings=SamplerSettings(sampler="card_plugin", num_generations=4)).text)
    assert f"plug-in sampler `test_card.{CardPlugin.__qualname__}` (registered as `card_plugin`)" in text
    assert "which does not describe its rule" in text and "round" not in text and "pool" not in text
    text = procedure(render(tmp_path, settings=SamplerSettings(sampler="described_plugin", num_generations=4)).text)
    assert "Completions drawn by a rule of its own." in text


def test_front_matter_has_the_hub_ids_the_run_knows_and_no_placeholder(tmp_path):
    from huggingface_hub import ModelCardData

    # A base model loaded from the Hugging Face cache, whose own card declares a license; a Hub and a local dataset.
    snapshot = tmp_path / "hub" / "models--Qwen--Qwen2.5-0.5B" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "README.md").write_text("---\nlicense: apache-2.0\n---\n# Qwen2.5\n")
    local = tmp_path / "math.jsonl"
    local.write_text("{}")
    trl_data = ModelCardData(  # as TRL's generate_model_card writes it
        base_model=None,
        datasets=["open-r1/OpenR1-Math-220k", str(local)],
        library_name="transformers",
        licence="license",
        model_name="tiny-ada",
        tags=["generated_from_trainer", "trl", "grpo", "reinforce-ada"],
    )
    card = render(tmp_path, card_data=trl_data, base_model_name_or_path=str(snapshot), reward_names=["math_verify"])
    data = card.data.to_dict()
    assert data["base_model"] == "Qwen/Qwen2.5-0.5B" and data["license"] == "apache-2.0"
    assert data["pipeline_tag"] == "text-generation"
    chosen = render(tmp_path, card_data=trl_data, base_model_name_or_path=str(snapshot), license="mit")
    assert ModelCard(chosen.content).data.license == "mit"  # the user's license wins over the base model's
    assert data["datasets"] == ["open-r1/OpenR1-Math-220k"]  # the Hub rejects local paths there
    assert data["library_name"] == "transformers" and "reinforce-ada" in data["tags"] and "licence" not in data
    text = " ".join(card.text.split())
    assert (
        "fine-tuned version of [Qwen/Qwen2.5-0.5B](https://huggingface.co/Qwen/Qwen2.5-0.5B) on the datasets " in text
    )
    assert "(https://huggingface.co/datasets/open-r1/OpenR1-Math-220k) and `math.jsonl` (a local file)" in text
    assert "rewarded by `math_verify`." in text
    assert str(tmp_path) not in card.content  # no absolute path anywhere, front matter included

    # Nothing known: no base model, no datasets, and no license key at all.
    bare = render(tmp_path, card_data=ModelCardData(licence="license", library_name="transformers")).content
    front_matter = bare.split("---")[1]
    assert "licence" not in front_matter and "license" not in front_matter and "datasets" not in front_matter


def test_the_card_says_what_the_data_were_from_the_datasets_own_description(tmp_path):
    from trl_ada.tiny import TINY_ARITH_ASSETS

    card = render(
        tmp_path,
        base_model_name_or_path=str(TINY_ARITH_ASSETS),
        data_description="trl-ada's embedded arithmetic task (20000 fresh problems of graded difficulty)",
        reward_names=["exact_match_reward"],
    )
    text = " ".join(card.text.split())
    assert "(`trl_ada.tiny.load_tiny_arith_model()`) on trl-ada's embedded arithmetic task (20000 fresh" in text
    assert "of graded difficulty), rewarded by `exact_match_reward`." in text


def test_the_command_lines_license_reaches_the_card_whose_header_huggingface_hub_reads(tmp_path):
    """`trl-ada train --license` sets the card's `license` (an id the Hub would not take stops the run before any
    model loads), and the header parses with huggingface_hub (`metadata_load`, `ModelCardData`) with the fields a
    Hub push needs, each of the form the Hub takes."""
    import os
    import subprocess
    import sys

    from huggingface_hub import ModelCardData, metadata_load
    from huggingface_hub.utils import validate_repo_id

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    output = tmp_path / "run"
    command = [sys.executable, "-m", "trl_ada.cli", "train", "--output_dir", str(output)]
    refused = subprocess.run(
        [*command, "--license", "Apache 2.0"], capture_output=True, text=True, env=env, timeout=300
    )
    assert refused.returncode != 0 and "not a Hub license id" in refused.stderr, refused.stderr[-2000:]
    assert "Loading weights" not in refused.stderr and not output.exists()  # refused before anything ran
    short = ["--max_steps", "1", "--heldout_size", "0", "--arithmetic_train_size", "64", "--license", "mit"]
    result = subprocess.run([*command, *short], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    header = metadata_load(output / "README.md")
    assert header == ModelCard.load(output / "README.md").data.to_dict()
    data = ModelCardData(**header)
    assert data.license == "mit" and data.pipeline_tag == "text-generation" and data.library_name == "transformers"
    for repo_id in [*([data.base_model] if data.base_model else []), *(data.datasets or [])]:
        validate_repo_id(repo_id)  # no local path: the Hub rejects those in base_model and datasets


@pytest.mark.parametrize("license_id", ["not-a-license", "Apache-2.0", "apache 2.0", "gpl-4.0"])
def test_a_license_the_hub_does_not_list_is_refused_with_the_nearest(license_id):
    from trl_ada.reporting.card import HUB_LICENSES, check_license

    with pytest.raises(ValueError, match="is not a Hub license id"):
        check_license(license_id)
    for accepted in ("apache-2.0", "mit", "llama3.1", "cc-by-nc-sa-4.0", "other"):
        assert accepted in HUB_LICENSES
        check_license(accepted)
