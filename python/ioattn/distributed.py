"""Context-parallel (ring) attention over torch.distributed: NCCL on GPUs, gloo on CPUs.

Each rank of a process group holds a shard of one sequence's queries, keys and values (the same
positions for all three: self-attention). The K/V shards travel around the ring, one hop per
step, with non-blocking send/recv that runs while the rank attends its queries to the block it
already has; after world_size steps every query has seen every key, and the partial results are
combined with common/online_softmax.h's merge rule (:func:`ioattn.merge_partials`). Forward only.

Layouts (:func:`shard`, :func:`unshard`): contiguous gives rank r positions
[r S/N, (r+1) S/N); zigzag cuts the sequence into 2N chunks and gives rank r chunks r and
2N-1-r, so under a causal mask every rank has the same number of visible (query, key) pairs.

Masks are exact: causal masks and windows are the library's (bottom-right aligned over the whole
sequence, whose query and key lengths are equal), and each (query piece, key piece) pair of a step
becomes one ioattn call with the rows and keys that can see each other and the window that
reproduces the global mask there, or no call when nothing is visible.
"""

from __future__ import annotations

import math
import time
from typing import List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from . import _core
from .ops import _merge_into, attention

__all__ = ["ring_attention", "shard", "unshard"]

_UNBOUNDED = (-1, -1)


# --------------------------------------------------------------------------------------------
# Layouts
# --------------------------------------------------------------------------------------------


def _pieces(world: int, rank: int, length: int, zigzag: bool) -> List[Tuple[int, int, int]]:
    """(global start, local start, length) of each contiguous piece of rank's shard of `length`."""
    if not zigzag:
        return [(rank * length, 0, length)]
    half = length // 2
    if rank == world - 1:  # chunks N-1 and N touch: one piece, so its diagonal is one causal call
        return [(rank * half, 0, length)]
    return [(rank * half, 0, half), ((2 * world - 1 - rank) * half, half, half)]


def _check_layout(total: int, world: int, zigzag: bool, what: str) -> int:
    parts = 2 * world if zigzag else world
    if world < 1 or total % parts:
        layout = f"zigzag (2 x {world} chunks)" if zigzag else f"contiguous ({world} shards)"
        raise ValueError(f"{what}: a sequence of {total} positions does not split evenly for a {layout} layout")
    return total // parts


def shard(x: Tensor, rank: int, world_size: int, *, zigzag: bool = False, dim: int = 1) -> Tensor:
    """Rank's shard of the full sequence x along `dim` (1 for (B, S, H, D); 2 for (B, H, S) lse).

    Contiguous: a view of positions [rank S/N, (rank+1) S/N). Zigzag: chunks rank and
    2N-1-rank of 2N, concatenated (a copy). The length must split evenly (ValueError).
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"shard: rank {rank} is not in [0, {world_size})")
    total = x.shape[dim]
    size = _check_layout(total, world_size, zigzag, "shard")
    if not zigzag:
        return x.narrow(dim, rank * size, size)
    return torch.cat([x.narrow(dim, rank * size, size), x.narrow(dim, (2 * world_size - 1 - rank) * size, size)], dim)


def unshard(shards: Sequence[Tensor], *, zigzag: bool = False, dim: int = 1) -> Tensor:
    """The full sequence from every rank's shard (a list in rank order), the inverse of shard()."""
    world = len(shards)
    if world == 0:
        raise ValueError("unshard: no shards")
    lengths = [s.shape[dim] for s in shards]
    if len(set(lengths)) != 1:
        raise ValueError(f"unshard: the shards have different lengths {lengths} along dim {dim}")
    if not zigzag:
        return torch.cat(list(shards), dim)
    if lengths[0] % 2:
        raise ValueError(f"unshard: zigzag shards hold two equal chunks; a length of {lengths[0]} is odd")
    half = lengths[0] // 2
    front = [s.narrow(dim, 0, half) for s in shards]
    back = [s.narrow(dim, half, half) for s in reversed(shards)]
    return torch.cat(front + back, dim)


# --------------------------------------------------------------------------------------------
# The calls of one step
# --------------------------------------------------------------------------------------------


def _band(causal: bool, window: Tuple[int, int]) -> Tuple[float, float]:
    """[lo, hi] of key position - query position for a visible pair over the whole sequence.

    With equal query and key lengths the library's bottom-right alignment has offset 0, so the
    global mask is a band around the diagonal."""
    left, right = window
    lo = -left if left >= 0 else -math.inf
    hi = right if right >= 0 else math.inf
    if causal:
        hi = min(hi, 0)
    return lo, hi


def _block(q_start: int, q_len: int, k_start: int, k_len: int, lo: float, hi: float):
    """The ioattn call for queries at global positions [q_start, +q_len) against keys at
    [k_start, +k_len) under the band lo <= key - query <= hi: None when no pair is visible, else
    (i0, i1, j0, j1, window) over query rows [i0, i1) and keys [j0, j1) of the block.

    The library's windows are bottom-right aligned with non-negative sizes, which cannot say
    "only keys right of the diagonal"; dropping the rows and keys that see nothing moves the
    bottom-right corner inside the band, where the band is two non-negative offsets from it."""
    delta = k_start - q_start
    blo, bhi = lo - delta, hi - delta  # the band over j - i in block coordinates
    i0, i1 = max(0, -bhi), min(q_len, k_len - blo)
    j0, j1 = max(0, blo), min(k_len, q_len + bhi)
    if not (i0 < i1 and j0 < j1):
        return None
    i0, i1, j0, j1 = int(i0), int(i1), int(j0), int(j1)
    rows, keys = i1 - i0, j1 - j0
    off = keys - rows
    shift = j0 - i0
    blo, bhi = blo - shift, bhi - shift
    left = -1 if blo <= -(rows - 1) else int(off - blo)
    right = -1 if bhi >= keys - 1 else int(bhi - off)
    if left < -1 or right < -1:
        raise AssertionError(f"ring_attention: no window for block {(q_start, q_len, k_start, k_len, lo, hi)}")
    return i0, i1, j0, j1, (left, right)


def _join(calls, same, adjacent, joined):
    result = []
    for c in calls:
        p = result[-1] if result else None
        if p is not None and p[4] == c[4] == _UNBOUNDED and same(p, c) and adjacent(p, c):
            result[-1] = joined(p, c)
        else:
            result.append(c)
    return result


def _step_calls(q_pieces, k_pieces, lo: float, hi: float):
    """The calls (q0, q1, k0, k1, window) of one step, in local query rows and rows of the K/V
    block; unmasked calls on adjacent rows or keys are joined (zigzag's pieces are adjacent in
    memory), as one call costs less than two and one merge rounds less than two."""
    calls = []
    for q_global, q_local, q_len in q_pieces:
        for k_global, k_local, k_len in k_pieces:
            b = _block(q_global, q_len, k_global, k_len, lo, hi)
            if b is not None:
                i0, i1, j0, j1, window = b
                calls.append((q_local + i0, q_local + i1, k_local + j0, k_local + j1, window))
    calls = _join(
        sorted(calls), lambda p, c: p[:2] == c[:2], lambda p, c: p[3] == c[2], lambda p, c: (*p[:3], c[3], p[4])
    )
    calls = _join(
        sorted(calls, key=lambda c: (c[2], c[3], c[0])),
        lambda p, c: p[2:4] == c[2:4],
        lambda p, c: p[1] == c[0],
        lambda p, c: (p[0], c[1], *p[2:]),
    )
    return calls


# --------------------------------------------------------------------------------------------
# ring_attention
# --------------------------------------------------------------------------------------------


def _check_inputs(q: Tensor, k: Tensor, v: Tensor) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor):
            raise TypeError(f"ring_attention: {name} must be a torch tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"ring_attention: {name} must be 4-D (B, S, H, D), got shape {tuple(x.shape)}")
    if not (q.shape[1] == k.shape[1] == v.shape[1]):
        raise ValueError(
            "ring_attention: q, k and v must hold the same positions (self-attention); got local lengths "
            f"{q.shape[1]}, {k.shape[1]}, {v.shape[1]}"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"ring_attention: q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"ring_attention: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")


_DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def _check_ranks(q: Tensor, k: Tensor, v: Tensor, group, world: int, zigzag: bool) -> None:
    """Every rank must send and receive blocks of one shape, or the ring hangs or corrupts: all
    ranks compare their shapes (one small all_gather) and raise the same error together."""
    desc = [q.shape[1], q.shape[0], q.shape[2], k.shape[2], k.shape[3], v.shape[3], _DTYPE_CODES.get(q.dtype, 9)]
    mine = torch.tensor(desc + [int(zigzag)], dtype=torch.int64, device=q.device)
    everyone = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine, group=group)
    table = [t.tolist() for t in everyone]
    lengths = [row[0] for row in table]
    if len(set(lengths)) != 1:
        raise ValueError(
            f"ring_attention: the ranks hold different sequence lengths {lengths} (in rank order); every rank "
            "must hold the same number of positions (pad the sequence to a multiple of the shard count)"
        )
    if any(row != table[0] for row in table):
        raise ValueError(
            "ring_attention: the ranks disagree on (seqlen, batch, heads_q, heads_kv, head_dim, head_dim_v, dtype, "
            f"zigzag): {table}"
        )
    if zigzag and lengths[0] % 2:
        raise ValueError(f"ring_attention: zigzag shards hold two equal chunks; a local length of {lengths[0]} is odd")


def _peer(group, rank_in_group: int) -> int:
    return rank_in_group if group is None else dist.get_global_rank(group, rank_in_group)


def ring_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    group: Optional[dist.ProcessGroup] = None,
    *,
    causal: bool = False,
    window: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    scale: Optional[float] = None,
    return_lse: bool = False,
    zigzag: bool = False,
    _trace: Optional[list] = None,
):
    """Exact attention over a sequence sharded across the ranks of `group` (default: the world).

    q (B, S_local, Hq, D), k (B, S_local, Hkv, D), v (B, S_local, Hkv, Dv): this rank's shard,
    contiguous in rank order, or zigzag when ``zigzag`` (see :func:`shard`); every rank holds the
    same S_local (else ValueError on every rank, naming the lengths). causal, window, softcap and
    scale mean what they mean for :func:`ioattn.attention` over the whole sequence. Returns this
    rank's out (B, S_local, Hq, Dv) in q's dtype, and with return_lse also lse (B, Hq, S_local)
    float32. Collective: every rank of the group must call it. Only the Hkv heads of K and V
    travel (GQA); partials are merged in float32 and out is rounded once at the end.
    """
    _check_inputs(q, k, v)
    left, right = _core.window_pair(window)
    lo, hi = _band(bool(causal), (left, right))
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    _check_ranks(q, k, v, group, world, zigzag)

    B, S, Hq, _ = q.shape
    D, Dv = k.shape[3], v.shape[3]
    # One buffer per block (K and V side by side in the last axis): one message per hop, and
    # views of it have the contiguous head_dim the library needs.
    block = torch.cat([k, v], dim=-1)
    spare = torch.empty_like(block) if world > 1 else None
    acc = torch.zeros((B, S, Hq, Dv), dtype=torch.float32, device=q.device)
    acc_lse = torch.full((B, Hq, S), float("-inf"), dtype=torch.float32, device=q.device)
    q_pieces = _pieces(world, rank, S, zigzag)
    send_to, recv_from = _peer(group, (rank + 1) % world), _peer(group, (rank - 1) % world)
    moves = block.numel() > 0

    for step in range(world):
        source = (rank - step) % world
        t0 = time.perf_counter()
        requests = []
        if step < world - 1 and moves:
            requests = dist.batch_isend_irecv(
                [dist.P2POp(dist.isend, block, send_to, group), dist.P2POp(dist.irecv, spare, recv_from, group)]
            )
        t1 = time.perf_counter()
        calls = _step_calls(q_pieces, _pieces(world, source, S, zigzag), lo, hi)
        for q0, q1, k0, k1, win in calls:
            out, lse = attention(
                q[:, q0:q1], block[:, k0:k1, :, :D], block[:, k0:k1, :, D:],
                window=win, softcap=softcap, scale=scale, return_lse=True,
            )
            _merge_into(acc[:, q0:q1], acc_lse[:, :, q0:q1], out, lse)
        t2 = time.perf_counter()
        for r in requests:
            r.wait()
        t3 = time.perf_counter()
        # Host times: on CUDA they are launch times, not the kernels' (bench/python/ring_scaling.py
        # reads them on the CPU).
        if _trace is not None:
            _trace.append(
                {"step": step, "source": source, "calls": len(calls), "post_s": t1 - t0, "compute_s": t2 - t1,
                 "wait_s": t3 - t2, "bytes": block.numel() * block.element_size() if requests else 0}
            )
        if requests:
            block, spare = spare, block

    out = acc.to(q.dtype)
    return (out, acc_lse) if return_lse else out
