"""`replay="successes"`: a prompt whose draws all came back wrong trains on its latest stored correct completion."""

import json
import math
import os

import pytest
from conftest import TINY_MODEL_KWARGS, FirstCompletionRight, tiny_args
from datasets import Dataset
from test_trainer import recording

from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
from trl_ada.checkpoints import CheckpointError
from trl_ada.samplers import SamplerSettings, build_sampler
from trl_ada.samplers.dapo import BatchFiller
from trl_ada.samplers.signal import trl_advantages_stand_in
from trl_ada.schedules.replay_rows import REPLAY_ROWS_NAME, load_replay_rows
from trl_ada.tiny import build_tiny_model


def replaying(**overrides):
    return build_sampler(
        SamplerSettings(**({"sampler": "uniform", "num_generations": 4, "replay": "successes"} | overrides))
    )


def step(sampler, keys, rewards):
    current = sampler.begin(len(keys), keys)
    requests = current.requests()
    current.observe(requests, [reward for group in rewards for reward in group])
    return current.finish()


def scaled(values, std):
    return tuple(v / (std + 1e-4) for v in values)


def test_an_all_wrong_group_trains_on_its_stored_success_in_place_of_its_last_draw():
    sampler = replaying()
    first = step(sampler, ["a", "b"], [[0, 1, 1, 0], [0, 0, 0, 0]])
    assert first.replay_stored == (2, None)  # the latest positive draw of "a"; "b" has none
    assert all(result.replayed is None for result in first.prompts)
    second = step(sampler, ["a", "b"], [[0, 0, 0, 0], [0, 0, 0, 0]])
    a, b = second.prompts
    assert a.kept == (0, 1, 2, 4) and a.replayed == (1, 1.0)  # index 4: no draw of this pool
    # The pool baseline reads the pool and the replayed success: [0, 0, 0, 0, 1], mean 0.2, sample std sqrt(0.2).
    assert a.baseline == pytest.approx(0.2)
    assert a.advantages == pytest.approx(scaled((-0.2, -0.2, -0.2, 0.8), math.sqrt(0.2)))
    assert a.pass_rate == 0.0  # the pass rate counts the prompt's own draws only
    assert b.replayed is None and not b.has_signal and b.advantages == (0.0,) * 4
    # Drawn 8, trained 3 of a's own draws: the replayed success is no draw.
    assert second.metrics["draws/drawn_total"] == 8 and second.metrics["draws/trained_total"] == 3
    kept_rewards = [result.kept_rewards(pool) for result, pool in zip(second.prompts, second.pools)]
    advantages = [result.advantages for result in second.prompts]
    assert not trl_advantages_stand_in(sampler.settings, "downsample", kept_rewards, advantages)


def test_the_group_baseline_reads_the_trained_group_with_its_replayed_success():
    sampler = replaying(baseline="group")
    step(sampler, ["a"], [[1, 0, 0, 0]])
    replayed = step(sampler, ["a"], [[0, 0, 0, 0]]).prompts[0]
    assert replayed.baseline == 0.25
    assert replayed.advantages == pytest.approx(scaled((-0.25, -0.25, -0.25, 0.75), 0.5))


@pytest.mark.parametrize(
    ("later", "why"),
    [([[0, 1, 0, 0]], "a positive of its own"), ([[math.nan] * 4], "nothing scorable")],
)
def test_a_group_with_a_positive_or_nothing_scorable_is_not_replayed(later, why):
    sampler = replaying()
    step(sampler, ["a"], [[1, 0, 0, 0]])
    assert step(sampler, ["a"], later).prompts[0].replayed is None, why


def test_the_index_is_bounded_ages_by_generation_batch_and_resumes_from_json():
    sampler = replaying(replay_buffer_size=2)
    step(sampler, ["a", "b"], [[1, 0, 0, 0], [1, 0, 0, 0]])
    step(sampler, ["c"], [[0, 0, 1, 0]])
    assert list(sampler.replay.stored) == ["b", "c"]  # "a", stored first, is forgotten first
    resumed = replaying(replay_buffer_size=2)
    resumed.load_state_dict(json.loads(json.dumps(sampler.state_dict())))
    step(resumed, ["x"], [[0, 0, 0, 0]])  # another generation batch
    assert step(resumed, ["b"], [[0, 0, 0, 0]]).prompts[0].replayed == (3, 1.0)
    assert step(resumed, ["a"], [[0, 0, 0, 0]]).prompts[0].replayed is None


def test_dapo_keeps_an_all_wrong_group_that_replays_a_success_instead_of_refilling():
    sampler = replaying(sampler="dapo", num_generations=2)
    step(sampler, ["a"], [[1, 0]])
    later = step(sampler, ["a", "z"], [[0, 0], [0, 0]])
    assert [prompt.has_signal for prompt in later.prompts] == [True, False]
    filler = BatchFiller(num_prompts=1)
    filler.add(later)
    assert filler.is_full and filler.take(keep_partial=False) == [(0, 0)]
    assert filler.update_results(sampler.settings)[0].advantages == pytest.approx(
        scaled((-1 / 3, 2 / 3), math.sqrt(1 / 3))
    )


def test_replay_is_refused_where_it_cannot_hold(tmp_path):
    with pytest.raises(ValueError, match="replay='successes' puts a stored success in the place of one"):
        AdaGRPOConfig(**tiny_args(tmp_path), sampler="seq_balance", train_on="pool", replay="successes")
    from trl_ada.async_grpo import AdaAsyncGRPOConfig

    with pytest.raises(ValueError, match="does not replay stored completions"):
        AdaAsyncGRPOConfig(str(tmp_path), replay="successes", use_cpu=True, bf16=False)


DATASET = Dataset.from_list([{"prompt": "12+7="}, {"prompt": "30+4="}])


def replay_trainer(output_dir, tokenizer, reward=None, **overrides):
    config = AdaGRPOConfig(**tiny_args(output_dir, **overrides), sampler="uniform", replay="successes")
    model = build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS)
    return recording(AdaGRPOTrainer)(
        model, [reward or FirstCompletionRight()], args=config, train_dataset=DATASET, processing_class=tokenizer
    )


def replayed_rows(trainer):
    """Per recorded step, the rows (prompt ids, completion ids, advantage) of the step's batch, as lists."""
    steps = []
    for record in trainer.recorded:
        steps.append(
            [
                (prompt.tolist(), completion.tolist(), advantage)
                for prompt, completion, advantage in zip(
                    record["prompt_ids"], record["completion_ids"], record["advantages"].tolist(), strict=True
                )
            ]
        )
    return steps


def test_the_trainer_trains_the_stored_completion_in_place_of_the_last_wrong_draw(tmp_path, tokenizer):
    trainer = replay_trainer(tmp_path, tokenizer, max_steps=3)
    trainer.train()
    first, *later = replayed_rows(trainer)
    # The very first completion scored is the first row of the first step, the only success of the run.
    success = first[0]
    assert success[2] > 0
    for rows in later:
        # The success's prompt trains on it as the last row of its group: the one row with a positive advantage.
        positive = [row for row in rows if row[2] > 0]
        assert [(row[0], row[1]) for row in positive] == [(success[0], success[1])]
        group = [row for row in rows if row[0] == success[0]]
        assert group[-1][1] == success[1]
    logged = [entry for entry in trainer.state.log_history if "ada/replay/share" in entry]
    assert [entry["ada/replay/share"] for entry in logged] == [0.0, 1 / 8, 1 / 8]
    assert [entry.get("ada/replay/age") for entry in logged][1:] == [1.0, 2.0]
    # Drawn completions only: 8 per step, of which the replayed prompt trains 3 of its own (the other has no signal).
    assert [entry["ada/draws/drawn_total"] for entry in logged] == [8, 8, 8]
    assert [entry["ada/draws/trained_total"] for entry in logged] == [4, 3, 3]


def test_the_stored_completions_are_saved_with_each_checkpoint_and_resumed(tmp_path, tokenizer):
    first = replay_trainer(tmp_path, tokenizer, max_steps=2, save_strategy="steps", save_steps=2)
    first.train()
    checkpoint = tmp_path / "checkpoint-2"
    assert (checkpoint / REPLAY_ROWS_NAME.format(rank=0)).is_file()
    stored = first.ada_replay_rows
    # Wrong on every completion after the resume, so the success the step trains on can only be the stored one.
    never_right = FirstCompletionRight(scored=1)
    resumed = replay_trainer(tmp_path, tokenizer, never_right, max_steps=3, save_strategy="steps", save_steps=2)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.ada_replay_rows.keys() == stored.keys()
    [key] = stored
    assert resumed.ada_replay_rows[key].row.completion_ids.tolist() == stored[key].row.completion_ids.tolist()
    # The resumed step replays the success drawn before the checkpoint.
    [rows] = replayed_rows(resumed)
    assert [row[1] for row in rows if row[2] > 0] == [stored[key].row.completion_ids.tolist()]

    os.remove(checkpoint / REPLAY_ROWS_NAME.format(rank=0))
    missing = replay_trainer(tmp_path, tokenizer, never_right, max_steps=3, save_strategy="steps", save_steps=2)
    with pytest.raises(CheckpointError, match="has no ada_replay_rows_<rank>.json there"):
        missing.train(resume_from_checkpoint=str(checkpoint))


def test_a_checkpoint_inside_a_generation_block_saves_the_index_and_the_completions_of_one_moment(tmp_path, tokenizer):
    """TRL regenerates a generation block on resume, so a checkpoint inside one saves the sampler state from before
    the block; the stored completions it saves must be from that moment too, or the index and the rows disagree."""
    from trl_ada.checkpoints import read_sampler_state

    trainer = replay_trainer(
        tmp_path,
        tokenizer,
        max_steps=2,
        steps_per_generation=2,
        per_device_train_batch_size=4,
        save_strategy="steps",
        save_steps=1,
    )
    trainer.train()
    inside = tmp_path / "checkpoint-1"  # the first optimizer step of a two-step block
    indexed = {key for key, _, _ in read_sampler_state(str(inside))["sampler"]["replay"]["stored"]}
    saved = load_replay_rows(str(inside), 0, "cpu")
    assert set(saved) == indexed == set()  # nothing was stored before the block
    assert trainer.ada_replay_rows  # while the block did store a success


def test_the_card_says_what_was_replayed():
    from trl_ada.samplers.base import describe

    assert 'replay="successes"' in describe(replaying().settings)
    assert "replay" not in describe(replaying(replay="none").settings)


class _WritesAFile:
    """A pickle whose loading would write a file: what a hostile checkpoint on the Hub could hold."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_checkpoint_is_data_a_pickle_in_it_is_refused_not_loaded(tmp_path, tokenizer):
    import pickle

    first = replay_trainer(tmp_path, tokenizer, max_steps=2, save_strategy="steps", save_steps=2)
    first.train()
    checkpoint = tmp_path / "checkpoint-2"
    saved = checkpoint / REPLAY_ROWS_NAME.format(rank=0)
    assert saved.suffix == ".json" and json.loads(saved.read_text())  # plain data
    # An older trl-ada's pickle, replaced by a hostile one, in place of the JSON file.
    os.remove(saved)
    marker = tmp_path / "written_by_the_checkpoint"
    (checkpoint / "ada_replay_rows_0.pkl").write_bytes(pickle.dumps(_WritesAFile(str(marker))))
    resumed = replay_trainer(tmp_path, tokenizer, max_steps=3, save_strategy="steps", save_steps=2)
    with pytest.raises(CheckpointError, match="no longer loads"):
        resumed.train(resume_from_checkpoint=str(checkpoint))
    assert not marker.exists()


def direct_completion_logprob(model, row, temperature):
    """A completion's log-probability under `model`, computed here from the logits: the reference for the trainer's."""
    import torch

    ids = torch.tensor([list(row.prompt_ids) + list(row.completion_ids)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1] / temperature
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    targets = ids[0, 1:]
    start = len(row.prompt_ids) - 1
    return float(logprobs[start:, :].gather(1, targets[start:, None]).sum())


def test_a_replayed_success_is_weighted_by_its_truncated_importance_ratio(tmp_path, tokenizer, monkeypatch):
    """pi_then is the trainer's model's log-probability of the success when it was stored, pi_now when it is replayed;
    the replayed row's advantage is the sampler's times min(1, pi_now / pi_then), whichever engine generated it."""
    from trl_ada.schedules import replay_rows as replay_module

    calls = []
    original = replay_module.sequence_logprobs

    def recorded(trainer, rows):
        values = original(trainer, rows)
        for row, value in zip(rows, values, strict=True):
            # The trainer's computation equals one made here from the model's logits (at TRL's temperature).
            assert value == pytest.approx(direct_completion_logprob(trainer.model, row, trainer.temperature), abs=1e-4)
        if not calls:
            # Pretend the success was far likelier when drawn, so that its replays carry a correction below 1.
            values = [value + math.log(1e3) for value in values]
        calls.append(values)
        return values

    monkeypatch.setattr(replay_module, "sequence_logprobs", recorded)
    trainer = replay_trainer(tmp_path, tokenizer, max_steps=3)
    trainer.train()
    assert len(calls[0]) == 1  # the first step stored one success (its behaviour log-probability)
    replays = 0
    for record, selection in zip(trainer.recorded, trainer.selections, strict=True):
        trained = iter(record["advantages"].tolist())
        for result, pool in zip(selection.prompts, selection.pools, strict=True):
            for index, advantage in zip(result.kept, result.advantages, strict=True):
                got = next(trained)
                if index < len(pool):
                    assert got == pytest.approx(advantage, abs=1e-6)
                    continue
                replays += 1
                # The step's call computed the replayed row's pi_now last; pi_then is the first call's (as stored).
                expected = min(1.0, math.exp(calls[replays][-1] - calls[0][0]))
                assert 0.0 < expected < 1.0 and got == pytest.approx(advantage * expected, rel=1e-4)
    assert replays == 2 and len(calls) == 3
    logged = [entry["ada/replay/weight"] for entry in trainer.state.log_history if "ada/replay/weight" in entry]
    assert logged == pytest.approx([min(1.0, math.exp(call[-1] - calls[0][0])) for call in calls[1:]], rel=1e-4)


def test_a_replayed_row_goes_to_trl_without_its_engines_sampling_logprobs():
    """TRL reads a NaN sampling log-probability as an importance ratio of 1, so its vLLM correction leaves the replayed
    row alone and the one correction is trl-ada's, as for a row transformers generated (which has none)."""
    import numpy as np
    import torch

    from trl_ada.schedules.driver import replayed_row
    from trl_ada.schedules.pools import LocalRow, PoolEntry

    row = LocalRow.from_lists([1, 2], [3, 4, 5], "345", [-0.1, -0.2, -0.3], {})
    entry = PoolEntry(torch.tensor([1.0]), False, 0, row)
    trained = replayed_row(entry)
    assert np.isnan(trained.row.logprobs).all() and len(trained.row.logprobs) == 3
    assert row.logprobs.tolist() == pytest.approx([-0.1, -0.2, -0.3])  # the stored row is left as it was
    without = PoolEntry(torch.tensor([1.0]), False, 0, LocalRow.from_lists([1], [3], "3", None, {}))
    assert replayed_row(without) is without
