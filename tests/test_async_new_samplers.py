"""
Issue 33, item 7: the new samplers in the asynchronous worker (`AdaRolloutLoop`), on the generation batch of issue 32
(`prompts_per_generation_batch`). `knapsack` splits each batch's budget as `est` does; `dapo_gated` draws the dataset
walk as `dapo` does and passes over a refill visit of a prompt its gate rejects (`StreamGate`). Both samplers' states
travel through the worker's state hand-over (`worker_state`, what a checkpoint saves) and restore a resumed worker.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter, defaultdict

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("trl.experimental.async_grpo.async_rollout_worker")

from test_async_rules import async_config  # noqa: E402
from test_async_worker_hardening import make_loop, one_draw  # noqa: E402

from trl_ada.async_grpo.async_grpo_config import MIN_PROMPTS_PER_GENERATION_BATCH  # noqa: E402
from trl_ada.async_grpo.async_grpo_trainer import async_sampling  # noqa: E402
from trl_ada.async_grpo.rollout import StreamGate  # noqa: E402
from trl_ada.schedules import prompt_key  # noqa: E402


@pytest.fixture(autouse=True)
def accelerate_state():
    # TRL's loop logs through accelerate's logger, which needs the state its child process sets up.
    from accelerate.state import PartialState

    PartialState()


@pytest.fixture(scope="module")
def tokenizer():
    from async_fixtures import chat_tokenizer

    from trl_ada.tiny import load_tiny_arith_model

    return chat_tokenizer(load_tiny_arith_model()[1])


def question(index: int) -> dict:
    return {"prompt": [{"role": "user", "content": f"question {index}"}]}


class Stream:
    """
    Drives a loop's work iterator in submission order, every draw answered at once by `right(question, draw)`, and
    records what the stream did: each row met (TRL's row id), whether it was drawn, the draws each (batch, prompt) got,
    and the prompts kept with a signal before the row was met (what an epoch counts).
    """

    def __init__(self, loop, right) -> None:
        self.loop, self.right = loop, right
        self.work = loop._repeat_iterator()
        self.samples: list = []
        self.draws: Counter = Counter()  # (batch, prompt) -> draws submitted
        self.rows_met: list[tuple[int, bool, int]] = []  # (row id, drawn, kept prompts before it) in stream order
        self.batches_seen: set[int] = set()

    def kept_prompts(self) -> int:
        return len({sample.group_id for sample in self.samples})

    def run(self, rows: int) -> None:
        """Until every row below `rows` is finished (counted by the loop)."""
        loop = self.loop
        while loop._counted_below < rows:
            kept_before = self.kept_prompts()
            group_id, row = next(self.work)
            draw = loop._draws[group_id]
            if draw.batch not in self.batches_seen:  # a batch opened: the rows met since the last one
                self.batches_seen.add(draw.batch)
                drawn = set(loop._batches[draw.batch].row_ids)
                first = self.rows_met[-1][0] + 1 if self.rows_met else 0
                self.rows_met += [(r, r in drawn, kept_before) for r in range(first, max(drawn) + 1)]
            self.draws[(draw.batch, draw.prompt)] += 1
            text = row["prompt"][0]["content"]
            group = one_draw(
                group_id, self.right(int(text.split()[-1]), draw.draw), prompt=draw.prompt, draw=draw.draw
            )
            group.prompts = [row["prompt"]]
            self.samples += asyncio.run(loop._score_group(group))


# -- knapsack --------------------------------------------------------------------------------------------------------

HARD, EASY = 0, 1
"""Of the knapsack test's 8 questions: 1 of 8 draws right, and 7 of 8; the others 4 of 8."""


def right_by_question(index: int, draw: int) -> bool:
    rights = {HARD: 1, EASY: 7}.get(index, 4)
    return draw % 8 < rights


def test_knapsack_gives_a_hard_and_an_easy_prompt_different_budgets_under_trls_defaults(tmp_path, tokenizer):
    sampling = async_sampling(async_config(tmp_path, sampler="knapsack"))
    # TRL's defaults: one prompt per optimizer step, over which the step's budget would be that prompt's alone.
    assert sampling.prompts_per_batch == MIN_PROMPTS_PER_GENERATION_BATCH and sampling.pooled
    n = sampling.settings.num_generations
    loop = make_loop(sampling.settings, tokenizer, prompts_per_batch=sampling.prompts_per_batch, rows=8)
    stream = Stream(loop, right_by_question)
    stream.run(rows=16)  # the dataset twice: a first visit, then one from the tracked pass rates
    first = [stream.draws[(0, prompt)] for prompt in range(8)]
    second = [stream.draws[(1, prompt)] for prompt in range(8)]
    assert first == [n] * 8  # first visits get num_generations
    # The knapsack's value p(1-p)^2 (1 - p^k - (1-p)^k): the hard prompt draws more than the easy one (both mixed),
    # from the step's fixed total. Over a batch of one prompt both would draw exactly num_generations.
    assert second[HARD] > second[EASY] and len(set(second)) > 1
    assert sum(second) == 8 * n
    # train_on="all": every draw of a prompt with a signal is trained on, its group the whole pool.
    trained = Counter(sample.group_id for sample in stream.samples if sample.group_id >= 8)
    assert [trained[8 + prompt] for prompt in range(8)] == second


def test_knapsacks_state_travels_with_the_workers_state_and_restores_its_budgets(tmp_path, tokenizer):
    settings = async_sampling(async_config(tmp_path, sampler="knapsack")).settings
    loop = make_loop(settings, tokenizer, prompts_per_batch=8, rows=8)
    Stream(loop, right_by_question).run(rows=8)
    saved = json.loads(json.dumps(loop.worker_state().sampler))  # as the checkpoint's JSON holds it
    assert len(saved["last_pass_rate"]) == 8 and saved["estimator"]["counts"]
    resumed = make_loop(settings, tokenizer, prompts_per_batch=8, rows=8, initial_state=saved)
    fresh = make_loop(settings, tokenizer, prompts_per_batch=8, rows=8)
    budgets = {}
    for name, one in (("original", loop), ("resumed", resumed), ("fresh", fresh)):
        one._rows = iter(enumerate([question(i) for i in range(8)]))
        one._open_batch()
        budgets[name] = one._batches[max(one._batches)].step.step.budgets
    assert budgets["resumed"] == budgets["original"] != budgets["fresh"]


def test_knapsack_and_dapo_gated_batch_level_checks_in_the_async_config(tmp_path):
    with pytest.raises(ValueError, match="prompts_per_generation_batch=1 with sampler='knapsack'"):
        async_config(tmp_path, sampler="knapsack", prompts_per_generation_batch=1)
    with pytest.raises(ValueError, match="=1 with sampler='dapo_gated' \\(its gate measures"):
        async_config(tmp_path, sampler="dapo_gated", prompts_per_generation_batch=1)
    with pytest.raises(ValueError, match="sampler_kwargs train_on='downsample' cuts each pool .* choose one"):
        async_config(
            tmp_path,
            sampler="knapsack",
            num_generations=4,
            train_on="pool",
            sampler_kwargs={"train_on": "downsample", "min_draws": 4, "solved_draws": 4, "unsolved_draws": 4},
        )
    assert async_sampling(async_config(tmp_path, sampler="knapsack", train_on="pool")).train_on == "pool"
    gated = async_sampling(async_config(tmp_path, sampler="dapo_gated", prompts_per_generation_batch=4))
    assert gated.prompts_per_batch == 4 and gated.pooled


# -- dapo_gated ------------------------------------------------------------------------------------------------------

QUESTIONS = 12
HOPELESS = range(4)
"""Questions never answered right (every group dropped); the other 8 are right on every other draw (always mixed)."""


def right_unless_hopeless(index: int, draw: int) -> bool:
    return index not in HOPELESS and draw % 2 == 0


def gated_loop(tmp_path, tokenizer, **sampling):
    """The loop of `sampler="dapo_gated"` on the generation batch the config resolves (TRL's defaults otherwise)."""
    resolved = async_sampling(async_config(tmp_path, sampler="dapo_gated", num_generations=4))
    return make_loop(
        resolved.settings, tokenizer, prompts_per_batch=resolved.prompts_per_batch, rows=QUESTIONS, **sampling
    )


def test_dapo_gated_draws_a_prompt_its_gate_rejects_once_per_epoch_in_the_async_stream(tmp_path, tokenizer):
    loop = gated_loop(tmp_path, tokenizer)
    assert loop.ada_sampling.pooled and loop.ada_sampling.prompts_per_batch == MIN_PROMPTS_PER_GENERATION_BATCH
    stream = Stream(loop, right_unless_hopeless)
    stream.run(rows=QUESTIONS * 12)
    # An epoch is QUESTIONS prompts kept with a signal (TRL's count): per (question, epoch), the rows met and drawn.
    met, drawn = defaultdict(int), defaultdict(int)
    for row, was_drawn, kept_before in stream.rows_met:
        key = (row % QUESTIONS, kept_before // QUESTIONS)
        met[key] += 1
        drawn[key] += was_drawn
    epochs = max(epoch for _, epoch in met)
    assert epochs >= 5
    rejected_since = {}  # question -> the epoch of the gate's first pass over it
    for row, was_drawn, kept_before in stream.rows_met:
        rejected_since.setdefault(row % QUESTIONS, None)
        if not was_drawn and rejected_since[row % QUESTIONS] is None:
            rejected_since[row % QUESTIONS] = kept_before // QUESTIONS
    # The gate passes over the hopeless questions and never over a mixed one.
    assert {q for q, since in rejected_since.items() if since is not None} == set(HOPELESS)
    for q in HOPELESS:
        for epoch in range(epochs):  # the last epoch is incomplete
            # The loader's visit is kept: at least one draw every epoch. Once the gate rejects the prompt, only that
            # one: the stream met it again in the epoch (drops make an epoch longer than the dataset) and passed over.
            assert drawn[(q, epoch)] >= 1, (q, epoch)
            if epoch > rejected_since[q]:
                assert drawn[(q, epoch)] == 1, (q, epoch, met[(q, epoch)])
    assert any(met[(q, e)] > 1 for q in HOPELESS for e in range(rejected_since[q] + 1, epochs))
    # Passed-over rows are finished without a sample: the resume position moves past them.
    passed = {row for row, was_drawn, _ in stream.rows_met if not was_drawn}
    assert passed and passed <= loop._dropped and loop._gate.passed_over_total == len(passed)


def test_the_async_log_window_holds_every_row_the_gated_stream_passed_over(tmp_path, tokenizer):
    # A per-batch count under a plain name is averaged over TRL's log window, not summed.
    import warnings

    with warnings.catch_warnings():  # TRL warns on any import from trl.experimental
        warnings.simplefilter("ignore")
        from trl.experimental.async_grpo.async_grpo_trainer import _reduce_metric

    loop = gated_loop(tmp_path, tokenizer)
    pushed, push = [], loop._push_metrics
    loop._push_metrics = lambda values: (pushed.append(dict(values)), push(values))[1]
    stream = Stream(loop, right_unless_hopeless)
    stream.run(rows=QUESTIONS * 12)
    assert not loop._batches  # every batch the stream opened has finished and reported
    passed = [row for row, drawn, _ in stream.rows_met if not drawn]
    window = [values["ada/gate/passed_over_total"] for values in pushed if "ada/gate/passed_over_total" in values]
    assert sum(count > 0 for count in window) >= 2  # rows passed over in several batches: a mean is not the count
    assert _reduce_metric("ada/gate/passed_over_total", window) == len(passed) > 0
    assert not any("ada/gate/passed_over" in values for values in pushed)


def test_dapo_gateds_state_travels_with_the_workers_state_and_gates_the_resumed_stream(tmp_path, tokenizer):
    loop = gated_loop(tmp_path, tokenizer)
    Stream(loop, right_unless_hopeless).run(rows=QUESTIONS * 6)
    saved = json.loads(json.dumps(loop.worker_state().sampler))  # as the checkpoint's JSON holds it
    assert len(saved["history"]["counts"]) == QUESTIONS and saved["draws_seen"] > 0 and saved["mixed_share"] > 0
    resumed = gated_loop(tmp_path, tokenizer, initial_state=saved)
    for name in ("history", "mixed_share", "draws_seen", "positives_seen"):
        restored = getattr(resumed.sampler, name)
        assert (restored.counts if name == "history" else restored) == (
            loop.sampler.history.counts if name == "history" else getattr(loop.sampler, name)
        )
    keys = [prompt_key(question(i)) for i in range(QUESTIONS)]
    rejects = [resumed.sampler.refill_passes_over(key) for key in keys]
    assert rejects == [loop.sampler.refill_passes_over(key) for key in keys]
    assert rejects == [i in HOPELESS for i in range(QUESTIONS)]
    # The epoch's bookkeeping starts afresh: the resumed stream's first row of every prompt is drawn (no visit lost).
    stream = Stream(resumed, right_unless_hopeless)
    stream.run(rows=QUESTIONS)
    assert all(drawn for _, drawn, _ in stream.rows_met[:QUESTIONS])


def test_a_resumed_gated_worker_does_not_remember_again_the_rows_its_saved_state_counted(tmp_path, tokenizer):
    first = gated_loop(tmp_path, tokenizer)
    Stream(first, right_unless_hopeless).run(rows=8)
    state = first.worker_state()
    # The checkpoint's resume position is row 3: the resume draws rows 3 on again and trains them, but the gate's
    # history (each prompt's counts and the totals its prior's mean reads) must not count their draws a second time.
    ahead = state.counted_from(3)
    assert ahead[:5] == [3, 4, 5, 6, 7]
    resolved = async_sampling(async_config(tmp_path, sampler="dapo_gated", num_generations=4))
    resumed = make_loop(
        resolved.settings,
        tokenizer,
        prompts_per_batch=resolved.prompts_per_batch,
        rows=QUESTIONS,
        initial_state=json.loads(json.dumps(state.sampler)),
        loop={"dataset_start_index": 3, "ada_rows_already_counted": [row - 3 for row in ahead]},
    )
    Stream(resumed, right_unless_hopeless).run(rows=len(ahead) + 1)  # one row past what the saved state counted
    keys = [str(prompt_key(question(i))) for i in range(QUESTIONS)]
    before, after = first.sampler.history.counts, resumed.sampler.history.counts
    for index in ahead:
        assert after[keys[index]] == before[keys[index]], index  # before the fix: counted twice
    newly = [keys[index] for index in range(QUESTIONS) if index not in ahead and index >= 3 and keys[index] in after]
    assert newly and all(keys[i] not in before for i in range(8, QUESTIONS) if keys[i] in newly)
    # The totals behind the prior's mean moved by exactly the draws of the rows counted for the first time.
    assert resumed.sampler.draws_seen - first.sampler.draws_seen == sum(after[key][0] for key in newly)
    assert resumed.sampler.positives_seen - first.sampler.positives_seen == sum(after[key][1] for key in newly)
    assert resumed._rows_already_counted == set()


def test_a_resumed_gated_worker_counts_the_draws_of_rows_its_gate_had_passed_over(tmp_path, tokenizer):
    first = gated_loop(tmp_path, tokenizer)
    stream = Stream(first, right_unless_hopeless)
    stream.run(rows=QUESTIONS * 4)
    state = first.worker_state()
    passed = [row for row, drawn, _ in stream.rows_met if not drawn]
    assert passed
    # A checkpoint whose resume position is the first row passed over: the resumed stream (its epoch fresh) draws that
    # row, and its draws are the prompt's first since then, so they enter the gate's history.
    position = passed[0]
    ahead = state.counted_from(position)
    assert not set(passed) & set(ahead)  # before the fix: every passed-over row was saved as counted
    assert state.passed_over == passed
    resolved = async_sampling(async_config(tmp_path, sampler="dapo_gated", num_generations=4))
    resumed = make_loop(
        resolved.settings,
        tokenizer,
        prompts_per_batch=resolved.prompts_per_batch,
        rows=QUESTIONS,
        initial_state=json.loads(json.dumps(state.sampler)),
        loop={"dataset_start_index": position, "ada_rows_already_counted": [row - position for row in ahead]},
    )
    Stream(resumed, right_unless_hopeless).run(rows=1)
    key = str(prompt_key(question(position % QUESTIONS)))
    (total, positives), decay = first.sampler.history.counts[key], first.sampler.history.decay
    # Its four draws, all wrong (a hopeless question), entered the counts.
    assert resumed.sampler.history.counts[key] == pytest.approx((decay * total + 4, decay * positives))


class RejectsAll:
    """A sampler whose gate rejects every prompt."""

    def refill_passes_over(self, key) -> bool:
        return True


def test_a_gate_that_rejects_every_prompt_opens_a_new_epoch_after_one_walk_of_the_dataset():
    gate = StreamGate(RejectsAll(), dataset_size=3)
    assert [gate.passes_over(key, row) for row, key in enumerate("abc")] == [False] * 3  # the loader's visits
    assert [gate.passes_over(key, row) for row, key in enumerate("abc", 3)] == [True] * 3 and gate.epoch == 1
    # A new epoch: drawn again, never stuck.
    assert [gate.passes_over(key, row) for row, key in enumerate("ab", 6)] == [False, False]
    gate.count_kept(3)
    assert gate.epoch == 2 and not gate.passes_over("a", 8)
