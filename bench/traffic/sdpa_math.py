"""One call of PyTorch's unfused MATH attention (scaled_dot_product_attention under
sdpa_kernel(SDPBackend.MATH)) inside an NVTX range "sdpa", for Nsight Compute to profile every
kernel of that call and nothing else (bench/traffic/gpu_ncu.sh). bf16, B=1, hidden 2048."""
import argparse

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlen", type=int, required=True)
    ap.add_argument("--dim", type=int, required=True)
    ap.add_argument("--causal", type=int, default=0)
    a = ap.parse_args()
    heads = 2048 // a.dim
    # (B, H, S, D) as SDPA wants; fresh random values, never zeros.
    q, k, v = (torch.randn(1, heads, a.seqlen, a.dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    with sdpa_kernel(SDPBackend.MATH):
        F.scaled_dot_product_attention(q, k, v, is_causal=bool(a.causal))  # warm-up: lazy init
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push("sdpa")
        out = F.scaled_dot_product_attention(q, k, v, is_causal=bool(a.causal))
        torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
    print(f"sdpa math out[0,0,0,0] {out[0, 0, 0, 0].item():.6g}")


if __name__ == "__main__":
    main()
