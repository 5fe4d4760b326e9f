"""ioattn's PyTorch custom ops against torch SDPA / an fp64 oracle.

Numeric rule (docs/testing.md): with ref the fp64 oracle and naive the fp32 computation rounded
to the storage dtype, max|out - ref| <= 2 * max|naive - ref| + 2 * eps(dtype) * max|ref|; LSE
the same in fp32; rows with no visible key must give out = 0 and lse = -inf exactly.
"""

import math
import random
import shutil

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
import torch.nn.functional as F  # noqa: E402

import ioattn  # noqa: E402
from ioattn import _core, _ext, ops  # noqa: E402

EPS = {torch.float32: 2.0**-23, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
CUDA_BACKEND = _ext.backend_available(_core.BACKEND_CUDA)
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and CUDA_BACKEND else [])


# ----------------------------------------------------------------------------------------------
# Oracle
# ----------------------------------------------------------------------------------------------


def visible_mask(Sq, Sk, causal, window, device="cpu"):
    """(Sq, Sk) bool, bottom-right aligned (off = Sk - Sq), FlashAttention-2's rule."""
    i = torch.arange(Sq, device=device)[:, None] + (Sk - Sq)
    j = torch.arange(Sk, device=device)[None, :]
    vis = torch.ones(Sq, Sk, dtype=torch.bool, device=device)
    left, right = window
    if causal:
        vis &= j <= i
    if left >= 0:
        vis &= j >= i - left
    if right >= 0:
        vis &= j <= i + right
    return vis


def reference(q, k, v, causal=False, window=(-1, -1), softcap=0.0, scale=None, acc=torch.float64):
    """q (B, Sq, Hq, D), k/v (B, Sk, Hkv, D/Dv) -> out (B, Sq, Hq, Dv) in acc, lse (B, Hq, Sq).

    Without softcap the output is torch SDPA's (with an explicit bottom-right mask and
    enable_gqa); with softcap, and for the LSE, the scores are computed explicitly.
    """
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    qh, kh, vh = (x.to(acc).transpose(1, 2) for x in (q, k, v))  # (B, H, S, D)
    kh_r = kh.repeat_interleave(Hq // Hkv, dim=1) if Hkv else kh
    vh_r = vh.repeat_interleave(Hq // Hkv, dim=1) if Hkv else vh
    vis = visible_mask(Sq, Sk, causal, window, q.device)
    s = (qh @ kh_r.transpose(-1, -2)) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~vis, float("-inf"))
    lse = torch.logsumexp(s, dim=-1) if Sk else torch.full((B, Hq, Sq), float("-inf"), dtype=acc, device=q.device)
    empty_rows = ~vis.any(dim=-1)  # (Sq,)
    if softcap == 0 and Sk > 0 and Sq > 0 and B > 0:
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=vis, scale=scale, enable_gqa=Hq != Hkv)
    else:
        p = torch.softmax(s, dim=-1) if Sk else s.new_zeros(B, Hq, Sq, 0)
        out = p @ vh_r
    out = out.masked_fill(empty_rows[None, None, :, None], 0.0)
    return out.transpose(1, 2), lse


def check(out, q, k, v, lse=None, **kw):
    dtype = out.dtype
    ref, lse64 = reference(q, k, v, acc=torch.float64, **kw)
    naive, lse32 = reference(q, k, v, acc=torch.float32, **kw)
    naive = naive.to(dtype)
    assert out.shape == ref.shape and out.dtype == q.dtype
    assert torch.isfinite(out).all()
    if out.numel():
        o = out.double()
        bound = 2 * (naive.double() - ref).abs().max() + 2 * EPS[dtype] * ref.abs().max()
        err = (o - ref).abs().max()
        assert err <= bound, f"max|out - ref| = {err:.3g} > {bound:.3g}"
    if lse is not None:
        assert lse.dtype == torch.float32 and lse.shape == lse64.shape
        inf64 = torch.isinf(lse64)
        assert torch.equal(torch.isinf(lse) & (lse < 0), inf64), "lse = -inf exactly where no key is visible"
        fin = ~inf64
        if fin.any():
            l64, l32, l = lse64[fin], lse32[fin].double(), lse[fin].double()
            bound = 2 * (l32 - l64).abs().max() + 2 * EPS[torch.float32] * l64.abs().max()
            err = (l - l64).abs().max()
            assert err <= bound, f"max|lse - ref| = {err:.3g} > {bound:.3g}"


# The CUDA backend's largest head dim (docs/api.md); the CPU's is 512.
CUDA_MAX_HEAD_DIM = 256


def dims(device, D, Dv=None):
    """A case's (D, Dv) on the device: every case's head dims run on both backends."""
    Dv = D if Dv is None else Dv
    assert device != "cuda" or max(D, Dv) <= CUDA_MAX_HEAD_DIM
    return D, Dv


def rand(shape, dtype, device, gen):
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)


# ----------------------------------------------------------------------------------------------
# Dense attention
# ----------------------------------------------------------------------------------------------

# (B, Sq, Sk, Hq, Hkv, D, Dv, causal, window, softcap)
CASES = [
    (1, 1, 1, 1, 1, 8, 8, False, (-1, -1), 0.0),
    (2, 17, 17, 4, 4, 32, 32, False, (-1, -1), 0.0),
    (2, 33, 33, 4, 2, 64, 64, True, (-1, -1), 0.0),  # GQA, causal
    (1, 5, 40, 8, 1, 16, 16, True, (-1, -1), 0.0),  # MQA, Sq < Sk: bottom-right
    (2, 40, 7, 4, 2, 16, 16, True, (-1, -1), 0.0),  # Sq > Sk: leading rows see nothing
    (1, 50, 50, 2, 1, 32, 32, False, (8, 3), 0.0),  # two-sided window
    (2, 29, 61, 6, 3, 64, 64, True, (16, -1), 0.0),  # causal sliding window
    (1, 24, 24, 4, 4, 32, 32, False, (-1, -1), 30.0),  # softcap
    (2, 19, 37, 4, 2, 48, 48, True, (10, -1), 5.0),  # everything at once
    (1, 13, 21, 2, 2, 32, 16, False, (-1, -1), 0.0),  # Dv != D
    (3, 64, 128, 2, 1, 128, 128, True, (-1, -1), 0.0),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}_Sq{}_Sk{}_H{}-{}_D{}-{}_c{}_w{}_{}_cap{}".format(*c[:8], *c[8], c[9]))
def test_attention_matches_reference(case, dtype, device):
    B, Sq, Sk, Hq, Hkv, D, Dv, causal, window, softcap = case
    D, Dv = dims(device, D, Dv)
    gen = torch.Generator().manual_seed(hash(case) & 0xFFFF)
    q = rand((B, Sq, Hq, D), dtype, device, gen)
    k = rand((B, Sk, Hkv, D), dtype, device, gen)
    v = rand((B, Sk, Hkv, Dv), dtype, device, gen)
    out, lse = ioattn.attention(q, k, v, causal=causal, window=window, softcap=softcap, return_lse=True)
    check(out, q, k, v, lse, causal=causal, window=window, softcap=softcap)
    out2 = ops.attention(q, k, v, causal=causal, window=window, softcap=softcap)
    assert torch.equal(out, out2), "return_lse must not change the output"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_random_shapes(dtype):
    rng = random.Random(1234)
    gen = torch.Generator().manual_seed(1234)
    for _ in range(12):
        Hkv = rng.choice([1, 2, 3])
        Hq = Hkv * rng.choice([1, 2, 4])
        B, Sq, Sk = rng.randint(1, 3), rng.randint(1, 70), rng.randint(1, 70)
        D = rng.choice([8, 16, 32, 64, 80, 128])
        causal = rng.random() < 0.5
        window = (rng.choice([-1, 0, 5, 31]), rng.choice([-1, 0, 7]))
        softcap = rng.choice([0.0, 0.0, 20.0])
        scale = rng.choice([None, 0.05])
        q, k, v = (rand((B, S, H, D), dtype, "cpu", gen) for S, H in ((Sq, Hq), (Sk, Hkv), (Sk, Hkv)))
        out, lse = ioattn.attention(q, k, v, causal=causal, window=window, softcap=softcap, scale=scale, return_lse=True)
        check(out, q, k, v, lse, causal=causal, window=window, softcap=softcap, scale=scale)


@pytest.mark.parametrize("device", DEVICES)
def test_strided_inputs_bhsd_transposed(device):
    """(B, H, S, D) tensors transposed to (B, S, H, D): strides honoured, no copy needed."""
    gen = torch.Generator().manual_seed(5)
    D, _ = dims(device, 32)
    q = rand((2, 4, 23, D), torch.float32, device, gen).transpose(1, 2)
    k = rand((2, 2, 31, D), torch.float32, device, gen).transpose(1, 2)
    v = rand((2, 2, 31, D), torch.float32, device, gen).transpose(1, 2)
    assert not q.is_contiguous()
    out, lse = ioattn.attention(q, k, v, causal=True, return_lse=True)
    check(out, q, k, v, lse, causal=True)
    assert out.is_contiguous()


@pytest.mark.parametrize("device", DEVICES)
def test_scale(device):
    gen = torch.Generator().manual_seed(6)
    q, k, v = (rand((1, 9, 2, dims(device, 16)[0]), torch.float32, device, gen) for _ in range(3))
    out, lse = ioattn.attention(q, k, v, scale=0.3, return_lse=True)
    check(out, q, k, v, lse, scale=0.3)
    assert not torch.allclose(out, ioattn.attention(q, k, v))


@pytest.mark.parametrize("device", DEVICES)
def test_scale_zero_or_negative_means_default(device):
    """docs/api.md: scale <= 0 means 1/sqrt(D), as None does; through the op too."""
    gen = torch.Generator().manual_seed(8)
    q, k, v = (rand((1, 9, 2, dims(device, 16)[0]), torch.float32, device, gen) for _ in range(3))
    default = ioattn.attention(q, k, v)
    for scale in (0.0, -2.5):
        assert torch.equal(ioattn.attention(q, k, v, scale=scale), default)
        out, _ = torch.ops.ioattn.attention.default(q, k, v, False, -1, -1, 0.0, scale, False)
        assert torch.equal(out, default)
    with pytest.raises(ValueError, match="scale"):
        ioattn.attention(q, k, v, scale=float("inf"))


@pytest.mark.skipif("cuda" not in DEVICES, reason="no CUDA device or no CUDA backend")
def test_cuda_head_dim_without_kernel_is_not_implemented():
    """docs/api.md: the CUDA backend takes head dims up to 256; past that it refuses, never runs
    elsewhere in silence."""
    q = torch.randn(1, 8, 2, CUDA_MAX_HEAD_DIM + 8, device="cuda")
    with pytest.raises(NotImplementedError, match=f"head_dim={CUDA_MAX_HEAD_DIM + 8}"):
        ioattn.attention(q, q, q)


@pytest.mark.skipif(not torch.cuda.is_available() or CUDA_BACKEND, reason="a CUDA device and a build without CUDA")
def test_cuda_tensors_without_the_cuda_backend_are_not_implemented():
    q = torch.randn(1, 4, 2, 64, device="cuda")
    with pytest.raises(NotImplementedError, match="compiled without CUDA"):
        ioattn.attention(q, q, q)


def test_lse_matches_logsumexp_of_scaled_scores():
    gen = torch.Generator().manual_seed(7)
    q, k, v = (rand((1, 11, 2, 16), torch.float32, "cpu", gen) for _ in range(3))
    _, lse = ioattn.attention(q, k, v, return_lse=True)
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) / 4.0
    torch.testing.assert_close(lse.double(), torch.logsumexp(s, -1), rtol=0, atol=1e-5)


def test_no_lse_is_empty():
    q = torch.randn(1, 4, 2, 8)
    out, lse = torch.ops.ioattn.attention.default(q, q, q, False, -1, -1, 0.0, None, False)
    assert lse.shape == (0,) and lse.dtype == torch.float32
    assert out.shape == q.shape


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("B,Sq,Sk", [(0, 5, 5), (2, 0, 5), (2, 5, 0), (0, 0, 0)])
def test_empty(device, B, Sq, Sk):
    D, _ = dims(device, 16)
    q = torch.randn(B, Sq, 4, D, device=device)
    k = torch.randn(B, Sk, 2, D, device=device)
    v = torch.randn(B, Sk, 2, D, device=device)
    out, lse = ioattn.attention(q, k, v, causal=True, return_lse=True)
    assert out.shape == (B, Sq, 4, 16) and lse.shape == (B, 4, Sq)
    assert torch.equal(out, torch.zeros_like(out)), "no visible key: out = 0 exactly"
    assert bool((lse == float("-inf")).all())


def test_rows_with_no_visible_key():
    """Sq > Sk with causal: off = Sk - Sq = -2, rows 0 and 1 see no key; window (0, 0) leaves
    each other row exactly one key (j = i - 2)."""
    gen = torch.Generator().manual_seed(8)
    q, k, v = rand((1, 12, 1, 8), torch.float32, "cpu", gen), rand((1, 10, 1, 8), torch.float32, "cpu", gen), rand((1, 10, 1, 8), torch.float32, "cpu", gen)
    out, lse = ioattn.attention(q, k, v, causal=True, window=(0, 0), return_lse=True)
    assert torch.equal(out[:, :2], torch.zeros_like(out[:, :2]))
    assert bool((lse[..., :2] == float("-inf")).all())
    torch.testing.assert_close(out[:, 2:], v, rtol=0, atol=0)
    check(out, q, k, v, lse, causal=True, window=(0, 0))


# ----------------------------------------------------------------------------------------------
# Variable-length batches
# ----------------------------------------------------------------------------------------------


def _cu(lens, device):
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal,window,softcap", [(False, (-1, -1), 0.0), (True, (-1, -1), 0.0), (True, (6, -1), 10.0)])
def test_varlen_matches_per_sequence(device, dtype, causal, window, softcap):
    gen = torch.Generator().manual_seed(11)
    lens_q = [7, 1, 0, 33, 16]
    lens_k = [7, 9, 4, 40, 0]
    Hq, Hkv, D = 4, 2, dims(device, 32)[0]
    q = rand((sum(lens_q), Hq, D), dtype, device, gen)
    k = rand((sum(lens_k), Hkv, D), dtype, device, gen)
    v = rand((sum(lens_k), Hkv, D), dtype, device, gen)
    cq, ck = _cu(lens_q, device), _cu(lens_k, device)
    out, lse = ioattn.attention_varlen(
        q, k, v, cq, ck, max(lens_q), max(lens_k), causal=causal, window=window, softcap=softcap, return_lse=True
    )
    assert out.shape == q.shape and lse.shape == (Hq, q.shape[0])
    for b in range(len(lens_q)):
        qs, qe, ks, ke = cq[b].item(), cq[b + 1].item(), ck[b].item(), ck[b + 1].item()
        check(
            out[None, qs:qe], q[None, qs:qe], k[None, ks:ke], v[None, ks:ke], lse[None, :, qs:qe],
            causal=causal, window=window, softcap=softcap,
        )


def test_varlen_rejects_int64_cu_seqlens():
    q = torch.randn(8, 2, 16)
    cu = torch.tensor([0, 3, 8])
    with pytest.raises((ValueError, TypeError)):
        ioattn.attention_varlen(q, q, q, cu, cu, 5, 5)


# ----------------------------------------------------------------------------------------------
# KV cache
# ----------------------------------------------------------------------------------------------


def _gather_paged(cache, block_table, b, n, page):
    idx = torch.arange(n, device=cache.device)
    return cache[block_table[b].long()[idx // page], idx % page]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_kvcache_append_then_attend(device, dtype, paged):
    gen = torch.Generator().manual_seed(21)
    B, Hq, Hkv, D, page, max_pages = 3, 4, 2, dims(device, 32)[0], 16, 5
    seqlens = [0, 17, 50]
    s_new, sq = 3, 3
    if paged:
        num_pages = B * max_pages + 2
        k_cache = rand((num_pages, page, Hkv, D), dtype, device, gen)
        v_cache = rand((num_pages, page, Hkv, D), dtype, device, gen)
        perm = torch.randperm(num_pages, generator=gen)[: B * max_pages]
        block_table = perm.view(B, max_pages).to(torch.int32).to(device)
    else:
        k_cache = rand((B, page * max_pages, Hkv, D), dtype, device, gen)
        v_cache = rand((B, page * max_pages, Hkv, D), dtype, device, gen)
        block_table = None
    k0, v0 = k_cache.clone(), v_cache.clone()
    cache_seqlens = torch.tensor(seqlens, dtype=torch.int32, device=device)
    k_new = rand((B, s_new, Hkv, D), dtype, device, gen)
    v_new = rand((B, s_new, Hkv, D), dtype, device, gen)
    q = rand((B, sq, Hq, D), dtype, device, gen)

    out, lse = ioattn.attention_kvcache(
        q, k_cache, v_cache, cache_seqlens, k_new=k_new, v_new=v_new, block_table=block_table,
        causal=True, return_lse=True,
    )
    assert torch.equal(cache_seqlens.cpu(), torch.tensor(seqlens, dtype=torch.int32)), "cache_seqlens not advanced"
    # The cache holds k_new / v_new at [seqlens[b], seqlens[b] + s_new) and is unchanged elsewhere.
    k_exp, v_exp = k0.clone(), v0.clone()
    for b in range(B):
        pos = torch.arange(seqlens[b], seqlens[b] + s_new, device=device)
        if paged:
            pg, off = block_table[b].long()[pos // page], pos % page
            k_exp[pg, off], v_exp[pg, off] = k_new[b], v_new[b]
        else:
            k_exp[b, pos], v_exp[b, pos] = k_new[b], v_new[b]
    assert torch.equal(k_cache, k_exp) and torch.equal(v_cache, v_exp)
    for b in range(B):
        n = seqlens[b] + s_new
        if paged:
            kb, vb = _gather_paged(k_cache, block_table, b, n, page), _gather_paged(v_cache, block_table, b, n, page)
        else:
            kb, vb = k_cache[b, :n], v_cache[b, :n]
        check(out[b : b + 1], q[b : b + 1], kb[None], vb[None], lse[b : b + 1], causal=True)


def test_kvcache_without_append_and_int_seqlens():
    gen = torch.Generator().manual_seed(22)
    k_cache, v_cache = rand((2, 32, 1, 16), torch.float32, "cpu", gen), rand((2, 32, 1, 16), torch.float32, "cpu", gen)
    k0 = k_cache.clone()
    q = rand((2, 1, 4, 16), torch.float32, "cpu", gen)
    out = ioattn.attention_kvcache(q, k_cache, v_cache, 20)
    assert torch.equal(k_cache, k0)
    for b in range(2):
        check(out[b : b + 1], q[b : b + 1], k_cache[b : b + 1, :20], v_cache[b : b + 1, :20])


def test_kvcache_half_cache_f32_activations():
    """docs/api.md: the cache may hold f16/bf16 while q, out, k_new, v_new are f32."""
    gen = torch.Generator().manual_seed(23)
    k_cache = rand((1, 32, 2, 16), torch.float16, "cpu", gen)
    v_cache = rand((1, 32, 2, 16), torch.float16, "cpu", gen)
    q, k_new, v_new = (rand((1, 2, h, 16), torch.float32, "cpu", gen) for h in (4, 2, 2))
    seqlens = torch.tensor([10], dtype=torch.int32)
    out = ioattn.attention_kvcache(q, k_cache, v_cache, seqlens, k_new=k_new, v_new=v_new, causal=True)
    assert out.dtype == torch.float32
    assert torch.equal(k_cache[0, 10:12], k_new[0].half())
    check(out, q, k_cache[:, :12].float(), v_cache[:, :12].float(), causal=True)


# ----------------------------------------------------------------------------------------------
# Errors leave everything untouched
# ----------------------------------------------------------------------------------------------


def test_error_bad_heads_raises_value_error():
    q, k = torch.randn(1, 4, 3, 16), torch.randn(1, 4, 2, 16)
    with pytest.raises(ValueError):
        ioattn.attention(q, k, k)


def test_error_bad_window_argument():
    q = torch.randn(1, 4, 2, 16)
    for window, pattern in ((5, "pair"), ((2**40, 0), "window_left"), ((0, 1.5), "integers"), ((-3, 0), "window")):
        with pytest.raises(ValueError, match=pattern):
            ioattn.attention(q, q, q, window=window)


def test_error_numpy_beside_torch_names_the_argument():
    """A numpy array where a torch call needs a tensor: ValueError naming it, nothing written."""
    import numpy as np

    q = torch.randn(1, 4, 2, 16)
    with pytest.raises(ValueError, match="k is a numpy.ndarray"):
        ioattn.attention(q, q.numpy(), q)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match="cu_seqlens_k is a numpy.ndarray"):
        ioattn.attention_varlen(q[0], q[0], q[0], cu, cu.numpy(), 4, 4)
    k_cache = torch.randn(1, 8, 2, 16)
    k0 = k_cache.clone()
    with pytest.raises(ValueError, match="k_new is a numpy.ndarray"):
        ioattn.attention_kvcache(q, k_cache, k_cache.clone(), 2, k_new=q.numpy(), v_new=q)
    assert torch.equal(k_cache, k0)
    with pytest.raises(ValueError, match="q: .*torch.Tensor|torch.Tensor beside a numpy q"):
        ioattn.attention(q.numpy(), q, q.numpy())
    # cache_seqlens as numpy's integer scalar: every sequence's length, as a Python int is.
    out = ioattn.attention_kvcache(q, k_cache, k_cache, np.int32(5))
    torch.testing.assert_close(out, ioattn.attention(q, k_cache[:, :5], k_cache[:, :5]), rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_rows_outside_the_sequences_are_empty(device):
    gen = torch.Generator().manual_seed(9)
    q = rand((7, 2, dims(device, 8)[0]), torch.float32, device, gen)
    cu = torch.tensor([1, 3, 5], dtype=torch.int32, device=device)
    out, lse = ioattn.attention_varlen(q, q, q, cu, cu, 2, 2, return_lse=True)
    for row in (0, 5, 6):
        assert bool((out[row] == 0).all()) and bool((lse[:, row] == float("-inf")).all())


def test_error_kvcache_leaves_cache_untouched():
    gen = torch.Generator().manual_seed(31)
    k_cache, v_cache = rand((2, 16, 2, 16), torch.float32, "cpu", gen), rand((2, 16, 2, 16), torch.float32, "cpu", gen)
    k0, v0 = k_cache.clone(), v_cache.clone()
    q = rand((2, 1, 2, 16), torch.float32, "cpu", gen)
    k_new, v_new = rand((2, 4, 2, 16), torch.float32, "cpu", gen), rand((2, 4, 2, 16), torch.float32, "cpu", gen)
    # sequence 1 would overflow its 16 slots: nothing may be written, sequence 0's append included.
    seqlens = torch.tensor([0, 14], dtype=torch.int32)
    with pytest.raises(ValueError):
        ioattn.attention_kvcache(q, k_cache, v_cache, seqlens, k_new=k_new, v_new=v_new)
    assert torch.equal(k_cache, k0) and torch.equal(v_cache, v0)
    # a block table naming a page that does not exist
    bt = torch.tensor([[0], [7]], dtype=torch.int32)
    with pytest.raises(ValueError):
        ioattn.attention_kvcache(q, k_cache, v_cache, torch.tensor([1, 1], dtype=torch.int32),
                                 k_new=k_new[:, :1], v_new=v_new[:, :1], block_table=bt)
    assert torch.equal(k_cache, k0) and torch.equal(v_cache, v0)


def test_error_kvcache_needs_both_new():
    k_cache = torch.zeros(1, 8, 1, 16)
    with pytest.raises(ValueError):
        ioattn.attention_kvcache(torch.zeros(1, 1, 1, 16), k_cache, k_cache.clone(), 0, k_new=torch.zeros(1, 1, 1, 16))


# ----------------------------------------------------------------------------------------------
# torch.library: opcheck and torch.compile
# ----------------------------------------------------------------------------------------------


def _opcheck_samples():
    gen = torch.Generator().manual_seed(41)
    q, k, v = rand((2, 7, 4, 16), torch.float32, "cpu", gen), rand((2, 9, 2, 16), torch.float32, "cpu", gen), rand((2, 9, 2, 16), torch.float32, "cpu", gen)
    yield torch.ops.ioattn.attention.default, (q, k, v, True, -1, -1, 0.0, None, True)
    yield torch.ops.ioattn.attention.default, (q, k, v, False, 3, 2, 5.0, 0.2, False)
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    cuk = torch.tensor([0, 4, 9], dtype=torch.int32)
    yield torch.ops.ioattn.attention_varlen.default, (q[0], k[0], v[0], cu, cuk, 4, 5, True, -1, -1, 0.0, None, True)
    k_cache, v_cache = rand((6, 16, 2, 16), torch.float32, "cpu", gen), rand((6, 16, 2, 16), torch.float32, "cpu", gen)
    bt = torch.tensor([[3, 1], [0, 5]], dtype=torch.int32)
    seqlens = torch.tensor([5, 17], dtype=torch.int32)
    k_new, v_new = rand((2, 2, 2, 16), torch.float32, "cpu", gen), rand((2, 2, 2, 16), torch.float32, "cpu", gen)
    yield torch.ops.ioattn.attention_kvcache.default, (
        q[:, :2], k_cache, v_cache, seqlens, k_new, v_new, bt, True, -1, -1, 0.0, None, True)
    yield torch.ops.ioattn.attention_kvcache.default, (
        q[:, :1], k_cache, v_cache, seqlens, None, None, bt, False, -1, -1, 0.0, None, False)


@pytest.mark.parametrize("op,args", list(_opcheck_samples()), ids=lambda x: getattr(x, "__name__", None) or "")
def test_opcheck(op, args):
    torch.library.opcheck(op, args)


def _compile_backend():
    # inductor on CPU compiles C++; fall back to aot_eager (same tracing, no codegen) without a compiler
    return "inductor" if (shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")) else "aot_eager"


def test_torch_compile_fullgraph_attention():
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(51)
    q, k, v = rand((2, 16, 4, 32), torch.float32, "cpu", gen), rand((2, 24, 2, 32), torch.float32, "cpu", gen), rand((2, 24, 2, 32), torch.float32, "cpu", gen)

    def f(q, k, v):
        out, lse = ioattn.attention(q * 1.0, k, v, causal=True, window=(8, -1), return_lse=True)
        return out.sum(-1) + lse.transpose(1, 2), ops.attention(q, k, v, softcap=5.0)

    expect = f(q, k, v)
    explanation = torch._dynamo.explain(f)(q, k, v)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    got = torch.compile(f, fullgraph=True, backend=_compile_backend())(q, k, v)
    for a, b in zip(got, expect):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_torch_compile_fullgraph_varlen_and_kvcache():
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(52)
    q = rand((2, 1, 4, 16), torch.float32, "cpu", gen)
    k_cache, v_cache = rand((4, 16, 2, 16), torch.float32, "cpu", gen), rand((4, 16, 2, 16), torch.float32, "cpu", gen)
    bt = torch.tensor([[2, 0], [1, 3]], dtype=torch.int32)
    seqlens = torch.tensor([3, 20], dtype=torch.int32)
    k_new, v_new = rand((2, 1, 2, 16), torch.float32, "cpu", gen), rand((2, 1, 2, 16), torch.float32, "cpu", gen)
    cu = torch.tensor([0, 1, 2], dtype=torch.int32)

    def f(q, k_cache, v_cache, k_new, v_new):
        out = ioattn.attention_kvcache(q, k_cache, v_cache, seqlens, k_new=k_new, v_new=v_new, block_table=bt, causal=True)
        flat = out.view(2, 4, 16)
        return ioattn.attention_varlen(flat, flat[:, :2], flat[:, :2], cu, cu, 1, 1) + 1

    kc, vc = k_cache.clone(), v_cache.clone()
    expect = f(q, kc, vc, k_new, v_new)
    kc2, vc2 = k_cache.clone(), v_cache.clone()
    got = torch.compile(f, fullgraph=True, backend=_compile_backend())(q, kc2, vc2, k_new, v_new)
    torch.testing.assert_close(got, expect, rtol=1e-6, atol=1e-6)
    assert torch.equal(kc2, kc) and torch.equal(vc2, vc), "the compiled graph must perform the cache append"


def test_torch_compile_dynamic_shapes():
    torch._dynamo.reset()

    def f(q, k, v):
        return ioattn.attention(q, k, v, causal=True)

    cf = torch.compile(f, fullgraph=True, dynamic=True, backend=_compile_backend())
    gen = torch.Generator().manual_seed(53)
    for s in (5, 9, 17):
        q, k, v = (rand((1, s, 2, 16), torch.float32, "cpu", gen) for _ in range(3))
        torch.testing.assert_close(cf(q, k, v), f(q, k, v), rtol=1e-6, atol=1e-6)
