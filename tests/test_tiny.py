"""Tests of the tiny character-level tokenizer and model, and of the shipped warm-started arithmetic model."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trl_ada.tasks.arithmetic import accuracy_by_level, held_out_problems
from trl_ada.tiny import (
    CHARACTERS,
    SPECIAL_TOKENS,
    TINY_ARITH_ASSETS,
    build_char_tokenizer,
    build_tiny_model,
    corrupt_answer,
    default_cache_dir,
    load_tiny,
    load_tiny_arith_model,
    save_tiny,
)

SMALL = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1}


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def test_tokenizer_vocab_and_special_tokens(tokenizer):
    assert len(tokenizer) == len(SPECIAL_TOKENS) + len(CHARACTERS)
    assert (tokenizer.pad_token, tokenizer.eos_token, tokenizer.bos_token, tokenizer.unk_token) == SPECIAL_TOKENS
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.unk_token_id) == (
        0,
        1,
        2,
        3,
    )
    assert tokenizer.model_max_length == 512
    assert tokenizer.chat_template is None
    ids = tokenizer(list(CHARACTERS), add_special_tokens=False).input_ids
    assert sorted(id_ for row in ids for id_ in row) == list(range(len(SPECIAL_TOKENS), len(tokenizer)))


@pytest.mark.parametrize(
    "text",
    [
        " 47+385=",
        "  3+  5=",
        "\\frac{1}{2}",
        "\\boxed{12}",
        "a  b",
        "  lead and trail  ",
        "x^2_{i} : [0,1] (a/b).",
        "",
    ],
)
def test_tokenizer_round_trip(tokenizer, text):
    ids = tokenizer(text).input_ids
    assert len(ids) == len(text)  # one token per character, no BOS/EOS added
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids) == text


def test_tokenizer_round_trip_random_strings(tokenizer):
    rng = random.Random(0)
    texts = ["".join(rng.choice(CHARACTERS) for _ in range(rng.randint(1, 40))) for _ in range(200)]
    for text, ids in zip(texts, tokenizer(texts).input_ids, strict=True):
        assert tokenizer.decode(ids) == text
    assert tokenizer.batch_decode(tokenizer(texts).input_ids) == texts


def test_tokenizer_special_tokens_and_padding(tokenizer):
    ids = tokenizer("12<eos>").input_ids
    assert ids[-1] == tokenizer.eos_token_id and len(ids) == 3
    assert tokenizer.decode(ids, skip_special_tokens=True) == "12"
    assert tokenizer.decode(tokenizer("#").input_ids) == "<unk>"
    batch = tokenizer(["1+2=", "33+44="], padding=True, padding_side="left")
    assert batch.input_ids[0][:2] == [tokenizer.pad_token_id] * 2
    assert batch.attention_mask[0] == [0, 0, 1, 1, 1, 1]


def test_model_builds_deterministically_and_generates(tokenizer):
    model = build_tiny_model(tokenizer, seed=1, **SMALL)
    again = build_tiny_model(tokenizer, seed=1, **SMALL)
    other = build_tiny_model(tokenizer, seed=2, **SMALL)
    state, state_again = model.state_dict(), again.state_dict()
    assert all(torch.equal(state[key], state_again[key]) for key in state)
    assert not torch.equal(state["model.embed_tokens.weight"], other.state_dict()["model.embed_tokens.weight"])
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.config.max_position_embeddings == 512
    assert (model.config.pad_token_id, model.config.eos_token_id, model.config.bos_token_id) == (0, 1, 2)
    gen = model.generation_config
    assert (gen.pad_token_id, gen.eos_token_id, gen.bos_token_id) == (0, 1, 2)

    enc = tokenizer([" 12+ 34=", " 56*  7="], return_tensors="pt")
    torch.manual_seed(0)
    out = model.generate(**enc, max_new_tokens=5, do_sample=True, temperature=1.0)
    assert out.shape[0] == 2 and 8 < out.shape[1] <= 13
    assert torch.equal(out[:, :8], enc.input_ids)
    assert all(isinstance(text, str) for text in tokenizer.batch_decode(out[:, 8:], skip_special_tokens=True))


def test_default_model_shape(tokenizer):
    model = build_tiny_model(tokenizer)
    assert model.config.hidden_size // model.config.num_attention_heads == 32  # a head size vLLM's CPU path supports
    assert 0.5e6 < sum(p.numel() for p in model.parameters()) < 0.7e6


def test_save_load_round_trip_with_auto_classes(tokenizer, tmp_path):
    model = build_tiny_model(tokenizer, seed=3, **SMALL)
    save_tiny(model, tokenizer, tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    loaded_tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.config.tie_word_embeddings
    assert (loaded.generation_config.pad_token_id, loaded.generation_config.eos_token_id) == (0, 1)
    # Next to a Qwen2 config, transformers loads the tokenizer as `Qwen2Tokenizer` (a rebuilt byte-level pipeline):
    # it must still give the same ids and decode back to the same text.
    rng = random.Random(1)
    texts = ["\\boxed{ 47+385 }", "  two  spaces  ", " 47+385="]
    texts += ["".join(rng.choice(CHARACTERS) for _ in range(rng.randint(1, 30))) for _ in range(100)]
    for text in texts:
        assert loaded_tokenizer(text).input_ids == tokenizer(text).input_ids, text
        assert loaded_tokenizer.decode(loaded_tokenizer(text).input_ids) == text
    assert loaded_tokenizer.decode(tokenizer("12<eos><pad>").input_ids, skip_special_tokens=True) == "12"
    assert loaded_tokenizer.eos_token_id == tokenizer.eos_token_id
    assert loaded_tokenizer.pad_token_id == tokenizer.pad_token_id
    enc = tokenizer([" 12+ 34="], return_tensors="pt")
    with torch.no_grad():
        assert torch.allclose(model(**enc).logits, loaded(**enc).logits)
    model_again, tokenizer_again = load_tiny(tmp_path)
    assert type(model_again).__name__ == "Qwen2ForCausalLM"
    assert tokenizer_again.decode(tokenizer_again("1 2").input_ids) == "1 2"


def test_corrupt_answer_is_plausible_and_wrong():
    rng = random.Random(0)
    for answer in ["0", "7", "10", "11", "98", "100", "555", "9801", "1998"]:
        for _ in range(200):
            wrong = corrupt_answer(answer, rng)
            assert wrong != answer
            assert wrong.isdigit() and (wrong == "0" or not wrong.startswith("0"))
            assert abs(len(wrong) - len(answer)) <= 1


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("TRL_ADA_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path / "tiny-arith-v1"
    monkeypatch.delenv("TRL_ADA_CACHE")
    assert default_cache_dir().parts[-3:] == (".cache", "trl_ada", "tiny-arith-v1")


def test_shipped_model_loads_and_is_half_trained():
    assert (TINY_ARITH_ASSETS / "model.safetensors").is_file(), "run scripts/build_tiny_model.py"
    model, tokenizer = load_tiny_arith_model()
    assert tokenizer.decode(tokenizer(" 47+385=").input_ids) == " 47+385="
    problems = held_out_problems(64, seed=123)
    result = accuracy_by_level(model, tokenizer, problems, temperature=1.0, num_samples=1, seed=0)
    assert 0.1 < result["overall"] < 0.9
    # Easy levels clearly above hard ones: the pass rates spread, so adaptive sampling has something to do.
    assert result["per_level"][0] > result["per_level"][5]


def test_short_warm_start_is_deterministic():
    from trl_ada.tiny import build_warm_started

    kwargs = {"clean_steps": 4, "noisy_steps": 2, "batch_size": 8, "eval_problems": 0, "model_kwargs": SMALL}
    model, tokenizer, report = build_warm_started(seed=5, **kwargs)
    again, _, _ = build_warm_started(seed=5, **kwargs)
    state, state_again = model.state_dict(), again.state_dict()
    assert all(torch.equal(state[key], state_again[key]) for key in state)
    untrained = build_tiny_model(tokenizer, seed=5, **SMALL).state_dict()
    assert not torch.equal(state["model.norm.weight"], untrained["model.norm.weight"])
    assert set(report["phases"]) == {"clean", "noisy"}
    assert model.config.use_cache


def test_cache_and_fallback_load_without_building(tokenizer, tmp_path, monkeypatch):
    import trl_ada.tiny as tiny

    def no_build(**kwargs):
        raise AssertionError("must not build when the cache holds a model")

    monkeypatch.setattr(tiny, "build_warm_started", no_build)
    cached = tmp_path / "cache" / "tiny-arith-v1"
    save_tiny(build_tiny_model(tokenizer, seed=4, **SMALL), tokenizer, cached)
    model, loaded_tokenizer = tiny.get_warm_started_model(cached)
    assert model.config.hidden_size == 64 and len(loaded_tokenizer) == len(tokenizer)
    # Without shipped assets, load_tiny_arith_model falls back to the cache ($TRL_ADA_CACHE/tiny-arith-v1).
    monkeypatch.setattr(tiny, "TINY_ARITH_ASSETS", tmp_path / "missing")
    monkeypatch.setenv("TRL_ADA_CACHE", str(tmp_path / "cache"))
    model, _ = tiny.load_tiny_arith_model()
    assert model.config.hidden_size == 64
