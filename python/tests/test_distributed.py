"""ioattn.merge_partials and ioattn.distributed (ring attention over torch.distributed).

Ring attention runs in 2 and 4 gloo processes on this machine (ring_worker.py, one group per
world size for every case) and is compared, after unshard(), with single-process
ioattn.attention on the whole sequence and with the float64 reference under docs/testing.md's
rule. Against the single-process result the allowance is the merge's rounding: a few float32
operations per merge, world_size merges per row, plus for 16-bit dtypes the rounding of each
partial to the storage dtype before it is merged.
"""

import math
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
dist = pytest.importorskip("torch.distributed", reason="torch.distributed is not available")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed has no gloo backend", allow_module_level=True)

import ioattn  # noqa: E402
from ioattn import distributed as ring  # noqa: E402

import ring_worker  # noqa: E402
from reference import check_attention  # noqa: E402

EPS = {torch.float32: 2.0**-23, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}
WORKER = pathlib.Path(__file__).resolve().parent / "ring_worker.py"


# ---- merge_partials ----


def _partials(rng, B=2, S=9, H=3, D=8, Sk=20, split=7):
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for shape in ((B, S, H, D), (B, Sk, H, D), (B, Sk, H, D)))
    a = ioattn.attention(q, k[:, :split], v[:, :split], return_lse=True)
    b = ioattn.attention(q, k[:, split:], v[:, split:], return_lse=True)
    return (q, k, v), a, b


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_merge_of_two_key_sets_is_attention_over_both(rng, backend):
    (q, k, v), a, b = _partials(rng)
    args = a + b if backend == "numpy" else tuple(torch.from_numpy(x) for x in a + b)
    out, lse = ioattn.merge_partials(*args)
    out, lse = np.asarray(out), np.asarray(lse)
    assert out.dtype == np.float32 and lse.dtype == np.float32
    check_attention(q, k, v, out, lse)


def test_merge_torch_follows_the_cpp_rule(rng):
    """torch's merge and the header's (through _ext) do the same IEEE operations in the same
    order; exp and log are torch's vectorized ones against libm's, each within an ulp or so, so
    the weights differ by a few float32 ulps and every output by a few ulps of the larger term
    (an element where the two terms cancel can differ by many of its own ulps)."""
    _, a, b = _partials(rng, B=3, S=40, H=4, D=16, Sk=90, split=33)
    on, ln = ioattn.merge_partials(*a, *b)
    ot, lt = (x.numpy() for x in ioattn.merge_partials(*(torch.from_numpy(x) for x in a + b)))
    eps = np.float32(EPS[torch.float32])
    assert np.all(np.abs(on - ot) <= 4 * eps * np.maximum(np.abs(a[0]), np.abs(b[0])))
    assert np.all(np.abs(ln - lt) <= 4 * eps * np.maximum(np.maximum(np.abs(a[1]), np.abs(b[1])), 1))
    assert np.mean(on == ot) > 0.9
    # Where no exp or log is inexact the two agree bit for bit: equal lse (weights 1, l = 2).
    same = (a[0], a[1], b[0], a[1].copy())
    on, ln = ioattn.merge_partials(*same)
    ot, lt = ioattn.merge_partials(*(torch.from_numpy(x) for x in same))
    assert np.array_equal(on, ot.numpy()) and np.array_equal(ln, lt.numpy())


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_merge_special_rows(backend):
    """Rows of the header's -inf and NaN rules: row 0 both sides saw no key, row 1 only a did,
    row 2 only b did, row 3 b's lse is NaN, row 4 a's output holds a NaN."""
    inf, nan = float("inf"), float("nan")
    lse_a = np.array([[[-inf, 0.5, -inf, 1.0, 2.0]]], dtype=np.float32)
    lse_b = np.array([[[-inf, -inf, -0.25, nan, 1.0]]], dtype=np.float32)
    out_a = np.zeros((1, 5, 1, 2), dtype=np.float32)
    out_b = np.zeros((1, 5, 1, 2), dtype=np.float32)
    out_a[0, 1, 0] = [1.5, -2.0]
    out_b[0, 2, 0] = [0.75, 3.0]
    out_a[0, 3, 0] = [1.0, 1.0]
    out_a[0, 4, 0] = [nan, 1.0]
    args = (out_a, lse_a, out_b, lse_b)
    if backend == "torch":
        args = tuple(torch.from_numpy(x) for x in args)
    out, lse = (np.asarray(x) for x in ioattn.merge_partials(*args))
    assert np.array_equal(out[0, 0, 0], [0, 0]) and lse[0, 0, 0] == -inf
    assert np.array_equal(out[0, 1, 0], out_a[0, 1, 0]) and lse[0, 0, 1] == lse_a[0, 0, 1]
    assert np.array_equal(out[0, 2, 0], out_b[0, 2, 0]) and lse[0, 0, 2] == lse_b[0, 0, 2]
    assert np.isnan(out[0, 3, 0]).all() and np.isnan(lse[0, 0, 3])
    assert np.isnan(out[0, 4, 0, 0]) and np.isfinite(out[0, 4, 0, 1]) and np.isfinite(lse[0, 0, 4])


def test_merge_bf16_partials_and_errors(rng):
    _, a, b = _partials(rng)
    ta, tb = (torch.from_numpy(x) for x in a), (torch.from_numpy(x) for x in b)
    (oa, la), (ob, lb) = ta, tb
    out, lse = ioattn.merge_partials(oa.bfloat16(), la, ob.bfloat16(), lb)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    ref, _ = ioattn.merge_partials(oa, la, ob, lb)
    assert (out.float() - ref).abs().max() <= 2 * EPS[torch.bfloat16] * ref.abs().max()
    with pytest.raises(ValueError, match="lse_b must be float32"):
        ioattn.merge_partials(oa, la, ob, lb.double())
    with pytest.raises(ValueError, match="lse_a must be"):
        ioattn.merge_partials(oa, la.transpose(1, 2), ob, lb)
    with pytest.raises(ValueError, match="must be float32"):
        ioattn.merge_partials(a[0].astype(np.float16), a[1], b[0], b[1])
    with pytest.raises(ValueError, match="lse_b"):
        ioattn.merge_partials(a[0], a[1], b[0], b[1][:, :, :-1])


# ---- the block plan, sharding, balance (no processes) ----


def _library_mask(rows, keys, window):
    i = torch.arange(rows)[:, None] + (keys - rows)
    j = torch.arange(keys)[None, :]
    visible = torch.ones(rows, keys, dtype=torch.bool)
    if window[0] >= 0:
        visible &= j >= i - window[0]
    if window[1] >= 0:
        visible &= j <= i + window[1]
    return visible


@pytest.mark.parametrize("causal", [False, True])
def test_block_calls_reproduce_the_global_mask(causal):
    for rows, keys in [(1, 1), (5, 5), (4, 7), (7, 4)]:
        for q_start in range(0, 12, 3):
            for k_start in range(0, 12, 2):
                for window in [(-1, -1), (0, 0), (2, -1), (5, 1), (-1, 3), (9, 8)]:
                    lo, hi = ring._band(causal, window)
                    d = (torch.arange(keys)[None, :] + k_start) - (torch.arange(rows)[:, None] + q_start)
                    want = (d >= lo) & (d <= hi)
                    got = torch.zeros(rows, keys, dtype=torch.bool)
                    plan = ring._block(q_start, rows, k_start, keys, lo, hi)
                    if plan is not None:
                        i0, i1, j0, j1, w = plan
                        assert min(w) >= -1
                        got[i0:i1, j0:j1] = _library_mask(i1 - i0, j1 - j0, w)
                    assert torch.equal(got, want), (rows, keys, q_start, k_start, causal, window, plan)


@pytest.mark.parametrize("zigzag", [False, True])
def test_shard_unshard_round_trip(zigzag):
    x = torch.arange(2 * 24 * 3).reshape(2, 24, 3)
    for world in (1, 2, 3):
        shards = [ring.shard(x, r, world, zigzag=zigzag) for r in range(world)]
        assert torch.equal(ring.unshard(shards, zigzag=zigzag), x)
    lse_like = x.transpose(1, 2)
    shards = [ring.shard(lse_like, r, 4, zigzag=zigzag, dim=2) for r in range(4)]
    assert torch.equal(ring.unshard(shards, zigzag=zigzag, dim=2), lse_like)
    if zigzag:
        assert ring.shard(x, 1, 3, zigzag=True)[0, :, 0].tolist() == [12, 15, 18, 21, 48, 51, 54, 57]
    with pytest.raises(ValueError, match="does not split evenly"):
        ring.shard(x, 0, 5, zigzag=zigzag)


def _visible_pairs(world, rank, length, zigzag, causal, window=(-1, -1)):
    lo, hi = ring._band(causal, window)
    mine = ring._pieces(world, rank, length, zigzag)
    total = 0
    for source in range(world):
        for q0, q1, k0, k1, w in ring._step_calls(mine, ring._pieces(world, source, length, zigzag), lo, hi):
            total += int(_library_mask(q1 - q0, k1 - k0, w).sum())
    return total


def test_zigzag_balances_causal_work():
    world, length = 4, 16
    zigzag = [_visible_pairs(world, r, length, True, True) for r in range(world)]
    contiguous = [_visible_pairs(world, r, length, False, True) for r in range(world)]
    n = world * length
    assert sum(zigzag) == sum(contiguous) == n * (n + 1) // 2
    assert len(set(zigzag)) == 1 and contiguous == sorted(contiguous) and contiguous[0] < contiguous[-1]


def test_zigzag_non_causal_step_is_one_call():
    pieces = ring._pieces(4, 1, 16, True)
    assert ring._step_calls(pieces, ring._pieces(4, 2, 16, True), -math.inf, math.inf) == [(0, 16, 0, 16, (-1, -1))]


# ---- one process ----


@pytest.fixture
def single_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_one_rank_is_plain_attention(single_rank_group):
    q, k, v = ring_worker.inputs("f32-causal-zigzag-gqa")
    out, lse = ring.ring_attention(q, k, v, causal=True, zigzag=True, return_lse=True)
    ref, ref_lse = ioattn.attention(q, k, v, causal=True, return_lse=True)
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)
    with pytest.raises(ValueError, match="same positions"):
        ring.ring_attention(q, k[:, 1:], v[:, 1:])


# ---- gloo groups of 2 and 4 processes ----


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n}ranks")
def gloo_run(request, tmp_path_factory):
    world = request.param
    out_dir = tmp_path_factory.mktemp(f"ring{world}")
    # One thread per process: the ranks share this machine's cores.
    env = dict(os.environ, OMP_NUM_THREADS="1", IOATTN_NUM_THREADS="1")
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(r), str(world), port, str(out_dir)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for r in range(world)
    ]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=120)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    failed = [(r, p.returncode, log) for r, (p, log) in enumerate(zip(procs, logs)) if p.returncode != 0]
    if failed:
        pytest.fail("ring workers failed:\n" + "\n".join(f"rank {r} (exit {rc}):\n{log}" for r, rc, log in failed))
    return world, [torch.load(out_dir / f"rank{r}.pt") for r in range(world)]


def _gathered(ranks, name, zigzag):
    out = ring.unshard([r["results"][name][0] for r in ranks], zigzag=zigzag)
    lse = ring.unshard([r["results"][name][1] for r in ranks], zigzag=zigzag, dim=2)
    return out, lse


def _as_numpy(x):
    """numpy has float16 but no bfloat16: bf16 values go as the float32 values they are."""
    return x.numpy() if x.dtype in (torch.float32, torch.float16) else x.float().numpy()


def _bf16_rounding():
    return (lambda x: torch.from_numpy(np.asarray(x, dtype=np.float32)).bfloat16().float().numpy()), EPS[torch.bfloat16]


@pytest.mark.parametrize("name", list(ring_worker.CASES))
def test_ring_matches_single_process(gloo_run, name):
    world, ranks = gloo_run
    *_, dtype, options = ring_worker.CASES[name]
    options = dict(options)
    zigzag = options.pop("zigzag", False)
    q, k, v = ring_worker.inputs(name)
    out, lse = _gathered(ranks, name, zigzag)
    single, single_lse = ioattn.attention(q, k, v, return_lse=True, **options)
    assert out.dtype == dtype and lse.dtype == torch.float32 and out.shape == single.shape

    merge_rounding = 4 * world * EPS[torch.float32] + (2 * EPS[dtype] if dtype != torch.float32 else 0)
    err = (out.float() - single.float()).abs().max()
    assert err <= merge_rounding * single.float().abs().max(), f"max|ring - single| = {err:.3g}"
    lse_err = (lse - single_lse).abs().max()
    assert lse_err <= 4 * world * EPS[torch.float32] * single_lse.abs().max(), f"max|lse - single| = {lse_err:.3g}"

    rounding = _bf16_rounding() if dtype == torch.bfloat16 else None
    check_attention(*(_as_numpy(x) for x in (q, k, v)), _as_numpy(out), lse.numpy(), rounding=rounding, **options)


def test_ring_rejects_uneven_and_odd_shards(gloo_run):
    world, ranks = gloo_run
    lengths = str([8 + r for r in range(world)])
    for r in ranks:
        assert lengths in r["errors"]["uneven"] and "different sequence lengths" in r["errors"]["uneven"]
        assert "local length of 9 is odd" in r["errors"]["odd-zigzag"]
    out, _ = _gathered(ranks, "after-errors", False)
    expected, _ = _gathered(ranks, "f32", False)
    assert torch.equal(out, expected)
