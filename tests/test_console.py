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


def test_a_missing_vllm_server_is_named_at_once_and_the_error_gives_the_command(
    tmp_path, tokenizer, caplog, monkeypatch
):
    """TRL waits `vllm_server_timeout` for a server without a word; the trainer says at once what it waits for, and the
    error names the command that starts one for this run."""
    import logging
    import socket

    import pytest
    import trl.generation.vllm_client as vllm_client
    import trl.generation.vllm_generation as vllm_generation

    for module in (vllm_generation, vllm_client):  # nothing listens anyway: vLLM itself is never reached
        monkeypatch.setattr(module, "is_vllm_available", lambda *args, **kwargs: True)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # free once closed: no server there
    config = AdaGRPOConfig(
        **tiny_args(tmp_path), use_vllm=True, vllm_mode="server", vllm_server_host="127.0.0.1",
        vllm_server_port=port, vllm_server_timeout=1,
    )  # fmt: skip
    model = build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS)
    with caplog.at_level(logging.INFO, logger="trl_ada.trainer"), pytest.raises(ConnectionError) as error:
        AdaGRPOTrainer(
            model, [starts_low_digit], args=config, train_dataset=make_dataset(8, seed=0), processing_class=tokenizer
        )
    url = f"http://127.0.0.1:{port}"
    assert f"No vLLM server answered at {url}" in str(error.value) and "trl vllm-serve --model" in str(error.value)
    waited = [r.getMessage() for r in caplog.records if "Waiting up to 1 s" in r.getMessage()]
    assert len(waited) == 1 and url in waited[0] and "trl vllm-serve --model" in waited[0]
