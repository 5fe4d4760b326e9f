"""PyTorch CPU SDPA against ioattn.attention at the prefill shapes, same data, same thread count.

float32 q/K/V (B, S, H, D); torch gets (B, H, S, D) views (transpose, no copy) as SDPA expects.
ioattn's thread count comes from IOATTN_NUM_THREADS, which must be set before this process starts
(run.sh does that); torch.set_num_threads gets the same number. The two alternate for `rounds`
rounds after one warm-up each; medians. Prints one line per shape.

usage: torch_sdpa.py THREADS [S] [rounds]
"""
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import ioattn


def main():
    threads = int(sys.argv[1])
    S = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    if os.environ.get("IOATTN_NUM_THREADS") != str(threads):
        sys.exit("set IOATTN_NUM_THREADS=%d before starting" % threads)
    torch.set_num_threads(threads)
    B, H = 1, 16
    torch.manual_seed(0)
    for D in (128, 64):
        q, k, v = (torch.rand(B, S, H, D) * 2 - 1 for _ in range(3))
        for causal in (False, True):
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

            def run_torch():
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)

            def run_io():
                return ioattn.attention(q, k, v, causal=causal)

            with torch.no_grad():
                diff = (run_torch() - run_io()).abs().max().item()
                t_io, t_th = [], []
                for r in range(rounds):
                    order = (run_io, run_torch) if r % 2 == 0 else (run_torch, run_io)
                    for fn in order:
                        t0 = time.perf_counter()
                        fn()
                        dt = (time.perf_counter() - t0) * 1e3
                        (t_io if fn is run_io else t_th).append(dt)
            mi, mt = statistics.median(t_io), statistics.median(t_th)
            flops = 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)
            print(
                "prefill B=%d H=%d S=%d D=%d %s threads=%d ioattn_ms=%.2f torch_ms=%.2f speedup=%.2f "
                "ioattn_GFLOP/s=%.1f torch_GFLOP/s=%.1f maxdiff=%.2e"
                % (B, H, S, D, "causal" if causal else "full", threads, mi, mt, mt / mi,
                   flops / mi / 1e6, flops / mt / 1e6, diff),
                flush=True,
            )


if __name__ == "__main__":
    main()
