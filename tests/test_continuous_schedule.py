"""The continuous schedule end to end, over real HTTP, against a stand-in for `trl vllm-serve` (`fake_vllm_server.py`).

The trainer runs TRL's real `VLLMGeneration` and `VLLMClient` in server mode (only the NCCL weight push is replaced
by a counter: vLLM is not installed here); draws go out one request each and are aborted by closing their
connection. Correct completions are shorter, so they come back first: a pool filled in arrival order would be biased.
The checks are on the rows: every prompt's pool is its first draws in submission order, every scored completion is
one of those, the kept rows carry the server's log-probs for their own draw, the server saw aborted requests, and the
weights were pushed once per step. `tests/test_vllm_server.py` runs the same schedule against a real vLLM server.

The two-process tests at the end run `tests/server_mode_run.py` (one launch for three scenarios): the continuous
schedule's broadcasts and the ranks' sampler states, a reward failing on the main process only, and (in rounds) a
server whose engine dies during a sampling round.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import TINY_MODEL_KWARGS, launch_two_processes, tiny_args
from fake_vllm_server import FakeVLLMServer
from trl.generation import vllm_client as vllm_client_module
from trl.generation.vllm_client import VLLMClient
from trl.generation.vllm_generation import VLLMGeneration

import trl_ada.schedules.continuous as schedule_module
from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
from trl_ada.schedules.server_draws import ServerDraws
from trl_ada.tiny import build_tiny_model

STEPS = 3


def starts_low_digit(completions, **kwargs):
    return [1.0 if c[:1].isdigit() and int(c[:1]) < 5 else 0.0 for c in completions]


class RecordingDraws(ServerDraws):
    """`ServerDraws` that remembers every draw's prompt and the choice it came back with."""

    log: list[dict[str, Any]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.record: dict[str, Any] = {"submitted": {}, "returned": {}, "arrival": [], "aborted": set()}
        RecordingDraws.log.append(self.record)

    def submit(self, key, prompt_ids):
        self.record["submitted"][key] = list(prompt_ids)
        super().submit(key, prompt_ids)

    def wait(self, timeout=None):
        finished = super().wait(timeout)
        for key, choice in finished:
            self.record["returned"][key] = choice
            self.record["arrival"].append(key)
        return finished

    def abort(self, keys):
        self.record["aborted"].update(keys)
        return super().abort(keys)


@pytest.fixture
def server(tokenizer):
    digit_ids = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    fake = FakeVLLMServer(digit_ids=digit_ids, eos_id=tokenizer.eos_token_id, seconds_per_token=0.01)
    yield fake
    fake.close()


def continuous_trainer(tmp_path, tokenizer, dataset, server, monkeypatch, **sampling):
    pushes: list[int] = []
    scored: list[list[int]] = []

    def scoring_reward(completions, completion_ids, **kwargs):
        scored.extend(list(ids) for ids in completion_ids)
        return starts_low_digit(completions)

    def init_vllm(self: VLLMGeneration) -> None:
        self.vllm_client = VLLMClient(base_url=server.base_url, connection_timeout=10)
        # The NCCL weight push cannot run without CUDA: count it instead.
        self.vllm_client.update_named_params = lambda metadata, params: pushes.append(sum(1 for _ in params))

    monkeypatch.setattr(VLLMGeneration, "_init_vllm", init_vllm)
    # TRL's client only checks that vLLM is importable; it talks HTTP (plus NCCL for the weight push, replaced above).
    monkeypatch.setattr(vllm_client_module, "is_vllm_available", lambda: True)
    monkeypatch.setattr(schedule_module, "ServerDraws", RecordingDraws)
    RecordingDraws.log = []
    config = AdaGRPOConfig(
        **tiny_args(tmp_path, max_steps=STEPS, per_device_train_batch_size=16, max_completion_length=8),
        reward_weights=[1.0],
        **({"sampler": "seq_balance", "round_size": 4, "max_rounds": 4} | sampling),
    )
    model = build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS)
    trainer = AdaGRPOTrainer(model, [scoring_reward], args=config, train_dataset=dataset, processing_class=tokenizer)
    # What GRPOTrainer.__init__ sets for `use_vllm=True, vllm_mode="server"` (not settable here: vLLM is not installed).
    trainer.vllm_generation = VLLMGeneration(
        model=trainer.model,
        accelerator=trainer.accelerator,
        processing_class=tokenizer,
        mode="server",
        server_base_url=server.base_url,
        temperature=trainer.temperature,
        max_completion_length=trainer.max_completion_length,
        logprobs=0,
    )
    trainer.use_vllm, trainer.vllm_mode, trainer._last_loaded_step = True, "server", -1
    trainer.args.generation_schedule = "continuous"

    batches: list[tuple[list, Any]] = []
    original = schedule_module.sample_continuously

    def recording_sample(trainer_, group_inputs, keys, pools):
        selection, stats = original(trainer_, group_inputs, keys, pools)
        batches.append((pools, selection, stats))
        return selection, stats

    monkeypatch.setattr(schedule_module, "sample_continuously", recording_sample)
    trainer.train()
    return trainer, batches, pushes, scored


def test_continuous_pools_are_first_draws_in_submission_order(
    tmp_path, tokenizer, arithmetic_dataset, server, monkeypatch
):
    trainer, batches, pushes, scored = continuous_trainer(tmp_path, tokenizer, arithmetic_dataset, server, monkeypatch)
    assert len(batches) == STEPS == len(RecordingDraws.log)
    expected_scored: list[list[int]] = []
    arrived_out_of_order = 0
    grew = 0  # steps in which some pool outgrew n: not a plain GRPO batch
    for (pools, selection, stats), record in zip(batches, RecordingDraws.log, strict=True):
        returned = record["returned"]
        # One step can end with every pool at 4 (each of the 4 prompts drew 2 right and 2 wrong first: 0.375^4 ~ 2%
        # at p = 0.5), so the run as a whole must grow pools, not each step.
        grew += any(len(pool) > 4 for pool in pools)
        for g, pool in enumerate(pools):
            # The pool is draws 0..k-1 of the prompt, in submission order, each with its own completion and log-probs.
            assert len(pool) == len(selection.pools[g]) >= 4
            for d, entry in enumerate(pool):
                choice = returned[(g, d)]
                assert entry.row.completion_ids.tolist() == choice["token_ids"]
                assert entry.row.prompt_ids.tolist() == record["submitted"][(g, d)] == choice["prompt_token_ids"]
                np.testing.assert_array_equal(
                    entry.row.logprobs, np.asarray(choice["logprobs"]["token_logprobs"], dtype=np.float32)
                )
                assert (
                    selection.pools[g][d]
                    == starts_low_digit([trainer.processing_class.decode(choice["token_ids"])])[0]
                )
                expected_scored.append(choice["token_ids"])
            # Nothing is drawn past an exit check: every draw submitted is in the pool.
            assert sorted(d for (p, d) in record["submitted"] if p == g) == list(range(len(pool)))
            kept = selection.prompts[g].kept
            assert all(i < len(pool) for i in kept)
        # Some prompt's draws came back out of submission order (short, correct completions first).
        for g in range(len(pools)):
            order = [d for (p, d) in record["arrival"] if p == g]
            arrived_out_of_order += order != sorted(order)
        assert stats.submitted == len(record["submitted"]) == sum(len(pool) for pool in pools)
    assert grew > 0
    # Every completion scored is a pool draw (no aborted or dropped draw reached the reward function), and all were.
    assert Counter(map(tuple, scored)) == Counter(map(tuple, expected_scored))
    # Nothing was aborted (an exited prompt has nothing in flight), and draws did come back out of order.
    assert not any(request.aborted for request in server.requests) and not any(
        r["aborted"] for r in RecordingDraws.log
    )
    assert arrived_out_of_order > 0
    # One weight push per optimizer step, before its first draw.
    assert len(pushes) == STEPS
    # The schedule's own metrics, each logged once per step (item 3 of issue 21: no metric defined twice).
    logs = [entry for entry in trainer.state.log_history if "ada/continuous/scoring_batches" in entry]
    assert len(logs) == STEPS
    for entry, (_, _, stats) in zip(logs, batches, strict=True):
        assert {key for key in entry if key.startswith("ada/continuous/")} == {
            "ada/continuous/scoring_batches",
            "ada/continuous/draws_per_scoring_batch",
            "ada/continuous/seconds",
        }
        assert entry["ada/continuous/scoring_batches"] == stats.scoring_batches
        assert entry["ada/continuous/draws_per_scoring_batch"] == pytest.approx(
            stats.submitted / stats.scoring_batches
        )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"sampler": "uniform"}, "schedules the draws of sampler='seq_pos' or 'seq_balance'"),
        ({"sampler": "seq_balance", "dapo_refill": True}, "with dapo_refill"),
        ({"sampler": "seq_balance", "use_vllm": False}, "transformers generation generates in synchronous calls"),
        ({"sampler": "seq_balance", "vllm_mode": "colocate"}, "vLLM in 'colocate' mode"),
    ],
)
def test_continuous_schedule_rejects_what_it_cannot_schedule(tmp_path, overrides, message):
    settings = {"use_vllm": True, "vllm_mode": "server", "generation_schedule": "continuous"} | overrides
    with pytest.raises(ValueError, match=message):
        AdaGRPOConfig(**tiny_args(tmp_path), **settings)


def test_continuous_schedule_rejects_agent_rollouts_before_loading(tmp_path, arithmetic_dataset, monkeypatch):
    # Built with rounds (vLLM is not installed here), then switched: the check reads the config, before any model load.
    config = AdaGRPOConfig(**tiny_args(tmp_path), sampler="seq_balance")
    config.generation_schedule = "continuous"
    with pytest.raises(ValueError, match="tools .* cannot take part"):
        AdaGRPOTrainer("no/such-model", [starts_low_digit], args=config, train_dataset=arithmetic_dataset, tools=[len])


# ---------------------------------------------------------------------------------------------------------------------
# vLLM server mode on two processes (tests/server_mode_run.py, against tests/fake_vllm_server.py)
# ---------------------------------------------------------------------------------------------------------------------

SERVER_MODE_SCRIPT = Path(__file__).parent / "server_mode_run.py"


@pytest.fixture(scope="module")
def server_mode_reports(tmp_path_factory, tokenizer):
    out_dir = tmp_path_factory.mktemp("server_mode")
    digit_ids = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    servers = [
        FakeVLLMServer(digit_ids=digit_ids, eos_id=tokenizer.eos_token_id, seconds_per_token=0.005, **dies)
        for dies in ({}, {"dies_at_request": 2})
    ]
    try:
        (out_dir / "server_url").write_text(servers[0].base_url)
        (out_dir / "dying_server_url").write_text(servers[1].base_url)
        reports = launch_two_processes(SERVER_MODE_SCRIPT, out_dir, timeout=300)
    finally:
        for server in servers:
            server.close()
    return reports, servers[1].base_url


@pytest.mark.slow
def test_continuous_schedule_broadcasts_no_sampler_state_and_the_ranks_agree(server_mode_reports):
    # Issue 32, item 22: the main process broadcast the whole sampler state (generator, tracker, a learned predictor's
    # weights) after every generation batch; now every process runs the sampling step on the scoring batches it scores.
    import server_mode_run

    runs = [report["continuous"] for report in server_mode_reports[0]]
    for run in runs:
        assert run["error"] is None, run.get("traceback")
    main, follower = runs
    assert main["tracked_prompts"] >= server_mode_run.TRACKED_PROMPTS and main["state_bytes"] > 500_000
    # Per batch: the scoring batches' (prompt, draw) pairs and the end, a few kB, whatever the tracker holds.
    assert len(main["broadcast_bytes"]) == 2 and max(main["broadcast_bytes"]) < 20_000, main["broadcast_bytes"]
    assert main["selections"] and main["selections"] == follower["selections"]
    assert main["state_digest"] == follower["state_digest"]
    assert main["tracked_prompts"] == follower["tracked_prompts"]


@pytest.mark.slow
def test_a_reward_failing_on_the_main_process_ends_the_step_on_every_process(server_mode_reports):
    # Issue 21, item 4: the main process's reward raises inside a scoring batch while the other process sits in that
    # batch's reward gather. Both must raise the error; a hang fails the launch's timeout instead of hanging CI.
    main, follower = (report["reward_failure"] for report in server_mode_reports[0])
    expected = (
        "Reward function 'fails_on_the_main_process' raised during scoring batch 1 of training step 1: ValueError: "
        "the main process's verifier is down"
    )
    assert main["error"] is not None and main["error"].startswith(f"RuntimeError: {expected}"), main
    assert follower["error"] is not None, follower
    assert follower["error"].startswith(
        f"RuntimeError: The main process's continuous sampling failed: RuntimeError: {expected}"
    ), follower


@pytest.mark.slow
def test_a_lost_server_in_a_sampling_round_raises_the_same_error_on_every_process(server_mode_reports):
    # Issue 32, item 22: the main process's request was abandoned (the server's engine died) while the other process
    # waited for its completions in TRL's broadcast; that process then failed on gloo's "Connection closed by peer".
    reports, dying_url = server_mode_reports
    main, follower = (report["lost_server"] for report in reports)
    assert main["error"] is not None and follower["error"] is not None, (main, follower)
    assert main["error"].startswith(
        f"VLLMServerError: The vLLM server at {dying_url} stopped answering during sampling round 2 of training "
        "step 1 (VLLMServerUnresponsive: "
    ), main["error"]
    assert "start the run again" in main["error"]
    assert follower["error"] == main["error"], follower.get("traceback")
