#include "llm/cpu/quant_kernels.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/cpu/parallel.h"
#include "common/cpu/simd.h"
#include "llm/quant_blocks.h"

namespace rcn_fast {

int64_t qgemm_scratch_floats(int64_t K) { return 4 * (K + 16); }

namespace {

#define RCN_KERNELS(ns) \
  QuantKernels { #ns, 0, &ns::qgemm, &ns::iqgemm, &ns::quantize_x, &ns::attend, &ns::silu_mul }
const QuantKernels kGeneric = RCN_KERNELS(generic);
#if RCN_HAVE_AVX2
const QuantKernels kAvx2 = RCN_KERNELS(avx2);
#endif
#if RCN_HAVE_AVX512
const QuantKernels kAvx512 = RCN_KERNELS(avx512);
const QuantKernels kAvx512Vnni = RCN_KERNELS(avx512vnni);
#endif
#undef RCN_KERNELS

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
  const QuantKernels* best = quant_kernels_named("avx512vnni");
  if (best == nullptr) best = quant_kernels_named("avx512");
  if (best == nullptr) best = quant_kernels_named("avx2");
  if (best == nullptr) best = quant_kernels_named("generic");
  Choice c{*best, ""};
  if (const char* env = std::getenv("RCN_FAST_SIMD")) {
    const QuantKernels* want = quant_kernels_named(env);
    if (want != nullptr) {
      c.k = *want;
      c.note = std::string("RCN_FAST_SIMD=") + env;
    } else {
      c.note = std::string("RCN_FAST_SIMD='") + env + "' is not compiled in or not supported here (generic|avx2|avx512|avx512vnni); ignored";
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
  static const QuantKernels a5v = with_lanes(kAvx512Vnni, &avx512vnni::lanes);
  if (name == "avx512vnni" && cpu_supports_avx512vnni()) return &a5v;
#endif
  return nullptr;
}

std::string quant_compiled() {
  std::string s = "generic";
#if RCN_HAVE_AVX2
  s += ",avx2";
#endif
#if RCN_HAVE_AVX512
  s += ",avx512,avx512vnni";
#endif
  return s;
}

int64_t quant_chunk_rows(int64_t N, int threads) {
  if (threads <= 1) return std::max<int64_t>(kPackRows, (N + kPackRows - 1) / kPackRows * kPackRows);
  const int64_t c = (N + int64_t(threads) * 8 - 1) / (int64_t(threads) * 8);
  return std::max<int64_t>(kPackRows, (c + kPackRows - 1) / kPackRows * kPackRows);
}

PackedCopy pack_weights(int qtype, const uint8_t* w, int64_t N, int64_t K, int64_t row_bytes, int num_threads) {
  PackedCopy p;
  const QType t = QType(qtype);
  const int64_t bytes = packed_bytes(t, N, K);
  if (bytes == 0) return p;
  p.bytes = bytes;
  p.data.reset(static_cast<uint8_t*>(::operator new[](size_t(bytes), std::align_val_t(64))));
  const int64_t groups = N / kPackRows;
  const int threads = int(std::max<int64_t>(1, std::min<int64_t>(num_threads > 0 ? num_threads : default_num_threads(),
                                                                    groups / 64 + 1)));
  run_threads(threads, [&](int i) {
    pack_groups(t, w, row_bytes, K, groups * i / threads, groups * (i + 1) / threads, p.data.get());
  });
  return p;
}

void quant_matmul(const QGemmArgs& a_in, int64_t N, int num_threads, const QuantKernels& k, bool q8) {
  QGemmArgs a = a_in;
  std::vector<uint8_t> xq;
  const QType qt = QType(a.qtype);
  if (q8 && qtype_is_blocked(qt) && a.xq == nullptr) {  // quantised once, before the threads
    a.xq_stride = xq_row_bytes(qt, a.K);
    xq.resize(size_t(a.xq_stride * a.M));
    k.quantize_x(a.qtype, a.x, a.x_stride, a.M, a.K, xq.data(), a.xq_stride);
    a.xq = xq.data();
  }
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
      run_qgemm(k, a, n0, std::min(N, n0 + chunk), bufs[size_t(t)].data());
    }
  });
}

}  // namespace rcn_fast
