"""Two calls of PyTorch SDPA with one backend on the FlashAttention protocol shape (hidden 2048,
B = 16384 / S, bf16), for Nsight Compute to profile the second, which runs inside the NVTX range
"sdpa" (bench/gpu/ncu_stalls.sh): whatever kernels the backend launches for it, nothing else.
usage: sdpa_one.py S D CAUSAL [flash|cudnn]"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

s, d, causal = int(sys.argv[1]), int(sys.argv[2]), bool(int(sys.argv[3]))
backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[sys.argv[4] if len(sys.argv) > 4 else "flash"]
b, h = 16384 // s, 2048 // d
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
with sdpa_kernel(backend):
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("sdpa")
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
print("ok", out.float().abs().mean().item())
