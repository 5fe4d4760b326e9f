/* ioattn: IO-aware exact attention. Public C ABI; see docs/ and README.md. */
#ifndef IOATTN_IOATTN_H_
#define IOATTN_IOATTN_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define IOATTN_API __declspec(dllexport)
#else
#define IOATTN_API __attribute__((visibility("default")))
#endif

typedef enum ioattn_dtype { IOATTN_F32 = 0, IOATTN_F16 = 1, IOATTN_BF16 = 2 } ioattn_dtype;
typedef enum ioattn_backend { IOATTN_BACKEND_CPU = 0, IOATTN_BACKEND_CUDA = 1 } ioattn_backend;
typedef enum ioattn_status {
  IOATTN_OK = 0,
  IOATTN_ERROR_INVALID_ARGUMENT = 1, /* malformed request: shapes, strides, dtypes, null pointers, ranges */
  IOATTN_ERROR_UNSUPPORTED = 2,      /* well-formed, but this build/backend cannot run it: never a silent fallback */
  IOATTN_ERROR_OUT_OF_MEMORY = 3,
  IOATTN_ERROR_BACKEND = 4 /* e.g. a CUDA runtime error */
} ioattn_status;

typedef struct ioattn_tensor {
  void* data;                                    /* host pointer (CPU) or device pointer (CUDA) */
  int32_t dtype;                                 /* ioattn_dtype */
  int64_t batch, seqlen, heads, head_dim;        /* logical shape (B, S, H, D) */
  int64_t stride_batch, stride_seq, stride_head; /* in elements, >= 0; D is contiguous */
} ioattn_tensor;

typedef struct ioattn_options {
  float scale;                       /* <= 0: 1/sqrt(D) */
  int32_t causal;                    /* 0 or 1 */
  int32_t window_left, window_right; /* -1: unbounded */
  float softcap;                     /* 0: off */
  int32_t backend;                   /* ioattn_backend */
  int32_t num_threads; /* CPU; 0: library default (IOATTN_NUM_THREADS env, else all cores the process may run on) */
  void* cuda_stream;   /* CUDA; NULL: default stream */
} ioattn_options;

/* scale 0, causal 0, windows -1, softcap 0, CPU, 0 threads, NULL stream. */
IOATTN_API void ioattn_options_default(ioattn_options* opt);

/* Dense attention. lse may be NULL, else fp32 [B][Hq][Sq] contiguous, same memory space as out. */
IOATTN_API ioattn_status ioattn_forward(const ioattn_tensor* q, const ioattn_tensor* k, const ioattn_tensor* v,
                                        const ioattn_tensor* out, float* lse, const ioattn_options* opt);

typedef struct ioattn_kvcache {
  ioattn_tensor k, v;         /* contiguous: (B, S_max, Hkv, D); paged: (num_pages, page_size, Hkv, D) */
  const int32_t* seqlens;     /* [B]: tokens already cached for each sequence, before the append */
  const int32_t* block_table; /* NULL: contiguous; else [B][max_pages_per_seq] page ids */
  int32_t max_pages_per_seq;
} ioattn_kvcache;

/* Appends k_new/v_new (B, Snew, Hkv, D; both NULL for no append) into the cache at seqlens[b], then
   attends q (B, Sq, Hq, D) over the seqlens[b] + Snew keys of sequence b (Sk = seqlens[b] + Snew).
   seqlens is not modified. lse: fp32 [B][Hq][Sq]. The cache may hold f16/bf16 while q, out, k_new
   and v_new are f32. */
IOATTN_API ioattn_status ioattn_forward_kvcache(const ioattn_tensor* q, const ioattn_kvcache* cache,
                                                const ioattn_tensor* k_new, const ioattn_tensor* v_new,
                                                const ioattn_tensor* out, float* lse, const ioattn_options* opt);

/* Packed sequences: q is (1, total_q, Hq, D), k/v (1, total_k, Hkv, D); sequence b owns rows
   [cu_seqlens_q[b], cu_seqlens_q[b+1]) of q and [cu_seqlens_k[b], cu_seqlens_k[b+1]) of k/v.
   lse: fp32 [Hq][total_q]. */
IOATTN_API ioattn_status ioattn_forward_varlen(const ioattn_tensor* q, const ioattn_tensor* k, const ioattn_tensor* v,
                                               const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k, int32_t batch,
                                               const ioattn_tensor* out, float* lse, const ioattn_options* opt);

IOATTN_API const char* ioattn_status_string(ioattn_status s);
/* Thread-local, human-readable detail of this thread's last failure. */
IOATTN_API const char* ioattn_last_error(void);
IOATTN_API const char* ioattn_version(void);

/* 1 when this build can run the backend here (CUDA: compiled in and a device is visible). */
IOATTN_API int ioattn_backend_available(int32_t backend);

/* Calibration of the CPU backend's plans on this machine (docs/api.md, "Calibration").
   ioattn_tune times candidates around the cache-derived plan (prefill block sizes; decode
   prefetch distance and key splits) and writes the winners to a per-machine file, which later
   calls of every process on this machine load. Under 60 s on 2 cores; quick = 1 runs tiny
   problems in seconds (a smoke test, not a calibration to keep). */
typedef void (*ioattn_tune_progress)(int32_t done, int32_t total, const char* what, void* user);
typedef struct ioattn_tune_options {
  const char* path;              /* file to write; NULL: ioattn_tune_path() */
  int32_t num_threads;           /* threads to time with; 0: library default */
  int32_t quick;                 /* 0 or 1 */
  ioattn_tune_progress progress; /* called after each timed call; may be NULL */
  void* user;                    /* passed to progress */
} ioattn_tune_options;
IOATTN_API void ioattn_tune_options_default(ioattn_tune_options* opt);
IOATTN_API ioattn_status ioattn_tune(const ioattn_tune_options* opt);
/* The calibration file this process reads: IOATTN_TUNE_FILE if set (empty: calibration off),
   else $XDG_CACHE_HOME/ioattn/tune-<machine hash>.json (~/.cache without XDG_CACHE_HOME).
   "" when calibration is off. */
IOATTN_API const char* ioattn_tune_path(void);

#ifdef __cplusplus
}
#endif

#endif /* IOATTN_IOATTN_H_ */
