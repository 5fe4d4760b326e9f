// Qualifiers that let the few rules shared by both backends compile as host code and as CUDA
// device code from one source.
#pragma once

#if defined(__CUDACC__)
#define IOATTN_HD __host__ __device__ __forceinline__
#else
#define IOATTN_HD inline
#endif
