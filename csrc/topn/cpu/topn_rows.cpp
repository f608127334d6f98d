#include "topn/cpu/topn_rows.h"

#include <algorithm>
#include <vector>

#include "common/cpu/parallel.h"
#include "topn/cpu/serial_group.h"
#include "topn/topn_block_select.h"

namespace rcn_fast {
namespace {

namespace ts = topn_select;

// candidates a selection offers between two flush checks on one thread
constexpr int kRound = 256;
// rows a thread takes at least (a row without a tie costs k copies)
constexpr int64_t kRowsPerThread = 64;

template <DType CT>
void finish_range(const TopnFinishProblem& p, int64_t q0, int64_t q1) {
  const SerialGroup g;
  const ts::Layout L = ts::layout(int(p.k), kRound);
  std::vector<float> s(size_t(L.slots));
  std::vector<uint32_t> id(size_t(L.slots));
  ts::Run<uint32_t> run;
  ts::init(run);
  using CS = typename Storage<CT>::type;
  for (int64_t q = q0; q < q1; ++q) {
    const ts::RescoreNan<CT> score{p.scores + q * p.ld, p.queries ? p.queries + q * p.q_stride : nullptr,
                                   static_cast<const CS*>(p.corpus), p.c_stride, p.d};
    ts::finish_row(g, run, s.data(), id.data(), L, p.top_s + q * p.kk, p.top_i + q * p.kk, p.kk, p.n, score,
                   p.out_s + q * p.k, p.out_i + q * p.k, p.id_base);
  }
}

}  // namespace

void topn_finish_rows(const TopnFinishProblem& p, int num_threads) {
  if (p.Q == 0) return;
  const int64_t want = std::max<int64_t>(1, p.Q / kRowsPerThread);
  const int threads = int(std::min<int64_t>(want, num_threads > 0 ? num_threads : default_num_threads()));
  const int64_t per = (p.Q + threads - 1) / threads;
  run_threads(threads, [&](int t) {
    const int64_t q0 = int64_t(t) * per, q1 = std::min(p.Q, q0 + per);
    if (q0 >= q1) return;
    switch (p.corpus_dtype) {
      case DType::F32: finish_range<DType::F32>(p, q0, q1); break;
      case DType::F16: finish_range<DType::F16>(p, q0, q1); break;
      case DType::BF16: finish_range<DType::BF16>(p, q0, q1); break;
    }
  });
}

}  // namespace rcn_fast
