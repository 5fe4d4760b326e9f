// ioattn._ext: the C ABI (include/ioattn/ioattn.h) and the CLI's model commands for Python.
//
// Arrays come from any framework through DLPack (numpy, torch, ...) and are passed to the library
// as they are: shape and element strides straight from the DLPack tensor, no copy, no conversion.
// A layout the C ABI cannot express (a head_dim that is not contiguous) is a ValueError. The
// library validates everything before it writes anything, so an error leaves out, lse and the
// cache untouched; the checks here (ranks, dtypes, devices, the lse and index arrays the C ABI
// takes as raw pointers) run before the call too.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/online_softmax.h"
#include "ioattn/ioattn.h"
#include "tools/cli.h"

#if defined(IOATTN_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace nb = nanobind;

namespace {

// read: q, k, v, k_new, v_new, cu_seqlens, cache_seqlens, block_table; and the cache, which only an
// append writes (the Python layer refuses a read-only cache then), so a read-only one can be read
using In = nb::ndarray<nb::ro>;
using Out = nb::ndarray<>;  // written: out, lse

constexpr int kDeviceCpu = 1, kDeviceCudaHost = 3, kDeviceCuda = 2, kDeviceCudaManaged = 13;

[[noreturn]] void raise(PyObject* type, const std::string& message) {
  PyErr_SetString(type, message.c_str());
  throw nb::python_error();
}
[[noreturn]] void value_error(const std::string& message) { raise(PyExc_ValueError, message); }

// The library's status as the Python exception of the brief: the message is ioattn_last_error().
void check(ioattn_status s) {
  if (s == IOATTN_OK) return;
  const std::string message = ioattn_last_error();
  switch (s) {
    case IOATTN_ERROR_INVALID_ARGUMENT: raise(PyExc_ValueError, message);
    case IOATTN_ERROR_UNSUPPORTED: raise(PyExc_NotImplementedError, message);
    case IOATTN_ERROR_OUT_OF_MEMORY: raise(PyExc_MemoryError, message);
    default: raise(PyExc_RuntimeError, message);
  }
}

std::string dtype_text(nb::dlpack::dtype d) {
  using C = nb::dlpack::dtype_code;
  std::string kind;
  switch (C(d.code)) {
    case C::Int: kind = "int"; break;
    case C::UInt: kind = "uint"; break;
    case C::Float: kind = "float"; break;
    case C::Bfloat: kind = "bfloat"; break;
    case C::Complex: kind = "complex"; break;
    case C::Bool: kind = "bool"; break;
    default: kind = "dtype code " + std::to_string(int(d.code)) + " of ";
  }
  std::string s = kind + std::to_string(int(d.bits));
  if (d.lanes != 1) s += "x" + std::to_string(int(d.lanes));
  return s;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}
template <class A>
std::string shape_text(const A& a) {
  return shape_text(std::vector<int64_t>(a.shape_ptr(), a.shape_ptr() + a.ndim()));
}

std::string device_text(int type, int id) {
  switch (type) {
    case kDeviceCpu: return "cpu";
    case kDeviceCudaHost: return "cuda pinned host memory";
    case kDeviceCuda: return "cuda:" + std::to_string(id);
    case kDeviceCudaManaged: return "cuda managed memory (device " + std::to_string(id) + ")";
    default: return "DLPack device type " + std::to_string(type);
  }
}

// Where the call computes: every array must live there (docs/api.md, "Memory spaces").
struct Place {
  int backend;    // IOATTN_BACKEND_*
  int device_id;  // CUDA: q's device
};

template <class A>
void check_place(const A& a, const char* name, const Place& place) {
  const int t = a.device_type();
  bool ok;
  if (place.backend == IOATTN_BACKEND_CPU)
    ok = t == kDeviceCpu || t == kDeviceCudaHost;
  else
    ok = (t == kDeviceCuda || t == kDeviceCudaManaged) && a.device_id() == place.device_id;
  if (!ok) {
    const std::string where = place.backend == IOATTN_BACKEND_CPU
                                  ? "host memory (backend CPU)"
                                  : "memory of cuda:" + std::to_string(place.device_id) + " (backend CUDA)";
    value_error(std::string(name) + ": on " + device_text(t, a.device_id()) +
                ", but every array of the call must be in " + where);
  }
}

template <class A>
int32_t storage_dtype(const A& a, const char* name) {
  const nb::dlpack::dtype d = a.dtype();
  using C = nb::dlpack::dtype_code;
  if (d.lanes == 1 && d.bits == 32 && d.code == uint8_t(C::Float)) return IOATTN_F32;
  if (d.lanes == 1 && d.bits == 16 && d.code == uint8_t(C::Float)) return IOATTN_F16;
  if (d.lanes == 1 && d.bits == 16 && d.code == uint8_t(C::Bfloat)) return IOATTN_BF16;
  value_error(std::string(name) + ": dtype " + dtype_text(d) + " is not supported (float32, float16 or bfloat16)");
}

// A 4-D (B, S, H, D) array, or a 3-D (S, H, D) one viewed as (1, S, H, D) (packed sequences).
template <class A>
ioattn_tensor tensor_of(const A& a, const char* name, size_t rank, const Place& place) {
  if (a.ndim() != rank) {
    value_error(std::string(name) + ": expected a " + std::to_string(rank) + "-D array " +
                (rank == 4 ? "(batch, seqlen, heads, head_dim)" : "(total_tokens, heads, head_dim)") + ", got shape " +
                shape_text(a));
  }
  check_place(a, name, place);
  ioattn_tensor t{};
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  t.dtype = storage_dtype(a, name);
  const size_t o = rank == 4 ? 1 : 0;  // index of the seqlen axis
  t.batch = rank == 4 ? int64_t(a.shape(0)) : 1;
  t.seqlen = int64_t(a.shape(o));
  t.heads = int64_t(a.shape(o + 1));
  t.head_dim = int64_t(a.shape(o + 2));
  t.stride_batch = rank == 4 ? a.stride(0) : t.seqlen * a.stride(0);
  t.stride_seq = a.stride(o);
  t.stride_head = a.stride(o + 1);
  // A stride over an axis of extent 1 never moves, and an empty array has no layout: any value
  // means the same there (numpy and torch report 0 or arbitrary strides for them).
  if (t.head_dim > 1 && a.size() > 0 && a.stride(o + 2) != 1) {
    value_error(std::string(name) + ": head_dim stride is " + std::to_string(a.stride(o + 2)) +
                " elements; the library needs a contiguous head_dim (stride 1) and makes no hidden copy "
                "(pass a copy that is contiguous in its last dimension)");
  }
  return t;
}

// C-contiguous (axes of extent 1 excepted) and non-empty checks for arrays the C ABI takes as
// raw pointers.
template <class A>
bool c_contiguous(const A& a) {
  if (a.size() == 0) return true;
  int64_t expected = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expected) return false;
    expected *= int64_t(a.shape(i));
  }
  return true;
}

// lse: None, or float32 of exactly `shape`, C-contiguous, where the call computes.
float* lse_of(const Out& lse, const std::vector<int64_t>& shape, const char* layout, const Place& place) {
  if (!lse.is_valid()) return nullptr;
  bool same = lse.ndim() == shape.size();
  for (size_t i = 0; same && i < shape.size(); ++i) same = int64_t(lse.shape(i)) == shape[i];
  if (!same) {
    value_error(std::string("lse: expected shape ") + layout + " = " + shape_text(shape) + ", got " + shape_text(lse));
  }
  const nb::dlpack::dtype d = lse.dtype();
  if (!(d.code == uint8_t(nb::dlpack::dtype_code::Float) && d.bits == 32 && d.lanes == 1))
    value_error("lse: expected float32, got " + dtype_text(d));
  if (!c_contiguous(lse)) value_error("lse: must be C-contiguous (the library writes it as a dense array)");
  check_place(lse, "lse", place);
  return static_cast<float*>(lse.data());
}

// An int32 index array (cu_seqlens, cache_seqlens, block_table): C-contiguous, where the call computes.
const int32_t* index_of(const In& a, const char* name, size_t rank, const Place& place) {
  if (a.ndim() != rank)
    value_error(std::string(name) + ": expected a " + std::to_string(rank) + "-D int32 array, got shape " +
                shape_text(a));
  const nb::dlpack::dtype d = a.dtype();
  if (!(d.code == uint8_t(nb::dlpack::dtype_code::Int) && d.bits == 32 && d.lanes == 1))
    value_error(std::string(name) + ": expected int32, got " + dtype_text(d));
  if (!c_contiguous(a)) value_error(std::string(name) + ": must be C-contiguous");
  check_place(a, name, place);
  return static_cast<const int32_t*>(a.data());
}

Place place_of(const In& q, int backend) {
  if (backend != IOATTN_BACKEND_CPU && backend != IOATTN_BACKEND_CUDA)
    value_error("backend=" + std::to_string(backend) + ": expected 0 (CPU) or 1 (CUDA)");
  return {backend, backend == IOATTN_BACKEND_CUDA ? q.device_id() : 0};
}

ioattn_options options_of(bool causal, int32_t window_left, int32_t window_right, float softcap, float scale,
                          int32_t backend, int32_t num_threads, uintptr_t stream) {
  ioattn_options o;
  ioattn_options_default(&o);
  o.causal = causal ? 1 : 0;
  o.window_left = window_left;
  o.window_right = window_right;
  o.softcap = softcap;
  o.scale = scale;
  o.backend = backend;
  o.num_threads = num_threads;
  o.cuda_stream = reinterpret_cast<void*>(stream);
  return o;
}

// The CUDA backend runs on the current device: make it the arrays' device for the call.
class DeviceScope {
 public:
  explicit DeviceScope(const Place& place) {
#if defined(IOATTN_HAVE_CUDA)
    if (place.backend != IOATTN_BACKEND_CUDA) return;
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess) {
      (void)cudaGetLastError();
      return;
    }
    if (current != place.device_id && cudaSetDevice(place.device_id) == cudaSuccess) previous_ = current;
    (void)cudaGetLastError();
#else
    (void)place;
#endif
  }
  ~DeviceScope() {
#if defined(IOATTN_HAVE_CUDA)
    if (previous_ >= 0) cudaSetDevice(previous_);
#endif
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

void forward(const In& q, const In& k, const In& v, const Out& out, const Out& lse, bool causal, int32_t window_left,
             int32_t window_right, float softcap, float scale, int32_t backend, int32_t num_threads, uintptr_t stream) {
  const Place place = place_of(q, backend);
  const ioattn_tensor tq = tensor_of(q, "q", 4, place), tk = tensor_of(k, "k", 4, place),
                      tv = tensor_of(v, "v", 4, place), to = tensor_of(out, "out", 4, place);
  float* l = lse_of(lse, {tq.batch, tq.heads, tq.seqlen}, "(batch, heads_q, seqlen_q)", place);
  const ioattn_options o = options_of(causal, window_left, window_right, softcap, scale, backend, num_threads, stream);
  ioattn_status s;
  {
    nb::gil_scoped_release release;
    DeviceScope device(place);
    s = ioattn_forward(&tq, &tk, &tv, &to, l, &o);
  }
  check(s);
}

void forward_varlen(const In& q, const In& k, const In& v, const In& cu_seqlens_q, const In& cu_seqlens_k,
                    const Out& out, const Out& lse, bool causal, int32_t window_left, int32_t window_right,
                    float softcap, float scale, int32_t backend, int32_t num_threads, uintptr_t stream) {
  const Place place = place_of(q, backend);
  const ioattn_tensor tq = tensor_of(q, "q", 3, place), tk = tensor_of(k, "k", 3, place),
                      tv = tensor_of(v, "v", 3, place), to = tensor_of(out, "out", 3, place);
  const int32_t* cq = index_of(cu_seqlens_q, "cu_seqlens_q", 1, place);
  const int32_t* ck = index_of(cu_seqlens_k, "cu_seqlens_k", 1, place);
  if (cu_seqlens_q.shape(0) < 1 || cu_seqlens_q.shape(0) - 1 > size_t(INT32_MAX))
    value_error("cu_seqlens_q: expected batch + 1 entries (at least 1), got " + std::to_string(cu_seqlens_q.shape(0)));
  if (cu_seqlens_k.shape(0) != cu_seqlens_q.shape(0))
    value_error("cu_seqlens_k: has " + std::to_string(cu_seqlens_k.shape(0)) + " entries but cu_seqlens_q has " +
                std::to_string(cu_seqlens_q.shape(0)) + " (both are batch + 1)");
  const int32_t batch = int32_t(cu_seqlens_q.shape(0) - 1);
  float* l = lse_of(lse, {tq.heads, tq.seqlen}, "(heads_q, total_q)", place);
  const ioattn_options o = options_of(causal, window_left, window_right, softcap, scale, backend, num_threads, stream);
  ioattn_status s;
  {
    nb::gil_scoped_release release;
    DeviceScope device(place);
    s = ioattn_forward_varlen(&tq, &tk, &tv, cq, ck, batch, &to, l, &o);
  }
  check(s);
}

void forward_kvcache(const In& q, const In& k_cache, const In& v_cache, const In& cache_seqlens, const In& k_new,
                     const In& v_new, const In& block_table, const Out& out, const Out& lse, bool causal,
                     int32_t window_left, int32_t window_right, float softcap, float scale, int32_t backend,
                     int32_t num_threads, uintptr_t stream) {
  const Place place = place_of(q, backend);
  const ioattn_tensor tq = tensor_of(q, "q", 4, place), to = tensor_of(out, "out", 4, place);
  ioattn_kvcache cache{};
  cache.k = tensor_of(k_cache, "k_cache", 4, place);
  cache.v = tensor_of(v_cache, "v_cache", 4, place);
  cache.seqlens = index_of(cache_seqlens, "cache_seqlens", 1, place);
  if (int64_t(cache_seqlens.shape(0)) != tq.batch)
    value_error("cache_seqlens: expected shape (" + std::to_string(tq.batch) + ",) (one entry per batch of q), got " +
                shape_text(cache_seqlens));
  if (block_table.is_valid()) {
    cache.block_table = index_of(block_table, "block_table", 2, place);
    if (int64_t(block_table.shape(0)) != tq.batch)
      value_error("block_table: expected (" + std::to_string(tq.batch) + ", max_pages) (one row per batch of q), got " +
                  shape_text(block_table));
    if (block_table.shape(1) > size_t(INT32_MAX)) value_error("block_table: more than 2^31-1 pages per sequence");
    cache.max_pages_per_seq = int32_t(block_table.shape(1));
  }
  if (k_new.is_valid() != v_new.is_valid())
    value_error(std::string("k_new and v_new: give both or neither (") + (k_new.is_valid() ? "v_new" : "k_new") +
                " is None)");
  ioattn_tensor tkn{}, tvn{};
  if (k_new.is_valid()) {
    tkn = tensor_of(k_new, "k_new", 4, place);
    tvn = tensor_of(v_new, "v_new", 4, place);
  }
  float* l = lse_of(lse, {tq.batch, tq.heads, tq.seqlen}, "(batch, heads_q, seqlen_q)", place);
  const ioattn_options o = options_of(causal, window_left, window_right, softcap, scale, backend, num_threads, stream);
  const ioattn_tensor* pk = k_new.is_valid() ? &tkn : nullptr;
  const ioattn_tensor* pv = v_new.is_valid() ? &tvn : nullptr;
  ioattn_status s;
  {
    nb::gil_scoped_release release;
    DeviceScope device(place);
    s = ioattn_forward_kvcache(&tq, &cache, pk, pv, &to, l, &o);
  }
  check(s);
}

// The header's merge() on normalized partials, row by row: a partial with lse = -inf is the state
// (m = -inf, l = 0), any other (m = lse, l = 1, O = out). The Python wrapper allocates out and lse.
using Rows4 = nb::ndarray<const float, nb::ndim<4>, nb::device::cpu>;
using Rows3 = nb::ndarray<const float, nb::ndim<3>, nb::device::cpu>;
using MergedOut = nb::ndarray<float, nb::ndim<4>, nb::device::cpu>;
using MergedLse = nb::ndarray<float, nb::ndim<3>, nb::device::cpu>;

void merge_partials(const Rows4& out_a, const Rows3& lse_a, const Rows4& out_b, const Rows3& lse_b,
                    const MergedOut& out, const MergedLse& lse) {
  const size_t B = out_a.shape(0), S = out_a.shape(1), H = out_a.shape(2), D = out_a.shape(3);
  const auto same4 = [&](size_t b, size_t s, size_t h, size_t d) { return b == B && s == S && h == H && d == D; };
  if (!same4(out_b.shape(0), out_b.shape(1), out_b.shape(2), out_b.shape(3)) ||
      !same4(out.shape(0), out.shape(1), out.shape(2), out.shape(3)))
    value_error("merge_partials: out_a " + shape_text(out_a) + ", out_b " + shape_text(out_b) + " and out " +
                shape_text(out) + " must have one shape (B, S, H, D)");
  const auto check_rows = [&](const char* name, size_t b, size_t h, size_t s, const std::string& shape) {
    if (b != B || h != H || s != S)
      value_error(std::string("merge_partials: ") + name + " " + shape +
                  " must be (B, H, S) = " + shape_text(std::vector<int64_t>{int64_t(B), int64_t(H), int64_t(S)}));
  };
  check_rows("lse_a", lse_a.shape(0), lse_a.shape(1), lse_a.shape(2), shape_text(lse_a));
  check_rows("lse_b", lse_b.shape(0), lse_b.shape(1), lse_b.shape(2), shape_text(lse_b));
  check_rows("lse", lse.shape(0), lse.shape(1), lse.shape(2), shape_text(lse));
  const auto oa = out_a.view(), ob = out_b.view();
  const auto la = lse_a.view(), lb = lse_b.view();
  auto o = out.view();
  auto l = lse.view();
  nb::gil_scoped_release release;
  for (size_t b = 0; b < B; ++b)
    for (size_t h = 0; h < H; ++h)
      for (size_t s = 0; s < S; ++s) {
        const float m_a = la(b, h, s), m_b = lb(b, h, s);
        const float l_a = m_a == -INFINITY ? 0.f : 1.f, l_b = m_b == -INFINITY ? 0.f : 1.f;
        const ioattn::softmax::MergeWeights w =
            ioattn::softmax::merge(m_a, l_a, m_b, l_b, [](float x) { return std::exp(x); });
        const float scale = ioattn::softmax::output_scale(w.l);
        for (size_t d = 0; d < D; ++d)
          o(b, s, h, d) = (w.weight_a * oa(b, s, h, d) + w.weight_b * ob(b, s, h, d)) * scale;
        l(b, h, s) = ioattn::softmax::row_lse(w.m, w.l, ioattn::softmax::Domain::natural);
      }
}

std::string model_json(const std::string& command, const std::vector<std::string>& args) {
  using namespace ioattn::cli;
  std::string text, message;
  int code = kExitOk;
  {
    nb::gil_scoped_release release;
    try {
      text = ioattn::cli::model_json(command, args);
    } catch (const CliError& e) {
      code = e.code();
      message = e.what();
    }
  }
  if (code != kExitOk) {
    const std::string line = "ioattn " + command + ": " + message;
    if (code == kExitUsage) raise(PyExc_ValueError, line);
    if (code == kExitUnsupported) raise(PyExc_NotImplementedError, line);
    raise(PyExc_RuntimeError, line);
  }
  return text;
}

// ioattn_tune with the GIL released (the run takes seconds); returns the path written.
std::string tune(std::optional<std::string> path, int threads, bool quick) {
  const std::string target = path ? *path : std::string(ioattn_tune_path());
  ioattn_tune_options opt;
  ioattn_tune_options_default(&opt);
  opt.path = path ? path->c_str() : nullptr;
  opt.num_threads = threads;
  opt.quick = quick ? 1 : 0;
  ioattn_status s;
  {
    nb::gil_scoped_release release;
    s = ioattn_tune(&opt);
  }
  check(s);
  return target;
}

}  // namespace

NB_MODULE(_ext, m) {
  m.doc() = "ioattn's C ABI and model commands; use the ioattn package, not this module";

  m.def("forward", &forward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse").none(),
        nb::arg("causal"), nb::arg("window_left"), nb::arg("window_right"), nb::arg("softcap"), nb::arg("scale"),
        nb::arg("backend"), nb::arg("num_threads"), nb::arg("stream"),
        "ioattn_forward on (B, S, H, D) arrays; lse None or float32 (B, Hq, Sq).");
  m.def("forward_varlen", &forward_varlen, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("cu_seqlens_q"),
        nb::arg("cu_seqlens_k"), nb::arg("out"), nb::arg("lse").none(), nb::arg("causal"), nb::arg("window_left"),
        nb::arg("window_right"), nb::arg("softcap"), nb::arg("scale"), nb::arg("backend"), nb::arg("num_threads"),
        nb::arg("stream"), "ioattn_forward_varlen on packed (total, H, D) arrays; lse None or float32 (Hq, total_q).");
  m.def("forward_kvcache", &forward_kvcache, nb::arg("q"), nb::arg("k_cache"), nb::arg("v_cache"),
        nb::arg("cache_seqlens"), nb::arg("k_new").none(), nb::arg("v_new").none(), nb::arg("block_table").none(),
        nb::arg("out"), nb::arg("lse").none(), nb::arg("causal"), nb::arg("window_left"), nb::arg("window_right"),
        nb::arg("softcap"), nb::arg("scale"), nb::arg("backend"), nb::arg("num_threads"), nb::arg("stream"),
        "ioattn_forward_kvcache: append k_new/v_new at cache_seqlens, then attend; lse None or (B, Hq, Sq).");
  m.def("merge_partials", &merge_partials, nb::arg("out_a"), nb::arg("lse_a"), nb::arg("out_b"), nb::arg("lse_b"),
        nb::arg("out"), nb::arg("lse"),
        "common/online_softmax.h's merge of two float32 (out (B, S, H, D), lse (B, H, S)) partials into out, lse.");
  m.def("model_json", &model_json, nb::arg("command"), nb::arg("args"),
        "`ioattn <command> <args> --json` (plan, traffic, explain, hw): the JSON text.");
  m.def("tune", &tune, nb::arg("path").none(), nb::arg("threads"), nb::arg("quick"),
        "ioattn_tune: calibrate the CPU plans on this machine; returns the file written");
  m.def("tune_path", [] { return std::string(ioattn_tune_path()); });
  m.def("version", [] { return std::string(ioattn_version()); });
  m.def(
      "backend_available", [](int32_t backend) { return ioattn_backend_available(backend) != 0; }, nb::arg("backend"));
}
