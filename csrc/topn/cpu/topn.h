// Exact top-n maximum inner product search on the CPU.
#pragma once
#include <cstdint>

#include "common/problems.h"

namespace rcn_fast {

// Fills scores_out/ids_out: per query the k best (score desc, id asc) of the
// admissible scores (not NaN, not -inf); the rest padded (-inf, -1).
// num_threads <= 0 means default_num_threads().
void topn_cpu(const TopnProblem& p, int num_threads);

}  // namespace rcn_fast
