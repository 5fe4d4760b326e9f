"""The CUDA forward beside PyTorch's scaled_dot_product_attention FLASH_ATTENTION and
CUDNN_ATTENTION backends on the FlashAttention benchmark protocol (16k tokens per batch, hidden
2048, bf16, D 64, 128 and 256, S 512..16k, causal and not), in one run on one GPU.

Our numbers come from bench_gpu_forward (CUDA events, median of 30, JSON lines); the peers are
timed here with triton.testing.do_bench (median), on tensors in the same (B, S, H, D) memory
layout, with fresh random inputs. FLOPs: 4 * B * H * S^2 * D, halved when causal.

usage: compare.py --ours ioattn.jsonl [--json peers.json] [--max-seqlen 16384]
"""
import torch

from sdpa_common import PEERS, fmt, load_ours, parse_args, print_device, ratio, save_rows, time_peer


def main():
    args = parse_args(max_seqlen=16384)
    ours = load_ours(args.ours, lambda r: (r["head_dim"], r["causal"], r["seqlen"]))

    torch.manual_seed(0)
    rows = []
    for d in (64, 128, 256):
        for causal in (False, True):
            s = 512
            while s <= args.max_seqlen:
                b, h = 16384 // s, 2048 // d
                q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
                flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
                row = {"head_dim": d, "causal": causal, "seqlen": s}
                for name, backend in PEERS.items():
                    ms = time_peer(backend, q, k, v, rep=100, is_causal=causal)
                    row[name + "_tflops"] = flops / ms * 1e-9 if ms else None
                mine = ours.get((d, causal, s))
                row["ioattn_tflops"] = mine["tflops"] if mine else None
                row["ioattn_check"] = mine["check"] if mine else "missing"
                rows.append(row)
                del q, k, v
                s *= 2

    print_device()
    print("| D | causal | S | ioattn TFLOP/s | FA2 (SDPA flash) | cuDNN (SDPA) | vs flash | vs cuDNN | check |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['head_dim']} | {int(r['causal'])} | {r['seqlen']} | {fmt(r['ioattn_tflops'], '.0f')} | "
              f"{fmt(r['flash_tflops'], '.0f')} | {fmt(r['cudnn_tflops'], '.0f')} | {ratio(r['ioattn_tflops'], r['flash_tflops'])} | "
              f"{ratio(r['ioattn_tflops'], r['cudnn_tflops'])} | {r['ioattn_check']} |")
    save_rows(args.json, rows)


if __name__ == "__main__":
    main()
