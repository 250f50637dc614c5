"""
`trl_ada.async_grpo.tree_attention`: the plain-torch stand-in for TRL's GPU-only `"tree_fa3"` attention.

Every check packs samples with TRL's own `TreeRow` and compares the tree forward, at the packed position of each
sample token's trie node, with that sample computed alone by ordinary causal attention.
"""

import copy
import os
import random

import pytest
import torch
from transformers import AttentionInterface, Qwen2Config, Qwen2ForCausalLM
from transformers.masking_utils import AttentionMaskInterface

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

packing = pytest.importorskip("trl.experimental.async_grpo.packing", reason="tree packing is TRL 1.16's")

from trl_ada.async_grpo import tree_attention as ta  # noqa: E402

ATOL = RTOL = 1e-5


@pytest.fixture(autouse=True)
def restore_registrations(monkeypatch):
    """Each test registers what it needs; put transformers' tables and TRL's `packing` back afterwards."""
    monkeypatch.setattr(AttentionInterface, "_global_mapping", dict(AttentionInterface._global_mapping))
    monkeypatch.setattr(AttentionMaskInterface, "_global_mapping", dict(AttentionMaskInterface._global_mapping))
    monkeypatch.setattr(packing, "tree_attention", packing.tree_attention)
    ta.kernel_available.cache_clear()
    yield
    ta.kernel_available.cache_clear()


# --- samples and packing -------------------------------------------------------------------------------------------


def make_sample(ids: list[int], prompt_len: int, group_id: int) -> dict:
    """A rollout sample as `RolloutQueueDataset` yields it to the batchers (prompt untrained, completion trained)."""
    n = len(ids)
    return {
        "input_ids": torch.tensor(ids),
        "completion_mask": torch.tensor([0] * prompt_len + [1] * (n - prompt_len)),
        "old_log_probs": -torch.rand(n),
        "advantage": 0.5,
        "group_id": group_id,
    }


def plain_samples() -> list[dict]:
    """(a) Unrelated sequences: nothing shared, one chain per sample."""
    return [
        make_sample([1, 2, 3, 4, 5], 2, 0),
        make_sample([6, 7, 8], 1, 1),
        make_sample([9, 10, 11, 12, 13, 14], 3, 2),
    ]


def forked_samples() -> list[dict]:
    """(b) Several completions of one prompt: one shared prompt segment, one branch per completion."""
    prompt = [1, 2, 3, 4, 5]
    return [make_sample(prompt + c, len(prompt), 0) for c in ([6, 7], [8, 9, 10], [11], [12, 13, 14, 15])]


def nested_samples() -> list[dict]:
    """(c) Forks inside forks, a sample that is a prefix of another, a duplicate, and a second prompt group."""
    prompt = [1, 2, 3]
    completions = [
        [4, 5, 6],
        [4, 5, 7, 8],
        [4, 5, 7, 9, 10],
        [4, 5],  # a prefix of the three above: ends on its own leaf
        [4, 11],
        [12, 13],
        [4, 5, 6],  # a duplicate: shares every node, leaf included
    ]
    samples = [make_sample(prompt + c, len(prompt), 0) for c in completions]
    samples += [make_sample([1, 2, 14, 15], 2, 1), make_sample([16, 17, 18], 1, 2)]  # shares [1] only; unrelated
    return samples


def random_samples(seed: int) -> list[dict]:
    """Random sequences over a 3-token vocabulary, so prefixes collide and fork at every depth."""
    rng = random.Random(seed)
    samples = []
    for i in range(10):
        n = rng.randint(1, 9)
        samples.append(make_sample([rng.randrange(3) for _ in range(n)], rng.randint(0, n - 1), i % 3))
    return samples


SCENARIOS = {
    "plain": plain_samples,
    "forked": forked_samples,
    "nested": nested_samples,
    "random0": lambda: random_samples(0),
    "random1": lambda: random_samples(1),
}


def pack(samples: list[dict]) -> tuple[dict, list[torch.Tensor]]:
    """
    Pack `samples` in one `TreeRow`, and find the packed position of each sample token's trie node.

    A sample ends on a leaf, the end of exactly one segment, and the root-to-leaf path that segment gathers is the
    sample's nodes in order. A leaf is a segment end that no other segment's path passes through.
    """
    row = packing.TreeRow()
    for sample in samples:
        row.add(sample)
    packed = row.pack()
    kv, cu_k = packed["tree_kv_index"], packed["tree_cu_seqlens_k"].tolist()
    paths = [kv[a:b] for a, b in zip(cu_k[:-1], cu_k[1:], strict=True)]
    uses = torch.bincount(kv, minlength=len(packed["input_ids"]))
    leaves = [path for path in paths if uses[path[-1]] == 1]
    positions = []
    for sample in samples:
        ids = sample["input_ids"]
        (path,) = [p for p in leaves if len(p) == len(ids) and torch.equal(packed["input_ids"][p], ids)]
        assert torch.equal(packed["position_ids"][path], torch.arange(len(ids)))
        positions.append(path)
    # The loss terms agree: a trained token is predicted at the packed position of its predecessor's node.
    expected = [
        int(pos[p - 1])
        for sample, pos in zip(samples, positions, strict=True)
        for p in sample["completion_mask"].nonzero().flatten().tolist()
        if p > 0
    ]
    assert packed["token_index"].tolist() == expected
    return packed, positions


def tree_kwargs(packed: dict) -> dict:
    """The attention kwargs exactly as `AsyncGRPOTrainer.compute_loss` builds them (after the collator's padding)."""
    kwargs = {
        key: packed[key][packed[key] >= 0] for key in ("tree_kv_index", "tree_cu_seqlens_q", "tree_cu_seqlens_k")
    }
    kwargs["tree_max_seqlen_q"], kwargs["tree_max_seqlen_k"] = packed["tree_max_seqlens"].tolist()
    return kwargs


# --- a naive reference ---------------------------------------------------------------------------------------------


def reference_attention(q, k, v, scaling=None, sliding_window=None, softcap=None):
    """Ordinary causal attention of one sample, head by head: q `(Hq, L, D)`, k/v `(Hkv, L, D)` -> `(L, Hq, D)`."""
    q_heads, length, head_dim = q.shape
    scale = scaling if scaling is not None else 1 / head_dim**0.5
    i = torch.arange(length)[:, None]
    j = torch.arange(length)[None, :]
    visible = j <= i
    if sliding_window:
        visible = visible & (i - j < sliding_window)
    out = []
    for h in range(q_heads):
        kv_head = h * k.shape[0] // q_heads
        scores = (q[h] @ k[kv_head].T) * scale
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        out.append(weights @ v[kv_head])
    return torch.stack(out, dim=1)


def random_qkv(n: int, q_heads: int, kv_heads: int, head_dim: int = 8, spread: float = 1.0, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(1, q_heads, n, head_dim, generator=generator) * spread
    k = torch.randn(1, kv_heads, n, head_dim, generator=generator) * spread
    v = torch.randn(1, kv_heads, n, head_dim, generator=generator)
    return q, k, v


# --- attention-level checks ----------------------------------------------------------------------------------------

VARIANTS = {
    "mha": dict(q_heads=4, kv_heads=4),
    "gqa2": dict(q_heads=4, kv_heads=2),
    "mqa": dict(q_heads=4, kv_heads=1),
    "window3": dict(q_heads=4, kv_heads=2, sliding_window=3),
    "window1": dict(q_heads=2, kv_heads=2, sliding_window=1),
    "softcap": dict(q_heads=4, kv_heads=2, softcap=2.0, spread=3.0),
    "scaling": dict(q_heads=4, kv_heads=2, scaling=0.9),
    "all": dict(q_heads=6, kv_heads=2, sliding_window=4, softcap=3.0, scaling=0.6, spread=2.0),
}


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_matches_per_sample_reference(scenario, variant):
    options = dict(VARIANTS[variant])
    q_heads, kv_heads, spread = options.pop("q_heads"), options.pop("kv_heads"), options.pop("spread", 1.0)
    samples = SCENARIOS[scenario]()
    packed, positions = pack(samples)
    q, k, v = random_qkv(len(packed["input_ids"]), q_heads, kv_heads, spread=spread)

    out, weights = ta.tree_attention_torch(None, q, k, v, None, **tree_kwargs(packed), **options)

    assert weights is None
    assert out.shape == (1, len(packed["input_ids"]), q_heads, q.shape[-1])
    assert out.dtype == q.dtype
    for pos in positions:
        expected = reference_attention(q[0][:, pos], k[0][:, pos], v[0][:, pos], **options)
        torch.testing.assert_close(out[0, pos], expected, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("scenario", ["forked", "nested"])
def test_scenarios_share_and_fork(scenario):
    """The forked rows really share tokens, and have segments with fewer queries than keys (bottom-right alignment)."""
    samples = SCENARIOS[scenario]()
    packed, _ = pack(samples)
    assert len(packed["input_ids"]) < sum(len(s["input_ids"]) for s in samples)
    len_q = packed["tree_cu_seqlens_q"].diff()
    len_k = packed["tree_cu_seqlens_k"].diff()
    assert (len_k > len_q).sum() >= 2


def test_bottom_right_alignment_by_hand():
    """A two-token segment after a three-token prefix: row i of the segment sees keys 0..3+i."""
    q, k, v = random_qkv(5, 2, 2, seed=1)
    kwargs = dict(
        tree_kv_index=torch.tensor([0, 1, 2, 0, 1, 2, 3, 4]),
        tree_cu_seqlens_q=torch.tensor([0, 3, 5], dtype=torch.int32),
        tree_cu_seqlens_k=torch.tensor([0, 3, 8], dtype=torch.int32),
        tree_max_seqlen_q=3,
        tree_max_seqlen_k=5,
    )
    out, _ = ta.tree_attention_torch(None, q, k, v, None, **kwargs)
    torch.testing.assert_close(out[0], reference_attention(q[0], k[0], v[0]), atol=ATOL, rtol=RTOL)


def test_gradients_match_reference():
    """The trainer backpropagates through it: gradients of a loss over every sample's tokens match the reference."""
    samples = nested_samples()
    packed, positions = pack(samples)
    n = len(packed["input_ids"])
    weights = [
        torch.randn(len(pos), 4, 8, generator=torch.Generator().manual_seed(i)) for i, pos in enumerate(positions)
    ]

    q, k, v = (x.requires_grad_() for x in random_qkv(n, 4, 2))
    out, _ = ta.tree_attention_torch(None, q, k, v, None, **tree_kwargs(packed), sliding_window=4, softcap=3.0)
    sum((out[0, pos] * w).sum() for pos, w in zip(positions, weights, strict=True)).backward()

    q_ref, k_ref, v_ref = (x.requires_grad_() for x in random_qkv(n, 4, 2))
    loss = 0
    for pos, w in zip(positions, weights, strict=True):
        expected = reference_attention(
            q_ref[0][:, pos], k_ref[0][:, pos], v_ref[0][:, pos], sliding_window=4, softcap=3.0
        )
        loss = loss + (expected * w).sum()
    loss.backward()
    for got, want in ((q, q_ref), (k, k_ref), (v, v_ref)):
        assert torch.isfinite(got.grad).all()
        torch.testing.assert_close(got.grad, want.grad, atol=1e-4, rtol=1e-4)


def test_computes_in_query_dtype():
    packed, positions = pack(forked_samples())
    q, k, v = (x.to(torch.bfloat16) for x in random_qkv(len(packed["input_ids"]), 4, 2))
    out, _ = ta.tree_attention_torch(None, q, k.float(), v.float(), None, **tree_kwargs(packed))
    assert out.dtype == torch.bfloat16
    for pos in positions:
        expected = reference_attention(q[0][:, pos].float(), k[0][:, pos].float(), v[0][:, pos].float())
        torch.testing.assert_close(out[0, pos].float(), expected, atol=3e-2, rtol=3e-2)


# --- end to end: a tiny Qwen2 --------------------------------------------------------------------------------------


@pytest.mark.parametrize("sliding", [False, True], ids=["full", "sliding"])
def test_tiny_qwen2_tree_forward_matches_eager_per_sample(sliding):
    ta.register_cpu_tree_attention()
    config = Qwen2Config(
        vocab_size=32,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        **(dict(use_sliding_window=True, sliding_window=3, max_window_layers=1) if sliding else {}),
    )
    torch.manual_seed(0)
    eager = Qwen2ForCausalLM._from_config(copy.deepcopy(config), attn_implementation="eager").eval()
    tree = Qwen2ForCausalLM._from_config(copy.deepcopy(config), attn_implementation=ta.TREE_ATTENTION).eval()
    tree.load_state_dict(eager.state_dict())
    assert eager.config._attn_implementation == "eager"
    assert tree.config._attn_implementation == "tree_fa3"
    if sliding:
        assert tree.config.layer_types == ["full_attention", "sliding_attention"]

    forked = forked_samples()
    for sample in forked:
        sample["group_id"] = 3
    samples = nested_samples() + forked
    packed, positions = pack(samples)
    with torch.no_grad():
        logits = tree(
            input_ids=packed["input_ids"].unsqueeze(0),
            position_ids=packed["position_ids"].unsqueeze(0),
            **tree_kwargs(packed),
        ).logits
        for sample, pos in zip(samples, positions, strict=True):
            ids = sample["input_ids"].unsqueeze(0)
            alone = eager(input_ids=ids, position_ids=torch.arange(ids.shape[1]).unsqueeze(0)).logits
            torch.testing.assert_close(logits[0, pos], alone[0], atol=ATOL, rtol=RTOL)


# --- registration --------------------------------------------------------------------------------------------------


def test_register_cpu_tree_attention():
    ta.register_cpu_tree_attention()
    assert AttentionInterface._global_mapping["tree_fa3"] is ta.tree_attention_torch
    assert AttentionMaskInterface._global_mapping["tree_fa3"]() is None
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    assert ALL_ATTENTION_FUNCTIONS.get_interface("tree_fa3", None) is ta.tree_attention_torch


def test_trainer_registration_does_not_override_cpu_version(monkeypatch):
    """`AsyncGRPOTrainer.__init__` calls `register_tree_attention()`; after the swap it registers the CPU version."""
    from trl.experimental.async_grpo import async_grpo_trainer

    monkeypatch.setattr(packing, "tree_attention", ta.KERNEL_TREE_ATTENTION)  # TRL as shipped
    packing.register_tree_attention()  # the kernel version, as a trainer built earlier would have left it
    assert AttentionInterface._global_mapping["tree_fa3"] is ta.KERNEL_TREE_ATTENTION
    assert ta.use_cpu_tree_attention_if_no_kernel(force=True)
    assert AttentionInterface._global_mapping["tree_fa3"] is ta.tree_attention_torch
    async_grpo_trainer.register_tree_attention()  # what the trainer's __init__ calls
    assert AttentionInterface._global_mapping["tree_fa3"] is ta.tree_attention_torch
    assert ta.use_cpu_tree_attention_if_no_kernel(force=True)  # idempotent
    assert AttentionInterface._global_mapping["tree_fa3"] is ta.tree_attention_torch


def test_kernel_unavailable_without_cuda_and_never_downloads(monkeypatch):
    def no_download():
        raise AssertionError("kernel_available() tried to load the kernel without CUDA")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(packing, "_flash_attn", no_download)
    assert ta.kernel_available() is False
    assert ta.use_cpu_tree_attention_if_no_kernel() is True
    assert AttentionInterface._global_mapping["tree_fa3"] is ta.tree_attention_torch


def test_kernel_available_when_it_loads(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(packing, "_flash_attn", lambda: object())
    monkeypatch.setattr(ta.importlib.util, "find_spec", lambda name: object())
    # TRL's own function, even after an earlier trainer in this process installed the CPU one.
    monkeypatch.setattr(packing, "tree_attention", ta.KERNEL_TREE_ATTENTION)
    packing.register_tree_attention()
    assert ta.kernel_available() is True
    assert ta.use_cpu_tree_attention_if_no_kernel() is False  # leaves the kernel version in place
    assert packing.tree_attention is ta.KERNEL_TREE_ATTENTION
    assert AttentionInterface._global_mapping["tree_fa3"] is ta.KERNEL_TREE_ATTENTION


def test_kernel_unavailable_when_loading_fails(monkeypatch):
    def broken():
        raise RuntimeError("no kernel for this GPU")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(ta.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(packing, "_flash_attn", broken)
    assert ta.kernel_available() is False
