// What run, demo and bench share: host tensors, one call of ioattn_forward on either backend
// (staging through device memory for CUDA), contract status codes mapped to exit codes, and the
// comparison against the fp64 reference.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/params.h"
#include "common/problem.h"
#include "ioattn/ioattn.h"

namespace ioattn::cli {

// A contiguous (B, S, H, D) host tensor in its storage dtype.
struct HostTensor {
  DType dtype = DType::f32;
  int64_t batch = 0, seqlen = 0, heads = 0, head_dim = 0;
  std::vector<unsigned char> bytes;

  HostTensor() = default;
  HostTensor(DType t, int64_t b, int64_t s, int64_t h, int64_t d);
  int64_t count() const { return batch * seqlen * heads * head_dim; }
  ioattn_tensor view() const;
  float at(int64_t i) const { return load_as_f32(bytes.data(), i, dtype); }
};

struct ForwardJob {
  const HostTensor* q = nullptr;
  const HostTensor* k = nullptr;
  const HostTensor* v = nullptr;
  HostTensor* out = nullptr;
  std::vector<float>* lse = nullptr;  // null, or resized to B * Hq * Sq
  ioattn_options options{};
};

// Runs the job `repeats` times (results of the last run stay in out/lse) and returns the fastest
// call in seconds. CUDA jobs copy inputs to the device once, time the kernel with a device
// synchronization, and copy results back. Throws CliError: the library's INVALID_ARGUMENT -> 2,
// UNSUPPORTED -> 3, anything else -> 1, with ioattn_last_error()'s detail.
double run_forward(const ForwardJob& job, int repeats);

// "this build has no CUDA" / "no CUDA device is visible": why backend 1 is unavailable.
std::string cuda_unavailable_reason();

// Problem description of a job, for FLOP counts and plans.
Problem problem_of_job(const ForwardJob& job);

// Params over the job's host buffers for query heads [head_begin, head_begin + head_count), a
// range of whole GQA groups; out (not set here) is addressed as (B, Sq, n, Dv) contiguous and lse
// as (B, n, Sq). With the full head range this is the request ioattn_forward resolves.
AttnParams params_for_heads(const ForwardJob& job, int64_t head_begin, int64_t head_count);

// Reference results for query heads [head_begin, head_begin + head_count): out as (B, Sq, n, Dv)
// and lse as (B, n, Sq), in double, computed by naive_attention<T> from the same stored inputs.
template <class T>
void reference_heads(const ForwardJob& job, int64_t head_begin, int64_t head_count, std::vector<T>* out,
                     std::vector<T>* lse);

struct ErrorStats {
  double max_abs = 0;                // over elements where both are finite, or both infinite of one sign
  double max_ref_abs = 0;            // largest finite reference magnitude (scales the rounding floor)
  int64_t mismatched_nonfinite = 0;  // NaN or infinity on one side only, or infinities of opposite sign
  int64_t compared = 0;
  void add(double got, double ref);
};

// Kernel output heads [head_begin, +count) against reference_heads' layout.
ErrorStats compare_out(const HostTensor& out, int64_t head_begin, int64_t head_count, const std::vector<double>& ref);
ErrorStats compare_lse(const std::vector<float>& lse, int64_t batch, int64_t heads, int64_t seqlen_q,
                       int64_t head_begin, int64_t head_count, const std::vector<double>& ref);

}  // namespace ioattn::cli
