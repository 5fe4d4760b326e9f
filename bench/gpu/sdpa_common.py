"""What compare.py (forward) and compare_decode.py (decode) share: the command line, reading
bench_gpu_*'s JSON lines, timing one PyTorch SDPA backend, and printing and saving the table.
Both scripts are run by path (python3 bench/gpu/compare.py ...), so this folder is on sys.path."""
import argparse
import json

import torch
import torch.nn.functional as F
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

PEERS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


def parse_args(max_seqlen):
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", required=True)
    ap.add_argument("--json")
    ap.add_argument("--max-seqlen", type=int, default=max_seqlen)
    return ap.parse_args()


def load_ours(path, key):
    """bench_gpu_* rows by key(row); lines that are not JSON objects are its comments."""
    ours = {}
    with open(path) as f:
        for line in f:
            if line.startswith("{"):
                r = json.loads(line)
                ours[key(r)] = r
    return ours


def time_peer(backend, q, k, v, rep, warm_first=False, note="", **sdpa_args):
    """Median milliseconds of one SDPA call under backend, or None where it refuses the shape."""
    def run():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, **sdpa_args)

    try:
        if warm_first:
            run()
            torch.cuda.synchronize()
        return triton.testing.do_bench(run, warmup=25, rep=rep, return_mode="median")
    except RuntimeError as err:  # backend unavailable for this shape
        print(f"# {backend}{note}: {err}".splitlines()[0])
        return None


def fmt(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def ratio(a, b):
    return "-" if a is None or b is None else f"{a / b:.2f}"


def print_device():
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}")


def save_rows(path, rows):
    if path:
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)
