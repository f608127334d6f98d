#include "topn/cpu/topn_int8.h"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <limits>

#include "common/cpu/parallel.h"
#include "common/cpu/simd.h"
#include "topn/topn_int8.h"

namespace rcn_fast {
namespace {

constexpr int64_t kTileRows = 256;  // rows whose intervals a thread writes at once, then filters

const Int8Isa kGeneric{"generic", &generic::int8_intervals, false};
#if RCN_HAVE_AVX2
const Int8Isa kAvx2{"avx2", &avx2::int8_intervals, true};
#endif
#if RCN_HAVE_AVX512VNNI
const Int8Isa kAvx512Vnni{"avx512vnni", &avx512vnni::int8_intervals, true};
#endif
#if RCN_HAVE_AVXVNNI
const Int8Isa kAvxVnni{"avxvnni", &avxvnni::int8_intervals, true};
#endif

const Int8Isa* supported(const std::string& name) {
  if (name == "generic") return &kGeneric;
#if RCN_HAVE_AVX2
  if (name == "avx2" && cpu_supports_avx2()) return &kAvx2;
#endif
#if RCN_HAVE_AVX512VNNI
  if (name == "avx512vnni" && cpu_supports_avx512vnni()) return &kAvx512Vnni;
#endif
#if RCN_HAVE_AVXVNNI
  if (name == "avxvnni" && cpu_supports_avxvnni()) return &kAvxVnni;
#endif
  return nullptr;
}

const Int8Isa& chosen() {
  static const Int8Isa* c = [] {
    const Int8Isa* best = nullptr;
    for (const char* name : {"avx512vnni", "avxvnni", "avx2", "generic"})
      if (best == nullptr) best = supported(name);
    if (const char* env = std::getenv("RCN_FAST_SIMD")) {
      const std::string want = std::string(env) == "avx512" ? "avx512vnni" : env;
      if (const Int8Isa* w = supported(want)) best = w;
    }
    return best;
  }();
  return *c;
}

// The 16-bit query terms 256 c1 + c2 [Q, width] (empty for the generic variant).
std::vector<int16_t> query_q16(const TopnInt8Problem& p, const Int8Isa& isa) {
  std::vector<int16_t> q16;
  if (!isa.q16) return q16;
  q16.resize(size_t(p.Q * p.width));
  for (int64_t q = 0; q < p.Q; ++q) {
    const int8_t* c = p.qcodes + q * 2 * p.width;
    for (int64_t i = 0; i < p.width; ++i) q16[size_t(q * p.width + i)] = int16_t(256 * c[i] + c[p.width + i]);
  }
  return q16;
}

Int8TileArgs tile_args(const TopnInt8Problem& p, const std::vector<int16_t>& q16) {
  Int8TileArgs a{};
  a.codes = p.codes;
  a.rows = p.rows;
  a.qcodes = p.qcodes;
  a.q16 = q16.empty() ? nullptr : q16.data();
  a.qparams = p.qparams;
  a.width = p.width;
  a.Q = p.Q;
  return a;
}

int thread_count(int64_t n, int num_threads) {
  const int64_t tasks = (n + kTileRows - 1) / kTileRows;
  return int(std::max<int64_t>(1, std::min<int64_t>(tasks, num_threads > 0 ? num_threads : default_num_threads())));
}

// One thread's running selection for one query: its rows' largest lo
// values (at least the k largest), the k-th of them once known (the
// running bound, never above the k-th largest lo over all rows), and the
// rows whose hi reached the bound when they were seen.
struct Running {
  std::vector<float> lo;
  float bound = -std::numeric_limits<float>::infinity();
  std::vector<int64_t> ids;
  std::vector<float> his;
  size_t kept_at = 0;  // candidates after the last pruning

  void compact(size_t k) {
    std::nth_element(lo.begin(), lo.begin() + std::ptrdiff_t(k - 1), lo.end(), std::greater<float>());
    lo.resize(k);
    bound = lo[k - 1];
    // candidates below the raised bound can go (the memory of a long scan)
    if (ids.size() >= 2 * std::max<size_t>(kept_at, 4096)) {
      size_t w = 0;
      for (size_t i = 0; i < ids.size(); ++i) {
        if (his[i] >= bound) {
          ids[w] = ids[i];
          his[w++] = his[i];
        }
      }
      ids.resize(w);
      his.resize(w);
      kept_at = w;
    }
  }
};

}  // namespace

const Int8Isa* int8_isa_named(const std::string& name) { return name.empty() ? &chosen() : supported(name); }

std::string int8_isa_compiled() {
  std::string s = "generic";
#if RCN_HAVE_AVX2
  s += ",avx2";
#endif
#if RCN_HAVE_AVX512VNNI
  s += ",avx512vnni";
#endif
#if RCN_HAVE_AVXVNNI
  s += ",avxvnni";
#endif
  return s;
}

void topn_int8_intervals(const TopnInt8Problem& p, int num_threads, const Int8Isa& isa) {
  if (p.Q == 0 || p.N == 0) return;
  const std::vector<int16_t> q16 = query_q16(p, isa);
  const int threads = thread_count(p.N, num_threads);
  run_threads(threads, [&](int t) {
    int64_t j0, j1;
    split_range(p.N, threads, t, j0, j1);
    Int8TileArgs a = tile_args(p, q16);
    a.j0 = j0;
    a.j1 = j1;
    a.lo = p.lo + j0;
    a.hi = p.hi + j0;
    a.ld = p.ld;
    isa.intervals(a);
  });
}

Int8Candidates topn_int8_candidates(const TopnInt8Problem& p, int64_t k, int num_threads, const Int8Isa& isa) {
  Int8Candidates out;
  out.counts.assign(size_t(p.Q), 0);
  if (p.Q == 0 || p.N == 0) return out;
  const std::vector<int16_t> q16 = query_q16(p, isa);
  const int threads = thread_count(p.N, num_threads);
  const size_t kk = size_t(k), cap = kk + std::max<size_t>(kk, 256);
  std::vector<std::vector<Running>> state(size_t(threads), std::vector<Running>(size_t(p.Q)));
  run_threads(threads, [&](int t) {
    int64_t j0, j1;
    split_range(p.N, threads, t, j0, j1);
    std::vector<Running>& runs = state[size_t(t)];
    for (Running& r : runs) r.lo.reserve(cap);
    std::vector<float> lo(size_t(p.Q * kTileRows)), hi(lo.size());
    Int8TileArgs a = tile_args(p, q16);
    a.lo = lo.data();
    a.hi = hi.data();
    a.ld = kTileRows;
    for (int64_t tj = j0; tj < j1; tj += kTileRows) {
      a.j0 = tj;
      a.j1 = std::min(j1, tj + kTileRows);
      isa.intervals(a);
      const int64_t n = a.j1 - a.j0;
      for (int64_t q = 0; q < p.Q; ++q) {
        Running& r = runs[size_t(q)];
        const float* l = lo.data() + q * kTileRows;
        const float* h = hi.data() + q * kTileRows;
        for (int64_t i = 0; i < n; ++i) {
          if (h[i] >= r.bound) {  // NaN never
            r.ids.push_back(tj + i);
            r.his.push_back(h[i]);
          }
          if (l[i] > r.bound) {
            r.lo.push_back(l[i]);
            if (r.lo.size() == cap) r.compact(kk);
          }
        }
      }
    }
  });
  // T per query: the k-th largest lo over every thread's kept values (each
  // holds its rows' k largest), then the candidates with hi >= T
  std::vector<float> all;
  for (int64_t q = 0; q < p.Q; ++q) {
    all.clear();
    for (const auto& runs : state) all.insert(all.end(), runs[size_t(q)].lo.begin(), runs[size_t(q)].lo.end());
    float T = -std::numeric_limits<float>::infinity();
    if (all.size() >= kk) {
      std::nth_element(all.begin(), all.begin() + std::ptrdiff_t(kk - 1), all.end(), std::greater<float>());
      T = all[kk - 1];
    }
    int64_t c = 0;
    for (const auto& runs : state) {
      const Running& r = runs[size_t(q)];
      for (size_t i = 0; i < r.ids.size(); ++i) {
        if (r.his[i] >= T) {
          out.ids.push_back(r.ids[i]);
          ++c;
        }
      }
    }
    out.counts[size_t(q)] = c;
  }
  return out;
}

}  // namespace rcn_fast
