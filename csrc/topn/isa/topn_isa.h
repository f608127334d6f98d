// Interface between the top-n driver (topn/cpu/topn.cpp, baseline flags) and the
// ISA-specific scan kernels (topn/isa/topn_scan.cpp, compiled once per SIMD
// variant). Declarations and plain structs only: no inline code may live
// here, so no function compiled with AVX2 can be picked by the linker for
// the baseline build.
#pragma once
#include <cstdint>

namespace rcn_fast {

// Per-thread candidate buffers, one per query. A score enters query q's
// buffer when it beats thr[q]; a full buffer is compacted to the best k
// (topn_compact) and thr[q] becomes the k-th score.
struct TopnCollector {
  float* scores;    // [Q, cap]
  int64_t* ids;     // [Q, cap]
  int64_t* count;   // [Q]
  float* thr;       // [Q]
  int64_t cap;      // > k
  int64_t k;
  void* scratch;    // [cap] (score, id) pairs for topn_compact, owned by the caller (no thread_local:
                    // glibc aborts when it cannot allocate a dlopen'd module's TLS)
};

// Defined in topn/cpu/topn.cpp (baseline flags).
void topn_compact(TopnCollector* c, int64_t q);

struct TopnScanArgs {
  const float* qrows;   // [Q, d] float32, contiguous
  const float* qpack;   // [ceil(Q/16), d, 16] float32, zero padded
  int64_t Q, d;
  const void* corpus;   // rows of d elements of `dtype`
  int dtype;            // DType
  int64_t row_stride;   // elements between corpus rows
  int64_t row_begin, row_end;  // this thread's rows
  float* work;          // topn_workspace_floats(d) floats
  TopnCollector* col;
};

// Scratch each scan thread needs, in floats.
int64_t topn_workspace_floats(int64_t d);
// Queries up to this count take the matrix-vector path.
constexpr int64_t kTopnGemvMaxQueries = 4;
constexpr int64_t kTopnBlockRows = 96;  // corpus rows per block (multiple of 6)
constexpr int64_t kTopnDepth = 256;     // d-slice kept in L1 per micro-kernel call

namespace generic {
void topn_scan(const TopnScanArgs& a);
}
namespace avx2 {
void topn_scan(const TopnScanArgs& a);
}

}  // namespace rcn_fast
