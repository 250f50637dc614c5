"""
`AdaAsyncGRPOTrainer` trains on CPU: TRL's asynchronous trainer with the rollout loop that draws Reinforce-Ada pools,
against the stand-in completions server of `tests/async_fixtures.py` (sampling from the tiny arithmetic model over real
HTTP, its weights synced from the trainer). The worker runs in a thread (`ThreadRolloutWorker`, since TRL's spawned
worker needs vLLM), built by the trainer itself with TRL's own arguments through `rollout_worker_class`.
"""

from __future__ import annotations

import asyncio
import statistics

import pytest
import torch

pytest.importorskip("aiohttp")
async_grpo = pytest.importorskip("trl.experimental.async_grpo")
from trl_ada.trl_seam import async_grpo_private  # noqa: E402

if not async_grpo_private.has_tree_packing():
    pytest.skip("TRL's async trainer trains on CPU from TRL 1.16 (tree packing)", allow_module_level=True)

from async_fixtures import (  # noqa: E402
    FakeCompletionsServer,
    InProcessWeightTransfer,
    ThreadRolloutWorker,
    allow_cpu_training,
    chat_tokenizer,
    conversational,
    cpu_config,
    save_chat_model,
)
from transformers import AutoModelForCausalLM  # noqa: E402
from trl.experimental.async_grpo import async_grpo_trainer as trainer_module  # noqa: E402

from trl_ada import AdaAsyncGRPOConfig, AdaAsyncGRPOTrainer  # noqa: E402
from trl_ada.async_grpo.rollout import AdaRolloutLoop  # noqa: E402
from trl_ada.tasks.arithmetic import exact_match_reward, make_dataset  # noqa: E402
from trl_ada.tiny import load_tiny_arith_model  # noqa: E402


class ThreadAdaWorker(ThreadRolloutWorker):
    """The test stand-in for `AdaAsyncRolloutWorker`: the same loop, in a thread."""

    _loop_cls = AdaRolloutLoop


class CPUAdaAsyncGRPOTrainer(AdaAsyncGRPOTrainer):
    rollout_worker_class = ThreadAdaWorker


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_chat_model(tmp_path_factory.mktemp("tiny-arith-chat"))


@pytest.fixture(scope="module")
def tokenizer():
    return chat_tokenizer(load_tiny_arith_model()[1])


@pytest.fixture(scope="module")
def dataset():
    # Levels 0-3: some prompts the model nearly always gets right, some rarely, so pools differ in size.
    return conversational(make_dataset(48, seed=0, levels=[0, 1, 2, 3]))


@pytest.fixture
def server(model_dir, tokenizer):
    with FakeCompletionsServer(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), tokenizer) as srv:
        yield srv


def config(tmp_path, server, **overrides):
    return cpu_config(AdaAsyncGRPOConfig, tmp_path, server, **overrides)


def record_collated(monkeypatch) -> list[list[dict]]:
    collated: list[list[dict]] = []
    original = trainer_module.DataCollatorForRollout.torch_call

    def recording(self, examples):
        (rows,) = examples
        collated.append([sample for row in rows for sample in row.samples])
        return original(self, examples)

    monkeypatch.setattr(trainer_module.DataCollatorForRollout, "torch_call", recording)
    return collated


def train(tmp_path, monkeypatch, server, model_dir, tokenizer, dataset, **overrides):
    collated = record_collated(monkeypatch)
    trainer = CPUAdaAsyncGRPOTrainer(
        model=str(model_dir),
        reward_funcs=exact_match_reward,
        args=config(tmp_path, server, **overrides),
        train_dataset=dataset,
        processing_class=tokenizer,
        weight_transfer=InProcessWeightTransfer(server),
    )
    assert isinstance(trainer.rollout_worker, ThreadAdaWorker)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 3
    moved = [name for name, p in trainer.model.named_parameters() if not torch.equal(before[name], p.detach())]
    assert moved, "no parameter changed"
    logged: dict[str, list[float]] = {}  # every logged value of each metric, step by step
    for entry in trainer.state.log_history:
        for key, value in entry.items():
            if value is not None:
                logged.setdefault(key, []).append(value)
    return trainer, collated, logged


def served(server) -> dict[tuple[tuple[int, ...], tuple[int, ...]], list]:
    produced = {}
    for record in server.requests:
        if record.answered_at is not None:
            produced.setdefault((tuple(record.prompt_ids), tuple(record.completion_ids)), []).append(record)
    return produced


def check_provenance(collated, server) -> None:
    """Every trained row is a completion the server sampled, with the server's log-probs."""
    produced = served(server)
    for sample in (s for batch in collated for s in batch):
        mask = sample["completion_mask"].astype(bool)
        ids = sample["input_ids"]
        records = produced.get((tuple(ids[~mask].tolist()), tuple(ids[mask].tolist())), [])
        old = torch.tensor(sample["old_log_probs"][mask])
        assert any(torch.equal(old, torch.tensor(r.logprobs)) for r in records), ids


@pytest.mark.wall_clock_limit(240)
def test_seq_balance_trains_with_pools_larger_than_the_update_group(
    tmp_path, monkeypatch, server, model_dir, tokenizer, dataset, wall_clock_guard
):
    trainer, collated, logged = train(
        tmp_path, monkeypatch, server, model_dir, tokenizer, dataset, sampler="seq_balance", round_size=2, max_rounds=6
    )
    # Every rule is per prompt (linear objective): each prompt is queued as soon as its pool is done.
    assert trainer.ada_sampling.pooled and trainer.ada_sampling.prompts_per_batch == 1
    check_provenance(collated, server)
    # The update group of each prompt is num_generations draws of its pool; pools drew more than that on average.
    per_group: dict[int, int] = {}
    for sample in (s for batch in collated[:3] for s in batch):
        per_group[sample["group_id"]] = per_group.get(sample["group_id"], 0) + 1
    assert set(per_group.values()) == {4}
    print({k: v for k, v in logged.items() if k.startswith("ada/")})
    assert max(logged["ada/samples_per_prompt/max"]) > 4
    assert min(logged["ada/samples_per_prompt/mean"]) >= 4
    assert "ada/async/pool_version_span_max" in logged and "sample/staleness_mean" in logged
    # More draws than GRPO's n per trained prompt reached the server.
    assert len(server.requests) > 4 * len(per_group)


@pytest.mark.wall_clock_limit(240)
def test_train_on_pool_trains_on_every_draw_of_the_pools(
    tmp_path, monkeypatch, server, model_dir, tokenizer, dataset, wall_clock_guard
):
    trainer, collated, logged = train(
        tmp_path,
        monkeypatch,
        server,
        model_dir,
        tokenizer,
        dataset,
        sampler="seq_balance",
        round_size=2,
        max_rounds=6,
        train_on="pool",
    )
    assert trainer.ada_sampling.train_on == "pool" and trainer.rollout_worker.loop.ada_sampling.train_on == "pool"
    check_provenance(collated, server)  # every trained row is a completion the server produced
    groups: dict[int, list[dict]] = {}
    for sample in (s for batch in collated for s in batch):
        groups.setdefault(sample["group_id"], []).append(sample)
    # Prompts trained on more rows than their update group of 4: their whole pools.
    assert max(len(rows) for rows in groups.values()) > 4
    assert max(logged["ada/samples_per_prompt/max"]) > 4
    # Every row of a whole pool has the advantage share * (r - b) / (std + 1e-4): b and std its pool's mean and std
    # (linear objective, weight 1; `reward_std` is the pool's std), and the share that of its outcome's draws the
    # balanced group of 4 keeps (the prompt weighs what its update group would): zero where the pool is constant.
    from test_async_rollout import balanced_shares

    checked = 0
    for rows in groups.values():
        std = rows[0]["metrics"]["reward_std"]
        if std == 0.0:
            assert all(row["advantage"] == 0.0 for row in rows)
            continue
        rewards = [row["metrics"]["reward"] for row in rows]
        if len(rows) < 2 or statistics.stdev(rewards) != pytest.approx(std):
            continue  # part of a pool (the rest after the last step): its mean and shares are not these rows'
        mean = statistics.fmean(rewards)
        shares = balanced_shares(rewards, 4)
        expected = [share * (r - mean) / (std + 1e-4) for share, r in zip(shares, rewards, strict=True)]
        assert [row["advantage"] for row in rows] == pytest.approx(expected)
        checked += len(rows) > 4
    assert checked  # some whole pool larger than its update group was checked


ASYNC_REWARD_CALLS: list[int] = []
"""How many completions each call of `exact_match_reward_async` scored (the worker runs in this process's thread)."""


async def exact_match_reward_async(completions, answer, **kwargs):
    """`exact_match_reward` as an `async def` reward function (module-level, so TRL's spawned worker can pickle it)."""
    ASYNC_REWARD_CALLS.append(len(completions))
    await asyncio.sleep(0.05)  # a remote verifier's latency: draws keep coming back meanwhile, and wait to be scored
    return exact_match_reward(completions, answer)


@pytest.mark.wall_clock_limit(240)
def test_an_async_reward_function_scores_batches_of_draws_and_trains(
    tmp_path, monkeypatch, server, model_dir, tokenizer, dataset, wall_clock_guard
):
    ASYNC_REWARD_CALLS.clear()
    collated = record_collated(monkeypatch)
    trainer = CPUAdaAsyncGRPOTrainer(
        model=str(model_dir),
        reward_funcs=exact_match_reward_async,
        args=config(tmp_path, server, sampler="seq_balance", round_size=2, max_rounds=6),
        train_dataset=dataset,
        processing_class=tokenizer,
        weight_transfer=InProcessWeightTransfer(server),
    )
    trainer.train()
    assert trainer.state.global_step == 3
    check_provenance(collated, server)
    # TRL's worker awaited the coroutine function (a sync call would have got a coroutine, not rewards), once per
    # batch of the draws waiting to be scored: more draws than calls, and no draw scored twice.
    answered = sum(1 for record in server.requests if record.answered_at is not None)
    assert ASYNC_REWARD_CALLS and len(ASYNC_REWARD_CALLS) < sum(ASYNC_REWARD_CALLS) <= answered
    rewards = [s["metrics"]["reward"] for batch in collated for s in batch]
    assert set(rewards) <= {0.0, 1.0} and "rewards/exact_match_reward_async" in trainer.state.log_history[0]


@pytest.mark.wall_clock_limit(240)
def test_dapo_drops_groups_without_a_signal_and_trains(
    tmp_path, monkeypatch, server, model_dir, tokenizer, dataset, wall_clock_guard
):
    trainer, collated, logged = train(tmp_path, monkeypatch, server, model_dir, tokenizer, dataset, sampler="dapo")
    assert not trainer.ada_sampling.pooled
    check_provenance(collated, server)
    assert sum(logged["ada/dapo/groups_total"]) >= 1
    # Every trained group has a signal: its rewards (the samples' metrics) are not all equal.
    groups: dict[int, list[float]] = {}
    for sample in (s for batch in collated[:3] for s in batch):
        groups.setdefault(sample["group_id"], []).append(sample["metrics"]["reward"])
    assert groups and all(len(set(rewards)) > 1 for rewards in groups.values() if len(rewards) == 4)


def signal_on_even_rows(completions, constant, **kwargs):
    """Rewards 0, 1, 0, 1 for a group of a row with a signal, all 0 for a `constant` row (DAPO drops its group)."""
    return [0.0 if flat else float(i % 2) for i, flat in enumerate(constant)]


@pytest.mark.wall_clock_limit(240)
def test_a_checkpoint_resumes_past_the_rows_dapo_dropped(
    tmp_path, monkeypatch, server, model_dir, tokenizer, dataset, wall_clock_guard
):
    import itertools
    import json

    # Every odd row is constant: TRL's row ids (dataset_start_index 0) 1, 3, 5, ... are dropped, never trained.
    data = dataset.add_column("constant", [i % 2 == 1 for i in range(len(dataset))])
    collated = record_collated(monkeypatch)
    trainer = CPUAdaAsyncGRPOTrainer(
        model=str(model_dir),
        reward_funcs=signal_on_even_rows,
        args=config(tmp_path, server, sampler="dapo", max_steps=2, save_strategy="steps", save_steps=2),
        train_dataset=data,
        processing_class=tokenizer,
        weight_transfer=InProcessWeightTransfer(server),
    )
    seen = {}
    asked = trainer._ask_worker_state

    def recording_ask():  # the worker's answer at the save hands over the rows it dropped
        answer = asked()
        seen.update(
            rows=trainer._dropped_row_ids | set(answer.dropped),
            trained={s["group_id"] for batch in collated for s in batch},
        )
        return answer

    monkeypatch.setattr(trainer, "_ask_worker_state", recording_ask)
    trainer.train()
    position = json.loads((tmp_path / "out" / "checkpoint-2" / "rollout_state.json").read_text())["prompt_index"]
    dropped, trained = seen["rows"], seen["trained"]
    assert dropped and all(row % 2 == 1 for row in dropped), dropped  # the worker's drops, nothing stale
    assert trained and all(row % 2 == 0 for row in trained), trained
    # The resume position is the first row neither trained nor dropped: past the run's first dropped row, row 1 (TRL's
    # own, from the trained rows alone), so a resume draws no trained row again.
    assert position == next(g for g in itertools.count() if g not in trained | dropped)
    # The first row the run did not train is row 1, dropped: the position is past it. (On a loaded machine row 1's
    # draws can still be in flight at the save, after later rows finished; the position is then 1, nothing before it
    # was dropped, and the line above is the whole check. A CI run under load showed dropped = {3, 5, ..., 13}.)
    first_untrained = next(g for g in itertools.count() if g not in trained)
    assert first_untrained == 1
    if first_untrained in dropped:
        assert position > first_untrained
    # TRL's own count of trained groups (epochs, `batch/groups_per_step`) is unchanged.
    assert not dropped & trainer._trained_groups and trained <= trainer._trained_groups


@pytest.mark.wall_clock_limit(240)
def test_est_trains_from_the_tracker(tmp_path, monkeypatch, server, model_dir, tokenizer, dataset, wall_clock_guard):
    trainer, collated, logged = train(tmp_path, monkeypatch, server, model_dir, tokenizer, dataset, sampler="est")
    assert trainer.ada_sampling.pooled
    check_provenance(collated, server)
    assert "ada/samples_per_prompt/mean" in logged


def test_uniform_builds_trls_own_worker_with_trls_arguments(
    tmp_path, monkeypatch, server, model_dir, tokenizer, dataset
):
    # sampler="uniform" is AsyncGRPOTrainer: TRL's own loop class, with exactly the arguments TRL's trainer gives its
    # worker (so the same groups, rewards and advantages). The worker class is TRL's with a dead child found and
    # stopped (`RobustAsyncRolloutWorker`, tests/test_async_faults.py); both run in a thread here.
    from trl.experimental.async_grpo import async_rollout_worker

    trls_loop = async_rollout_worker._AsyncRolloutLoop
    real = AdaAsyncGRPOTrainer.uniform_worker_class
    assert issubclass(real, async_rollout_worker.AsyncRolloutWorker) and real._loop_cls is trls_loop
    monkeypatch.setattr(trainer_module, "AsyncRolloutWorker", ThreadRolloutWorker)
    monkeypatch.setattr(CPUAdaAsyncGRPOTrainer, "uniform_worker_class", ThreadRolloutWorker)
    common = dict(
        model=str(model_dir),
        reward_funcs=exact_match_reward,
        train_dataset=dataset,
        processing_class=tokenizer,
        weight_transfer=InProcessWeightTransfer(server),
    )
    ada = CPUAdaAsyncGRPOTrainer(args=config(tmp_path, server, sampler="uniform"), **common)
    plain_args = async_grpo.AsyncGRPOConfig(
        **{
            k: v
            for k, v in config(tmp_path, server).to_dict().items()
            if k in async_grpo.AsyncGRPOConfig.__dataclass_fields__ and k not in ("push_to_hub_token", "hub_token")
        }
    )
    allow_cpu_training(monkeypatch)  # TRL's own trainer, on CPU (the Ada trainer changed nothing of TRL's for good)
    plain = async_grpo.AsyncGRPOTrainer(args=plain_args, **common)
    assert type(ada.rollout_worker) is ThreadRolloutWorker and ada.rollout_worker.loop_cls is trls_loop
    assert plain.rollout_worker.loop_cls is trls_loop
    assert ada.rollout_worker._loop_kwargs.keys() == plain.rollout_worker._loop_kwargs.keys()
    for key, value in plain.rollout_worker._loop_kwargs.items():
        if key not in ("dataset", "processing_class"):
            assert ada.rollout_worker._loop_kwargs[key] == value, key


def test_a_plain_async_config_gets_the_reinforce_ada_defaults(tmp_path, server):
    plain = async_grpo.AsyncGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")
    upgraded = AdaAsyncGRPOConfig.from_async_config(plain)
    assert isinstance(upgraded, AdaAsyncGRPOConfig) and upgraded.sampler == "seq_balance"
    assert upgraded.num_generations == plain.num_generations and upgraded.max_staleness == plain.max_staleness


def test_bad_knobs_fail_before_any_model_loads(tmp_path, server):
    with pytest.raises(ValueError, match="round_size=3 has no effect with sampler='uniform'"):
        config(tmp_path, server, sampler="uniform", round_size=3)
    with pytest.raises(ValueError, match="dapo_on_exhausted='keep_partial': the asynchronous worker has no partial"):
        config(tmp_path, server, sampler="dapo", dapo_on_exhausted="keep_partial")
    # TRL's asynchronous rule, the group's std, is the default: a remembered baseline or SPO's batch normalisation
    # names the scaling it needs.
    with pytest.raises(ValueError, match="baseline='tracked' needs scale_rewards='none'"):
        config(tmp_path, server, sampler="dapo", baseline="tracked")
    with pytest.raises(ValueError, match="baseline='predicted' needs scale_rewards='none'"):
        config(tmp_path, server, sampler="dapo", baseline="predicted", pass_rate_predictor="learned")
    with pytest.raises(ValueError, match="scale_rewards='group' would scale the rewards a second time"):
        config(tmp_path, server, sampler="dapo", normalize_advantages=True)
    with pytest.raises(ValueError, match="no_such_sampler.* is not supported. Choose one of"):
        config(tmp_path, server, sampler="no_such_sampler")


@pytest.mark.wall_clock_limit(300)
def test_checkpoints_hold_the_workers_sampler_state_and_resume_restores_it(
    tmp_path, monkeypatch, server, model_dir, tokenizer, dataset, wall_clock_guard
):
    import json

    from trl_ada.checkpoints import SAMPLER_STATE_NAME

    common = dict(
        model=str(model_dir),
        reward_funcs=exact_match_reward,
        train_dataset=dataset,
        processing_class=tokenizer,
        weight_transfer=InProcessWeightTransfer(server),
    )
    first = CPUAdaAsyncGRPOTrainer(
        args=config(tmp_path, server, sampler="est", max_steps=2, save_strategy="steps", save_steps=2), **common
    )
    assert first.ada_sampling.initial_state is None
    first.train()
    checkpoint = tmp_path / "out" / "checkpoint-2"
    saved = json.loads((checkpoint / SAMPLER_STATE_NAME).read_text())
    assert saved["trainer"] == "CPUAdaAsyncGRPOTrainer"
    tracked = saved["sampler"]
    assert json.dumps(tracked) != json.dumps(build_fresh_state())  # the tracker saw prompts

    resumed = CPUAdaAsyncGRPOTrainer(args=config(tmp_path, server, sampler="est", max_steps=3), **common)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.state.global_step == 3
    loop = resumed.rollout_worker.loop
    assert loop.ada_sampling.initial_state == tracked  # the worker's sampler began from the checkpoint's state
    # TRL's own resume position still holds: the rows trained before the checkpoint are not drawn again first.
    # The resumed run's samples keep TRL's row ids (its resume position and epoch counting read them).
    assert (
        resumed.rollout_worker._loop_kwargs["dataset_start_index"]
        == json.loads((checkpoint / "rollout_state.json").read_text())["prompt_index"]
    )


def build_fresh_state():
    from trl_ada.samplers import SamplerSettings, build_sampler

    return build_sampler(SamplerSettings(sampler="est", num_generations=4, seed=0)).state_dict()


def test_the_model_card_names_the_asynchronous_trainer_and_its_sampler(
    tmp_path, monkeypatch, server, model_dir, tokenizer, dataset
):
    trainer = CPUAdaAsyncGRPOTrainer(
        model=str(model_dir),
        reward_funcs=exact_match_reward,
        args=config(tmp_path, server, sampler="seq_balance", max_steps=2, save_strategy="steps", save_steps=2),
        train_dataset=dataset,
        processing_class=tokenizer,
        weight_transfer=InProcessWeightTransfer(server),
    )
    trainer.train()
    card = (tmp_path / "out" / "README.md").read_text()
    assert "trl-ada's AdaAsyncGRPOTrainer, on TRL's asynchronous GRPO trainer" in card
    assert "| `sampler` | seq_balance |" in card and "async-grpo" in card
    assert "| `train_on` | downsample |" in card  # the asynchronous trainer's own knob (ASYNC_ONLY_FIELDS)


def test_prompts_wait_for_their_batch_only_where_a_rule_reads_it(tmp_path, server):
    from trl_ada.async_grpo.async_grpo_trainer import async_sampling

    def batch(**knobs) -> int:
        return async_sampling(config(tmp_path, server, **knobs)).prompts_per_batch

    assert batch(sampler="seq_balance") == 1  # linear objective: every weight is 1, nothing to normalise
    assert batch(sampler="seq_balance", objective="log", normalize_weights=False) == 1
    # Weights normalised over the batch, budgets sharing its mean: one step holds 8 // 4 = 2 prompts, so the batch is
    # prompts_per_generation_batch's default floor (tests/test_async_rules.py), or what it says.
    assert batch(sampler="seq_balance", objective="log") == 8
    assert batch(sampler="est") == 8
    assert batch(sampler="est", prompts_per_generation_batch=2) == 2


@pytest.mark.wall_clock_limit(240)
@pytest.mark.parametrize(
    ("sampler_name", "state_key", "metric"),
    [
        ("knapsack", "last_pass_rate", "ada/knapsack/first_visit_share"),
        ("dapo_gated", "history", "ada/gate/mixed_share"),
    ],
)
def test_knapsack_and_dapo_gated_train_and_save_their_state(
    tmp_path, monkeypatch, server, model_dir, tokenizer, dataset, wall_clock_guard, sampler_name, state_key, metric
):
    # Issue 33 item 7; their rules in the worker: tests/test_async_new_samplers.py.
    import json

    from trl_ada.checkpoints import SAMPLER_STATE_NAME

    trainer, collated, logged = train(
        tmp_path,
        monkeypatch,
        server,
        model_dir,
        tokenizer,
        dataset,
        sampler=sampler_name,
        save_strategy="steps",
        save_steps=2,
    )
    # One optimizer step holds 8 // 4 = 2 prompts: the generation batch is prompts_per_generation_batch's floor.
    assert trainer.ada_sampling.pooled and trainer.ada_sampling.prompts_per_batch == 8
    check_provenance(collated, server)
    assert metric in logged
    saved = json.loads((tmp_path / "out" / "checkpoint-2" / SAMPLER_STATE_NAME).read_text())["sampler"]
    assert saved[state_key]  # the worker's sampler saw prompts, and the checkpoint holds what it learned


@pytest.mark.wall_clock_limit(240)
def test_spo_trains_in_the_asynchronous_trainer_and_saves_its_tracker(
    tmp_path, monkeypatch, server, model_dir, tokenizer, dataset, wall_clock_guard
):
    # Its rules in the worker: tests/test_async_remembered.py.
    import json

    from trl_ada.checkpoints import SAMPLER_STATE_NAME
    from trl_ada.experimental.spo import SpoOptions

    trainer, collated, logged = train(
        tmp_path, monkeypatch, server, model_dir, tokenizer, dataset,
        sampler="spo", num_generations=2, save_strategy="steps", save_steps=2, **SpoOptions.recipe,
    )  # fmt: skip
    assert trainer.ada_sampling.pooled and not trainer.ada_sampling.trl_advantages
    check_provenance(collated, server)
    assert "ada/priority/passed_over_total" in logged
    saved = json.loads((tmp_path / "out" / "checkpoint-2" / SAMPLER_STATE_NAME).read_text())["sampler"]
    assert saved["baseline_history"]["counts"]  # the tracker saw prompts, and the checkpoint holds it
