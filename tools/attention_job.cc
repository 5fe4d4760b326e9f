#include "tools/attention_job.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "common/hardware.h"
#include "common/reference.h"
#include "tools/cli.h"
#include "tools/device_buffer.h"

namespace ioattn::cli {

HostTensor::HostTensor(DType t, int64_t b, int64_t s, int64_t h, int64_t d)
    : dtype(t), batch(b), seqlen(s), heads(h), head_dim(d), bytes(size_t(b * s * h * d) * dtype_bytes(t)) {}

ioattn_tensor HostTensor::view() const {
  // ioattn_tensor has one non-const data pointer for inputs and outputs alike; the library only
  // reads q, k and v.
  return {const_cast<unsigned char*>(bytes.data()),
          int32_t(dtype),
          batch,
          seqlen,
          heads,
          head_dim,
          seqlen * heads * head_dim,
          heads * head_dim,
          head_dim};
}

std::string cuda_unavailable_reason() {
#if defined(IOATTN_HAVE_CUDA)
  return "no usable CUDA device is visible";
#else
  return "this build has no CUDA backend (configured with IOATTN_CUDA=OFF or without nvcc)";
#endif
}

void throw_status(const char* entry, ioattn_status s) {
  const std::string detail = std::string(entry) + ": " + ioattn_status_string(s) + ": " + ioattn_last_error();
  switch (s) {
    case IOATTN_ERROR_INVALID_ARGUMENT: throw usage_error(detail);
    case IOATTN_ERROR_UNSUPPORTED: throw unsupported_error(detail);
    default: throw internal_error(detail);
  }
}

namespace {

using Clock = std::chrono::steady_clock;

double run_host(const ForwardJob& job, int repeats) {
  ioattn_tensor q = job.q->view(), k = job.k->view(), v = job.v->view(), out = job.out->view();
  float* lse = job.lse ? job.lse->data() : nullptr;
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    const ioattn_status s = ioattn_forward(&q, &k, &v, &out, lse, &job.options);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s != IOATTN_OK) throw_status("ioattn_forward", s);
    best = std::min(best, dt);
  }
  return best;
}

double run_cuda(const ForwardJob& job, int repeats) {
  DeviceBuffer dq(job.q->bytes.size()), dk(job.k->bytes.size()), dv(job.v->bytes.size()), dout(job.out->bytes.size()),
      dlse(job.lse ? job.lse->size() * sizeof(float) : 0);
  dq.upload(job.q->bytes.data());
  dk.upload(job.k->bytes.data());
  dv.upload(job.v->bytes.data());
  ioattn_tensor q = job.q->view(), k = job.k->view(), v = job.v->view(), out = job.out->view();
  q.data = dq.get();
  k.data = dk.get();
  v.data = dv.get();
  out.data = dout.get();
  float* lse = job.lse ? static_cast<float*>(dlse.get()) : nullptr;
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    const ioattn_status s = ioattn_forward(&q, &k, &v, &out, lse, &job.options);
    if (s != IOATTN_OK) throw_status("ioattn_forward", s);
    device_synchronize();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  dout.download(job.out->bytes.data());
  if (job.lse) dlse.download(job.lse->data());
  return best;
}

}  // namespace

double run_forward(const ForwardJob& job, int repeats) {
  if (job.lse) job.lse->assign(size_t(job.q->batch * job.q->heads * job.q->seqlen), 0.f);
  if (job.options.backend == IOATTN_BACKEND_CUDA) {
    if (!ioattn_backend_available(IOATTN_BACKEND_CUDA)) {
      throw unsupported_error("--backend cuda: " + cuda_unavailable_reason());
    }
    return run_cuda(job, repeats);
  }
  return run_host(job, repeats);
}

Problem problem_of_job(const ForwardJob& job) {
  Problem pr;
  pr.batch = job.q->batch;
  pr.heads_q = job.q->heads;
  pr.heads_kv = job.k->heads;
  pr.seqlen_q = job.q->seqlen;
  pr.seqlen_k = job.k->seqlen;
  pr.head_dim = job.q->head_dim;
  pr.head_dim_v = job.v->head_dim;
  pr.dtype = pr.kv_dtype = job.q->dtype;
  pr.causal = job.options.causal != 0;
  pr.window_left = job.options.window_left;
  pr.window_right = job.options.window_right;
  pr.with_lse = job.lse != nullptr;
  return pr;
}

AttnParams params_for_heads(const ForwardJob& job, int64_t head_begin, int64_t head_count) {
  const HostTensor &q = *job.q, &k = *job.k, &v = *job.v;
  const int64_t group = q.heads / k.heads;
  // A run of whole GQA groups is a smaller problem over the same buffers: offset the pointers to
  // its first query head and first kv head, keep the strides, and kv_head_of() maps within it
  // exactly as in the full problem.
  if (head_begin % group != 0 || head_count % group != 0) {
    throw internal_error("params_for_heads: the head range must cover whole GQA groups");
  }
  AttnParams p;
  p.q = q.bytes.data() + size_t(head_begin * q.head_dim) * dtype_bytes(q.dtype);
  p.k = k.bytes.data() + size_t(head_begin / group * k.head_dim) * dtype_bytes(k.dtype);
  p.v = v.bytes.data() + size_t(head_begin / group * v.head_dim) * dtype_bytes(v.dtype);
  p.io_dtype = q.dtype;
  p.kv_dtype = k.dtype;
  p.batch = q.batch;
  p.heads_q = head_count;
  p.heads_kv = head_count / group;
  p.head_dim = q.head_dim;
  p.head_dim_v = v.head_dim;
  p.seqlen_q = q.seqlen;
  p.seqlen_k = k.seqlen;
  p.q_batch_stride = q.seqlen * q.heads * q.head_dim;
  p.q_seq_stride = q.heads * q.head_dim;
  p.q_head_stride = q.head_dim;
  p.k_batch_stride = k.seqlen * k.heads * k.head_dim;
  p.k_seq_stride = k.heads * k.head_dim;
  p.k_head_stride = k.head_dim;
  p.v_batch_stride = v.seqlen * v.heads * v.head_dim;
  p.v_seq_stride = v.heads * v.head_dim;
  p.v_head_stride = v.head_dim;
  p.o_batch_stride = q.seqlen * head_count * v.head_dim;
  p.o_seq_stride = head_count * v.head_dim;
  p.o_head_stride = v.head_dim;
  p.lse_batch_stride = head_count * q.seqlen;
  p.lse_head_stride = q.seqlen;
  const ioattn_options& o = job.options;
  p.scale = o.scale > 0 ? o.scale : float(1.0 / std::sqrt(double(q.head_dim)));
  p.softcap = o.softcap;
  p.causal = o.causal != 0;
  p.window_left = o.window_left;
  p.window_right = o.window_right;
  p.num_threads = o.num_threads > 0 ? o.num_threads : default_threads();
  return p;
}

template <class T>
void reference_heads(const ForwardJob& job, int64_t head_begin, int64_t head_count, std::vector<T>* out,
                     std::vector<T>* lse) {
  const AttnParams p = params_for_heads(job, head_begin, head_count);
  out->assign(size_t(p.batch * p.seqlen_q * head_count * p.head_dim_v), T(0));
  lse->assign(size_t(p.batch * head_count * p.seqlen_q), T(0));
  naive_attention<T>(p, out->data(), lse->data());
}

template void reference_heads<double>(const ForwardJob&, int64_t, int64_t, std::vector<double>*, std::vector<double>*);
template void reference_heads<float>(const ForwardJob&, int64_t, int64_t, std::vector<float>*, std::vector<float>*);

void ErrorStats::add(double got, double ref) {
  ++compared;
  if (std::isnan(got) && std::isnan(ref)) return;
  if (std::isinf(got) || std::isinf(ref) || std::isnan(got) || std::isnan(ref)) {
    if (!(std::isinf(got) && std::isinf(ref) && (got > 0) == (ref > 0))) ++mismatched_nonfinite;
    return;
  }
  max_abs = std::max(max_abs, std::fabs(got - ref));
  max_ref_abs = std::max(max_ref_abs, std::fabs(ref));
}

ErrorStats compare_out(const HostTensor& out, int64_t head_begin, int64_t head_count, const std::vector<double>& ref) {
  ErrorStats e;
  const int64_t dv = out.head_dim;
  for (int64_t b = 0; b < out.batch; ++b)
    for (int64_t i = 0; i < out.seqlen; ++i)
      for (int64_t h = 0; h < head_count; ++h)
        for (int64_t c = 0; c < dv; ++c) {
          const int64_t got = ((b * out.seqlen + i) * out.heads + head_begin + h) * dv + c;
          const int64_t want = ((b * out.seqlen + i) * head_count + h) * dv + c;
          e.add(out.at(got), ref[size_t(want)]);
        }
  return e;
}

ErrorStats compare_lse(const std::vector<float>& lse, int64_t batch, int64_t heads, int64_t seqlen_q,
                       int64_t head_begin, int64_t head_count, const std::vector<double>& ref) {
  ErrorStats e;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < head_count; ++h)
      for (int64_t i = 0; i < seqlen_q; ++i) {
        e.add(lse[size_t((b * heads + head_begin + h) * seqlen_q + i)],
              ref[size_t((b * head_count + h) * seqlen_q + i)]);
      }
  return e;
}

}  // namespace ioattn::cli
