// Exact top-n maximum inner product search on the CPU.
#pragma once
#include <cstdint>

#include "common/dtypes.h"

namespace rcn_fast {

struct TopnProblem {
  const void* queries;      // [Q, d] rows of `query_dtype`, unit inner stride
  DType query_dtype;
  int64_t query_stride;     // elements between query rows
  const void* corpus;       // [N, d] rows of `corpus_dtype`, unit inner stride
  DType corpus_dtype;
  int64_t corpus_stride;    // elements between corpus rows
  int64_t Q, N, d, k;
  float* scores_out;        // [Q, k] contiguous
  int64_t* ids_out;         // [Q, k] contiguous
};

// Fills scores_out/ids_out: per query the k best (score desc, id asc) of the
// admissible scores (not NaN, not -inf); the rest padded (-inf, -1).
// num_threads <= 0 means default_num_threads().
void topn_cpu(const TopnProblem& p, int num_threads);

}  // namespace rcn_fast
