"""The log line a person reads: TRL's metrics and a few of trl-ada's, not its whole accounting (which still reaches
`log_history` and `report_to`)."""

from conftest import TINY_MODEL_KWARGS, starts_low_digit, tiny_args

from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
from trl_ada.reporting.console import CONSOLE_ADA_METRICS
from trl_ada.tasks.arithmetic import make_dataset
from trl_ada.tiny import build_tiny_model


def test_the_printed_line_is_short_and_the_history_whole(tmp_path, tokenizer, capsys):
    config = AdaGRPOConfig(**tiny_args(tmp_path, max_steps=1))  # disable_tqdm: transformers' printer
    trainer = AdaGRPOTrainer(
        build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS), [starts_low_digit], args=config,
        train_dataset=make_dataset(8, seed=0), processing_class=tokenizer,
    )  # fmt: skip
    trainer.train()
    printed = capsys.readouterr().out
    line = next(line for line in printed.splitlines() if "'loss'" in line)
    history = trainer.state.log_history[0]
    assert "ada/draws/drawn_total" in history and "ada/rounds" in history  # the whole accounting is kept
    assert "ada/draws" not in line and "ada/rounds" not in line  # and not printed
    assert "'reward'" in line and "ada/samples_per_prompt/mean" in line
    shown = [key for key in history if key.startswith("ada/") and f"'{key}'" in line]
    assert set(shown) <= set(CONSOLE_ADA_METRICS) and len(line) < 1500


def _trainer(tmp_path, tokenizer, reward, dataset, **knobs):
    config = AdaGRPOConfig(**tiny_args(tmp_path, max_steps=3), **knobs)
    return AdaGRPOTrainer(
        build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS), [reward], args=config, train_dataset=dataset,
        processing_class=tokenizer,
    )  # fmt: skip


def never_right(completions, **kwargs):
    return [0.0] * len(completions)


def always_right(completions, **kwargs):
    return [1.0] * len(completions)


def test_data_the_model_never_or_always_solves_is_named_once_with_the_fix(tmp_path, tokenizer, caplog):
    import logging

    for reward, word in ((never_right, "too hard"), (always_right, "too easy"), (starts_low_digit, None)):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            _trainer(tmp_path, tokenizer, reward, make_dataset(64, seed=0), round_size=4, max_rounds=2).train()
        warned = [r.getMessage() for r in caplog.records if "generation batches came back" in r.getMessage()]
        if word is None:
            assert warned == []
        else:
            assert len(warned) == 1 and word in warned[0] and "--pass_rate_band" in warned[0]


def test_a_memory_that_will_see_no_prompt_twice_is_named_at_the_start(tmp_path, tokenizer, caplog):
    import logging

    # Three steps of two prompts: six prompts drawn, so a dataset of four comes back and one of 2,000 does not.
    for dataset_size, warns in ((2_000, True), (4, False)):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            trainer = _trainer(
                tmp_path, tokenizer, starts_low_digit, make_dataset(dataset_size, seed=0), sampler="knapsack"
            )
            trainer.train()
        warned = [r.getMessage() for r in caplog.records if "no prompt comes back" in r.getMessage()]
        assert bool(warned) == warns and (not warns or "sampler='knapsack'" in warned[0])
