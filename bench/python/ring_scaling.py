"""Scaling of ioattn.distributed.ring_attention over gloo on this CPU: 1, 2, 4 and 8 ranks at one
fixed total sequence, with predicted against measured communication time.

Every rank is a process of its own (this script, re-run with --worker), pinned to one core
(rank r on the r % C-th allowed core) with one thread for ioattn and torch. Per world size N:

- wall: ring_attention's time, the slowest rank's, median of --reps calls after a warm-up;
- compute: per rank, the sum over steps of its ioattn calls and merges; max and max/mean (the
  load balance zigzag is for);
- wait: per rank, the time it blocked on the K/V hop after its compute (communication the compute
  did not hide); the slowest rank's;
- link: one block's bytes sent alone between ranks 0 and 1 (ping-pong, the others idle), giving
  a bandwidth; predicted communication = (N - 1) hops x bytes / that bandwidth;
- ring alone: the N - 1 hops of the same blocks with no compute, all ranks at once;
- efficiency: T_1 / (min(N, C) x T_N): the work done per core-second against one process on one
  core (the classic T_1 / (N T_N) when every rank has its own core). T_1 is rank 0 running
  ioattn.attention on the whole problem alone right after each ring call, and the figure is the
  median of the per-rep ratios: on a shared VM whose speed drifts between minutes, only
  measurements taken side by side compare;
- 2-core ceiling: T_1 / the time of ranks 0 and 1 each running the whole problem at once on
  their two cores, measured in the same reps: 1.0 when two cores give twice one core's
  throughput, 0.5 when they give no more than one. Efficiency for N >= 2 cannot pass it.

With N > C ranks the cores are time-shared: per-step compute stretches by about N / C, the hops
wait for descheduled peers, and the rows say so (oversubscribed). Those rows show the ring's
overhead on a shared CPU, not the scaling on N devices.

usage: ring_scaling.py [--seqlen 8192] [--ranks 1,2,4,8] [--heads 8] [--kv-heads 2] [--head-dim 64]
                       [--no-causal] [--contiguous] [--reps 3] [--json PATH]
"""
import argparse
import json
import os
import pathlib
import platform
import socket
import statistics
import subprocess
import sys
import time

from build_tree import import_ioattn  # noqa: E402  (this folder)


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# ---------------------------------------------------------------------------------------------
# One rank
# ---------------------------------------------------------------------------------------------


def ping_pong(dist, block, rank, rounds):
    """One-way seconds for `block` between ranks 0 and 1, the other ranks idle."""
    dist.barrier()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(block, 1)
            dist.recv(block, 1)
        elif rank == 1:
            dist.recv(block, 0)
            dist.send(block, 0)
        times.append((time.perf_counter() - t0) / 2)
    dist.barrier()
    return statistics.median(times[1:]) if rank == 0 else None


def ring_alone(dist, block, spare, rank, world):
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(world - 1):
        ops = [dist.P2POp(dist.isend, block, (rank + 1) % world), dist.P2POp(dist.irecv, spare, (rank - 1) % world)]
        for r in dist.batch_isend_irecv(ops):
            r.wait()
        block, spare = spare, block
    return time.perf_counter() - t0


def worker(args):
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[args.rank % len(cores)]})
    os.environ["IOATTN_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    ioattn = import_ioattn("distributed")
    ring = ioattn.distributed
    rank, world = args.rank, args.world
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=world)

    gen = torch.Generator().manual_seed(0)
    S, H, Hkv, D = args.seqlen, args.heads, args.kv_heads, args.head_dim
    full = [torch.randn((1, S, h, D), generator=gen) for h in (H, Hkv, Hkv)]
    zigzag = not args.contiguous
    q, k, v = (ring.shard(x, rank, world, zigzag=zigzag).contiguous() for x in full)

    def whole_problem():
        t0 = time.perf_counter()
        ioattn.attention(*full, causal=args.causal)
        return time.perf_counter() - t0

    walls, traces, alone, pair = [], [], [], []
    for i in range(args.reps + 1):
        trace = []
        dist.barrier()
        t0 = time.perf_counter()
        ring.ring_attention(q, k, v, causal=args.causal, zigzag=zigzag, _trace=trace)
        wall = time.perf_counter() - t0
        # The baselines of this rep, minutes apart they would not compare on a shared VM: rank 0
        # alone on the whole problem, then ranks 0 and 1 (two cores) on it at once.
        dist.barrier()
        t_alone = whole_problem() if rank == 0 else None
        dist.barrier()
        t_pair = whole_problem() if rank < 2 and world > 1 else None
        dist.barrier()
        if i:  # the first rep is the warm-up
            walls.append(wall)
            traces.append(trace)
            alone.append(t_alone)
            pair.append(t_pair)

    block = torch.cat([k, v], dim=-1)
    spare = torch.empty_like(block)
    one_way = ping_pong(dist, block, rank, 7) if world > 1 else None
    hops_alone = statistics.median(ring_alone(dist, block, spare, rank, world) for _ in range(3)) if world > 1 else 0.0

    mine = {
        "walls": walls,
        "alone": alone,
        "pair": pair,
        "wall": statistics.median(walls),
        "compute": statistics.median(sum(s["compute_s"] for s in t) for t in traces),
        "wait": statistics.median(sum(s["wait_s"] + s["post_s"] for s in t) for t in traces),
        "steps_compute": [statistics.median(t[j]["compute_s"] for t in traces) for j in range(world)],
        "ring_alone": hops_alone,
        "one_way": one_way,
        "bytes": block.numel() * block.element_size(),
    }
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        print(json.dumps(everyone))
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------------


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(args, world):
    port = str(free_port())
    base = [sys.executable, __file__, "--worker", "--world", str(world), "--port", port]
    base += ["--seqlen", str(args.seqlen), "--heads", str(args.heads), "--kv-heads", str(args.kv_heads)]
    base += ["--head-dim", str(args.head_dim), "--reps", str(args.reps)]
    base += ([] if args.causal else ["--no-causal"]) + (["--contiguous"] if args.contiguous else [])
    procs = [subprocess.Popen(base + ["--rank", str(r)], stdout=subprocess.PIPE, text=True) for r in range(world)]
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        sys.exit(f"ring_scaling: a rank of the {world}-rank run failed: {[p.returncode for p in procs]}")
    return json.loads(outs[0].strip().splitlines()[-1])


def summarize(world, ranks, cores):
    reps = range(len(ranks[0]["walls"]))
    wall_per_rep = [max(r["walls"][i] for r in ranks) for i in reps]
    t1_per_rep = ranks[0]["alone"]
    compute = [r["compute"] for r in ranks]
    steps = max(world - 1, 0)
    row = {
        "ranks": world,
        "oversubscribed": world > cores,
        "wall_s": statistics.median(wall_per_rep),
        "t1_s": statistics.median(t1_per_rep),
        "compute_max_s": max(compute),
        "balance": max(compute) / (sum(compute) / len(compute)),
        "wait_max_s": max(r["wait"] for r in ranks),
        "bytes_per_hop": ranks[0]["bytes"],
        "hops": steps,
        "link_GBps": None,
        "predicted_comm_s": 0.0,
        "ring_alone_s": max(r["ring_alone"] for r in ranks),
        "step_compute_s": max(max(r["steps_compute"][1:], default=0.0) for r in ranks),
        "efficiency": statistics.median(t1 / (min(world, cores) * w) for t1, w in zip(t1_per_rep, wall_per_rep)),
        "ceiling": 1.0,
        "per_rank": [{k: r[k] for k in ("walls", "compute", "wait", "steps_compute")} for r in ranks],
        "t1_per_rep": t1_per_rep,
    }
    if world > 1:
        one_way = ranks[0]["one_way"]
        row["link_GBps"] = ranks[0]["bytes"] / one_way / 1e9
        row["predicted_comm_s"] = steps * one_way
        row["hop_s"] = one_way
        if cores > 1:
            pair_per_rep = [max(ranks[0]["pair"][i], ranks[1]["pair"][i]) for i in reps]
            row["ceiling"] = statistics.median(t1 / p for t1, p in zip(t1_per_rep, pair_per_rep))
    return row


def print_table(rows, args, cores):
    mask = "causal" if args.causal else "non-causal"
    layout = "contiguous" if args.contiguous else "zigzag"
    print(
        f"# ring_attention over gloo: S={args.seqlen} total, Hq={args.heads}, Hkv={args.kv_heads}, D={args.head_dim}, "
        f"f32, {mask}, {layout}; {cpu_model()}, {cores} cores; one core and one thread per rank"
    )
    head = (
        "ranks", "S/rank", "MB/hop", "link GB/s", "hop s", "wall s", "T1 s", "compute max s", "max/mean",
        "step compute s", "wait s", "predicted comm s", "ring alone s", "hidden?", "efficiency", "2-core ceiling",
        "note",
    )
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        n = r["ranks"]
        hidden = "-" if n == 1 else ("yes" if r["step_compute_s"] >= r["hop_s"] else "no")
        note = f"oversubscribed: {n} ranks on {cores} cores" if r["oversubscribed"] else ""
        cells = (
            n, args.seqlen // n, f"{r['bytes_per_hop'] / 1e6:.2f}" if n > 1 else "-",
            f"{r['link_GBps']:.2f}" if n > 1 else "-", f"{r['hop_s']:.4f}" if n > 1 else "-",
            f"{r['wall_s']:.3f}", f"{r['t1_s']:.3f}", f"{r['compute_max_s']:.3f}", f"{r['balance']:.2f}",
            f"{r['step_compute_s']:.4f}" if n > 1 else "-", f"{r['wait_max_s']:.4f}",
            f"{r['predicted_comm_s']:.4f}", f"{r['ring_alone_s']:.4f}", hidden, f"{r['efficiency']:.2f}",
            f"{r['ceiling']:.2f}" if n > 1 else "-", note,
        )
        print("| " + " | ".join(str(c) for c in cells) + " |")
    if any(r["oversubscribed"] for r in rows):
        print(
            f"\nRows marked oversubscribed run more ranks than this machine's {cores} cores: ranks time-share "
            "the cores, so their compute and waits include time descheduled; efficiency there is per core, "
            "not per rank."
        )


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seqlen", type=int, default=8192)
    p.add_argument("--ranks", default="1,2,4,8")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--no-causal", dest="causal", action="store_false")
    p.add_argument("--contiguous", action="store_true", help="contiguous shards instead of zigzag")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)

    cores = len(os.sched_getaffinity(0))
    rows = []
    for world in (int(n) for n in args.ranks.split(",")):
        row = summarize(world, run_world(args, world), cores)
        rows.append(row)
        print(f"ranks={world}: wall {row['wall_s']:.3f} s", file=sys.stderr, flush=True)
    print_table(rows, args, cores)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "cpu": cpu_model(), "cores": cores, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
