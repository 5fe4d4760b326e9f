"""Hugging Face transformers integration: ``attn_implementation="ioattn"``.

Importing this module registers ``"ioattn"`` with transformers' ``AttentionInterface`` (the
attention function) and ``AttentionMaskInterface`` (the mask transformers builds for it)::

    import ioattn.transformers  # noqa: F401
    model = AutoModelForCausalLM.from_config(config, attn_implementation="ioattn")

What runs where:

- query/key/value arrive as (B, H, S, D) and are handed to the kernels as (B, S, H, D) views
  (a transpose, no copy: the library takes the strides; the head dim stays contiguous).
- GQA/MQA natively (no ``repeat_kv``); causal from ``is_causal`` / ``module.is_causal``
  (bottom-right aligned, so decoding with a cache needs no mask); ``sliding_window`` W becomes
  the window (W - 1 keys to the left, transformers' ``kv_idx > q_idx - W``); ``softcap`` and
  ``scaling`` are passed through.
- The mask transformers builds for ``"ioattn"`` is FlashAttention-2's: ``None`` when nothing is
  padded, else the 2-D (B, kv_len) padding mask. A padded batch (left or right padding) runs as
  a packed variable-length batch: the valid tokens are gathered, ``attention_varlen`` runs, and
  the output is scattered back with zeros at padded query rows. Packed sequences given by
  ``position_ids`` restarting inside a row without a mask, or by ``cu_seq_lens_q/k`` (a
  padding-free collator), run as varlen too, as with FlashAttention-2 in transformers. Under
  ``torch.compile`` the ``position_ids`` check (which reads the positions) is skipped: packed
  rows then need ``cu_seq_lens_q/k``.
- A static cache without a padding mask has key slots past the tokens written so far. The mask
  function then passes the keys in use per sequence, an int32 (B,) tensor computed from
  transformers' offsets without reading them, and the attention runs through
  ``attention_kvcache`` over that many keys (no copy, no host sync, so it compiles).
- A 4-D mask passed in by the caller is accepted when it is a padding mask on top of the causal
  (and sliding-window) pattern, which is checked exactly; any other mask (an additive bias,
  a document mask, a ``BlockMask``) raises ``NotImplementedError``.
- ``dropout`` must be 0 (the kernels are inference kernels); attention sinks (``s_aux``) and
  position biases raise ``NotImplementedError``. The library has no backward pass.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import ops

__all__ = ["ioattn_attention_forward", "ioattn_attention_mask", "register"]

NAME = "ioattn"


# --------------------------------------------------------------------------------------------
# Mask preparation
# --------------------------------------------------------------------------------------------


def ioattn_attention_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function=None,
    attention_mask: Optional[torch.Tensor] = None,
    **kwargs,
):
    """The mask transformers builds for ``"ioattn"``: None, the 2-D bool padding mask, or, for a
    static cache without padding, the keys in use per sequence as an int32 (B,) tensor.

    Same contract as transformers' ``flash_attention_mask``: the causal and sliding-window
    patterns are not materialised (the kernels apply them); only padding is passed on.
    """
    if attention_mask is None:
        # The keys hold kv_length slots from kv_offset; the tokens written so far end at
        # q_offset + q_length. A static cache passes q_offset as a tensor (reading it would break
        # a compiled graph), and only a static cache has slots past the tokens.
        in_use = q_offset + q_length - kv_offset
        if isinstance(in_use, torch.Tensor):
            return in_use.to(torch.int32).reshape(1).repeat(batch_size)
        if in_use < kv_length:
            return torch.full((batch_size,), in_use, dtype=torch.int32, device=kwargs.get("device"))
        return None
    if attention_mask.dim() == 1:
        return attention_mask  # keys in use, made by this function (generate builds masks ahead)
    attention_mask = attention_mask[:, -kv_length:]
    if attention_mask.shape[1] == kv_length and bool(attention_mask.all()):
        return None
    return attention_mask


def _unpad_indices(valid: torch.Tensor):
    """valid (B, S) bool -> (flat indices into B*S, cu_seqlens int32 (B+1,), max_seqlen)."""
    lens = valid.sum(dim=1, dtype=torch.int32)
    idx = torch.nonzero(valid.reshape(-1), as_tuple=False).flatten()
    cu = torch.zeros(valid.shape[0] + 1, dtype=torch.int32, device=valid.device)
    torch.cumsum(lens, dim=0, out=cu[1:])
    max_len = int(lens.max()) if lens.numel() else 0
    return idx, cu, max_len


def _gather(x_bshd: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """(B, S, H, D) view of any strides -> (N, H, D) rows at flat indices idx of B*S."""
    B, S = x_bshd.shape[:2]
    return x_bshd[idx // S, idx % S]


def _mask_to_padding(mask, batch: int, Sq: int, Sk: int, causal: bool, window: Tuple[int, int]):
    """Turn a 2-D padding mask or a 4-D mask into (q_valid (B, Sq), kv_valid (B, Sk)) bool.

    Returns None when the mask masks nothing beyond the causal/window pattern.
    Raises NotImplementedError for masks that are not padding on top of that pattern.
    """
    if not isinstance(mask, torch.Tensor):
        raise NotImplementedError(
            f"ioattn: attention_mask of type {type(mask).__name__} is not supported "
            "(only None, a 2-D padding mask or a 4-D padding+causal mask)"
        )
    if mask.dim() == 2:
        m = mask.to(torch.bool)
        B = m.shape[0]
        L = m.shape[1]
        if L > Sk:
            m = m[:, -Sk:]
            L = Sk
        kv_valid = torch.zeros((B, Sk), dtype=torch.bool, device=m.device)
        # A mask shorter than the keys (a static cache) covers the first L slots; the rest
        # are unused cache slots.
        kv_valid[:, :L] = m
        if L == Sk and bool(m.all()):
            return None
        if Sq == L:
            q_valid = m
        elif Sq == 1:
            q_valid = torch.ones((B, 1), dtype=torch.bool, device=m.device)
        elif Sq < L:
            q_valid = m[:, L - Sq:]
        else:
            raise NotImplementedError(
                f"ioattn: a 2-D padding mask of length {L} for {Sq} queries and {Sk} keys is not supported"
            )
        return q_valid, kv_valid

    B = batch
    if mask.dim() != 4:
        raise NotImplementedError(f"ioattn: attention_mask of rank {mask.dim()} is not supported")
    if mask.dtype == torch.bool:
        allowed = mask
    else:
        if not mask.is_floating_point():
            raise NotImplementedError(f"ioattn: attention_mask of dtype {mask.dtype} is not supported")
        allowed = mask > torch.finfo(mask.dtype).min / 2
        if bool((mask[allowed] != 0).any()):
            raise NotImplementedError(
                "ioattn: an additive attention bias (a float mask with values other than 0 and -inf/min) "
                "is not supported"
            )
    if allowed.shape[1] != 1:
        # one mask per head: accept only when it is the same for every head
        if bool((allowed != allowed[:, :1]).any()):
            raise NotImplementedError("ioattn: a per-head attention mask is not supported")
    if allowed.shape[-1] < Sk or allowed.shape[-2] < Sq:
        raise NotImplementedError(
            f"ioattn: a 4-D mask of shape {tuple(mask.shape)} for {Sq} queries and {Sk} keys is not supported"
        )
    allowed = allowed[:, 0, -Sq:, :Sk].expand(B, Sq, Sk)
    kv_valid = allowed.any(dim=1)
    # Which query rows are real tokens: with a cache (or none) the queries are the last Sq keys
    # (their rows' contents do not matter when padded: they come out as zeros); with a static
    # cache the unused slots are at the end, and every row that sees a key is a query.
    candidates = [allowed.any(dim=2)]
    if Sq <= Sk:
        candidates.insert(0, kv_valid[:, Sk - Sq:])
    for q_valid in candidates:
        if _is_varlen_pattern(allowed, q_valid, kv_valid, causal, window):
            break
    else:
        raise NotImplementedError(
            "ioattn: attention_mask is not a padding mask on top of the causal/sliding-window pattern "
            "(e.g. a document or prefix mask); such masks are not supported"
        )
    if bool(q_valid.all()) and bool(kv_valid.all()):
        return None
    return q_valid, kv_valid


def _is_varlen_pattern(allowed, q_valid, kv_valid, causal, window) -> bool:
    """Whether allowed (B, Sq, Sk) is, on the valid query rows, exactly what the varlen kernel
    computes: the t-th of nq valid queries sees the valid keys of rank r (of nk) under the
    bottom-right causal/window rule, off = nk - nq."""
    nq = q_valid.sum(1, keepdim=True)
    nk = kv_valid.sum(1, keepdim=True)
    pos = (q_valid.cumsum(1) - 1 + (nk - nq))[:, :, None]  # (B, Sq, 1)
    r = (kv_valid.cumsum(1) - 1)[:, None, :]  # (B, 1, Sk)
    expect = kv_valid[:, None, :].expand_as(allowed)
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    if left >= 0:
        expect = expect & (r >= pos - left)
    if right >= 0:
        expect = expect & (r <= pos + right)
    rows = q_valid[:, :, None].expand_as(allowed)
    return not bool(((expect != allowed) & rows).any())


def _packed_from_position_ids(position_ids: Optional[torch.Tensor], B: int, S: int):
    """Packed sequences (positions restarting inside a row) -> segment validity, else None."""
    if position_ids is None or not isinstance(position_ids, torch.Tensor) or position_ids.dim() != 2:
        return None
    if position_ids.shape[-1] != S or S <= 1 or torch.compiler.is_compiling():
        return None
    pos = position_ids.expand(B, S)
    starts = torch.diff(pos, dim=-1) != 1  # (B, S-1): a new sequence starts at s+1
    if not bool(starts.any()):
        return None
    return starts


# --------------------------------------------------------------------------------------------
# The attention function
# --------------------------------------------------------------------------------------------


def ioattn_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    sliding_window: Optional[int] = None,
    softcap: Optional[float] = None,
    is_causal: Optional[bool] = None,
    **kwargs,
) -> Tuple[torch.Tensor, None]:
    if dropout:
        raise NotImplementedError(
            f"ioattn: attention dropout ({dropout}) is not supported; the kernels are exact inference kernels "
            "(call model.eval() or set attention_dropout=0)"
        )
    if kwargs.get("s_aux") is not None:
        raise NotImplementedError("ioattn: attention sinks (s_aux) are not supported")
    if kwargs.get("position_bias") is not None:
        raise NotImplementedError("ioattn: position biases are not supported")

    B, Hq, Sq, D = query.shape
    Sk = key.shape[2]
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    causal = bool(is_causal)  # bottom-right aligned: decoding with a cache needs no mask
    if sliding_window is not None and sliding_window > 0:
        # transformers: key visible iff kv_idx > q_idx - W, i.e. W - 1 keys to the left.
        window = (int(sliding_window) - 1, -1 if causal else int(sliding_window) - 1)
    else:
        window = (-1, -1)
    softcap = float(softcap) if softcap else 0.0

    # (B, H, S, D) -> (B, S, H, D) views: strides are honoured, the head dim stays contiguous.
    # A head dim that is not contiguous (no model in transformers makes one) is copied here
    # rather than rejected by the library.
    q, k, v = (x.transpose(1, 2) if x.stride(-1) == 1 else x.transpose(1, 2).contiguous() for x in (query, key, value))

    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None and cu_k is not None and attention_mask is None:
        # padding-free batches (DataCollatorWithFlattening): sequences already packed in one row
        return _varlen_rows(q, k, v, cu_q, cu_k, kwargs.get("max_length_q"), kwargs.get("max_length_k"),
                            causal, window, softcap, scaling), None

    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 1:
        # keys in use per sequence (ioattn_attention_mask, a static cache): q is their last Sq
        out = ops.attention_kvcache(
            q, k, v, attention_mask, causal=causal, window=window, softcap=softcap, scale=scaling
        )
        return out, None

    padding = None
    if attention_mask is not None:
        padding = _mask_to_padding(attention_mask, B, Sq, Sk, causal, window)
    elif Sq == Sk:
        starts = _packed_from_position_ids(kwargs.get("position_ids"), B, Sq)
        if starts is not None:
            return _packed_forward(q, k, v, starts, causal, window, softcap, scaling), None

    if padding is None:
        out = ops.attention(q, k, v, causal=causal, window=window, softcap=softcap, scale=scaling)
        return out, None

    q_valid, kv_valid = padding
    q_idx, cu_q, max_q = _unpad_indices(q_valid)
    k_idx, cu_k, max_k = _unpad_indices(kv_valid)
    out_unpad = ops.attention_varlen(
        _gather(q, q_idx), _gather(k, k_idx), _gather(v, k_idx), cu_q, cu_k, max_q, max_k,
        causal=causal, window=window, softcap=softcap, scale=scaling,
    )
    out = out_unpad.new_zeros((B * Sq, Hq, v.shape[-1]))
    out[q_idx] = out_unpad
    return out.view(B, Sq, Hq, v.shape[-1]), None


def _packed_forward(q, k, v, starts, causal, window, softcap, scaling):
    """Rows of (B, S) holding several sequences, split where positions restart."""
    B, S = q.shape[:2]
    first = torch.ones((B, 1), dtype=torch.bool, device=q.device)
    begin = torch.cat([first, starts], dim=1).reshape(-1)  # a sequence starts here
    cu = torch.nonzero(begin, as_tuple=False).flatten()
    cu = torch.cat([cu, cu.new_tensor([B * S])]).to(torch.int32)
    return _varlen_rows(q, k, v, cu, cu, None, None, causal, window, softcap, scaling)


def _varlen_rows(q, k, v, cu_q, cu_k, max_q, max_k, causal, window, softcap, scaling):
    """(B, S, H, D) tensors whose B * S rows are the packed sequences of cu_q / cu_k."""
    B, S, Hq, _ = q.shape
    cu_q, cu_k = cu_q.to(torch.int32), cu_k.to(torch.int32)
    if max_q is None:
        max_q = int((cu_q[1:] - cu_q[:-1]).max()) if cu_q.numel() > 1 else 0
    if max_k is None:
        max_k = int((cu_k[1:] - cu_k[:-1]).max()) if cu_k.numel() > 1 else 0
    # reshape is a view when the tensor is contiguous in (B, S) and a copy otherwise (keys and
    # values arrive transposed from (B, H, S, D)): the packed layout needs one row per token.
    out = ops.attention_varlen(
        q.reshape(B * S, Hq, q.shape[-1]), k.reshape(-1, k.shape[2], k.shape[-1]),
        v.reshape(-1, v.shape[2], v.shape[-1]), cu_q, cu_k, int(max_q), int(max_k),
        causal=causal, window=window, softcap=softcap, scale=scaling,
    )
    return out.view(B, S, Hq, v.shape[-1])


# --------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------


def register(name: str = NAME) -> None:
    """Register the attention and mask functions under ``name`` (done on import for "ioattn")."""
    try:
        from transformers import AttentionInterface
    except ImportError:  # older layouts
        from transformers.modeling_utils import AttentionInterface  # type: ignore
    AttentionInterface.register(name, ioattn_attention_forward)
    try:
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError:
        # transformers without the mask interface builds 4-D masks (or 2-D ones for FA2) and
        # passes them as they are; _mask_to_padding handles both.
        return
    AttentionMaskInterface.register(name, ioattn_attention_mask)


register()
