// The int8 bounded scan on the CPU (topn/topn_int8.h; the CUDA kernels are
// topn/cuda/topn_int8.h): the intervals lo / hi [Q, N] of TopnInt8Problem,
// and the search's candidates, filtered while the scan runs.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/problems.h"
#include "topn/isa/topn_int8_isa.h"

namespace rcn_fast {

// One compiled variant of the scan's kernel (topn/isa/topn_int8_scan.cpp).
struct Int8Isa {
  const char* name;                       // generic, avx2, avx512vnni, avxvnni
  void (*intervals)(const Int8TileArgs&);
  bool q16;                               // takes the 16-bit query terms
};

// The variant named `name` where it is compiled in and this CPU runs it;
// null otherwise. "" names the one in use: the widest this CPU runs
// (avx512vnni, avxvnni, avx2, generic), unless RCN_FAST_SIMD names another
// (generic | avx2 | avx512 (= avx512vnni) | avx512vnni | avxvnni).
const Int8Isa* int8_isa_named(const std::string& name);
// The variants compiled into this build, e.g. "generic,avx2,avx512vnni,avxvnni".
std::string int8_isa_compiled();

void topn_int8_intervals(const TopnInt8Problem& p, int num_threads, const Int8Isa& isa);

// The candidates of an exact top-k search by the bounded scan: for each
// query, the rows with hi >= T, T the k-th largest lo of the query over all
// rows (-inf when fewer than k rows), in ascending row order. Threads split
// the rows; each keeps, per query, its rows' k largest lo (its k-th is a
// running bound, never above T) and the rows whose hi reaches that bound,
// so the scan writes no [Q, N] intervals. p.lo / p.hi are not used.
struct Int8Candidates {
  std::vector<int64_t> counts;  // [Q]
  std::vector<int64_t> ids;     // sum(counts), query after query
};
Int8Candidates topn_int8_candidates(const TopnInt8Problem& p, int64_t k, int num_threads, const Int8Isa& isa);

}  // namespace rcn_fast
