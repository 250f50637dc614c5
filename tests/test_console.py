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
