#include "topn/cpu/topn_int8.h"

#include <algorithm>

#include "common/cpu/parallel.h"
#include "topn/topn_int8.h"

namespace rcn_fast {
namespace {

constexpr int64_t kRowsPerTask = 4096;

int32_t dot_i8(const int8_t* a, const int8_t* b, int64_t n) {
  int32_t s = 0;
  for (int64_t i = 0; i < n; ++i) s += int32_t(a[i]) * int32_t(b[i]);
  return s;
}

}  // namespace

void topn_int8_intervals(const TopnInt8Problem& p, int num_threads) {
  if (p.Q == 0 || p.N == 0) return;
  const int64_t tasks = (p.N + kRowsPerTask - 1) / kRowsPerTask;
  const int threads = int(std::min<int64_t>(tasks, num_threads > 0 ? num_threads : default_num_threads()));
  const int64_t per = (tasks + threads - 1) / threads * kRowsPerTask;
  run_threads(threads, [&](int t) {
    const int64_t j0 = int64_t(t) * per, j1 = std::min(p.N, j0 + per);
    for (int64_t j = j0; j < j1; ++j) {
      const int8_t* c = p.codes + j * p.width;
      const float* rb = p.rows + j * topn_int8::kRowBounds;
      for (int64_t q = 0; q < p.Q; ++q) {
        const int8_t* qc = p.qcodes + q * 2 * p.width;
        const int32_t i1 = dot_i8(qc, c, p.width), i2 = dot_i8(qc + p.width, c, p.width);
        topn_int8::interval(i1, i2, p.qparams + q * topn_int8::kQueryParams, rb, p.lo + q * p.ld + j,
                            p.hi + q * p.ld + j);
      }
    }
  });
}

}  // namespace rcn_fast
