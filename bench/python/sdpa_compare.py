"""ioattn's Python entry points beside torch's scaled_dot_product_attention, on CPU and CUDA.

Two parts, per device:

- overhead: a tiny problem (B=1, S=1 or 16, D=64; f32 on CPU, bf16 on CUDA), the median
  microseconds of one call over many after a warm-up, through each layer of ioattn's torch path
  (the public ioattn.attention, the custom op torch.ops.ioattn.attention, the runner
  ioattn._core.run_forward and the extension ioattn._ext.forward into a preallocated output) and
  through SDPA, by default and forced onto each backend that applies on the device. On CPU each
  call is timed alone. On CUDA the time is host-side: a batch of calls is launched, synchronized
  once at its end, and divided by its count, so it is the launch overhead whenever that exceeds a
  kernel this small, which it does.
- throughput: real shapes (CPU: B=1 H=16 S=1024/4096 D=64/128 f32; CUDA: bf16, B*S=16k tokens,
  H*D=2048, S=1024..8192, D=64/128), causal and not, milliseconds and TFLOP/s of ioattn.attention
  and of each SDPA backend, ioattn's ratio to each, and ioattn's largest absolute difference from
  default SDPA. FLOPs: 4 * B * H * S^2 * D, halved when causal. CPU calls alternate between the
  two sides, one timed call each per round; CUDA calls are timed with events.

Inputs are (B, S, H, D) tensors; SDPA gets (B, H, S, D) views of the same memory (transpose, no
copy), as bench/peers/torch_sdpa.py does. On CPU both sides use torch.get_num_threads() threads:
IOATTN_NUM_THREADS is set to it when unset (ioattn reads it per call), and when it is set, torch
is given that number instead.

ioattn comes from the installed package, or from a build tree's extension with this checkout's
python/ioattn when IOATTN_BUILD_DIR names one (as python/tests/conftest.py does).

usage: sdpa_compare.py [--device cpu,cuda] [--quick] [--json PATH] [--part overhead,throughput]
"""
import argparse
import contextlib
import json
import os
import pathlib
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from build_tree import import_ioattn  # noqa: E402  (this folder)

# The SDPA backends that can run on each device (None: SDPA's own choice).
SDPA_BACKENDS = {
    "cpu": {"default": None, "math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION},
    "cuda": {
        "default": None,
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
    },
}
DTYPE = {"cpu": torch.float32, "cuda": torch.bfloat16}
BACKEND_CUDA = 1


def match_threads():
    env = os.environ.get("IOATTN_NUM_THREADS")
    if env:
        torch.set_num_threads(int(env))
    else:
        os.environ["IOATTN_NUM_THREADS"] = str(torch.get_num_threads())
    return torch.get_num_threads()


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def sdpa_call(backend, qt, kt, vt, causal):
    """A call of SDPA under `backend`; the context is entered around the timing loop, not each
    call, so its cost stays out of the per-call time."""
    if backend is None:
        return None, lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    return sdpa_kernel(backend), lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)


class Unavailable(Exception):
    pass


def per_call_us(fn, device, calls, warmup, context=None):
    """Median µs of one call: timed alone on CPU; on CUDA, batches of 100 launched back to back
    with one synchronize per batch, the batch's time divided by its count."""
    with context or contextlib.nullcontext():
        try:
            for _ in range(warmup):
                fn()
            sync(device)
        except RuntimeError as err:
            raise Unavailable(str(err).splitlines()[0]) from None
        samples = []
        if device == "cpu":
            clock = time.perf_counter_ns
            for _ in range(calls):
                t0 = clock()
                fn()
                samples.append(clock() - t0)
        else:
            batch = 100
            for _ in range(max(1, calls // batch)):
                t0 = time.perf_counter_ns()
                for _ in range(batch):
                    fn()
                torch.cuda.synchronize()
                samples.append((time.perf_counter_ns() - t0) / batch)
    return statistics.median(samples) / 1e3


def overhead_rows(ioattn, device, quick):
    from ioattn import _core, _ext

    shapes = [(1, 1, 64), (1, 2, 64), (16, 2, 64)]
    calls, warmup = (2000, 200) if quick else (20000, 1000)
    rows = []
    gen = torch.Generator().manual_seed(0)
    for S, H, D in shapes:
        q, k, v = (torch.randn(1, S, H, D, generator=gen).to(device, DTYPE[device]) for _ in range(3))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        out = torch.empty_like(q)
        backend, stream = _core.placement(q)
        callers = {
            "ioattn.attention": (None, lambda: ioattn.attention(q, k, v)),
            "torch.ops.ioattn.attention": (
                None,
                lambda: torch.ops.ioattn.attention.default(q, k, v, False, -1, -1, 0.0, None, False),
            ),
            "_core.run_forward (out given)": (
                None,
                lambda: _core.run_forward(q, k, v, out, None, causal=False, window=(-1, -1), softcap=0.0, scale=None),
            ),
            "_ext.forward (out given)": (
                None,
                lambda: _ext.forward(q, k, v, out, None, False, -1, -1, 0.0, 0.0, backend, 0, stream),
            ),
        }
        for name, sdpa_backend in SDPA_BACKENDS[device].items():
            callers["sdpa " + name] = sdpa_call(sdpa_backend, qt, kt, vt, False)
        if device == "cuda" and not _ext.backend_available(BACKEND_CUDA):
            for name in [n for n in callers if not n.startswith("sdpa")]:
                del callers[name]
        row = {"device": device, "dtype": str(DTYPE[device]).replace("torch.", ""), "B": 1, "S": S, "H": H, "D": D}
        with torch.no_grad():
            for name, (context, fn) in callers.items():
                try:
                    row[name] = per_call_us(fn, device, calls, warmup, context)
                except Unavailable as err:
                    print(f"# {device} S={S} H={H} {name}: {err}", flush=True)
                    row[name] = None
        rows.append(row)
        print(f"# overhead {device} S={S} H={H} done", flush=True)
    return rows


def cuda_ms(fn, reps):
    """Median ms of one call, CUDA events around each."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def cpu_ms_alternating(fns, rounds):
    """Median ms of each of `fns` (a dict), one timed call each per round, in an order that
    rotates between rounds so neither side always runs on the caches the other left."""
    names = list(fns)
    times = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for n in order:
            t0 = time.perf_counter()
            fns[n]()
            times[n].append((time.perf_counter() - t0) * 1e3)
    return {n: statistics.median(t) for n, t in times.items()}


def throughput_shapes(device, quick):
    if device == "cpu":
        seqlens, dims = ((1024,), (64,)) if quick else ((1024, 4096), (64, 128))
        return [(1, 16, S, D, c) for D in dims for S in seqlens for c in (False, True)]
    seqlens, dims = ((1024, 4096), (128,)) if quick else ((1024, 2048, 4096, 8192), (64, 128))
    return [(16384 // S, 2048 // D, S, D, c) for D in dims for S in seqlens for c in (False, True)]


def throughput_rows(ioattn, device, quick, math_max_seqlen):
    from ioattn import _ext

    ours = device == "cpu" or _ext.backend_available(BACKEND_CUDA)
    if not ours:
        print("# this ioattn build has no CUDA backend: SDPA alone on cuda", flush=True)
    rows = []
    gen = torch.Generator().manual_seed(1)
    for B, H, S, D, causal in throughput_shapes(device, quick):
        q, k, v = (torch.randn(B, S, H, D, generator=gen).to(device, DTYPE[device]) for _ in range(3))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        fns = {}
        if ours:
            fns["ioattn"] = lambda: ioattn.attention(q, k, v, causal=causal)
        for name, backend in SDPA_BACKENDS[device].items():
            if name == "math" and S > math_max_seqlen:
                continue  # materializes S x S scores per head: minutes at these sizes

            def run(backend=backend):
                if backend is None:
                    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

            fns[name] = run
        row = {"device": device, "dtype": str(DTYPE[device]).replace("torch.", ""), "B": B, "H": H, "S": S, "D": D,
               "causal": causal}
        with torch.no_grad():
            reference = fns["default"]().transpose(1, 2)
            if ours:
                row["max_abs_err"] = (fns["ioattn"]() - reference).abs().max().item()
            del reference
            working = {}
            for name, fn in fns.items():
                try:
                    fn()  # warm-up, and SDPA refuses a shape its backend cannot take here
                    sync(device)
                    working[name] = fn
                except RuntimeError as err:
                    print(f"# {device} S={S} D={D} causal={int(causal)} {name}: {str(err).splitlines()[0]}", flush=True)
            if device == "cuda":
                reps = 10 if quick else 30
                ms = {name: cuda_ms(fn, reps) for name, fn in working.items()}
            else:
                ms = cpu_ms_alternating(working, 3 if quick else 7)
        flops = 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)
        for name in fns:
            row[name + "_ms"] = ms.get(name)
            row[name + "_tflops"] = flops / ms[name] * 1e-9 if name in ms else None
        rows.append(row)
        print(f"# throughput {device} S={S} D={D} causal={int(causal)} done", flush=True)
        del q, k, v, qt, kt, vt
    return rows


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def overhead_table(rows):
    names = [k for k in rows[0] if k not in ("device", "dtype", "B", "S", "H", "D")]
    lines = ["| device | dtype | S | H | D | " + " | ".join(names) + " |", "|---" * (5 + len(names)) + "|"]
    for r in rows:
        lines.append(f"| {r['device']} | {r['dtype']} | {r['S']} | {r['H']} | {r['D']} | "
                     + " | ".join(fmt(r[n], ".1f") for n in names) + " |")
    return lines


def throughput_table(rows, device):
    peers = [n for n in SDPA_BACKENDS[device] if any(r.get(n + "_ms") is not None for r in rows)]
    ours = any("ioattn_ms" in r for r in rows)
    head = ["B", "H", "S", "D", "causal"]
    if ours:
        head += ["ioattn ms", "ioattn TFLOP/s"]
    head += [f"{p} ms" for p in peers]
    if ours:
        head += [f"vs {p}" for p in peers] + ["max abs err"]
    spec = ".3f" if device == "cpu" else ".2f"
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for r in rows:
        cells = [str(r["B"]), str(r["H"]), str(r["S"]), str(r["D"]), str(int(r["causal"]))]
        if ours:
            cells += [fmt(r.get("ioattn_ms"), spec), fmt(r.get("ioattn_tflops"), ".3f" if device == "cpu" else ".0f")]
        cells += [fmt(r.get(p + "_ms"), spec) for p in peers]
        if ours:
            mine = r.get("ioattn_ms")
            # > 1: ioattn is faster (the peer's time over ours).
            cells += [fmt(r[p + "_ms"] / mine if mine and r.get(p + "_ms") else None, ".2f") for p in peers]
            cells.append(fmt(r.get("max_abs_err"), ".1e"))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def machine(device):
    if device == "cuda":
        return torch.cuda.get_device_name()
    name = platform.processor() or "cpu"
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{name}, {os.cpu_count()} logical cores"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=None, help="cpu, cuda or cpu,cuda (default: cpu, and cuda when torch has it)")
    ap.add_argument("--part", default="overhead,throughput", help="overhead, throughput or both")
    ap.add_argument("--quick", action="store_true", help="fewer calls, fewer shapes")
    ap.add_argument("--math-max-seqlen", type=int, default=1024, help="longest S timed on SDPA's math backend")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    devices = args.device.split(",") if args.device else ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    parts = args.part.split(",")
    if "cuda" in devices and not torch.cuda.is_available():
        sys.exit("--device cuda: torch sees no CUDA device")
    threads = match_threads()
    ioattn = import_ioattn("ops")

    result = {
        "ioattn": ioattn.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": threads,
        "quick": args.quick,
        "machines": {d: machine(d) for d in devices},
        "overhead": [],
        "throughput": [],
    }
    print(f"# ioattn {ioattn.__version__}, torch {torch.__version__}, python {platform.python_version()}, "
          f"CPU threads {threads} (ioattn and torch)", flush=True)
    for device in devices:
        print(f"# {device}: {result['machines'][device]}", flush=True)
        if "overhead" in parts:
            result["overhead"] += overhead_rows(ioattn, device, args.quick)
        if "throughput" in parts:
            result["throughput"] += throughput_rows(ioattn, device, args.quick, args.math_max_seqlen)

    for device in devices:
        rows = [r for r in result["overhead"] if r["device"] == device]
        if rows:
            how = "one call timed alone" if device == "cpu" else "host-side: 100 calls, one synchronize, divided"
            print(f"\n### Per-call overhead, {device} (median µs; {how})\n")
            print("\n".join(overhead_table(rows)))
        rows = [r for r in result["throughput"] if r["device"] == device]
        if rows:
            print(f"\n### Throughput, {device} (median ms; vs X = X's time / ioattn's, > 1: ioattn faster)\n")
            print("\n".join(throughput_table(rows, device)))
    sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
