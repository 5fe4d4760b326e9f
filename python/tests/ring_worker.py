"""One rank of test_distributed.py's gloo groups: runs ring_attention on every case of CASES
and saves its shards, and the errors of the rejected layouts, for the test to compare.

usage: ring_worker.py RANK WORLD_SIZE PORT OUT_DIR (IOATTN_BUILD_DIR as for the tests)
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import conftest  # noqa: E402,F401  (finds ioattn the tests' way: IOATTN_BUILD_DIR or the installed package)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from ioattn import distributed as ring  # noqa: E402

# name: (B, S total, Hq, Hkv, D, Dv, dtype, options); S splits into 2 x 4 zigzag chunks.
CASES = {
    "f32": (2, 64, 4, 4, 32, 32, torch.float32, {}),
    "f32-causal": (1, 96, 4, 4, 32, 32, torch.float32, {"causal": True}),
    "f32-causal-zigzag-gqa": (2, 96, 8, 2, 64, 64, torch.float32, {"causal": True, "zigzag": True}),
    "f32-zigzag": (1, 64, 4, 1, 16, 24, torch.float32, {"zigzag": True}),  # MQA, Dv != D
    "f32-window": (1, 128, 4, 2, 32, 32, torch.float32, {"window": (20, 7)}),
    "f32-causal-window-zigzag": (1, 128, 4, 2, 32, 32, torch.float32,
                                 {"causal": True, "window": (37, -1), "zigzag": True}),
    "f32-softcap-scale": (1, 64, 4, 4, 32, 32, torch.float32, {"causal": True, "softcap": 5.0, "scale": 0.3}),
    "bf16-causal-zigzag-gqa": (2, 96, 8, 2, 64, 64, torch.bfloat16, {"causal": True, "zigzag": True}),
    "bf16": (1, 64, 4, 2, 64, 64, torch.bfloat16, {}),
    "f16-causal-window-zigzag": (1, 64, 4, 2, 32, 32, torch.float16,
                                 {"causal": True, "window": (20, -1), "zigzag": True}),
}


def inputs(name):
    """The full q, k, v of a case, the same on every rank and in the test."""
    B, S, Hq, Hkv, D, Dv, dtype, _ = CASES[name]
    gen = torch.Generator().manual_seed(sorted(CASES).index(name))
    q = torch.randn((B, S, Hq, D), generator=gen)
    k = torch.randn((B, S, Hkv, D), generator=gen)
    v = torch.randn((B, S, Hkv, Dv), generator=gen)
    return tuple(x.to(dtype) for x in (q, k, v))


def error_of(fn):
    try:
        fn()
    except ValueError as e:
        return str(e)
    return None


def main(rank, world, port, out_dir):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    results, errors = {}, {}
    for name, (*_, options) in CASES.items():
        options = dict(options)
        zigzag = options.pop("zigzag", False)
        q, k, v = (ring.shard(x, rank, world, zigzag=zigzag) for x in inputs(name))
        results[name] = ring.ring_attention(q, k, v, zigzag=zigzag, return_lse=True, **options)

    def uneven():
        n = 8 + rank
        x = torch.zeros((1, n, 2, 16))
        ring.ring_attention(x, x, x, causal=True)

    def odd_zigzag():
        x = torch.zeros((1, 9, 2, 16))
        ring.ring_attention(x, x, x, causal=True, zigzag=True)

    errors["uneven"] = error_of(uneven)
    errors["odd-zigzag"] = error_of(odd_zigzag)
    # A group still usable after the rejections: nothing was left half-sent.
    q, k, v = (ring.shard(x, rank, world) for x in inputs("f32"))
    results["after-errors"] = ring.ring_attention(q, k, v, return_lse=True)
    torch.save({"results": results, "errors": errors}, pathlib.Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
