"""The Reinforce-Ada model card, plots and metrics files, and what push_to_hub uploads (no network)."""

import re
from pathlib import Path
from unittest import mock

import pytest
from conftest import TINY_MODEL_KWARGS, starts_low_digit, tiny_args
from huggingface_hub import ModelCard

from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
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
    assert set(card.data.tags) >= {"trl", "grpo", "reinforce-ada"}
    assert card.data.datasets in ("local/arithmetic", ["local/arithmetic"])  # as TRL wrote it
    text = card.text
    assert "## Reinforce-Ada" in text and "| `sampler` | seq_balance |" in text and "| `round_size` | 4 |" in text
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
    with mock.patch("transformers.trainer.hf_api", return_value=FakeApi()):
        trained.push_to_hub(blocking=True)
    (upload,) = uploads
    assert upload["repo_id"] == "someone/tiny-ada"
    assert {"README.md", "model.safetensors", "config.json", "plots/reward.png", "metrics.json"} <= set(
        upload["files"]
    )
    card = ModelCard.load(Path(trained.args.output_dir) / "README.md")
    assert "someone/tiny-ada" in card.text  # the quick start points at the pushed repo
