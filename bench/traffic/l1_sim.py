#!/usr/bin/env python3
"""Line-level LRU simulation of the CPU flash kernel's L1 traffic (and, with --l2, of the level
behind it), for checking the traffic model's rules (common/traffic.cc) one term at a time.

It replays the loop nest of cpu/flash_kernel.cc in head mode (tiles from the first query block,
as the head task runs them; per key block and 48-row panel: ScoreTile over row-vector chunks, the
two SoftmaxBlock passes, the rescale of the panel's O rows, AccumulatePv chunk by chunk and group
by group, the row-by-row keys) over the scratch layout of MakeGeometry, and counts the lines each
phase fills, per array for P V. Without --l2 it leaves out the K/V packing, the stack and a few
scalars, and rescales every row (the kernel rescales only the rows whose max grew).

    l1_sim.py --seqlen 256 --dim 128 --block-q 132 --block-kv 160 [--causal] [--ways 8|0]
              [--l1 32768] [--avx512] [--by-chunk] [--l2 524288]

--ways 0 is fully associative. On the cachegrind geometry it agrees with cachegrind's
per-function counts within a few percent (S=512 D=128, 168x128: PvTile 171k lines measured,
167k here; ScoreTile 173k both).

--l2 BYTES adds a second level (same ways) that sees only the first level's misses, as
cachegrind's LL does, and the rest of one f32 call: the caller's Q, K, V and O (laid out after the
scratch), the K/V copy packed key by key, Q read by the Q^T packing, O written out. Its fills
(`L2 ...` lines, per phase and array) are what the model's L2-beyond rules predict.
"""
import argparse
from collections import OrderedDict

LINE = 64
FLOAT = 4
PANEL_ROWS = 48


class Cache:
    def __init__(self, size, ways, name='', behind=None):
        self.ways = ways if ways else size // LINE
        self.nsets = size // (self.ways * LINE)
        assert self.nsets * self.ways * LINE == size, "size must be sets x ways x 64"
        self.sets = [OrderedDict() for _ in range(self.nsets)]
        self.last = None
        self.tag = 'tile'
        self.fills = {}
        self.name = name
        self.behind = behind  # the next level: it sees this level's misses only

    def touch(self, addr, region):
        line = addr // LINE
        if line == self.last:  # already the most recent line
            return
        self.last = line
        s = self.sets[line % self.nsets]
        if line in s:
            s.move_to_end(line)
            return
        for key in (self.tag, self.tag + '.' + region):
            key = self.name + key
            self.fills[key] = self.fills.get(key, 0) + 1
        s[line] = True
        if len(s) > self.ways:
            s.popitem(last=False)
        if self.behind is not None:
            self.behind.tag = self.tag
            self.behind.touch(addr, region)

    def span(self, addr, nbytes, region):
        for a in range(addr - addr % LINE, addr + nbytes, LINE):
            self.touch(a, region)


def simulate(a):
    # The score tile (rows x svecs vectors) and the P V tile (pv_rows x pvecs, since 964956b its
    # own: 6 x 4 on AVX-512), whose columns are the V panels' width.
    lanes, svecs, score_rows = (16, 3, 8) if a.avx512 else (8, 2, 6)
    pv_rows, pvecs = 6, 4 if a.avx512 else 2
    pcols = pvecs * lanes
    S, D = a.seqlen, a.dim
    dvq = -(-D // pcols) * pcols
    mp_max = -(-a.block_q // lanes) * lanes
    regions = [('qt', mp_max * D), ('qrow', D), ('hk', S * D), ('hv', S * dvq), ('vtmp', dvq),
               ('st', a.block_kv * PANEL_ROWS), ('o', mp_max * D)]
    regions += [(n, mp_max) for n in ('m', 'l', 'alpha', 'mref', 'mblk', 'lo', 'hi')]
    regions += [('row_lo', 2 * mp_max), ('row_hi', 2 * mp_max)]
    off, at = {}, 0
    for name, floats in regions:
        off[name] = at
        at += -(-floats * FLOAT // 64) * 64
    l2 = Cache(a.l2, a.ways, 'L2 ') if a.l2 else None
    c = Cache(a.l1, a.ways, '', l2)
    vstride = S * pcols * FLOAT
    vecs_total = D // lanes
    tiles = -(-S // a.block_q)
    # The caller's tensors (one head, f32), after the scratch.
    for name in ('q', 'k', 'v', 'out'):
        off[name] = at
        at += -(-S * D * FLOAT // 4096) * 4096
    if l2:
        c.tag = 'pack'  # PackRows over all keys: K row to [key][D], V row to its column panels
        for j in range(S):
            c.span(off['k'] + j * D * FLOAT, D * FLOAT, 'k_src')
            c.span(off['hk'] + j * D * FLOAT, D * FLOAT, 'k')
            for v in range(0, D, lanes):
                c.span(off['v'] + (j * D + v) * FLOAT, lanes * FLOAT, 'v_src')
                c.span(off['hv'] + ((v // pcols) * S * pcols + j * pcols + v % pcols) * FLOAT, lanes * FLOAT, 'v')
    for qb in range(tiles):
        p0 = qb * a.block_q
        rows = min(a.block_q, S - p0)
        mp = -(-rows // lanes) * lanes
        vis_end = [p0 + r + 1 if a.causal else S for r in range(rows)]
        u1 = max(vis_end)
        nb = -(-u1 // a.block_kv)
        c.tag = 'tile'
        for r in range(mp):  # Q^T packing
            if l2 and r < rows:
                c.span(off['q'] + (p0 + r) * D * FLOAT, D * FLOAT, 'q_src')
            for d in range(D):
                c.touch(off['qt'] + ((r // lanes) * D * lanes + d * lanes + r % lanes) * FLOAT, 'qt')
        c.span(off['o'], mp * D * FLOAT, 'o')  # O zeroed
        for k in range(nb):
            j0 = max(0, u1 - (nb - k) * a.block_kv)
            nk = u1 - (nb - 1 - k) * a.block_kv - j0
            kp = off['hk'] + j0 * D * FLOAT
            vp = off['hv'] + j0 * pcols * FLOAT
            lo = [0] * rows
            hi = [min(max(vis_end[r] - j0, 0), nk) for r in range(rows)]
            for r0p in range(0, rows, PANEL_ROWS):
                pr = min(PANEL_ROWS, rows - r0p)
                pmp = -(-pr // lanes) * lanes
                if not any(lo[r] < hi[r] for r in range(r0p, r0p + pr)):
                    continue
                c.tag = 'score'
                nvec = pmp // lanes
                for cv in range(0, nvec, svecs):
                    nc = min(svecs, nvec - cv)
                    for j in range(0, nk, score_rows):
                        nr = min(score_rows, nk - j)
                        for d in range(D):
                            for v in range(nc):
                                c.touch(off['qt'] + ((r0p // lanes + cv + v) * D * lanes + d * lanes) * FLOAT, 'qt')
                            for r in range(nr):
                                c.touch(kp + ((j + r) * D + d) * FLOAT, 'k')
                        for r in range(nr):
                            c.span(off['st'] + ((j + r) * pmp + cv * lanes) * FLOAT, nc * lanes * FLOAT, 'st')
                c.tag = 'softmax'
                for scalars in ('lo', 'mref'):  # pass 1 (mask bounds, block max), pass 2 (exp, sum)
                    for r0 in range(0, pmp, lanes):
                        c.touch(off[scalars] + (r0p + r0) * FLOAT, scalars)
                        for j in range(nk):
                            c.touch(off['st'] + (j * pmp + r0) * FLOAT, 'st')
                c.tag = 'rescale'
                for r in range(r0p, r0p + pr):
                    c.span(off['o'] + r * D * FLOAT, D * FLOAT, 'o')
                c.tag = 'pv'
                groups = []
                for g0 in range(r0p, r0p + pr, pv_rows):
                    rr = range(g0, min(r0p + pr, g0 + pv_rows))
                    ga, ge = max(lo[r] for r in rr), min(hi[r] for r in rr)
                    groups.append((g0, len(rr), ga, ge, all(lo[r] < hi[r] for r in rr) and ga < ge))
                for v in range(0, vecs_total, pvecs):
                    nc = min(pvecs, vecs_total - v)
                    panel = vp + (v // pvecs) * vstride
                    if a.by_chunk:
                        c.tag = 'pv.c%d' % (v // pvecs)
                    for g0, nr, ga, ge, fast in groups:
                        if not fast:
                            continue
                        for r in range(nr):
                            c.span(off['o'] + ((g0 + r) * D + v * lanes) * FLOAT, nc * lanes * FLOAT, 'o')
                        for j in range(ga, ge):
                            c.span(panel + j * pcols * FLOAT, nc * lanes * FLOAT, 'v')
                            c.span(off['st'] + (j * pmp + g0 - r0p) * FLOAT, nr * FLOAT, 'st')
                        for r in range(nr):
                            c.span(off['o'] + ((g0 + r) * D + v * lanes) * FLOAT, nc * lanes * FLOAT, 'o')
                c.tag = 'pv_rows'
                for g0, nr, ga, ge, fast in groups:
                    for r in range(g0, g0 + nr):
                        for ra, re in ([(lo[r], ga), (ge, hi[r])] if fast else [(lo[r], hi[r])]):
                            for v in range(0, vecs_total, 4):
                                for j in range(ra, re):
                                    c.touch(off['st'] + (j * pmp + r - r0p) * FLOAT, 'st')
                                    for vv in range(v, min(v + 4, vecs_total)):
                                        c.touch(vp + (vv // pvecs) * vstride + ((vv % pvecs) * lanes + j * pcols) * FLOAT, 'v')
        c.tag = 'tile'
        for r in range(rows):  # output
            c.span(off['o'] + r * D * FLOAT, D * FLOAT, 'o')
            if l2:
                c.span(off['out'] + (p0 + r) * D * FLOAT, D * FLOAT, 'out')
    return {**c.fills, **(l2.fills if l2 else {})}


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--seqlen', type=int, required=True)
    p.add_argument('--dim', type=int, required=True)
    p.add_argument('--block-q', type=int, required=True)
    p.add_argument('--block-kv', type=int, required=True)
    p.add_argument('--causal', action='store_true')
    p.add_argument('--ways', type=int, default=8, help='0: fully associative')
    p.add_argument('--l1', type=int, default=32768, help='bytes')
    p.add_argument('--avx512', action='store_true',
                   help='the AVX-512 register tiles (score 8 x 3 vectors of 16, P V 6 x 4)')
    p.add_argument('--by-chunk', action='store_true', help='P V fills per V column chunk')
    p.add_argument('--l2', type=int, default=0, help='bytes of a second level behind the first (0: none)')
    fills = simulate(p.parse_args())
    for key in sorted(fills):
        print('%-16s %10d lines %9.3f MB' % (key, fills[key], fills[key] * LINE / 1e6))


if __name__ == '__main__':
    main()
