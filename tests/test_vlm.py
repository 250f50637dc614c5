"""AdaGRPOTrainer on a tiny vision-language model (Qwen2-VL architecture, built in code; see `tiny_vlm.py`).

Each dataset row shows a solid-colour image with the same question, so only the image tells rows apart: a kept row that
lost its image, or took another row's, shows up as a wrong colour or a wrong reward.
"""

from pathlib import Path

import pytest
import torch
from conftest import launch_two_processes, tiny_args
from tiny_vlm import (
    build_processor,
    build_tiny_vlm,
    colour_dataset,
    colour_fingerprint,
    contains_colour_letter,
    kept_row_problems,
    recording,
)
from trl import GRPOConfig, GRPOTrainer

from trl_ada import AdaGRPOConfig, AdaGRPOTrainer

SCRIPT = Path(__file__).parent / "vlm_run.py"


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # The models are tiny: a second intra-op thread only adds synchronisation, which costs ~100x when the other core
    # is busy (a matmul of 700x32 by 32x64 takes 16 ms on 2 threads under load, 0.1 ms on 1).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def processor():
    return build_processor()


def train(trainer_class, config, processor, dataset, reward_funcs):
    model, _ = build_tiny_vlm(processor, seed=0)
    trainer = recording(trainer_class)(
        model, reward_funcs, args=config, train_dataset=dataset, processing_class=processor
    )
    trainer.train()
    return trainer


def losses(trainer):
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def test_grpo_trainer_trains_the_tiny_vlm(tmp_path, processor):
    # The test bed itself: TRL's own trainer generates from the images and updates every weight, vision tower included.
    config = GRPOConfig(**tiny_args(tmp_path, max_completion_length=8, max_steps=2))
    model, _ = build_tiny_vlm(processor, seed=0)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer = recording(GRPOTrainer)(
        model, [contains_colour_letter], args=config, train_dataset=colour_dataset(8), processing_class=processor
    )
    trainer.train()
    assert len(losses(trainer)) == 2
    unchanged = [name for name, p in trainer.model.named_parameters() if torch.equal(p, before[name])]
    assert unchanged == []
    for record in trainer.recorded:
        assert record["pixel_values"].shape == (8 * 4, 1176)  # 4 patches of 14x14x3x2 per 28x28 image
        assert record["image_grid_thw"].tolist() == [[1, 2, 2]] * 8
        assert record["num_images"] == [1] * 8
    assert all(call["pixels_match"] for call in trainer.generated)


def test_uniform_reproduces_grpo_trainer_on_a_vlm(tmp_path, processor):
    common = tiny_args(tmp_path, max_completion_length=8, max_steps=3)
    dataset = colour_dataset(8)
    grpo = train(GRPOTrainer, GRPOConfig(**common), processor, dataset, [contains_colour_letter])
    ada = train(
        AdaGRPOTrainer, AdaGRPOConfig(**common, sampler="uniform"), processor, dataset, [contains_colour_letter]
    )
    assert len(grpo.recorded) == len(ada.recorded) == 3
    for expected, actual in zip(grpo.recorded, ada.recorded, strict=True):
        assert expected.keys() == actual.keys()
        for key in ("completion_ids", "completion_mask", "advantages", "pixel_values", "image_grid_thw"):
            assert torch.equal(expected[key], actual[key]), key
        assert torch.equal(expected["mm_token_type_ids"], actual["mm_token_type_ids"])
        assert expected["num_images"] == actual["num_images"]
    assert any(record["advantages"].abs().sum() > 0 for record in ada.recorded)
    assert [call["rows"] for call in grpo.generated] == [call["rows"] for call in ada.generated]
    assert losses(grpo) == losses(ada)
    for (name, expected), actual in zip(grpo.model.named_parameters(), ada.model.parameters(), strict=True):
        assert torch.equal(actual, expected), name
    assert kept_row_problems(ada.generated, ada.handed_over, processor.image_processor, ada.recorded) == []


@pytest.mark.parametrize("column", ["image", "images"])
def test_seq_balance_keeps_each_row_with_its_own_image_and_reward(tmp_path, processor, column):
    config = AdaGRPOConfig(
        **tiny_args(tmp_path, max_completion_length=8, max_steps=3, per_device_train_batch_size=16),
        reward_weights=[1.0, 0.0],
        sampler="seq_balance",
        round_size=4,
        max_rounds=4,
    )
    dataset = colour_dataset(8, column=column)
    trainer = train(AdaGRPOTrainer, config, processor, dataset, [contains_colour_letter, colour_fingerprint])
    assert len(losses(trainer)) == 3
    # The rounds drew more than n for some prompt (else this would test a plain GRPO batch) ...
    assert any(size > 4 for pools in trainer.pools for size in pools), trainer.pools
    # ... and every row handed to TRL's loss is a completion generated from its own prompt's image, scored on it.
    assert [len(rows) for rows in trainer.handed_over] == [16, 16, 16]
    assert kept_row_problems(trainer.generated, trainer.handed_over, processor.image_processor, trainer.recorded) == []
    # Every prompt of a batch shows a different colour, and each keeps n rows.
    for rows in trainer.handed_over:
        colours = [row["colour"] for row in rows]
        assert sorted(colours.count(colour) for colour in set(colours)) == [4, 4, 4, 4]


@pytest.mark.slow
def test_seq_balance_on_two_processes_keeps_rows_with_their_images(tmp_path):
    reports = launch_two_processes(SCRIPT, tmp_path, timeout=300)
    assert [(r["num_processes"], r["process_index"]) for r in reports] == [(2, 0), (2, 1)]
    # A kept row may have been generated on the other process: look its generation up in both processes' records.
    generated = [call for report in reports for call in report["generated"]]
    for report in reports:
        assert report["losses"] and len(report["losses"]) == 3
        assert [len(rows) for rows in report["handed_over"]] == [8, 8, 8]  # per_device_train_batch_size
        assert kept_row_problems(generated, report["handed_over"]) == []
        assert report["loss_inputs_line_up"] == [[]] * 3  # pixel values, grids and completions, checked in-process
    assert reports[0]["pools"] == reports[1]["pools"]
    assert any(size > 4 for pools in reports[0]["pools"] for size in pools), reports[0]["pools"]
    assert all(moved is not None for moved in reports[0]["moved"])
    assert any(moved > 0 for moved in reports[0]["moved"])  # some kept rows changed process
    assert reports[0]["weights"] == reports[1]["weights"]
    assert reports[0]["weights"] != reports[0]["initial_weights"]
