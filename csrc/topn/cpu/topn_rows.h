// The torch backend's finishing of a chunk of top-n scores on the CPU
// (topn/topn_block_select.h finish_row per query row; the CUDA kernel,
// topn/cuda/topn_block_select.h, runs the same code).
#pragma once

#include "common/problems.h"

namespace rcn_fast {

void topn_finish_rows(const TopnFinishProblem& p, int num_threads);

}  // namespace rcn_fast
