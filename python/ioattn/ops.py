"""PyTorch integration: torch.library custom ops over ioattn's kernels.

Three operators are registered in the ``ioattn`` namespace, each with a CPU and a CUDA
implementation (both call :mod:`ioattn._core`, which picks the backend and the current CUDA
stream from the tensors) and a fake (meta) implementation, so ``torch.compile(fullgraph=True)``
traces them as single graph nodes:

- ``ioattn::attention(Tensor q, Tensor k, Tensor v, bool causal, int window_left,
  int window_right, float softcap, float? scale, bool return_lse) -> (Tensor, Tensor)``
- ``ioattn::attention_varlen(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q,
  Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, bool causal, int window_left,
  int window_right, float softcap, float? scale, bool return_lse) -> (Tensor, Tensor)``
- ``ioattn::attention_kvcache(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache,
  Tensor cache_seqlens, Tensor? k_new, Tensor? v_new, Tensor? block_table, bool causal,
  int window_left, int window_right, float softcap, float? scale, bool return_lse)
  -> (Tensor, Tensor)``; k_cache and v_cache are declared mutated (k_new/v_new are appended in
  place at cache_seqlens, FlashAttention's flash_attn_with_kvcache semantics).

Every op returns ``(out, lse)``. ``out`` is a new contiguous tensor of q's dtype with v's head
dim; ``lse`` is float32 ((B, Hq, Sq), (Hq, total_q) for varlen) when ``return_lse`` is true and
an empty float32 tensor of shape (0,) otherwise: the flag is a compile-time constant of the
graph, so both shapes are static for the tracer and no LSE is computed when nobody reads it.

The ops have no backward (the library is forward-only): an input that requires grad is an
error at backward time. The public wrappers :func:`attention`, :func:`attention_varlen` and
:func:`attention_kvcache` take FlashAttention's argument names and return ``out`` or
``(out, lse)``.
"""

from __future__ import annotations

import operator

from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from . import _core

__all__ = ["attention", "attention_varlen", "attention_kvcache", "merge_partials"]

# Inductor keeps the eager strides of the inputs of an op with this tag: the library takes any
# (B, S, H) strides but needs the head dim contiguous, and must not see a layout it rejects
# just because the compiler chose one.
_TAGS = (torch.Tag.needs_fixed_stride_order,) if hasattr(torch.Tag, "needs_fixed_stride_order") else ()
_DEVICES = ("cpu", "cuda")


def _outputs(q: Tensor, shapes, return_lse: bool, filled: bool = False):
    """out in q's dtype and, when requested, lse in float32 (else None: the kernel skips it).
    filled: out 0 and lse -inf, what a row gets that no sequence owns (varlen rows outside
    cu_seqlens_q, which the library leaves untouched)."""
    out_shape, lse_shape = shapes
    if filled:
        out = torch.zeros(out_shape, dtype=q.dtype, device=q.device)
        lse = torch.full(lse_shape, float("-inf"), dtype=torch.float32, device=q.device) if return_lse else None
    else:
        out = torch.empty(out_shape, dtype=q.dtype, device=q.device)
        lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device) if return_lse else None
    return out, lse


def _check_tensors(fn: str, names: Tuple[str, ...], *arrays) -> None:
    """Every array argument of a torch call is a torch.Tensor (or None where optional): torch's
    dispatcher would otherwise reject a numpy array with an error that names no argument. The
    type() test first keeps the common case (plain tensors) to a few steps."""
    for name, x in zip(names, arrays):
        if x is not None and type(x) is not Tensor and not isinstance(x, Tensor):
            raise ValueError(
                f"ioattn.{fn}: {name} is a {type(x).__module__}.{type(x).__name__} beside a torch.Tensor q: "
                "pass torch tensors for every array (or numpy arrays for all)"
            )


def _returned(q: Tensor, out: Tensor, lse: Optional[Tensor]):
    """The op's (out, lse): an empty (0,) lse when none was asked for, a static shape to trace."""
    return out, (lse if lse is not None else torch.empty((0,), dtype=torch.float32, device=q.device))


def _fake_outputs(q: Tensor, shapes, return_lse: bool):
    out_shape, lse_shape = shapes
    return q.new_empty(out_shape), q.new_empty(lse_shape if return_lse else (0,), dtype=torch.float32)


# --------------------------------------------------------------------------------------------
# ioattn::attention
# --------------------------------------------------------------------------------------------


def _dense_shapes(q: Tensor, v: Tensor):
    if q.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"ioattn.attention: q, k, v must be 4-D (B, S, H, D); got q {tuple(q.shape)}, v {tuple(v.shape)}"
        )
    B, Sq, Hq, _ = q.shape
    return (B, Sq, Hq, v.shape[3]), (B, Hq, Sq)


@torch.library.custom_op("ioattn::attention", mutates_args=(), device_types=_DEVICES, tags=_TAGS)
def _attention_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    scale: Optional[float],
    return_lse: bool,
) -> Tuple[Tensor, Tensor]:
    out, lse = _outputs(q, _dense_shapes(q, v), return_lse)
    _core.run_forward(
        q, k, v, out, lse,
        causal=causal, window=(window_left, window_right), softcap=softcap, scale=scale,
    )
    return _returned(q, out, lse)


@_attention_op.register_fake
def _attention_fake(q, k, v, causal, window_left, window_right, softcap, scale, return_lse):
    return _fake_outputs(q, _dense_shapes(q, v), return_lse)


# --------------------------------------------------------------------------------------------
# ioattn::attention_varlen
# --------------------------------------------------------------------------------------------


def _varlen_shapes(q: Tensor, v: Tensor):
    if q.dim() != 3 or v.dim() != 3:
        raise ValueError(
            "ioattn.attention_varlen: q, k, v must be 3-D (total, H, D); "
            f"got q {tuple(q.shape)}, v {tuple(v.shape)}"
        )
    total_q, Hq, _ = q.shape
    return (total_q, Hq, v.shape[2]), (Hq, total_q)


@torch.library.custom_op("ioattn::attention_varlen", mutates_args=(), device_types=_DEVICES, tags=_TAGS)
def _attention_varlen_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    scale: Optional[float],
    return_lse: bool,
) -> Tuple[Tensor, Tensor]:
    # max_seqlen_q / max_seqlen_k are FlashAttention's launch hints; the library reads the
    # lengths from cu_seqlens itself, so they are accepted and not needed.
    out, lse = _outputs(q, _varlen_shapes(q, v), return_lse, filled=True)
    _core.run_varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, out, lse,
        causal=causal, window=(window_left, window_right), softcap=softcap, scale=scale,
    )
    return _returned(q, out, lse)


@_attention_varlen_op.register_fake
def _attention_varlen_fake(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
    causal, window_left, window_right, softcap, scale, return_lse,
):
    return _fake_outputs(q, _varlen_shapes(q, v), return_lse)


# --------------------------------------------------------------------------------------------
# ioattn::attention_kvcache
# --------------------------------------------------------------------------------------------


@torch.library.custom_op(
    "ioattn::attention_kvcache", mutates_args=("k_cache", "v_cache"), device_types=_DEVICES, tags=_TAGS
)
def _attention_kvcache_op(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    cache_seqlens: Tensor,
    k_new: Optional[Tensor],
    v_new: Optional[Tensor],
    block_table: Optional[Tensor],
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    scale: Optional[float],
    return_lse: bool,
) -> Tuple[Tensor, Tensor]:
    out, lse = _outputs(q, _dense_shapes(q, v_cache), return_lse)
    _core.run_kvcache(
        q, k_cache, v_cache, cache_seqlens, k_new, v_new, block_table, out, lse,
        causal=causal, window=(window_left, window_right), softcap=softcap, scale=scale,
    )
    return _returned(q, out, lse)


@_attention_kvcache_op.register_fake
def _attention_kvcache_fake(
    q, k_cache, v_cache, cache_seqlens, k_new, v_new, block_table,
    causal, window_left, window_right, softcap, scale, return_lse,
):
    return _fake_outputs(q, _dense_shapes(q, v_cache), return_lse)


# --------------------------------------------------------------------------------------------
# Public wrappers (FlashAttention's names and argument conventions)
# --------------------------------------------------------------------------------------------

WindowArg = Union[Sequence[int], None]

# The OpOverloads, looked up once (torch.ops attribute access costs a few µs per call).
_ATTENTION = torch.ops.ioattn.attention.default
_ATTENTION_VARLEN = torch.ops.ioattn.attention_varlen.default
_ATTENTION_KVCACHE = torch.ops.ioattn.attention_kvcache.default
_VARLEN_ARRAYS = ("k", "v", "cu_seqlens_q", "cu_seqlens_k")
_KVCACHE_ARRAYS = ("k_cache", "v_cache", "k_new", "v_new", "block_table")


def _scale(scale: Optional[float]) -> Optional[float]:
    return None if scale is None else float(scale)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    window: WindowArg = (-1, -1),
    softcap: float = 0.0,
    scale: Optional[float] = None,
    return_lse: bool = False,
):
    """Exact attention on (B, S, H, D) tensors (FlashAttention's flash_attn_func layout).

    q (B, Sq, Hq, D), k (B, Sk, Hkv, D), v (B, Sk, Hkv, Dv) with Hq % Hkv == 0 (GQA/MQA);
    causal and windows are bottom-right aligned; ``scale`` None or <= 0 means 1/sqrt(D);
    ``softcap`` 0 is off. Returns out (B, Sq, Hq, Dv), or (out, lse) with lse float32 (B, Hq, Sq).
    """
    _check_tensors("attention", ("k", "v"), k, v)
    wl, wr = _core.window_pair(window)
    out, lse = _ATTENTION(
        q, k, v, bool(causal), wl, wr, float(softcap), _scale(scale), bool(return_lse)
    )
    return (out, lse) if return_lse else out


def attention_varlen(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    causal: bool = False,
    window: WindowArg = (-1, -1),
    softcap: float = 0.0,
    scale: Optional[float] = None,
    return_lse: bool = False,
):
    """Packed variable-length batch (FlashAttention's flash_attn_varlen_func layout).

    q (total_q, Hq, D), k/v (total_k, Hkv, D/Dv), cu_seqlens_q/k int32 (batch + 1,) on q's
    device. Returns out (total_q, Hq, Dv), or (out, lse) with lse float32 (Hq, total_q); rows
    outside [cu_seqlens_q[0], cu_seqlens_q[-1]) belong to no sequence and get 0 and lse -inf.
    """
    _check_tensors("attention_varlen", _VARLEN_ARRAYS, k, v, cu_seqlens_q, cu_seqlens_k)
    wl, wr = _core.window_pair(window)
    out, lse = _ATTENTION_VARLEN(
        q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k),
        bool(causal), wl, wr, float(softcap), _scale(scale), bool(return_lse),
    )
    return (out, lse) if return_lse else out


def attention_kvcache(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    cache_seqlens: Union[Tensor, int],
    *,
    k_new: Optional[Tensor] = None,
    v_new: Optional[Tensor] = None,
    block_table: Optional[Tensor] = None,
    causal: bool = False,
    window: WindowArg = (-1, -1),
    softcap: float = 0.0,
    scale: Optional[float] = None,
    return_lse: bool = False,
):
    """Attention over a KV cache (FlashAttention's flash_attn_with_kvcache semantics).

    k_cache/v_cache (B, S_max, Hkv, D) or paged (num_pages, page_size, Hkv, D) with
    block_table int32 (B, max_pages); cache_seqlens int32 (B,) (an int means the same length
    for every sequence). k_new/v_new (B, S_new, Hkv, D) are written into the cache in place at
    cache_seqlens[b]; cache_seqlens itself is not advanced. q (B, Sq, Hq, D) attends over
    cache_seqlens[b] + S_new keys. Returns out, or (out, lse) with lse float32 (B, Hq, Sq).
    """
    if (k_new is None) != (v_new is None):
        raise ValueError("ioattn.attention_kvcache: k_new and v_new must be given together")
    if not isinstance(cache_seqlens, Tensor):
        try:
            length = operator.index(cache_seqlens)  # an int, numpy's too: every sequence's length
        except TypeError:
            raise ValueError(
                f"ioattn.attention_kvcache: cache_seqlens must be an int32 tensor (B,) or an int, "
                f"got {type(cache_seqlens).__name__}"
            ) from None
        cache_seqlens = torch.full((q.shape[0],), length, dtype=torch.int32, device=q.device)
    _check_tensors("attention_kvcache", _KVCACHE_ARRAYS, k_cache, v_cache, k_new, v_new, block_table)
    wl, wr = _core.window_pair(window)
    out, lse = _ATTENTION_KVCACHE(
        q, k_cache, v_cache, cache_seqlens, k_new, v_new, block_table,
        bool(causal), wl, wr, float(softcap), _scale(scale), bool(return_lse),
    )
    return (out, lse) if return_lse else out


# --------------------------------------------------------------------------------------------
# Merging partial results (common/online_softmax.h's merge, on normalized outputs)
# --------------------------------------------------------------------------------------------
#
# A partial (out, lse) over a key set is the header's state (m = lse, l = 1, O = out) when it saw
# a key, and (m = -inf, l = 0, O = out = 0) when it saw none; merge() then gives the weights, and
# the output is (w_a O_a + w_b O_b) * output_scale(l), lse = row_lse(m, l). Each step below is
# one IEEE operation in the header's order, so the only difference from the C++ rule
# (ioattn._ext.merge_partials, the numpy path of ioattn.merge_partials) is the rounding of exp
# and log by torch's vectorized math against libm's.


def _merge_weights(lse_a: Tensor, lse_b: Tensor):
    """(weight_a, weight_b, lse) of merge(); weights already divided by l, (B, H, S) like lse."""
    neg_inf = float("-inf")
    m = torch.maximum(lse_a, lse_b)  # propagates NaN, as the header's m_a + m_b does
    ref = torch.where(m == neg_inf, 0.0, m)  # max_for_exp
    w_a = torch.where(lse_a == neg_inf, 0.0, torch.exp(lse_a - ref))
    w_b = torch.where(lse_b == neg_inf, 0.0, torch.exp(lse_b - ref))
    l = w_a + w_b  # l_a w_a + l_b w_b with l in {0, 1}: the products are exact
    lse = torch.where(l == 0, neg_inf, m + torch.log(l))
    scale = torch.where(l == 0, 0.0, torch.reciprocal(l))  # output_scale
    return w_a, w_b, scale, lse


def _row_factor(w: Tensor) -> Tensor:
    """(B, H, S) row weights as a (B, S, H, 1) factor of out."""
    return w.transpose(1, 2).unsqueeze(-1)


def _merge_into(acc: Tensor, acc_lse: Tensor, out: Tensor, lse: Tensor) -> None:
    """merge_partials into (acc, acc_lse) in place; acc float32 (B, S, H, Dv), views allowed."""
    w_a, w_b, scale, merged_lse = _merge_weights(acc_lse, lse)
    acc.mul_(_row_factor(w_a)).add_(out.to(acc.dtype) * _row_factor(w_b)).mul_(_row_factor(scale))
    acc_lse.copy_(merged_lse)


def _check_partials(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> None:
    for name, x, rank in (("out_a", out_a, 4), ("lse_a", lse_a, 3), ("out_b", out_b, 4), ("lse_b", lse_b, 3)):
        if not isinstance(x, Tensor):
            raise TypeError(f"merge_partials: {name} must be a torch tensor, got {type(x).__name__}")
        if x.dim() != rank:
            raise ValueError(f"merge_partials: {name} must be {rank}-D, got shape {tuple(x.shape)}")
    if out_a.shape != out_b.shape:
        raise ValueError(f"merge_partials: out_a {tuple(out_a.shape)} and out_b {tuple(out_b.shape)} differ")
    B, S, H, _ = out_a.shape
    for name, x in (("lse_a", lse_a), ("lse_b", lse_b)):
        if tuple(x.shape) != (B, H, S):
            raise ValueError(f"merge_partials: {name} must be (B, H, S) = {(B, H, S)}, got {tuple(x.shape)}")
        if x.dtype != torch.float32:
            raise ValueError(f"merge_partials: {name} must be float32, got {x.dtype}")
    devices = {x.device for x in (out_a, lse_a, out_b, lse_b)}
    if len(devices) != 1:
        raise ValueError(f"merge_partials: the tensors are on several devices: {sorted(map(str, devices))}")


def merge_partials(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor):
    """(out, lse) of attention over the union of two disjoint key sets, from each set's (out, lse).

    out (B, S, H, Dv) in any floating dtype, lse float32 (B, H, S), on any one device. The merge
    runs in float32 with common/online_softmax.h's rule: a side with lse = -inf saw no key and
    contributes nothing, both -inf give out = 0 and lse = -inf, NaN propagates. out comes back in
    the promoted dtype of out_a and out_b, lse in float32.
    """
    _check_partials(out_a, lse_a, out_b, lse_b)
    acc = out_a.to(torch.float32, copy=True)
    acc_lse = lse_a.clone()
    _merge_into(acc, acc_lse, out_b, lse_b)
    return acc.to(torch.promote_types(out_a.dtype, out_b.dtype)), acc_lse
