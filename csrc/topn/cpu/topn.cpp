#include "topn/cpu/topn.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <new>
#include <vector>

#include "topn/topn_order.h"
#include "topn/isa/topn_isa.h"
#include "common/cpu/parallel.h"
#include "common/cpu/simd.h"

namespace rcn_fast {
namespace {

struct Cand {
  float s;
  int64_t id;
};
inline bool cand_better(const Cand& a, const Cand& b) {
  return topn_better(a.s, a.id, b.s, b.id);
}

// The rows each scan thread takes at least (keeps small calls single-threaded).
constexpr int64_t kMinWorkPerThread = int64_t(1) << 21;  // multiply-adds

}  // namespace

int64_t topn_workspace_floats(int64_t d) {
  return 2 * kTopnBlockRows + d + kTopnBlockRows * d + kTopnBlockRows * 16 + 16;
}

void topn_compact(TopnCollector* c, int64_t q) {
  float* s = c->scores + q * c->cap;
  int64_t* id = c->ids + q * c->cap;
  const int64_t n = c->count[q];
  Cand* tmp = static_cast<Cand*>(c->scratch);  // [cap], reused: compactions are frequent early in a scan
  for (int64_t i = 0; i < n; ++i) tmp[i] = {s[i], id[i]};
  const int64_t keep = std::min(n, c->k);
  std::nth_element(tmp, tmp + (keep - 1), tmp + n, cand_better);
  for (int64_t i = 0; i < keep; ++i) {
    s[i] = tmp[i].s;
    id[i] = tmp[i].id;
  }
  c->count[q] = keep;
  if (keep == c->k) c->thr[q] = tmp[keep - 1].s;
}

void topn_cpu(const TopnProblem& p, int num_threads) {
  const int64_t Q = p.Q, N = p.N, d = p.d, k = p.k;
  const float ninf = -std::numeric_limits<float>::infinity();
  if (Q == 0) return;
  const int64_t k_eff = std::min(k, N);
  if (N == 0 || d == 0 || k_eff == 0) {
    // d == 0: every score is 0 (an empty sum), so the first k ids win.
    for (int64_t q = 0; q < Q; ++q)
      for (int64_t j = 0; j < k; ++j) {
        const bool real = d == 0 && j < k_eff;
        p.scores_out[q * k + j] = real ? 0.f : ninf;
        p.ids_out[q * k + j] = real ? j : -1;
      }
    return;
  }

  // Queries as contiguous float32 rows, and packed 16 at a time for the
  // matrix-matrix path: qpack[panel][k][lane].
  std::vector<float> qrows(static_cast<size_t>(Q * d));
  for (int64_t q = 0; q < Q; ++q)
    for (int64_t j = 0; j < d; ++j) {
      const int64_t off = q * p.query_stride + j;
      float v;
      switch (p.query_dtype) {
        case DType::F32: v = static_cast<const float*>(p.queries)[off]; break;
        case DType::F16: v = load_as_float<DType::F16>(static_cast<const uint16_t*>(p.queries) + off); break;
        default: v = load_as_float<DType::BF16>(static_cast<const uint16_t*>(p.queries) + off); break;
      }
      qrows[size_t(q * d + j)] = v;
    }
  std::vector<float> qpack;
  if (Q > kTopnGemvMaxQueries) {
    const int64_t nqp = (Q + 15) / 16;
    qpack.assign(size_t(nqp * d * 16), 0.f);
    for (int64_t q = 0; q < Q; ++q)
      for (int64_t j = 0; j < d; ++j)
        qpack[size_t(((q / 16) * d + j) * 16 + q % 16)] = qrows[size_t(q * d + j)];
  }

  int threads = num_threads > 0 ? num_threads : default_num_threads();
  const int64_t work = N * d * std::max<int64_t>(Q, 4);
  threads = int(std::max<int64_t>(1, std::min<int64_t>(threads, work / kMinWorkPerThread)));
  threads = int(std::min<int64_t>(threads, N));

  const int64_t cap = k_eff + std::max<int64_t>(k_eff, 64);
  struct ThreadState {
    std::vector<float> scores, thr, work;
    std::vector<int64_t> ids, count;
    std::vector<Cand> scratch;
    TopnCollector col;
  };
  std::vector<ThreadState> st(static_cast<size_t>(threads));
  auto init_state = [&](ThreadState& s) {
    s.scores.resize(size_t(Q * cap));
    s.ids.resize(size_t(Q * cap));
    s.count.assign(size_t(Q), 0);
    s.thr.assign(size_t(Q), ninf);
    s.work.resize(size_t(topn_workspace_floats(d)));
    s.scratch.resize(size_t(cap));
    s.col = TopnCollector{s.scores.data(), s.ids.data(), s.count.data(), s.thr.data(), cap, k_eff,
                          s.scratch.data()};
  };
  // Every thread's buffers are allocated here, on the caller, before any
  // thread starts: when memory runs short the scan uses fewer threads (a
  // failed allocation inside a worker thread could not even be caught: glibc
  // aborts when it cannot allocate the exception machinery's thread-local
  // data), and the scan threads allocate nothing.
  int ready = 0;
  for (; ready < threads; ++ready) {
    try {
      init_state(st[size_t(ready)]);
    } catch (const std::bad_alloc&) {
      if (ready == 0) throw;
      st[size_t(ready)] = ThreadState{};
      break;
    }
  }
  threads = ready;
  st.resize(size_t(threads));
  const auto scan = active_simd() == SimdLevel::AVX2 ? &avx2::topn_scan : &generic::topn_scan;
  // About kChunksPerThread chunks per thread, whole blocks of the GEMM path.
  constexpr int64_t kChunksPerThread = 16;
  int64_t chunk = threads == 1 ? N : (N + threads * kChunksPerThread - 1) / (threads * kChunksPerThread);
  chunk = std::max<int64_t>(chunk, 8 * kTopnBlockRows);
  chunk = (chunk + kTopnBlockRows - 1) / kTopnBlockRows * kTopnBlockRows;
  std::atomic<int64_t> next_row{0};

  run_threads(threads, [&](int t) {
    ThreadState& s = st[size_t(t)];
    TopnScanArgs a{};
    a.qrows = qrows.data();
    a.qpack = qpack.empty() ? nullptr : qpack.data();
    a.Q = Q;
    a.d = d;
    a.corpus = p.corpus;
    a.dtype = int(p.corpus_dtype);
    a.row_stride = p.corpus_stride;
    a.work = s.work.data();
    a.col = &s.col;
    // Threads take chunks of rows from a shared counter, so a thread that
    // the OS pauses (a busy machine) does not hold the others up; the
    // result does not depend on which thread scanned which chunk.
    for (;;) {
      const int64_t b = next_row.fetch_add(chunk);
      if (b >= N) break;
      a.row_begin = b;
      a.row_end = std::min(N, b + chunk);
      scan(a);
    }
  });

  // Merge the threads' buffers per query.
  // Each merge thread's buffer is reserved here, on the caller (see above):
  // fewer merge threads when memory is short, no allocation in a thread.
  int merge_threads = int(std::min<int64_t>(threads, Q));
  std::vector<std::vector<Cand>> merge_buf(static_cast<size_t>(merge_threads));
  for (int t = 0; t < merge_threads; ++t) {
    try {
      merge_buf[size_t(t)].reserve(size_t(threads) * size_t(cap));
    } catch (const std::bad_alloc&) {
      if (t == 0) throw;
      merge_threads = t;
      break;
    }
  }
  run_threads(merge_threads, [&](int t) {
    int64_t q0, q1;
    split_range(Q, merge_threads, t, q0, q1);
    std::vector<Cand>& all = merge_buf[size_t(t)];
    for (int64_t q = q0; q < q1; ++q) {
      all.clear();
      for (const ThreadState& s : st)
        for (int64_t i = 0; i < s.count[size_t(q)]; ++i)
          all.push_back({s.scores[size_t(q * cap + i)], s.ids[size_t(q * cap + i)]});
      const int64_t keep = std::min<int64_t>(int64_t(all.size()), k_eff);
      std::partial_sort(all.begin(), all.begin() + keep, all.end(), cand_better);
      for (int64_t j = 0; j < k; ++j) {
        p.scores_out[q * k + j] = j < keep ? all[size_t(j)].s : ninf;
        p.ids_out[q * k + j] = j < keep ? all[size_t(j)].id : -1;
      }
    }
  });
}

}  // namespace rcn_fast
