"""Decode (Sq = 1) beside PyTorch's scaled_dot_product_attention FLASH_ATTENTION and
CUDNN_ATTENTION backends: B = 8, Hq = 32, Hkv = 32 and 8, D = 128, bf16, Sk 4k..128k, in one run
on one GPU.

Our numbers come from bench_gpu_decode (CUDA events, median of 30, JSON lines). The peers run
here on tensors in the same (B, S, H, D) memory layout with fresh random inputs, timed with
triton.testing.do_bench (median). Every implementation is credited with the same bytes: the K/V
cache read once, B * Sk * Hkv * D * 2 bytes each for K and V. GQA goes to the peers as
enable_gqa=True; a backend that refuses it gets K/V expanded to Hq heads, which it then reads
Hq / Hkv times (the table marks such rows "expanded").

The ceiling is the card's copy bandwidth, measured first in the same run: a 2 GiB device-to-device
copy_ (bytes read + bytes written over its do_bench median), the figure issue 27's bar is
stated against.

Rows of a paged cache in the same file (bench_gpu_decode --page-size) get a table of their own.

usage: compare_decode.py --ours decode.jsonl [--json peers.json] [--max-seqlen 131072]
"""
import torch
import triton.testing

from sdpa_common import PEERS, fmt, load_ours, parse_args, print_device, ratio, save_rows, time_peer


def time_decode_peer(backend, q, k, v, gqa):
    return time_peer(backend, q, k, v, rep=200, warm_first=True, note=f" gqa={gqa}", enable_gqa=gqa)


def copy_tbps():
    src = torch.empty(1 << 30, device="cuda", dtype=torch.bfloat16).normal_()
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), rep=500, return_mode="median")
    moved = 2.0 * src.numel() * src.element_size()
    del src, dst
    torch.cuda.empty_cache()
    return moved / ms * 1e-9


def print_paged(ours, ceiling, rows):
    """Paged caches (bench_gpu_decode --page-size): SDPA takes no block table, so these rows stand
    against the copy ceiling alone, beside the contiguous cache of the same shape."""
    paged = sorted(k for k in ours if k[2] > 0)
    if not paged:
        return
    print()
    print("| Hkv | Sk | page size | splits | ioattn TB/s (kernels) | ioattn TB/s (API call) | of copy "
          "| contiguous, same shape | check |")
    print("|---|---|---|---|---|---|---|---|---|")
    for hkv, sk, page in paged:
        r, flat = ours[(hkv, sk, page)], ours.get((hkv, sk, 0))
        print(f"| {hkv} | {sk} | {page} | {r['kv_splits']} | {fmt(r['tbps'])} | {fmt(r['api_tbps'])} | "
              f"{ratio(r['tbps'], ceiling)} | {fmt(flat['tbps'] if flat else None)} | {r['check']} |")
        rows.append({"heads_kv": hkv, "seqlen_k": sk, "page_size": page, "copy_tbps": ceiling,
                     **{"ioattn_" + k: r[k] for k in ("tbps", "api_tbps", "kv_splits", "check")}})


def main():
    args = parse_args(max_seqlen=131072)
    ceiling = copy_tbps()
    ours = load_ours(args.ours, lambda r: (r["heads_kv"], r["seqlen_k"], r.get("page_size", 0)))

    torch.manual_seed(0)
    b, hq, d = 8, 32, 128
    rows = []
    for hkv in (32, 8):
        sk = 4096
        while sk <= args.max_seqlen:
            kv_bytes = 2.0 * b * sk * hkv * d * 2
            q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
            k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(2))
            row = {"heads_kv": hkv, "seqlen_k": sk, "copy_tbps": ceiling}
            for name, backend in PEERS.items():
                ms = time_decode_peer(backend, q, k, v, hkv != hq)
                expanded = False
                if ms is None and hkv != hq:
                    g = hq // hkv
                    ke, ve = (x.repeat_interleave(g, dim=1) for x in (k, v))
                    ms = time_decode_peer(backend, q, ke, ve, False)
                    expanded = ms is not None
                    del ke, ve
                row[name + "_tbps"] = kv_bytes / ms * 1e-9 if ms else None
                row[name + "_expanded"] = expanded
            mine = ours.get((hkv, sk, 0))
            for key in ("tbps", "api_tbps", "kv_splits", "check", "model_dram_bytes", "kv_bytes"):
                row["ioattn_" + key] = mine[key] if mine else None
            rows.append(row)
            del q, k, v
            torch.cuda.empty_cache()
            sk *= 2

    print_device()
    print(f"copy bandwidth (2 GiB copy_, read + write): {ceiling:.2f} TB/s")
    print()
    print("| Hkv | Sk | splits | ioattn TB/s (kernels) | ioattn TB/s (API call) | FA2 (SDPA flash) | cuDNN (SDPA) "
          "| vs FA2 | vs cuDNN | of copy | model/counted bytes | check |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        fl = fmt(r["flash_tbps"]) + (" (expanded)" if r["flash_expanded"] else "")
        cu = fmt(r["cudnn_tbps"]) + (" (expanded)" if r["cudnn_expanded"] else "")
        model = ratio(r["ioattn_model_dram_bytes"], r["ioattn_kv_bytes"])
        print(f"| {r['heads_kv']} | {r['seqlen_k']} | {fmt(r['ioattn_kv_splits'], 'd')} | {fmt(r['ioattn_tbps'])} | "
              f"{fmt(r['ioattn_api_tbps'])} | {fl} | {cu} | {ratio(r['ioattn_tbps'], r['flash_tbps'])} | "
              f"{ratio(r['ioattn_tbps'], r['cudnn_tbps'])} | {ratio(r['ioattn_tbps'], ceiling)} | {model} | "
              f"{r['ioattn_check']} |")
    print_paged(ours, ceiling, rows)
    save_rows(args.json, rows)


if __name__ == "__main__":
    main()
