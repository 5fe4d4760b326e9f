"""ioattn on numpy arrays (the CPU backend) against a float64 numpy reference written from
docs/api.md, with docs/testing.md's tolerance rule; the cache, strides, error paths and the model
commands."""

import json
import re
import shutil
import subprocess
import sys
import threading
import time
import pathlib

import numpy as np
import pytest

import ioattn
from ioattn import _core, _ext

from reference import EPS, F16, F32, SENTINEL, check_attention, reference  # noqa: F401


def randn(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


# ---- dense attention ----

CASES = [
    # B, Sq, Sk, Hq, Hkv, D, Dv, dtype, options
    (1, 1, 1, 1, 1, 1, 1, F32, {}),
    (2, 17, 17, 4, 4, 32, 32, F32, {}),
    (2, 33, 65, 4, 2, 24, 24, F32, {"causal": True}),
    (1, 65, 33, 6, 2, 40, 40, F32, {"causal": True}),  # Sq > Sk: leading rows see no key
    (3, 29, 41, 8, 1, 7, 7, F32, {"window": (5, 3)}),  # MQA, odd D
    (2, 50, 70, 4, 2, 64, 48, F32, {"window": (16, -1), "softcap": 30.0}),  # Dv != D
    (1, 31, 31, 2, 1, 128, 128, F32, {"causal": True, "window": (8, -1), "scale": 0.3}),
    (2, 19, 23, 4, 4, 64, 64, F16, {}),
    (2, 40, 40, 6, 3, 96, 96, F16, {"causal": True, "softcap": 20.0}),
    (1, 13, 77, 4, 2, 33, 33, F16, {"window": (0, 0)}),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"B{c[0]}-Sq{c[1]}-Sk{c[2]}-H{c[3]}/{c[4]}-D{c[5]}/{c[6]}-{c[7]}-{c[8]}")
def test_attention_matches_reference(rng, case):
    B, Sq, Sk, Hq, Hkv, D, Dv, dtype, opts = case
    q, k = randn(rng, (B, Sq, Hq, D), dtype), randn(rng, (B, Sk, Hkv, D), dtype)
    v = randn(rng, (B, Sk, Hkv, Dv), dtype)
    out, lse = ioattn.attention(q, k, v, return_lse=True, **opts)
    assert out.dtype == dtype and out.shape == (B, Sq, Hq, Dv)
    assert lse.dtype == F32 and lse.shape == (B, Hq, Sq)
    check_attention(q, k, v, out, lse, **opts)
    # Without lse: the same output, bit for bit.
    assert np.array_equal(ioattn.attention(q, k, v, **opts), out)


def test_attention_random_shapes(rng):
    for _ in range(12):
        B = int(rng.integers(1, 4))
        Sq, Sk = (int(x) for x in rng.integers(1, 90, size=2))
        Hkv = int(rng.integers(1, 4))
        Hq = Hkv * int(rng.integers(1, 4))
        D = int(rng.integers(1, 140))
        dtype = [F32, F16][int(rng.integers(0, 2))]
        opts = {"causal": bool(rng.integers(0, 2))}
        if rng.integers(0, 2):
            opts["window"] = (int(rng.integers(-1, 40)), int(rng.integers(-1, 40)))
        if rng.integers(0, 3) == 0:
            opts["softcap"] = float(rng.uniform(5, 50))
        q, k, v = (randn(rng, (B, S, H, D), dtype) for S, H in ((Sq, Hq), (Sk, Hkv), (Sk, Hkv)))
        out, lse = ioattn.attention(q, k, v, return_lse=True, **opts)
        check_attention(q, k, v, out, lse, **opts)


def test_empty_keys_and_queries(rng):
    q = randn(rng, (2, 5, 2, 16), F32)
    k = v = np.zeros((2, 0, 2, 16), F32)
    out, lse = ioattn.attention(q, k, v, return_lse=True)
    assert np.all(out == 0) and np.all(np.isneginf(lse))
    out = ioattn.attention(np.zeros((2, 0, 2, 16), F32), randn(rng, (2, 4, 2, 16), F32), randn(rng, (2, 4, 2, 16), F32))
    assert out.shape == (2, 0, 2, 16)
    out = ioattn.attention(*(np.zeros((0, 3, 2, 16), F32) for _ in range(3)))
    assert out.shape == (0, 3, 2, 16)


# ---- packed variable-length sequences ----


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("opts", [{}, {"causal": True}, {"window": (6, 2), "softcap": 15.0}])
def test_varlen_matches_per_sequence_reference(rng, dtype, opts):
    lens_q = np.array([5, 0, 17, 1, 9, 0], np.int32)
    lens_k = np.array([5, 3, 23, 0, 30, 0], np.int32)
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    Hq, Hkv, D = 4, 2, 24
    q = randn(rng, (cu_q[-1], Hq, D), dtype)
    k = randn(rng, (cu_k[-1], Hkv, D), dtype)
    v = randn(rng, (cu_k[-1], Hkv, D), dtype)
    out, lse = ioattn.attention_varlen(
        q, k, v, cu_q, cu_k, int(lens_q.max()), int(lens_k.max()), return_lse=True, **opts
    )
    assert out.shape == q.shape and lse.shape == (Hq, cu_q[-1]) and lse.dtype == F32
    for b in range(len(lens_q)):
        rq, rk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if lens_q[b] == 0:
            continue
        check_attention(q[None, rq], k[None, rk], v[None, rk], out[None, rq], lse[None, :, rq], **opts)


def test_varlen_rows_outside_the_sequences_are_empty(rng):
    """Rows of q before cu_seqlens_q[0] or past cu_seqlens_q[-1] belong to no sequence: out 0, lse -inf."""
    q = randn(rng, (7, 2, 8), F32)
    cu = np.array([1, 3, 5], np.int32)
    out, lse = ioattn.attention_varlen(q, q, q, cu, cu, 2, 2, return_lse=True)
    for row in (0, 5, 6):
        assert np.all(out[row] == 0) and np.all(lse[:, row] == -np.inf)
    for b in range(2):
        r = slice(cu[b], cu[b + 1])
        check_attention(q[None, r], q[None, r], q[None, r], out[None, r], lse[None, :, r])


def test_scale_zero_or_negative_means_default(rng):
    """docs/api.md: scale <= 0 means 1/sqrt(D), as None does."""
    q, k, v = (randn(rng, (2, 9, 2, 16), F32) for _ in range(3))
    default = ioattn.attention(q, k, v)
    for scale in (0.0, -1.0, -0.0):
        assert np.array_equal(ioattn.attention(q, k, v, scale=scale), default), scale
    assert np.array_equal(ioattn.attention(q, k, v, window=None), default)


def test_kvcache_read_only_cache(rng):
    """A read-only cache can be attended over; an append into it is refused and writes nothing."""
    k_cache, v_cache = randn(rng, (2, 12, 2, 16), F32), randn(rng, (2, 12, 2, 16), F32)
    k_cache.flags.writeable = v_cache.flags.writeable = False
    q = randn(rng, (2, 1, 4, 16), F32)
    out = ioattn.attention_kvcache(q, k_cache, v_cache, np.int32(7))
    check_attention(q, k_cache[:, :7], v_cache[:, :7], out, None)
    before = k_cache.copy()
    new = randn(rng, (2, 1, 2, 16), F32)
    with pytest.raises(ValueError, match="k_cache: read-only"):
        ioattn.attention_kvcache(q, k_cache, v_cache, 7, k_new=new, v_new=new)
    assert np.array_equal(k_cache, before)


def test_varlen_max_seqlen_is_checked(rng):
    cu = np.array([0, 4, 10], np.int32)
    q = randn(rng, (10, 2, 8), F32)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        ioattn.attention_varlen(q, q, q, cu, cu, 5, 6)


# ---- KV cache: append, then attend ----


def _kv_case(rng, B=3, Hq=4, Hkv=2, D=32, s_new=3, sq=3, cache_dtype=F32, q_dtype=F32):
    seqlens = np.array([0, 7, 12][:B], np.int32)
    q = randn(rng, (B, sq, Hq, D), q_dtype)
    k_new, v_new = randn(rng, (B, s_new, Hkv, D), q_dtype), randn(rng, (B, s_new, Hkv, D), q_dtype)
    # Each sequence's logical keys: seqlens[b] old rows, then the new ones.
    old_k = [randn(rng, (int(n), Hkv, D), cache_dtype) for n in seqlens]
    old_v = [randn(rng, (int(n), Hkv, D), cache_dtype) for n in seqlens]
    return seqlens, q, k_new, v_new, old_k, old_v


def _expected(q, old, new, b, cache_dtype):
    return np.concatenate([old[b], new[b].astype(cache_dtype)], axis=0)


@pytest.mark.parametrize("cache_dtype", [F32, F16])
@pytest.mark.parametrize("causal", [False, True])
def test_kvcache_contiguous_append_then_attend(rng, cache_dtype, causal):
    seqlens, q, k_new, v_new, old_k, old_v = _kv_case(rng, cache_dtype=cache_dtype)
    B, _, _, D = q.shape
    Hkv, S_max = k_new.shape[2], 20
    k_cache = np.full((B, S_max, Hkv, D), SENTINEL, cache_dtype)
    v_cache = np.full((B, S_max, Hkv, D), SENTINEL, cache_dtype)
    for b in range(B):
        k_cache[b, : seqlens[b]] = old_k[b]
        v_cache[b, : seqlens[b]] = old_v[b]
    seqlens_before = seqlens.copy()
    out, lse = ioattn.attention_kvcache(
        q, k_cache, v_cache, seqlens, k_new=k_new, v_new=v_new, causal=causal, return_lse=True
    )
    assert np.array_equal(seqlens, seqlens_before)  # not advanced
    s_new = k_new.shape[1]
    for b in range(B):
        n = seqlens[b]
        keys, vals = _expected(q, old_k, k_new, b, cache_dtype), _expected(q, old_v, v_new, b, cache_dtype)
        assert np.array_equal(k_cache[b, : n + s_new], keys) and np.array_equal(v_cache[b, : n + s_new], vals)
        assert np.all(k_cache[b, n + s_new :] == SENTINEL) and np.all(v_cache[b, n + s_new :] == SENTINEL)
        check_attention(q[b : b + 1], keys[None].astype(F32), vals[None].astype(F32), out[b : b + 1],
                        lse[b : b + 1], causal=causal)


@pytest.mark.parametrize("causal", [False, True])
def test_kvcache_paged_append_then_attend(rng, causal):
    seqlens, q, k_new, v_new, old_k, old_v = _kv_case(rng, B=3, s_new=5)
    B, _, _, D = q.shape
    Hkv, page_size, max_pages = k_new.shape[2], 4, 5
    num_pages = B * max_pages + 2
    block_table = rng.permutation(num_pages)[: B * max_pages].reshape(B, max_pages).astype(np.int32)
    k_cache = np.full((num_pages, page_size, Hkv, D), SENTINEL, F32)
    v_cache = np.full((num_pages, page_size, Hkv, D), SENTINEL, F32)

    def slot(b, pos):
        return block_table[b, pos // page_size], pos % page_size

    for b in range(B):
        for pos in range(seqlens[b]):
            k_cache[slot(b, pos)] = old_k[b][pos]
            v_cache[slot(b, pos)] = old_v[b][pos]
    written_before = ~np.all(k_cache == SENTINEL, axis=(2, 3))
    out = ioattn.attention_kvcache(
        q, k_cache, v_cache, seqlens, k_new=k_new, v_new=v_new, block_table=block_table, causal=causal
    )
    s_new = k_new.shape[1]
    touched = written_before.copy()
    for b in range(B):
        keys, vals = _expected(q, old_k, k_new, b, F32), _expected(q, old_v, v_new, b, F32)
        for pos in range(seqlens[b] + s_new):
            assert np.array_equal(k_cache[slot(b, pos)], keys[pos]) and np.array_equal(v_cache[slot(b, pos)], vals[pos])
            touched[slot(b, pos)] = True
        check_attention(q[b : b + 1], keys[None], vals[None], out[b : b + 1], None, causal=causal)
    # Nothing else in the pool was written.
    assert np.all(k_cache[~touched] == SENTINEL) and np.all(v_cache[~touched] == SENTINEL)


def test_kvcache_without_append_and_int_seqlens(rng):
    B, S, Hq, Hkv, D = 2, 9, 4, 4, 16
    k_cache, v_cache = randn(rng, (B, 12, Hkv, D), F32), randn(rng, (B, 12, Hkv, D), F32)
    before = k_cache.copy(), v_cache.copy()
    q = randn(rng, (B, 1, Hq, D), F32)
    out = ioattn.attention_kvcache(q, k_cache, v_cache, S)
    assert np.array_equal(k_cache, before[0]) and np.array_equal(v_cache, before[1])
    check_attention(q, k_cache[:, :S], v_cache[:, :S], out, None)


# ---- strides: honoured, zero-copy; a non-contiguous head_dim is refused ----


def test_strided_inputs_and_output_zero_copy(rng):
    B, S, H, D = 2, 11, 4, 16
    # q from a (B, H, S, D) buffer seen as (B, S, H, D); k, v every other row of a longer sequence
    # and a slice of wider heads; out written into a view of a larger sentinel-filled buffer.
    q = randn(rng, (B, H, S, D), F32).transpose(0, 2, 1, 3)
    k = randn(rng, (B, 2 * S, H, D + 8), F32)[:, ::2, :, 4 : 4 + D]
    v = randn(rng, (3 * B, S, H, D), F32)[::3]
    big = np.full((B, S, H + 2, 2 * D), SENTINEL, F32)
    out = big[:, :, 1 : H + 1, :D]
    assert not (q.flags.c_contiguous or k.flags.c_contiguous or v.flags.c_contiguous or out.flags.c_contiguous)
    _core.run_forward(q, k, v, out, None, causal=True, window=(-1, -1), softcap=0.0, scale=None)
    check_attention(q, k, v, out, None, causal=True)
    rest = big.copy()
    rest[:, :, 1 : H + 1, :D] = SENTINEL
    assert np.all(rest == SENTINEL)  # nothing written outside the view
    # The same numbers as from contiguous copies: the strides were read, not copied into a layout.
    dense = ioattn.attention(*(np.ascontiguousarray(x) for x in (q, k, v)), causal=True)
    assert np.array_equal(out, dense)
    # The public API takes strided numpy inputs as well.
    assert np.array_equal(ioattn.attention(q, k, v, causal=True), dense)


def test_non_contiguous_head_dim_raises(rng):
    q = randn(rng, (1, 4, 2, 32), F32)
    with pytest.raises(ValueError, match="contiguous head_dim.*no hidden copy"):
        ioattn.attention(q[..., ::2], q[..., ::2], q[..., ::2])
    out = np.full((1, 4, 2, 16), SENTINEL, F32)
    with pytest.raises(ValueError, match="contiguous head_dim"):
        _core.run_forward(q[..., :16], q[..., :16], q[..., :16], np.full((1, 4, 2, 32), SENTINEL, F32)[..., ::2],
                          None, causal=False, window=(-1, -1), softcap=0.0, scale=None)
    assert np.all(out == SENTINEL)


# ---- error paths: the right exception, nothing written ----

OPTS = {"causal": False, "window": (-1, -1), "softcap": 0.0, "scale": None}


def _dense_error_cases(rng):
    q = randn(rng, (2, 8, 4, 16), F32)
    kv = randn(rng, (2, 8, 2, 16), F32)
    yield "dtype mismatch", (q, kv.astype(F16), kv), {}, ValueError, "dtype"
    yield "head_dim mismatch", (q, randn(rng, (2, 8, 2, 8), F32), kv), {}, ValueError, "head_dim"
    yield "batch mismatch", (q, kv[:1], kv[:1]), {}, ValueError, "batch"
    yield "Hq % Hkv", (q, randn(rng, (2, 8, 3, 16), F32), randn(rng, (2, 8, 3, 16), F32)), {}, ValueError, "heads"
    yield "k/v length", (q, kv, kv[:, :5]), {}, ValueError, "seqlen"
    yield "rank", (q[0], kv, kv), {}, ValueError, "4-D"
    yield "float64", (q.astype(np.float64), kv.astype(np.float64), kv.astype(np.float64)), {}, ValueError, "float64"
    yield "window", (q, kv, kv), {"window": (-2, 0)}, ValueError, "window_left"
    yield "softcap", (q, kv, kv), {"softcap": -1.0}, ValueError, "softcap"
    yield "scale", (q, kv, kv), {"scale": float("nan")}, ValueError, "scale"
    yield "window beyond int32", (q, kv, kv), {"window": (2**40, 0)}, ValueError, "window_left"
    yield "window not integers", (q, kv, kv), {"window": (1.7, 0)}, ValueError, "window"
    yield "negative stride", (q[:, ::-1], kv, kv), {}, ValueError, "stride"
    yield "head_dim > 512", tuple(randn(rng, (1, 2, 1, 520), F32) for _ in range(3)), {}, NotImplementedError, "head"


def test_dense_errors_write_nothing(rng):
    for name, (q, k, v), opts, exc, pattern in _dense_error_cases(rng):
        out = np.full(q.shape[:-1] + v.shape[-1:] if q.ndim == 4 else (2, 8, 4, 16), SENTINEL, F32)
        lse = np.full((out.shape[0], out.shape[2], out.shape[1]), SENTINEL, F32)
        with pytest.raises(exc, match=re.compile(pattern, re.I)):
            _core.run_forward(q, k, v, out, lse, **{**OPTS, **opts})
        assert np.all(out == SENTINEL) and np.all(lse == SENTINEL), name


def test_bad_lse_and_out_write_nothing(rng):
    q = randn(rng, (2, 8, 4, 16), F32)
    out = np.full(q.shape, SENTINEL, F32)
    for lse, pattern in [
        (np.full((2, 8, 4), SENTINEL, F32), "lse: expected shape"),  # (B, Sq, Hq) instead of (B, Hq, Sq)
        (np.full((2, 4, 8), SENTINEL, np.float64), "float32"),
        (np.full((2, 8, 4), SENTINEL, F32).transpose(0, 2, 1), "C-contiguous"),
    ]:
        with pytest.raises(ValueError, match=pattern):
            _core.run_forward(q, q, q, out, lse, **OPTS)
        assert np.all(out == SENTINEL) and np.all(lse == SENTINEL)
    with pytest.raises(ValueError, match="out"):
        _core.run_forward(q, q, q, np.full((2, 8, 4, 8), SENTINEL, F32), None, **OPTS)
    # An output whose elements overlap (a broadcast view) is refused by the library.
    overlapping = np.broadcast_to(np.full((1, 8, 4, 16), SENTINEL, F32), q.shape)
    with pytest.raises((ValueError, TypeError)):
        _core.run_forward(q, q, q, overlapping, None, **OPTS)
    # An output aliasing an input is refused before anything is written.
    alias = q.copy()
    with pytest.raises(ValueError):
        _core.run_forward(alias, q, q, alias, None, **OPTS)
    assert np.array_equal(alias, q)


def test_varlen_errors_write_nothing(rng):
    q = randn(rng, (10, 2, 8), F32)
    out = np.full(q.shape, SENTINEL, F32)
    cu = np.array([0, 4, 10], np.int32)
    for cu_q, cu_k, pattern in [
        (np.array([0, 6, 4], np.int32), cu, "cu_seqlens_q"),
        (cu, np.array([0, 4, 11], np.int32), "cu_seqlens_k"),
        (cu.astype(np.int64), cu, "int32"),
        (cu, cu[:2], "entries"),
    ]:
        with pytest.raises(ValueError, match=pattern):
            _core.run_varlen(q, q, q, cu_q, cu_k, out, None, **OPTS)
        assert np.all(out == SENTINEL)


def test_kvcache_errors_write_nothing(rng):
    B, Hkv, D = 2, 2, 16
    q = randn(rng, (B, 1, 4, D), F32)
    k_new, v_new = randn(rng, (B, 2, Hkv, D), F32), randn(rng, (B, 2, Hkv, D), F32)
    seqlens = np.array([3, 5], np.int32)
    out = np.full(q.shape, SENTINEL, F32)
    contiguous = np.full((B, 6, Hkv, D), SENTINEL, F32)
    pages = np.full((8, 4, Hkv, D), SENTINEL, F32)
    cases = [
        ("append past S_max", (contiguous, contiguous.copy(), seqlens, k_new, v_new, None), "seqlens"),
        ("page id out of range", (pages, pages.copy(), seqlens, k_new, v_new, np.array([[0, 9], [1, 2]], np.int32)),
         "page id"),
        ("too few pages", (pages, pages.copy(), seqlens, k_new, v_new, np.array([[0], [1]], np.int32)), "pages"),
        ("k_new alone", (contiguous, contiguous.copy(), np.array([1, 1], np.int32), k_new, None, None), "k_new"),
        ("seqlens length", (contiguous, contiguous.copy(), np.array([1], np.int32), k_new, v_new, None),
         "cache_seqlens"),
        ("seqlens dtype", (contiguous, contiguous.copy(), np.array([1, 1], np.int64), k_new, v_new, None), "int32"),
        ("new dtype", (contiguous, contiguous.copy(), np.array([1, 1], np.int32), k_new.astype(F16),
                       v_new.astype(F16), None), "dtype"),
    ]
    for name, (kc, vc, sl, kn, vn, bt), pattern in cases:
        with pytest.raises(ValueError, match=re.compile(pattern, re.I)):
            _core.run_kvcache(q, kc, vc, sl, kn, vn, bt, out, None, **OPTS)
        assert np.all(kc == SENTINEL) and np.all(vc == SENTINEL) and np.all(out == SENTINEL), name


def test_public_api_type_errors(rng):
    with pytest.raises(TypeError, match="numpy array or a torch tensor"):
        ioattn.attention([[1.0]], [[1.0]], [[1.0]])
    q = randn(rng, (1, 2, 1, 4), np.float64)
    with pytest.raises(ValueError, match="bfloat16"):
        ioattn.attention(q, q, q)


def test_cuda_backend_needs_device_memory(rng):
    q = randn(rng, (1, 2, 1, 4), F32)
    with pytest.raises(ValueError, match="backend CUDA"):
        _ext.forward(q, q, q, np.empty_like(q), None, False, -1, -1, 0.0, 0.0, 1, 0, 0)
    assert _ext.backend_available(0) is True


def test_gil_released_during_call(rng):
    q = randn(rng, (1, 4096, 8, 64), F32)
    run = lambda: _core.run_forward(q, q, q, np.empty_like(q), None, num_threads=1, **OPTS)  # noqa: E731
    start = time.perf_counter()
    run()
    duration = time.perf_counter() - start
    if duration < 0.05:
        pytest.skip(f"the call takes {duration * 1e3:.1f} ms, too short to observe")
    worker = threading.Thread(target=run)
    stamps = [time.perf_counter()]
    worker.start()
    while worker.is_alive():
        stamps.append(time.perf_counter())
        time.sleep(0.001)
    worker.join()
    longest_gap = float(np.max(np.diff(stamps)))
    assert longest_gap < duration / 2, f"main thread stalled {longest_gap:.3f} s during a {duration:.3f} s call"


# ---- version and the model commands ----


def test_version_matches_cmake():
    cmake = pathlib.Path(__file__).resolve().parents[2] / "CMakeLists.txt"
    if not cmake.exists():
        pytest.skip("no CMakeLists.txt next to the tests")
    version = re.search(r"project\(ioattn\s+VERSION\s+([0-9.]+)", cmake.read_text()).group(1)
    assert ioattn.__version__ == version == _ext.version()


MODEL_CALLS = [
    ("plan", {"heads": 8, "kv_heads": 2, "seqlen_q": 1000, "head_dim": 64, "causal": True, "hw": "zen3"}),
    ("plan", {"hw": ["zen3", "h100-sxm"], "dtype": "bf16", "window": (128, 0)}),
    ("plan", {"batch": 4, "seqlen_q": 1, "seqlen_k": 8192, "hw": "host", "threads": 1}),
    ("traffic", {"heads": 16, "seqlen_q": 4096, "head_dim": 128, "head_dim_v": 64, "hw": "a100-80gb"}),
    ("traffic", {"hw": ["zen3", "h100-sxm"], "causal": True}),
    ("explain", {"seqlen_q": 2048, "hw": "zen3", "dtype": "f16"}),
    ("explain", {"hw": ["zen3", "h100-sxm"]}),
    ("hw", {}),
]


@pytest.mark.parametrize("command,kw", MODEL_CALLS)
def test_model_commands_return_cli_json(command, kw):
    result = getattr(ioattn, command)(**kw)
    hardware = kw.get("hw", "host")
    several = isinstance(hardware, list) and len(hardware) > 1
    if command == "traffic" or several:
        assert isinstance(result, list)
        assert len(result) == (len(hardware) if isinstance(hardware, list) else 1)
        if command != "explain":
            assert [r["hardware"] for r in result] == (hardware if isinstance(hardware, list) else [hardware])
    elif command == "hw":
        assert set(result) == {"host", "gpu", "profiles"}
    else:
        assert isinstance(result, dict)
    if command == "plan" and not several:
        assert result["problem"]["heads_q" if "heads_q" in result["problem"] else "heads"] == kw.get("heads", 16)
    if command == "explain" and not several:
        assert set(result) == {"memoryTraffic", "tiling", "numericalStability", "tradeoff", "failureMode"}


@pytest.mark.parametrize("command,kw", MODEL_CALLS)
def test_model_commands_match_cli_binary(cli, command, kw):
    args = ioattn._cli_args(command, kw, () if command == "hw" else ioattn._PROBLEM_KEYWORDS)
    run = subprocess.run([cli, command, *args, "--json"], capture_output=True, text=True, check=True)
    assert getattr(ioattn, command)(**kw) == json.loads(run.stdout)
    assert _ext.model_json(command, args) + "\n" == run.stdout  # the same bytes


def test_model_command_errors():
    with pytest.raises(TypeError, match="head_dims"):
        ioattn.plan(head_dims=64)
    with pytest.raises(TypeError, match="heads"):
        ioattn.hw(heads=4)
    with pytest.raises(ValueError, match=r"ioattn plan: --kv-heads: 3 does not divide --heads 8"):
        ioattn.plan(heads=8, kv_heads=3)
    with pytest.raises(ValueError, match="--hw"):
        ioattn.traffic(hw="no-such-machine")
    with pytest.raises(ValueError, match="--dtype"):
        ioattn.explain(dtype="f64")
    with pytest.raises(ValueError, match="unknown flag"):
        _ext.model_json("plan", ["--bogus"])
    with pytest.raises(ValueError, match="unknown command"):
        _ext.model_json("run", [])


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("nm") is None, reason="ELF and binutils' nm")
def test_extension_exports_only_its_init():
    # A libstdc++ a toolchain links statically into the module must not interpose on the shared one
    # Highway and numpy load: on the GPU machine the two versions mixed and `ioattn.plan` crashed in
    # its first number formatting. Weak template instantiations (V, W, u) are the module's own.
    out = subprocess.run(["nm", "-D", "--defined-only", _ext.__file__], capture_output=True, text=True, check=True)
    strong = [line.split()[-1] for line in out.stdout.splitlines() if line.split()[-2] not in ("V", "W", "u")]
    assert strong == ["PyInit__ext"]


def test_tune_writes_a_calibration_plan_applies(tmp_path):
    path = tmp_path / "sub" / "tune.json"
    doc = ioattn.tune(path=path, threads=2, quick=True)
    assert doc["name"] == "host"
    assert doc["calibration"]["threads"] == 2
    assert {e["head_dim"] for e in doc["calibration"]["prefill"]} == {64, 128}
    assert {e["kv_dtype"] for e in doc["calibration"]["decode"]} == {"f16", "bf16", "f32"}
    p = ioattn.plan(tune_file=str(path), heads=4, seqlen_q=512)
    assert p["calibrated"] is True and str(path) in p["calibration"]
    # The plan command's --tune-file lasts one call: the process's own path is back afterwards.
    assert ioattn.tune_path() != str(path)
    with pytest.raises(ValueError, match="opt.num_threads=-1"):
        ioattn.tune(path=path, threads=-1, quick=True)


def test_ring_model_through_plan():
    r = ioattn.plan(hw="h100-sxm", dtype="bf16", seqlen_q=131072, head_dim=128, ranks=8)["ring"]
    assert r["ranks"] == 8 and r["shard_seqlen"] == 16384 and r["hides"] is True
    with pytest.raises(ValueError, match="--ranks 3"):
        ioattn.plan(hw="zen3", seqlen_q=1000, ranks=3)
    # The detected host knows no link to its peers: the bandwidth has to be given.
    with pytest.raises(ValueError, match="--link-gbs"):
        ioattn.plan(seqlen_q=1024, ranks=2)
    assert ioattn.plan(seqlen_q=1024, ranks=2, link_gbs=10)["ring"]["link"]["bandwidth_gbs"] == 10
