"""ioattn: exact IO-aware attention (CPU and CUDA) for numpy arrays and torch tensors.

The attention functions have FlashAttention's names and semantics (flash_attn_func,
flash_attn_varlen_func, flash_attn_with_kvcache) on the library's contract (docs/api.md):
tensors are (batch, seqlen, heads, head_dim); causal masks and windows are aligned to the
bottom-right corner (key j is visible to query i iff j <= i + Sk - Sq); window=(left, right) with
-1 for unbounded; scale None (or <= 0) means 1/sqrt(head_dim); lse is the natural-log sum of exponentials in
float32. Strides are honoured and nothing is copied; a layout the library cannot take (a head_dim
that is not contiguous) raises ValueError.

numpy arrays (float32, float16) run on the CPU. torch tensors (float32, float16, bfloat16; CPU or
CUDA, on the current stream) go through the torch.library custom ops ``torch.ops.ioattn.*``
registered by ``ioattn.ops``.

plan(), traffic(), explain() and hw() are the command line's model commands: keyword arguments
named like its flags, dashes as underscores, returning its --json output as dicts and lists.
"""

import json as _json
import os as _os

import numpy as _np

from . import _core, _ext

__version__ = _ext.version()

__all__ = [
    "attention",
    "attention_varlen",
    "attention_kvcache",
    "merge_partials",
    "plan",
    "traffic",
    "explain",
    "hw",
    "tune",
    "tune_path",
    "__version__",
]

_NUMPY_DTYPES = (_np.dtype(_np.float32), _np.dtype(_np.float16))


def _numpy(x, name, rank):
    if _core.is_torch(x):
        raise ValueError(
            f"{name}: a torch.Tensor beside a numpy q: pass numpy arrays for every array (or torch tensors for all)"
        )
    if not isinstance(x, _np.ndarray):
        raise TypeError(f"{name}: expected a numpy array or a torch tensor, got {type(x).__name__}")
    if x.ndim != rank:
        raise ValueError(f"{name}: expected a {rank}-D array, got shape {x.shape}")
    return x


def _numpy_dtype(q):
    if q.dtype not in _NUMPY_DTYPES:
        raise ValueError(
            f"q: dtype {q.dtype} is not supported for numpy inputs (float32 or float16; numpy has no bfloat16, "
            "torch tensors have)"
        )
    return q.dtype


_ops_module = None


def _ops():
    """ioattn.ops, imported on the first torch call (it imports torch); a `from . import ops` in
    each call would cost an import-system lookup every time."""
    global _ops_module
    if _ops_module is None:
        from . import ops

        _ops_module = ops
    return _ops_module


def attention(q, k, v, *, causal=False, window=(-1, -1), softcap=0.0, scale=None, return_lse=False):
    """Exact attention of q (B, Sq, Hq, D) over k (B, Sk, Hkv, D) and v (B, Sk, Hkv, Dv).

    Hq % Hkv == 0 (GQA/MQA). Returns out (B, Sq, Hq, Dv) in q's dtype, and with return_lse also
    lse (B, Hq, Sq) float32. A row that sees no key gives out = 0 and lse = -inf.
    """
    if _core.is_torch(q):
        return _ops().attention(
            q, k, v, causal=causal, window=window, softcap=softcap, scale=scale, return_lse=return_lse
        )
    q, k, v = _numpy(q, "q", 4), _numpy(k, "k", 4), _numpy(v, "v", 4)
    out = _np.empty(q.shape[:3] + v.shape[3:], dtype=_numpy_dtype(q))
    lse = _np.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=_np.float32) if return_lse else None
    _core.run_forward(q, k, v, out, lse, causal=causal, window=window, softcap=softcap, scale=scale)
    return (out, lse) if return_lse else out


def _check_max_seqlen(cu_seqlens, max_seqlen, name):
    if max_seqlen is None:
        return
    if len(cu_seqlens) >= 2:
        longest = int(_np.max(_np.diff(cu_seqlens.astype(_np.int64))))
        if longest > int(max_seqlen):
            raise ValueError(f"max_seqlen_{name}={max_seqlen}: cu_seqlens_{name} holds a sequence of {longest}")


def attention_varlen(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    *,
    causal=False,
    window=(-1, -1),
    softcap=0.0,
    scale=None,
    return_lse=False,
):
    """Packed variable-length sequences: q (total_q, Hq, D), k (total_k, Hkv, D), v (total_k, Hkv, Dv).

    Sequence b owns rows cu_seqlens_q[b]:cu_seqlens_q[b+1] of q and cu_seqlens_k[b]:cu_seqlens_k[b+1]
    of k and v (int32, batch + 1 entries); masks apply per sequence. max_seqlen_q/k bound the
    sequence lengths (checked for numpy inputs). Returns out (total_q, Hq, Dv), and with
    return_lse also lse (Hq, total_q) float32.
    """
    if _core.is_torch(q):
        return _ops().attention_varlen(
            q,
            k,
            v,
            cu_seqlens_q,
            cu_seqlens_k,
            max_seqlen_q,
            max_seqlen_k,
            causal=causal,
            window=window,
            softcap=softcap,
            scale=scale,
            return_lse=return_lse,
        )
    q, k, v = _numpy(q, "q", 3), _numpy(k, "k", 3), _numpy(v, "v", 3)
    cu_seqlens_q, cu_seqlens_k = _numpy(cu_seqlens_q, "cu_seqlens_q", 1), _numpy(cu_seqlens_k, "cu_seqlens_k", 1)
    _check_max_seqlen(cu_seqlens_q, max_seqlen_q, "q")
    _check_max_seqlen(cu_seqlens_k, max_seqlen_k, "k")
    # Rows outside [cu_seqlens_q[0], cu_seqlens_q[-1]) belong to no sequence: 0 and lse -inf.
    out = _np.zeros(q.shape[:2] + v.shape[2:], dtype=_numpy_dtype(q))
    lse = _np.full((q.shape[1], q.shape[0]), -_np.inf, dtype=_np.float32) if return_lse else None
    _core.run_varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, out, lse, causal=causal, window=window, softcap=softcap, scale=scale
    )
    return (out, lse) if return_lse else out


def attention_kvcache(
    q,
    k_cache,
    v_cache,
    cache_seqlens,
    *,
    k_new=None,
    v_new=None,
    block_table=None,
    causal=False,
    window=(-1, -1),
    softcap=0.0,
    scale=None,
    return_lse=False,
):
    """Attention over a KV cache, after appending k_new/v_new into it in place (FlashAttention's
    flash_attn_with_kvcache).

    k_cache, v_cache: (B, S_max, Hkv, D) / (B, S_max, Hkv, Dv), or a paged cache
    (num_pages, page_size, Hkv, D) with block_table, int32 (B, max_pages) page ids.
    cache_seqlens: int32 (B,) (or an int for every sequence), the tokens already cached; it is not
    modified. k_new, v_new: None or (B, S_new, Hkv, D), written at positions cache_seqlens[b]...;
    q (B, Sq, Hq, D) then attends over cache_seqlens[b] + S_new keys. The cache may be float16 while
    q is float32. Returns out (B, Sq, Hq, Dv) in q's dtype, and with return_lse also lse (B, Hq, Sq).
    """
    if _core.is_torch(q):
        return _ops().attention_kvcache(
            q,
            k_cache,
            v_cache,
            cache_seqlens,
            k_new=k_new,
            v_new=v_new,
            block_table=block_table,
            causal=causal,
            window=window,
            softcap=softcap,
            scale=scale,
            return_lse=return_lse,
        )
    q = _numpy(q, "q", 4)
    k_cache, v_cache = _numpy(k_cache, "k_cache", 4), _numpy(v_cache, "v_cache", 4)
    if isinstance(cache_seqlens, (int, _np.integer)):
        cache_seqlens = _np.full((q.shape[0],), cache_seqlens, dtype=_np.int32)
    cache_seqlens = _numpy(cache_seqlens, "cache_seqlens", 1)
    if k_new is not None:
        k_new = _numpy(k_new, "k_new", 4)
    if v_new is not None:
        v_new = _numpy(v_new, "v_new", 4)
    if block_table is not None:
        block_table = _numpy(block_table, "block_table", 2)
    if k_new is not None:
        for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
            if not cache.flags.writeable:
                raise ValueError(f"{name}: read-only, and k_new/v_new are appended into it in place")
    out = _np.empty(q.shape[:3] + v_cache.shape[3:], dtype=_numpy_dtype(q))
    lse = _np.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=_np.float32) if return_lse else None
    _core.run_kvcache(
        q,
        k_cache,
        v_cache,
        cache_seqlens,
        k_new,
        v_new,
        block_table,
        out,
        lse,
        causal=causal,
        window=window,
        softcap=softcap,
        scale=scale,
    )
    return (out, lse) if return_lse else out


def merge_partials(out_a, lse_a, out_b, lse_b):
    """(out, lse) of attention over the union of two disjoint key sets from each set's (out, lse).

    out (B, S, H, Dv), lse float32 (B, H, S): what attention(..., return_lse=True) returns. The
    rule is common/online_softmax.h's merge: weights exp(lse - max) in float32, a side with
    lse = -inf contributes nothing, both -inf give out = 0 and lse = -inf, NaN propagates.
    torch tensors (any device) merge with torch operations and return out in the promoted dtype of
    out_a and out_b; numpy arrays (float32) merge in the C++ header's own code.
    """
    if _core.is_torch(out_a):
        return _ops().merge_partials(out_a, lse_a, out_b, lse_b)
    arrays = (out_a, lse_a, out_b, lse_b)
    for name, x, rank in zip(("out_a", "lse_a", "out_b", "lse_b"), arrays, (4, 3, 4, 3)):
        _numpy(x, name, rank)
        if x.dtype != _np.float32:
            raise ValueError(f"{name}: dtype {x.dtype}; numpy partials are merged in float32 and must be float32")
    out = _np.empty(out_a.shape, dtype=_np.float32)
    lse = _np.empty(lse_a.shape, dtype=_np.float32)
    _ext.merge_partials(out_a, lse_a, out_b, lse_b, out, lse)
    return out, lse


# ---- the model commands: plan, traffic, explain, hw ----

_PROBLEM_KEYWORDS = (
    "batch",
    "heads",
    "kv_heads",
    "seqlen_q",
    "seqlen_k",
    "head_dim",
    "head_dim_v",
    "dtype",
    "causal",
    "window",
    "scale",
    "softcap",
    "hw",
    "hw_file",
    "threads",
    "ranks",
    "link",
    "link_gbs",
    "tune_file",
)


def _cli_args(command, kw, allowed=_PROBLEM_KEYWORDS):
    """The command-line flags for keyword arguments ``kw`` of ``command`` (None values are left out).

    hw and hw_file take a name/path or a list of them (repeated --hw/--hw-file: all --hw first,
    then all --hw-file); causal is a bool switch; window a pair (left, right).
    """
    unknown = sorted(set(kw) - set(allowed))
    if unknown:
        raise TypeError(
            f"{command}() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}"
            + (f"; it takes {', '.join(allowed)}" if allowed else "; it takes none")
        )
    args = []
    for name in allowed:
        value = kw.get(name)
        if value is None:
            continue
        flag = "--" + name.replace("_", "-")
        if name == "causal":
            if not isinstance(value, (bool, _np.bool_)):
                raise TypeError(f"causal: expected a bool, got {value!r}")
            if value:
                args.append(flag)
        elif name == "window":
            left, right = _core.window_pair(value)
            args.append(f"{flag}={left},{right}")
        elif name in ("hw", "hw_file"):
            values = [value] if isinstance(value, (str, _os.PathLike)) else list(value)
            args.extend(f"{flag}={_os.fspath(v)}" for v in values)
        elif name == "dtype":
            if not isinstance(value, str):
                value = {"float32": "f32", "float16": "f16"}.get(_np.dtype(value).name, str(value))
            args.append(f"{flag}={value}")
        else:
            if isinstance(value, bool):
                raise TypeError(f"{name}: expected a number, got {value!r}")
            args.append(f"{flag}={value}")
    return args


def _model(command, kw, allowed=_PROBLEM_KEYWORDS):
    return _json.loads(_ext.model_json(command, _cli_args(command, kw, allowed)))


def plan(**kw):
    """`ioattn plan --json`: the tiling the planner chooses (a dict; a list of dicts for several hw)."""
    return _model("plan", kw)


def traffic(**kw):
    """`ioattn traffic --json`: predicted bytes per memory boundary, flash vs standard (always a list)."""
    return _model("traffic", kw)


def explain(**kw):
    """`ioattn explain --json`: the design outline (a dict; a list of dicts for several hw)."""
    return _model("explain", kw)


def hw(**kw):
    """`ioattn hw --json`: {host, gpu, profiles}; takes no arguments."""
    return _model("hw", kw, ())


def tune(*, path=None, threads=0, quick=False):
    """`ioattn tune`: times plan candidates on this machine and writes the calibration file that
    every later CPU call here applies (docs/api.md, "Calibration"). Returns the file's JSON as a
    dict. path: None for tune_path(); threads: 0 for the library default; quick: tiny problems,
    a smoke test rather than a calibration to keep."""
    written = _ext.tune(None if path is None else _os.fspath(path), int(threads), bool(quick))
    with open(written, encoding="utf-8") as f:
        return _json.load(f)


def tune_path():
    """The calibration file this process reads ("" when IOATTN_TUNE_FILE turns calibration off)."""
    return _ext.tune_path()
