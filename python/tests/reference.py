"""The float64 reference of docs/api.md's semantics and docs/testing.md's tolerance rule, for
numpy arrays (the torch tests convert with .numpy())."""

import math

import numpy as np

F32, F16 = np.dtype(np.float32), np.dtype(np.float16)
EPS = {F32: 2.0**-23, F16: 2.0**-10}  # bf16: 2**-7, see check_attention
SENTINEL = 1234.5  # exactly representable in f16 and f32


# ---- the reference: docs/api.md's semantics, computed in `compute` precision ----


def reference(q, k, v, *, causal=False, window=(-1, -1), softcap=0.0, scale=None, compute=np.float64):
    """(out, lse) for (B, Sq, Hq, D) q and (B, Sk, Hkv, D|Dv) k, v; out in `compute`, lse too."""
    q, k, v = (x.astype(compute) for x in (q, k, v))
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    group = Hq // Hkv
    k = np.repeat(k, group, axis=2)
    v = np.repeat(v, group, axis=2)
    scale = compute(1.0 / math.sqrt(D)) if scale is None else compute(scale)
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap:
        s = compute(softcap) * np.tanh(s / compute(softcap))
    i = np.arange(Sq)[:, None]
    j = np.arange(Sk)[None, :]
    off = Sk - Sq
    visible = np.ones((Sq, Sk), dtype=bool)
    if causal:
        visible &= j <= i + off
    left, right = window
    if left >= 0:
        visible &= j >= i + off - left
    if right >= 0:
        visible &= j <= i + off + right
    s = np.where(visible, s, -np.inf)
    m = s.max(axis=-1, keepdims=True) if Sk else np.full(s.shape[:-1] + (1,), -np.inf, compute)
    m0 = np.where(np.isfinite(m), m, 0).astype(compute)
    p = np.exp(s - m0)
    total = p.sum(axis=-1, keepdims=True)
    p = p / np.where(total > 0, total, 1)
    out = np.einsum("bhqk,bkhd->bqhd", p, v).astype(compute)
    with np.errstate(divide="ignore"):
        lse = np.where(total[..., 0] > 0, np.log(np.where(total[..., 0] > 0, total[..., 0], 1)) + m0[..., 0], -np.inf)
    return out, lse.astype(compute)


def check_close(got, ref, naive, eps, what):
    """docs/testing.md: max|got - ref| <= 2 max|naive - ref| + 2 eps max|ref| over finite elements;
    non-finite values must match exactly."""
    got, ref, naive = (np.asarray(x, dtype=np.float64) for x in (got, ref, naive))
    assert got.shape == ref.shape, what
    finite = np.isfinite(ref)
    assert np.array_equal(np.isnan(got), np.isnan(ref)), f"{what}: NaN pattern differs"
    assert np.array_equal(got[~finite & ~np.isnan(ref)], ref[~finite & ~np.isnan(ref)]), f"{what}: infinities differ"
    if not finite.any():
        return
    err = np.max(np.abs(got[finite] - ref[finite]))
    bound = 2 * np.max(np.abs(naive[finite] - ref[finite])) + 2 * eps * np.max(np.abs(ref[finite]))
    assert err <= bound, f"{what}: max error {err:.3g} > bound {bound:.3g}"


def check_attention(q, k, v, out, lse, *, rounding=None, **opts):
    """out (and lse when given) of attention over numpy q, k, v against the reference.

    rounding: (function rounding a float32 array to the storage dtype, that dtype's eps), for a
    storage dtype numpy lacks (bf16: the inputs and out are passed as float32 holding bf16 values);
    default: q.dtype's."""
    round_to, eps = rounding or ((lambda x: x.astype(q.dtype)), EPS[q.dtype])
    ref, ref_lse = reference(q, k, v, **opts)
    naive, naive_lse = reference(q, k, v, compute=np.float32, **opts)
    check_close(out, ref, round_to(naive), eps, "out")
    if lse is not None:
        check_close(lse, ref_lse, naive_lse, EPS[F32], "lse")
        # A row that sees no key: out exactly 0, lse -inf.
        empty = np.isneginf(ref_lse)  # (B, Hq, Sq)
        assert np.all(out.transpose(0, 2, 1, 3)[empty] == 0)
