"""ioattn._core's runners on torch tensors (DLPack, zero-copy): CPU always, CUDA where torch and
this build both have it. The public torch API (torch.ops.ioattn.*) is tested in test_torch_ops.py."""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from ioattn import _core, _ext
from reference import SENTINEL, check_attention

torch = pytest.importorskip("torch")

OPTS = {"causal": False, "window": (-1, -1), "softcap": 0.0, "scale": None}
CUDA = torch.cuda.is_available() and _ext.backend_available(_core.BACKEND_CUDA)
DEVICES = ["cpu"] + (["cuda"] if CUDA else [])


def as_numpy(t):
    return t.detach().float().cpu().numpy() if t.dtype == torch.bfloat16 else t.detach().cpu().numpy()


def rounding(dtype):
    if dtype == torch.bfloat16:
        return (lambda x: torch.from_numpy(np.ascontiguousarray(x, np.float32)).bfloat16().float().numpy()), 2.0**-7
    return None


def check(q, k, v, out, lse, **opts):
    check_attention(
        as_numpy(q), as_numpy(k), as_numpy(v), as_numpy(out), None if lse is None else as_numpy(lse),
        rounding=rounding(q.dtype), **opts
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("opts", [{}, {"causal": True, "softcap": 25.0}, {"window": (9, 2)}])
def test_forward_torch(device, dtype, opts):
    gen = torch.Generator().manual_seed(7)
    B, Sq, Sk, Hq, Hkv, D = 2, 37, 53, 6, 2, 64
    q = torch.randn(B, Sq, Hq, D, generator=gen).to(device, dtype)
    k = torch.randn(B, Sk, Hkv, D, generator=gen).to(device, dtype)
    v = torch.randn(B, Sk, Hkv, D, generator=gen).to(device, dtype)
    out = torch.full((B, Sq, Hq, D), SENTINEL, dtype=dtype, device=device)
    lse = torch.full((B, Hq, Sq), SENTINEL, dtype=torch.float32, device=device)
    _core.run_forward(q, k, v, out, lse, **{**OPTS, **opts})
    if device == "cuda":
        torch.cuda.synchronize()
    check(q, k, v, out, lse, **opts)


@pytest.mark.parametrize("device", DEVICES)
def test_strided_views_zero_copy(device):
    gen = torch.Generator().manual_seed(3)
    B, S, H, D = 2, 21, 4, 32
    # q, k, v as (B, H, S, D) storage seen as (B, S, H, D), the layout of a fused projection.
    qkv = torch.randn(B, 3 * H, S, D, generator=gen).to(device)
    q, k, v = (x.transpose(1, 2) for x in qkv.split(H, dim=1))
    big = torch.full((B, S, H, 2 * D), SENTINEL, device=device)
    out = big[..., D:]
    assert not (q.is_contiguous() or out.is_contiguous())
    _core.run_forward(q, k, v, out, None, **{**OPTS, "causal": True})
    assert torch.all(big[..., :D] == SENTINEL)
    assert out.data_ptr() == big.data_ptr() + D * 4  # written in place
    check(q, k, v, out, None, causal=True)


@pytest.mark.parametrize("device", DEVICES)
def test_requires_grad_inputs(device):
    D = 16
    q = torch.randn(1, 5, 2, D, device=device, requires_grad=True)
    out = torch.empty(1, 5, 2, D, device=device)
    _core.run_forward(q, q, q, out, None, **OPTS)
    check(q, q, q, out, None)


def test_non_contiguous_head_dim_raises():
    q = torch.randn(1, 4, 2, 32)
    out = torch.full((1, 4, 2, 16), SENTINEL)
    with pytest.raises(ValueError, match="contiguous head_dim"):
        _core.run_forward(q[..., ::2], q[..., ::2], q[..., ::2], out, None, **OPTS)
    assert torch.all(out == SENTINEL)


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_torch(device):
    gen = torch.Generator().manual_seed(5)
    lens = [4, 0, 11]
    cu = torch.tensor([0, 4, 4, 15], dtype=torch.int32, device=device)
    D = 32
    q = torch.randn(15, 4, D, generator=gen).to(device, torch.bfloat16)
    k = torch.randn(15, 2, D, generator=gen).to(device, torch.bfloat16)
    out = torch.full_like(q, SENTINEL)
    lse = torch.full((4, 15), SENTINEL, device=device)
    _core.run_varlen(q, k, k, cu, cu, out, lse, **{**OPTS, "causal": True})
    start = 0
    for n in lens:
        if n:
            r = slice(start, start + n)
            check(q[None, r], k[None, r], k[None, r], out[None, r], lse[None, :, r], causal=True)
        start += n


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_paged_kvcache_torch(device, cache_dtype):
    gen = torch.Generator().manual_seed(11)
    B, Hq, Hkv, D, page, s_new = 2, 4, 2, 64, 8, 3
    seqlens = torch.tensor([5, 13], dtype=torch.int32, device=device)
    block_table = torch.tensor([[3, 0, 5], [1, 4, 2]], dtype=torch.int32, device=device)
    k_cache = torch.randn(6, page, Hkv, D, generator=gen).to(device, cache_dtype)
    v_cache = torch.randn(6, page, Hkv, D, generator=gen).to(device, cache_dtype)
    before = k_cache.clone()
    q = torch.randn(B, 2, Hq, D, generator=gen).to(device)
    k_new = torch.randn(B, s_new, Hkv, D, generator=gen).to(device)
    v_new = torch.randn(B, s_new, Hkv, D, generator=gen).to(device)
    out = torch.full_like(q, SENTINEL)
    if device == "cuda" and cache_dtype != q.dtype:
        # docs/api.md: a half-precision cache under f32 activations runs on the CPU backend only.
        with pytest.raises(NotImplementedError, match="CPU backend only"):
            _core.run_kvcache(q, k_cache, v_cache, seqlens, k_new, v_new, block_table, out, None, **OPTS)
        assert torch.equal(k_cache, before) and bool((out == SENTINEL).all())
        return
    _core.run_kvcache(q, k_cache, v_cache, seqlens, k_new, v_new, block_table, out, None, **{**OPTS, "causal": True})
    for b in range(B):
        n = int(seqlens[b])
        rows = [(int(block_table[b, p // page]), p % page) for p in range(n + s_new)]
        keys = torch.stack([k_cache[i, j] for i, j in rows])
        vals = torch.stack([v_cache[i, j] for i, j in rows])
        assert torch.equal(keys[:n], torch.stack([before[i, j] for i, j in rows[:n]]))
        assert torch.equal(keys[n:], k_new[b].to(cache_dtype))
        check(q[b : b + 1], keys[None].float(), vals[None].float(), out[b : b + 1], None, causal=True)


def test_placement():
    assert _core.placement(torch.zeros(1)) == (_core.BACKEND_CPU, 0)
    assert _core.placement(np.zeros(1)) == (_core.BACKEND_CPU, 0)
    assert _core.is_torch(torch.zeros(1)) and not _core.is_torch(np.zeros(1))
    with pytest.raises(NotImplementedError, match="meta"):
        _core.placement(torch.zeros(1, device="meta"))


@pytest.mark.skipif(not CUDA, reason="no CUDA device or no CUDA backend in this build")
def test_cuda_current_stream_and_devices():
    q = torch.randn(1, 64, 2, 64, device="cuda", dtype=torch.float16)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        backend, handle = _core.placement(q)
        assert backend == _core.BACKEND_CUDA and handle == stream.cuda_stream
        out = torch.empty_like(q)
        _core.run_forward(q, q, q, out, None, **OPTS)
    stream.synchronize()
    check(q, q, q, out, None)
    with pytest.raises(ValueError, match="every array"):
        _core.run_forward(q, q, q, torch.empty_like(q, device="cpu"), None, **OPTS)


def test_importing_ioattn_does_not_import_torch():
    tests = pathlib.Path(__file__).resolve().parent
    code = (
        f"import sys; sys.path.insert(0, {str(tests)!r}); import conftest, ioattn, numpy; "
        "from ioattn import _core; assert not _core.is_torch(numpy.zeros(1)); "
        "ioattn.attention(*(numpy.ones((1, 2, 1, 4), numpy.float32),) * 3); "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ), cwd=tests)
