// The problem descriptions shared by the CPU and CUDA launchers (one struct
// each, so the bindings fill them the same way; pointers are host memory for
// the CPU launchers and device memory for the CUDA ones), and the result the
// sampling launchers report.
#pragma once
#include <cstdint>

#include "common/dtypes.h"

namespace rcn_fast {

// Exact top-n maximum inner product search (topn/cpu/topn.h, topn/cuda/topn.h).
struct TopnProblem {
  const void* queries;      // [Q, d] rows of `query_dtype`, unit inner stride
  DType query_dtype;
  int64_t query_stride;     // elements between query rows
  const void* corpus;       // [N, d] rows of `corpus_dtype`, unit inner stride
  DType corpus_dtype;
  int64_t corpus_stride;    // elements between corpus rows
  int64_t Q, N, d, k;       // CUDA: 1 <= k <= cuda::kTopnMaxK
  float* scores_out;        // [Q, k] contiguous
  int64_t* ids_out;         // [Q, k] contiguous
};

// The torch backend's finishing of one chunk of a top-n search
// (topn/topn_block_select.h finish_row, per query row): from the chunk's
// float32 scores and torch.topk's k + 1 best of each row, the exact top-k
// of each row (ids + id_base). With `queries` set (a float32 query split
// into corpus-dtype terms), a NaN score is recomputed from the float32
// query and the corpus row before it is judged (a corpus +-inf times a zero
// term is NaN in the split GEMM where the float32 product is +-inf).
struct TopnFinishProblem {
  const float* scores;      // [Q, n], rows `ld` elements apart
  int64_t ld;
  int64_t Q, n;             // n < 2^32
  const float* top_s;       // [Q, kk] contiguous, descending (NaN first)
  const int64_t* top_i;     // [Q, kk] column indices
  int64_t kk, k;            // kk = min(k + 1, n)
  int64_t id_base;
  float* out_s;             // [Q, k] contiguous
  int64_t* out_i;
  const float* queries;     // [Q, d] float32 rows `q_stride` apart, or null: no rescoring
  int64_t q_stride;
  const void* corpus;       // the chunk's rows [n, d] of corpus_dtype, `c_stride` apart
  DType corpus_dtype;
  int64_t c_stride, d;
};

// The int8 bounded scan of an exact top-n (topn/topn_int8.h): for every
// query q and corpus row j, the interval [lo, hi] that holds the float32
// score, from the rows' int8 codes and bounds and the queries' two int8
// terms and parameters.
struct TopnInt8Problem {
  const int8_t* codes;      // [N, width] row-major, width a multiple of 16, <= 1032
  const float* rows;        // [N, 3] per row: scale, norm, err
  int64_t N, width;
  const int8_t* qcodes;     // [Q, 2, width]: the query's two int8 terms
  const float* qparams;     // [Q, 5]: scale, rho, nu, gamma * nu, eta
  int64_t Q;
  float* lo;                // [Q, N], rows `ld` elements apart
  float* hi;
  int64_t ld;
};

// Relevance-based subset sampling, ReConnect eqs. 4-6 (sampling/cpu/sampling.h,
// sampling/cuda/sampling.h).
struct SamplingProblem {
  const float* query;       // [B, d] float32, unit inner stride
  int64_t query_stride;     // elements between query rows
  const void* cand;         // [B, n, d] of `cand_dtype`, unit inner stride
  DType cand_dtype;
  int64_t cand_stride_b;    // elements between questions
  int64_t cand_stride_n;    // elements between candidates
  const uint8_t* mask;      // [B, n] contiguous (1 = valid), or null: all valid
  const int64_t* keys;      // [B] stream id of each question
  int64_t B, n, d;
  int64_t num_subsets, subset_size;
  float inv_tau;            // 1 / tau, finite and > 0
  uint64_t seed;
  bool first_relevance;     // false: first document uniform
  int64_t* ids_out;         // [B, num_subsets, subset_size] contiguous
  float* logp_out;          // same shape, or null
};

// What a sampling launcher reports (CPU and CUDA alike): the first question
// (lowest index) that failed, if any.
enum class SamplingStatus : int {
  Ok = 0,
  NonFiniteCandidate = 1,  // dot(e_q, e_j) is NaN/inf: e_j (or e_q) holds NaN/inf or overflows
  NonFiniteScore = 2,      // a step's score / tau is NaN/inf (overflow)
};

struct SamplingResult {
  SamplingStatus status;
  int64_t question;   // the first question (lowest index) that failed
  int64_t candidate;  // the candidate, for NonFiniteCandidate
};

}  // namespace rcn_fast
