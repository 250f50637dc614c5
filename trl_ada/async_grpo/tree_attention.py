"""Plain-torch tree attention for TRL's `AsyncGRPOTrainer` (TRL 1.16), whose `attn_implementation="tree_fa3"` forwards
samples folded into a prefix trie through the GPU-only Hub kernel `kernels-community/flash-attn3`.
[`tree_attention_torch`] is a drop-in replacement with the kernel's semantics:

- Segment `s` holds the queries `cu_seqlens_q[s]:cu_seqlens_q[s + 1]` of the packed row and attends to the K/V rows
  `tree_kv_index[cu_seqlens_k[s]:cu_seqlens_k[s + 1]]`: the packed positions of its root-to-segment path.
- `causal=True` is aligned bottom-right, as flash-attention's varlen functions do when a segment has fewer queries than
  keys: query `i` of a segment of `Lq` queries sees key `j` of its `Lk`-long path iff `j <= i + (Lk - Lq)`, so the
  segment's last query sees the whole path. A query row that sees no key outputs zeros (cannot happen in a trie).
- `sliding_window=w` is the kernel's `window_size=(w - 1, 0)`: additionally `j >= i + (Lk - Lq) - (w - 1)`.
- `softcap=c` caps the scaled scores, `c * tanh(scores / c)`, before the softmax; `scaling` defaults to
  `1 / sqrt(head_dim)`.
- GQA: K/V may have fewer heads than Q; query head `h` reads K/V head `h // (q_heads // kv_heads)`.
- No dropout, no attention mask (TRL's mask function for `"tree_fa3"` returns `None`), and no attention weights
  returned, like the kernel path.

The scores and the value product are computed in the query's dtype and the softmax in float32, as transformers' eager
attention does (half-precision results agree with the kernel to rounding only).
"""

from __future__ import annotations

import importlib.util
from functools import cache
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface
from trl.experimental.async_grpo import packing

__all__ = [
    "kernel_available",
    "register_cpu_tree_attention",
    "tree_attention_torch",
    "use_cpu_tree_attention_if_no_kernel",
]

TREE_ATTENTION: str = packing.TREE_ATTENTION

# TRL's kernel-backed function, kept before `use_cpu_tree_attention_if_no_kernel` swaps it out of `packing`.
KERNEL_TREE_ATTENTION = packing.tree_attention


def tree_attention_torch(
    module: torch.nn.Module | None,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    tree_kv_index: torch.Tensor,
    tree_cu_seqlens_q: torch.Tensor,
    tree_cu_seqlens_k: torch.Tensor,
    tree_max_seqlen_q: int,
    tree_max_seqlen_k: int,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Tree attention over one packed row, with the semantics of `packing.tree_attention` (see the module docstring).

    Args:
        query: `(1, q_heads, N, head_dim)`, as transformers passes it.
        key, value: `(1, kv_heads, N, head_dim)`, `q_heads` a multiple of `kv_heads`.
        tree_kv_index: `(K,)` packed position of every K/V row gathered, the segments' paths end to end.
        tree_cu_seqlens_q, tree_cu_seqlens_k: `(S + 1,)` segment boundaries in the row and path boundaries in
            `tree_kv_index`.
        scaling, sliding_window, softcap: as above (`None`/`0`: none).
        module, attention_mask, tree_max_seqlen_q, tree_max_seqlen_k, **kwargs: Ignored, as the kernel path does.

    Returns:
        `(output, None)`, `output` of shape `(1, N, q_heads, head_dim)` in the query's dtype.
    """
    dtype = query.dtype
    q, k, v = (x.transpose(1, 2)[0].to(dtype) for x in (query, key, value))  # (N, heads, head_dim)
    q_heads, kv_heads, head_dim = q.shape[1], k.shape[1], q.shape[2]
    if q_heads % kv_heads:
        raise ValueError(f"query heads ({q_heads}) must be a multiple of key/value heads ({kv_heads})")
    kv_index = tree_kv_index.to(device=k.device, dtype=torch.long)
    k, v = k.index_select(0, kv_index), v.index_select(0, kv_index)
    if kv_heads != q_heads:
        k = k.repeat_interleave(q_heads // kv_heads, dim=1)
        v = v.repeat_interleave(q_heads // kv_heads, dim=1)
    scale = scaling if scaling is not None else head_dim**-0.5

    cu_q, cu_k = tree_cu_seqlens_q.tolist(), tree_cu_seqlens_k.tolist()
    outputs = []
    for q_start, q_end, k_start, k_end in zip(cu_q[:-1], cu_q[1:], cu_k[:-1], cu_k[1:], strict=True):
        len_q, len_k = q_end - q_start, k_end - k_start
        if len_q == 0:
            continue
        qs = q[q_start:q_end].transpose(0, 1)  # (heads, Lq, head_dim)
        ks = k[k_start:k_end].transpose(0, 1)  # (heads, Lk, head_dim)
        vs = v[k_start:k_end].transpose(0, 1)
        scores = torch.matmul(qs, ks.transpose(1, 2)).float() * scale  # (heads, Lq, Lk)
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        rows = torch.arange(len_q, device=q.device)[:, None] + (len_k - len_q)  # bottom-right aligned diagonal
        cols = torch.arange(len_k, device=q.device)[None, :]
        allowed = cols <= rows
        if sliding_window:
            allowed &= cols >= rows - (sliding_window - 1)
        # A finite fill keeps the backward NaN-free; a row that sees no key is zeroed, as the kernel outputs.
        probs = torch.softmax(scores.masked_fill(~allowed, torch.finfo(scores.dtype).min), dim=-1)
        probs = probs.masked_fill(~allowed.any(dim=-1, keepdim=True), 0.0)
        outputs.append(torch.matmul(probs.to(dtype), vs).transpose(0, 1))  # (Lq, heads, head_dim)
    out = torch.cat(outputs) if outputs else q.new_zeros(q.shape)
    return out.unsqueeze(0), None


def register_cpu_tree_attention() -> None:
    """Register [`tree_attention_torch`] as `"tree_fa3"` (and the `None` mask function), as
    `packing.register_tree_attention` does for the kernel version, which a later call of it overrides."""
    AttentionInterface.register(TREE_ATTENTION, tree_attention_torch)
    AttentionMaskInterface.register(TREE_ATTENTION, lambda **kwargs: None)


@cache
def kernel_available() -> bool:
    """Whether TRL's flash-attention kernel can run here: CUDA (or ROCm), the `kernels` package, and the kernel loads
    (without a GPU, `False` before touching the Hub). Cached: `kernel_available.cache_clear()` asks again."""
    if not torch.cuda.is_available():
        return False
    if importlib.util.find_spec("kernels") is None:
        return False
    try:
        packing._flash_attn()
    except Exception:
        return False
    return True


def use_cpu_tree_attention_if_no_kernel(force: bool = False) -> bool:
    """Make `"tree_fa3"` the plain-torch [`tree_attention_torch`] when the kernel is unavailable (or when `force`), for
    good: it also rebinds `packing.tree_attention`, which `packing.register_tree_attention` reads, so the call in
    `AsyncGRPOTrainer.__init__` registers it too. Idempotent; returns whether the CPU version is now installed."""
    if not force and kernel_available():
        return False
    packing.tree_attention = tree_attention_torch
    register_cpu_tree_attention()
    return True
