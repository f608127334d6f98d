#include "llm/cpu/quant_kernels.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/cpu/parallel.h"
#include "common/cpu/simd.h"

namespace rcn_fast {

int64_t qgemm_scratch_floats(int64_t K) { return 4 * (K + 16); }

namespace {

const QuantKernels kGeneric{"generic", 0, &generic::qgemm, &generic::attend, &generic::silu_mul};
#if RCN_HAVE_AVX2
const QuantKernels kAvx2{"avx2", 0, &avx2::qgemm, &avx2::attend, &avx2::silu_mul};
#endif
#if RCN_HAVE_AVX512
const QuantKernels kAvx512{"avx512", 0, &avx512::qgemm, &avx512::attend, &avx512::silu_mul};
#endif

QuantKernels with_lanes(const QuantKernels& k, int (*lanes)()) {
  QuantKernels out = k;
  out.lanes = lanes();
  return out;
}

struct Choice {
  QuantKernels k;
  std::string note;
};

Choice choose() {
  // the widest variant compiled in and supported here
  const QuantKernels* best = quant_kernels_named("avx512");
  if (best == nullptr) best = quant_kernels_named("avx2");
  if (best == nullptr) best = quant_kernels_named("generic");
  Choice c{*best, ""};
  if (const char* env = std::getenv("RCN_FAST_SIMD")) {
    const QuantKernels* want = quant_kernels_named(env);
    if (want != nullptr) {
      c.k = *want;
      c.note = std::string("RCN_FAST_SIMD=") + env;
    } else {
      c.note = std::string("RCN_FAST_SIMD='") + env + "' is not compiled in or not supported here (generic|avx2|avx512); ignored";
    }
  }
  return c;
}

const Choice& choice() {
  static const Choice c = choose();
  return c;
}

}  // namespace

const QuantKernels& quant_kernels() { return choice().k; }
std::string quant_note() { return choice().note; }

const QuantKernels* quant_kernels_named(const std::string& name) {
  static const QuantKernels g = with_lanes(kGeneric, &generic::lanes);
  if (name == "generic") return &g;
#if RCN_HAVE_AVX2
  static const QuantKernels a2 = with_lanes(kAvx2, &avx2::lanes);
  if (name == "avx2" && cpu_supports_avx2()) return &a2;
#endif
#if RCN_HAVE_AVX512
  static const QuantKernels a5 = with_lanes(kAvx512, &avx512::lanes);
  if (name == "avx512" && cpu_supports_avx512()) return &a5;
#endif
  return nullptr;
}

std::string quant_compiled() {
  std::string s = "generic";
#if RCN_HAVE_AVX2
  s += ",avx2";
#endif
#if RCN_HAVE_AVX512
  s += ",avx512";
#endif
  return s;
}

int64_t quant_chunk_rows(int64_t N, int threads) {
  if (threads <= 1) return std::max<int64_t>(4, (N + 3) / 4 * 4);
  const int64_t c = (N + int64_t(threads) * 8 - 1) / (int64_t(threads) * 8);
  return std::max<int64_t>(4, (c + 3) / 4 * 4);
}

void quant_matmul(const QGemmArgs& a, int64_t N, int num_threads, const QuantKernels& k) {
  int threads = num_threads > 0 ? num_threads : default_num_threads();
  // no more threads than chunks of 4 rows, nor than the work warrants (~64k multiply-adds each)
  const int64_t work = std::max<int64_t>(1, a.M * N * a.K / 65536);
  threads = int(std::max<int64_t>(1, std::min<int64_t>({int64_t(threads), (N + 3) / 4, work})));
  const int64_t chunk = quant_chunk_rows(N, threads);
  const size_t scratch = size_t(qgemm_scratch_floats(a.K));
  std::vector<std::vector<float>> bufs(static_cast<size_t>(threads));
  for (auto& b : bufs) b.resize(scratch);
  std::atomic<int64_t> next{0};
  run_threads(threads, [&](int t) {
    for (;;) {
      const int64_t n0 = next.fetch_add(chunk);
      if (n0 >= N) break;
      k.qgemm(a, n0, std::min(N, n0 + chunk), bufs[size_t(t)].data());
    }
  });
}

}  // namespace rcn_fast
