"""Framework-agnostic runners over ioattn._ext.

The numpy path of ``ioattn.attention*`` and the torch custom ops (``ioattn/ops.py``) both call
these with outputs they allocated themselves. Each runner works out where the call computes from
``q`` (a torch CUDA tensor: the CUDA backend on the current stream of its device; another DLPack
array on a CUDA device: the CUDA backend on the default stream; anything else: the CPU backend)
and passes the arrays through DLPack as they are: no copy, no conversion. Errors are the
library's: ValueError, NotImplementedError, MemoryError or RuntimeError with its message, and
nothing is written when one is raised.
"""

import math
import operator
import sys

from . import _ext

BACKEND_CPU = 0
BACKEND_CUDA = 1

_DLPACK_CUDA = (2, 13)  # kDLCUDA, kDLCUDAManaged


def is_torch(x):
    """True for a torch.Tensor; never imports torch (a tensor cannot exist before torch is imported)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def placement(q):
    """(backend, stream) for a call whose query is ``q``; stream is a cudaStream_t as an int."""
    if is_torch(q):
        # is_cpu and is_cuda are plain flags; q.device builds a torch.device object per call.
        if q.is_cpu:
            return BACKEND_CPU, 0
        if q.is_cuda:
            import torch

            return BACKEND_CUDA, torch.cuda.current_stream(q.device).cuda_stream
        raise NotImplementedError(f"ioattn runs on CPU and CUDA tensors; q is on {q.device}")
    dlpack_device = getattr(q, "__dlpack_device__", None)
    if dlpack_device is not None and dlpack_device()[0] in _DLPACK_CUDA:
        return BACKEND_CUDA, 0
    return BACKEND_CPU, 0


def _dlpack(x):
    """A plain torch tensor as a DLPack capsule from torch's C++ exporter; anything else as it is.

    Tensor.__dlpack__, which nanobind would call, is Python around that same exporter and costs
    several times more than the export (about 2 µs a tensor, most of a small call). Only a tensor
    its checks would pass takes the shortcut (a subclass keeps its own __dlpack__; a tensor that
    requires grad, has the conjugate bit, is not strided or is on a CUDA device other than the
    current one goes to __dlpack__ as before), and an export that fails leaves the tensor to
    __dlpack__ too, so every refusal reads as it did.
    """
    torch = sys.modules.get("torch")
    if torch is None or type(x) is not torch.Tensor:
        return x
    if x.requires_grad or x.is_conj() or x.layout != torch.strided:
        return x
    if not x.is_cpu and not (x.is_cuda and x.get_device() == torch.cuda.current_device()):
        return x
    try:
        return torch._C._to_dlpack(x)
    except Exception:  # the refusal is __dlpack__'s to report, as before
        return x


def _input(x):
    # DLPack refuses to export a tensor that requires grad; detach() is a view of the same storage.
    if x is not None and is_torch(x) and x.requires_grad:
        x = x.detach()
    return _dlpack(x)


_INT32_MAX = 2**31 - 1


def window_pair(window):
    """(left, right) as Python ints from a pair of integers (None: unbounded both sides); the
    library's rule (-1 = unbounded, else >= 0) is checked by the library itself."""
    if type(window) is tuple and len(window) == 2:  # the common case, checked in a few steps
        left, right = window
        if type(left) is int and type(right) is int and abs(left) <= _INT32_MAX and abs(right) <= _INT32_MAX:
            return window
    if window is None:
        return -1, -1
    try:
        left, right = window
        left, right = operator.index(left), operator.index(right)
    except (TypeError, ValueError):
        raise ValueError(f"window: expected a pair (left, right) of integers, -1 for unbounded, got {window!r}") from None
    for name, x in (("window_left", left), ("window_right", right)):
        if not -_INT32_MAX <= x <= _INT32_MAX:
            raise ValueError(f"{name}={x}: out of the 32-bit range the library takes (-1 for unbounded)")
    return left, right


def _scale(scale):
    if scale is None:
        return 0.0  # the library's 1/sqrt(head_dim)
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale={scale!r}: expected a finite value (<= 0 or None: 1/sqrt(head_dim))")
    return max(scale, 0.0)  # the contract's scale <= 0, passed as the library's 0


def _options(causal, window, softcap, scale, num_threads):
    left, right = window_pair(window)
    return (bool(causal), left, right, float(softcap), _scale(scale)), int(num_threads)


def run_forward(q, k, v, out, lse, *, causal, window, softcap, scale, num_threads=0):
    """Dense attention into ``out`` (B, Sq, Hq, Dv) and ``lse`` (None or float32 (B, Hq, Sq))."""
    opts, threads = _options(causal, window, softcap, scale, num_threads)
    backend, stream = placement(q)
    _ext.forward(_input(q), _input(k), _input(v), _dlpack(out), _dlpack(lse), *opts, backend, threads, stream)


def run_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, out, lse, *, causal, window, softcap, scale, num_threads=0):
    """Packed sequences: q (total_q, Hq, D), k/v (total_k, Hkv, D), int32 cu_seqlens of batch + 1
    entries; ``out`` (total_q, Hq, Dv), ``lse`` None or float32 (Hq, total_q)."""
    opts, threads = _options(causal, window, softcap, scale, num_threads)
    backend, stream = placement(q)
    _ext.forward_varlen(
        _input(q), _input(k), _input(v), _dlpack(cu_seqlens_q), _dlpack(cu_seqlens_k), _dlpack(out), _dlpack(lse), *opts,
        backend, threads, stream
    )


def run_kvcache(
    q, k_cache, v_cache, cache_seqlens, k_new, v_new, block_table, out, lse, *, causal, window, softcap, scale,
    num_threads=0
):
    """Appends k_new/v_new (None or (B, S_new, Hkv, D)) into the cache at cache_seqlens[b] in place,
    then attends q (B, Sq, Hq, D) over the cache_seqlens[b] + S_new keys of each sequence. The cache
    is (B, S_max, Hkv, D), or (num_pages, page_size, Hkv, D) with an int32 (B, max_pages) block_table.
    cache_seqlens (int32 (B,)) is not modified."""
    opts, threads = _options(causal, window, softcap, scale, num_threads)
    backend, stream = placement(q)
    _ext.forward_kvcache(
        _input(q), _dlpack(k_cache), _dlpack(v_cache), _dlpack(cache_seqlens), _input(k_new), _input(v_new),
        _dlpack(block_table), _dlpack(out), _dlpack(lse), *opts,
        backend, threads, stream
    )
