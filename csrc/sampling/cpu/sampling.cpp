// CPU launcher of the subset sampler. Threads take chunks of the flat range
// of (question, subset) pairs from a shared counter. A thread walks its
// pairs question by question and runs that question's subsets in lockstep,
// one step at a time:
//
//   prepare question b: its candidates as float32 rows (f16/bf16 converted
//                       once); rel_j = dot(e_q, e_j) now if the first draw
//                       needs it, else in the pass of the first step's rows
//   for t in 0..K-1:
//     draw step t of every subset (sampling/subset_sampler.h with one lane,
//     sampling/isa/sampling_steps.cpp)
//     score the documents just chosen against all candidates: one thin
//     matrix product for all subsets (sampling/isa/sampling_dots.cpp); rows an
//     earlier subset or step scored are reused; add each subset's row to
//     its acc (acc_j / t = dot(mean of the chosen, e_j))
//
// The matrix product reads the question's candidates once per step for all
// subsets instead of once per subset, and reuse skips rows entirely when
// subsets share documents (common with sharp distributions). Every number a
// subset sees is computed the same way whatever the split (a row's dot
// products do not depend on which other rows share its pass), so results do
// not depend on the thread count or batch composition.
#include "sampling/cpu/sampling.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <new>
#include <optional>
#include <stdexcept>
#include <vector>

#include "sampling/subset_sampler.h"
#include "sampling/isa/sampling_isa.h"
#include "common/cpu/parallel.h"
#include "common/cpu/simd.h"

namespace rcn_fast {
namespace {

constexpr int64_t kMinWorkPerThread = int64_t(1) << 20;     // multiply-adds
constexpr int64_t kCacheBudgetBytes = int64_t(32) << 20;   // per thread

struct Kernels {
  void (*dots)(const SamplingDotsArgs&);
  void (*convert)(const SamplingConvertArgs&);
  int (*draw)(const SamplingDrawArgs&);
};

Kernels pick_kernels() {
  if (active_simd() == SimdLevel::AVX2)
    return {&avx2::sampling_dots, &avx2::sampling_convert, &avx2::sampling_draw_step};
  return {&generic::sampling_dots, &generic::sampling_convert, &generic::sampling_draw_step};
}

struct Worker {
  const SamplingProblem& p;
  Kernels k;
  int64_t group;  // subsets run in lockstep at most
  // per question
  std::vector<float> e32;      // [n, d] converted candidates (f16/bf16)
  std::vector<float> rel;      // [n]
  std::vector<uint8_t> valid;  // [n]
  const float* e = nullptr;
  int64_t es = 0;
  // per lockstep group
  std::vector<float> acc;          // [group, n]
  std::vector<uint8_t> eligible;   // [group, n]
  std::vector<float> w;            // [n]
  std::vector<int64_t> slot_of;    // [n] row cache slot of a candidate, -1
  std::vector<float> rows;         // [cap, n] cached dot(e_c, e_j)
  int64_t used = 0;
  std::vector<int64_t> chosen;     // [group]
  std::vector<const float*> xs;    // rows to score in one pass
  std::vector<float*> outs;        // where their scores go
  std::vector<int64_t> pending;    // candidates those rows belong to
  bool rel_ready = false;          // rel of the current question computed

  Worker(const SamplingProblem& prob, Kernels kern, int64_t g) : p(prob), k(kern), group(g) {
    const size_t n = size_t(p.n);
    rel.resize(n);
    valid.resize(n);
    acc.resize(size_t(group) * n);
    eligible.resize(size_t(group) * n);
    w.resize(n);
    slot_of.resize(n);
    chosen.resize(size_t(group));
    const int64_t cap = std::min<int64_t>(p.n, group * std::max<int64_t>(p.subset_size - 1, 1));
    rows.resize(size_t(cap) * n);
    if (p.cand_dtype != DType::F32) e32.resize(n * size_t(p.d));
    xs.reserve(size_t(group) + 1);  // the scoring passes push at most group + 1 rows: no allocation later
    outs.reserve(size_t(group) + 1);
    pending.reserve(size_t(group));
  }

  // Returns false (and fills err) when question b's inputs are not finite.
  bool prepare(int64_t b, SamplingResult& err) {
    const int64_t n = p.n, d = p.d;
    if (p.cand_dtype == DType::F32) {
      e = static_cast<const float*>(p.cand) + b * p.cand_stride_b;
      es = p.cand_stride_n;
    } else {
      SamplingConvertArgs c{};
      c.src = static_cast<const uint16_t*>(p.cand) + b * p.cand_stride_b;
      c.src_stride = p.cand_stride_n;
      c.dtype = int(p.cand_dtype);
      c.n = n;
      c.d = d;
      c.dst = e32.data();
      k.convert(c);
      e = e32.data();
      es = d;
    }
    for (int64_t j = 0; j < n; ++j) valid[size_t(j)] = p.mask ? (p.mask[b * n + j] != 0) : 1;
    rel_ready = false;
    // With a uniform first draw, rel is computed later, in the same pass as
    // the first documents' rows (one pass over the candidates saved).
    return !p.first_relevance || compute_rel(b, err);
  }

  bool check_rel(int64_t b, SamplingResult& err) {
    rel_ready = true;
    for (int64_t j = 0; j < p.n; ++j)
      if (valid[size_t(j)] && !std::isfinite(rel[size_t(j)])) {
        err = {SamplingStatus::NonFiniteCandidate, b, j};
        return false;
      }
    return true;
  }

  bool compute_rel(int64_t b, SamplingResult& err) {
    const float* q = p.query + b * p.query_stride;
    float* out = rel.data();
    SamplingDotsArgs a{};
    a.x = &q;
    a.nx = 1;
    a.e = e;
    a.e_stride = es;
    a.n = p.n;
    a.d = p.d;
    a.out = &out;
    k.dots(a);
    return check_rel(b, err);
  }

  // Subsets [s0, s1) of question b (s1 - s0 <= group), all steps.
  bool run_group(int64_t b, int64_t s0, int64_t s1, SamplingResult& err) {
    const int64_t n = p.n, K = p.subset_size, G = s1 - s0;
    for (int64_t g = 0; g < G; ++g) {
      std::fill_n(acc.begin() + g * n, n, 0.f);
      std::copy_n(valid.begin(), n, eligible.begin() + g * n);
    }
    std::fill(slot_of.begin(), slot_of.end(), int64_t(-1));
    used = 0;
    SamplingDrawArgs da{};
    da.rel = rel.data();
    da.acc = acc.data();
    da.eligible = eligible.data();
    da.w = w.data();
    da.n = n;
    da.G = G;
    da.inv_tau = p.inv_tau;
    da.first_relevance = p.first_relevance;
    da.seed = p.seed;
    da.stream = uint64_t(p.keys[b]);
    da.s0 = s0;
    da.out_stride = K;
    da.chosen = chosen.data();
    for (int64_t t = 0; t < K; ++t) {
      const int64_t o = (b * p.num_subsets + s0) * K + t;
      da.t = t;
      da.ids_out = p.ids_out + o;
      da.logp_out = p.logp_out ? p.logp_out + o : nullptr;
      if (k.draw(da) != 0) {
        err = {SamplingStatus::NonFiniteScore, b, -1};
        return false;
      }
      if (t + 1 == K) break;
      // Score the newly chosen documents that no earlier step scored (and
      // the query, if rel is still missing).
      xs.clear();
      outs.clear();
      pending.clear();
      const bool with_rel = !rel_ready;
      if (with_rel) {
        xs.push_back(p.query + b * p.query_stride);
        outs.push_back(rel.data());
      }
      for (int64_t g = 0; g < G; ++g) {
        const int64_t c = chosen[size_t(g)];
        if (c < 0 || slot_of[size_t(c)] >= 0) continue;
        slot_of[size_t(c)] = used + int64_t(pending.size());
        xs.push_back(e + c * es);
        outs.push_back(rows.data() + slot_of[size_t(c)] * n);
        pending.push_back(c);
      }
      if (!xs.empty()) {
        SamplingDotsArgs a{};
        a.x = xs.data();
        a.nx = int64_t(xs.size());
        a.e = e;
        a.e_stride = es;
        a.n = n;
        a.d = p.d;
        a.out = outs.data();
        k.dots(a);
        used += int64_t(pending.size());
      }
      if (with_rel && !check_rel(b, err)) return false;
      for (int64_t g = 0; g < G; ++g) {
        const int64_t c = chosen[size_t(g)];
        if (c < 0) continue;
        const float* row = rows.data() + slot_of[size_t(c)] * n;
        float* ac = acc.data() + g * n;
        for (int64_t j = 0; j < n; ++j) ac[j] += row[j];
      }
    }
    return rel_ready || compute_rel(b, err);  // K = 1: no pass computed it yet
  }
};

}  // namespace

SamplingResult sample_subsets_cpu(const SamplingProblem& p, int num_threads) {
  SamplingResult ok{SamplingStatus::Ok, -1, -1};
  const int64_t N = p.num_subsets, K = p.subset_size, n = p.n;
  const int64_t items = p.B * N;
  if (items == 0 || K == 0) return ok;
  if (n == 0) {
    for (int64_t i = 0; i < items * K; ++i) {
      p.ids_out[i] = -1;
      if (p.logp_out) p.logp_out[i] = 0.f;
    }
    return ok;
  }
  // Subsets per lockstep group: bounded so a thread's row cache stays small.
  const int64_t per_subset = n * (4 * std::max<int64_t>(K - 1, 1) + 5);
  const int64_t group = std::max<int64_t>(1, std::min<int64_t>(N, kCacheBudgetBytes / per_subset));

  int threads = num_threads > 0 ? num_threads : default_num_threads();
  const int64_t work = items * K * n * std::max<int64_t>(p.d, 1);
  threads = int(std::max<int64_t>(1, std::min<int64_t>(threads, work / kMinWorkPerThread)));
  threads = int(std::min<int64_t>(threads, items));
  const Kernels kern = pick_kernels();
  std::vector<SamplingResult> errs(size_t(threads), ok);

  // Threads take chunks of (question, subset) items from a shared counter
  // (whole questions when there are enough), so a thread the OS pauses does
  // not hold the others up. Chunks are handed out in increasing order and a
  // thread stops at its first error, so the lowest failing question is
  // among the threads' first errors.
  int64_t chunk = threads == 1 ? items : std::max<int64_t>(1, items / (int64_t(threads) * 16));
  if (chunk > N) chunk = chunk / N * N;
  std::atomic<int64_t> next_item{0};
  // Every worker's buffers are allocated here, on the caller, before any
  // thread starts: when memory runs short fewer threads run (a failed
  // allocation inside a worker thread could not even be caught: glibc aborts
  // when it cannot allocate the exception machinery's thread-local data),
  // and the workers allocate nothing while they run.
  std::vector<std::optional<Worker>> workers(static_cast<size_t>(threads));
  int ready = 0;
  for (; ready < threads; ++ready) {
    try {
      workers[size_t(ready)].emplace(p, kern, group);
    } catch (const std::bad_alloc&) {
      if (ready == 0) throw;
      workers[size_t(ready)].reset();
      break;
    }
  }
  threads = ready;
  errs.resize(size_t(threads));
  run_threads(threads, [&](int t) {
    Worker& wk = *workers[size_t(t)];
    SamplingResult& err = errs[size_t(t)];
    for (;;) {
      const int64_t i0 = next_item.fetch_add(chunk);
      if (i0 >= items) return;
      const int64_t i1 = std::min(items, i0 + chunk);
      int64_t i = i0;
      while (i < i1) {
        const int64_t b = i / N;
        const int64_t s_end = std::min<int64_t>(N, i % N + (i1 - i));
        if (!wk.prepare(b, err)) return;
        for (int64_t s = i % N; s < s_end; s += group)
          if (!wk.run_group(b, s, std::min<int64_t>(s_end, s + group), err)) return;
        i += s_end - i % N;
      }
    }
  });
  const SamplingResult* first = nullptr;
  for (const SamplingResult& e : errs)
    if (e.status != SamplingStatus::Ok && (first == nullptr || e.question < first->question)) first = &e;
  return first ? *first : ok;
}

}  // namespace rcn_fast

// ---------------------------------------------------------------------------
// Warp emulation (tests only): `lanes` threads run sampling/subset_sampler.h
// with a group whose collectives reproduce sampling/cuda/sampling.cu's WarpGroup
// operation by operation (xor butterflies, Hillis-Steele scans), and the dot
// products in the kernel's order (group_dot8: 8 lanes a dot product, FMAs,
// 16-byte packs when `vec`). Compiled without FMA contraction, as the CUDA
// sampler is (--fmad=false), it is the GPU's arithmetic on the host
// (issue 55, Y2); only logf may differ in its last bit (log-probabilities).
// ---------------------------------------------------------------------------
namespace rcn_fast {
namespace {

struct LaneTeam {
  int size;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  float f[32];
  int64_t i[32];

  void barrier() {
    std::unique_lock<std::mutex> lock(mu);
    const uint64_t gen = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
    } else {
      cv.wait(lock, [&] { return generation != gen; });
    }
  }
};

struct EmulatedWarp {
  LaneTeam* team;
  int lane;
  int rank() const { return lane; }
  int size() const { return team->size; }

  template <class T, class Op>
  T butterfly(T x, T* buf, Op op) const {
    buf[lane] = x;
    team->barrier();
    T v[32];
    for (int l = 0; l < team->size; ++l) v[l] = buf[l];
    team->barrier();
    for (int o = team->size / 2; o > 0; o >>= 1) {
      T nv[32];
      for (int l = 0; l < team->size; ++l) nv[l] = op(v[l], v[l ^ o]);
      for (int l = 0; l < team->size; ++l) v[l] = nv[l];
    }
    return v[lane];
  }
  template <class T>
  T exscan(T x, T* buf) const {
    buf[lane] = x;
    team->barrier();
    T v[32];
    for (int l = 0; l < team->size; ++l) v[l] = buf[l];
    team->barrier();
    for (int o = 1; o < team->size; o <<= 1) {
      T nv[32];
      for (int l = 0; l < team->size; ++l) nv[l] = l >= o ? v[l] + v[l - o] : v[l];
      for (int l = 0; l < team->size; ++l) v[l] = nv[l];
    }
    return lane == 0 ? T(0) : v[lane - 1];
  }
  float sum_f(float x) const { return butterfly(x, team->f, [](float a, float b) { return a + b; }); }
  float max_f(float x) const {
    return butterfly(x, team->f, [](float a, float b) { return std::fmax(a, b); });
  }
  float exscan_f(float x) const { return exscan(x, team->f); }
  int64_t sum_i(int64_t x) const {
    return butterfly(x, team->i, [](int64_t a, int64_t b) { return a + b; });
  }
  int64_t exscan_i(int64_t x) const { return exscan(x, team->i); }
  int64_t min_i(int64_t x) const {
    return butterfly(x, team->i, [](int64_t a, int64_t b) { return b < a ? b : a; });
  }
  int64_t max_i(int64_t x) const {
    return butterfly(x, team->i, [](int64_t a, int64_t b) { return b > a ? b : a; });
  }
};

float load_f32(const SamplingProblem& p, int64_t b, int64_t j, int64_t k) {
  const int64_t off = b * p.cand_stride_b + j * p.cand_stride_n + k;
  switch (p.cand_dtype) {
    case DType::F32: return static_cast<const float*>(p.cand)[off];
    case DType::F16: return half_to_float(static_cast<const uint16_t*>(p.cand)[off]);
    default: return bf16_to_float(static_cast<const uint16_t*>(p.cand)[off]);
  }
}

// dot(x, y) over d elements in the order sampling/cuda/sampling.cu's
// group_dot<8, kVec> computes it (common/cuda/vec_load.cuh): lane `sub` of
// 8 takes packs sub, sub + 8, ... of 8 elements (kVec; the last d % 8
// elements one by one, element tail + sub, tail + sub + 8, ...) or elements
// sub, sub + 8, ... (not kVec), each an FMA into its own sum; then the xor
// butterfly over the 8 lanes (s += the partner's s for 4, 2, 1), lane 0's
// sum. x_at(k) and y_at(k) give the elements as float32.
template <class X, class Y>
float group_dot8(const X& x_at, const Y& y_at, int64_t d, bool vec) {
  constexpr int G = 8;
  float v[G];
  for (int sub = 0; sub < G; ++sub) {
    float s = 0.f;
    int64_t tail = 0;
    if (vec) {
      const int64_t packs = d / 8;
      for (int64_t c = sub; c < packs; c += G)
        for (int i = 0; i < 8; ++i) s = std::fma(x_at(c * 8 + i), y_at(c * 8 + i), s);
      tail = packs * 8;
    }
    for (int64_t e = tail + sub; e < d; e += G) s = std::fma(x_at(e), y_at(e), s);
    v[sub] = s;
  }
  for (int o = G / 2; o > 0; o >>= 1) {
    float nv[G];
    for (int l = 0; l < G; ++l) nv[l] = v[l] + v[l ^ o];
    for (int l = 0; l < G; ++l) v[l] = nv[l];
  }
  return v[0];
}

}  // namespace

SamplingResult sample_subsets_lanes(const SamplingProblem& p, int lanes, bool vec) {
  SamplingResult res{SamplingStatus::Ok, -1, -1};
  if (lanes < 1 || lanes > 32 || (lanes & (lanes - 1)) != 0)
    throw std::invalid_argument("lanes: expected a power of two in [1, 32]");
  const int64_t n = p.n, d = p.d, N = p.num_subsets, K = p.subset_size;
  std::vector<float> rel(size_t(p.B * n));
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t j = 0; j < n; ++j) {
      const float s = group_dot8([&](int64_t k) { return p.query[b * p.query_stride + k]; },
                                 [&](int64_t k) { return load_f32(p, b, j, k); }, d, vec);
      rel[size_t(b * n + j)] = s;
      const bool valid = p.mask == nullptr || p.mask[b * n + j] != 0;
      if (valid && !std::isfinite(s) && res.status == SamplingStatus::Ok)
        res = {SamplingStatus::NonFiniteCandidate, b, j};
    }
  if (res.status != SamplingStatus::Ok) return res;
  std::vector<float> acc(static_cast<size_t>(n)), w(static_cast<size_t>(n));
  std::vector<uint8_t> elig(static_cast<size_t>(n));
  LaneTeam team;
  team.size = lanes;
  run_threads_together(lanes, [&](int lane) {
    const EmulatedWarp g{&team, lane};
    for (int64_t item = 0; item < p.B * N; ++item) {
      const int64_t b = item / N, s = item % N;
      if (lane == 0)
        for (int64_t j = 0; j < n; ++j) {
          acc[size_t(j)] = 0.f;
          elig[size_t(j)] = p.mask == nullptr ? 1 : (p.mask[b * n + j] != 0);
        }
      team.barrier();
      const sampler::StepArgs a =
          sampler::step_args(p, b, s, rel.data() + b * n, acc.data(), elig.data(), w.data());
      bool stop = false;
      for (int64_t t = 0; t < K && !stop; ++t) {
        const sampler::Draw dr = sampler::sample_step(g, a, t);
        if (lane == 0) {
          if (dr.index == sampler::kNonFinite) {
            if (res.status == SamplingStatus::Ok) res = {SamplingStatus::NonFiniteScore, b, -1};
          } else {
            p.ids_out[item * K + t] = dr.index;
            if (p.logp_out) p.logp_out[item * K + t] = dr.logp;
            if (dr.index >= 0) {
              elig[size_t(dr.index)] = 0;
              for (int64_t j = 0; j < n; ++j) {
                if (!elig[size_t(j)]) continue;  // the kernel adds only to eligible candidates
                const float sim = group_dot8([&](int64_t k) { return load_f32(p, b, dr.index, k); },
                                             [&](int64_t k) { return load_f32(p, b, j, k); }, d, vec);
                acc[size_t(j)] += sim;
              }
            }
          }
        }
        stop = dr.index == sampler::kNonFinite;  // the same on every lane
        team.barrier();
      }
      if (stop) break;
    }
  });
  return res;
}

}  // namespace rcn_fast
