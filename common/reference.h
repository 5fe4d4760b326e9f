// Naive attention with exactly the contract's semantics (scale, softcap, bottom-right causal,
// windows, GQA, Dv != D, varlen, paged KV, LSE, empty rows). Instantiated in double it is the
// test oracle and the CLI's --check; in float it is the "same precision naive" term of the
// FlashAttention-2 tolerance rule. It reads the inputs exactly as the kernels do (same params,
// same storage rounding) and materializes one score row at a time.
#pragma once

#include "common/params.h"

namespace ioattn {

// out[o_offset(...) + c] and lse[lse_offset(...)] receive the results in precision T; both
// buffers must span the offsets that p's strides address. lse may be null.
template <class T>
void naive_attention(const AttnParams& p, T* out, T* lse);

extern template void naive_attention<double>(const AttnParams&, double*, double*);
extern template void naive_attention<float>(const AttnParams&, float*, float*);

}  // namespace ioattn
