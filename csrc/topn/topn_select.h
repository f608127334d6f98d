// The running top-k selection of the CUDA top-n scan (topn/cuda/topn_mma.cu),
// written once for a group of cooperating lanes: a CUDA warp or block, or
// one host thread (topn/cpu/topn_select_emulated.cpp runs the same code to test it on the
// CPU). Ordering rules: topn/topn_order.h.
//
// Each query's selection is a Run (count, buffer fill, threshold) and
// `slots` (score, id) entries: the kept list, best first, in [0, list), and
// a buffer of candidates in [list, list + buf). A candidate is admitted to
// the buffer only when it is admissible and beats the threshold, the k-th
// entry of the list (any admissible one while the list holds fewer than k):
// once the list is full, almost nothing passes (the design of RAFT's
// warp_sort_filtered and FAISS's WarpSelect, with the buffer in shared
// memory). The scan offers candidates in rounds of at most `round` per
// query; between rounds, a run whose buffer could overflow in the next
// round is flushed: list and buffer are sorted together by (score desc,
// id asc) with a bitonic network and the first k kept, which raises the
// threshold.
//
// The protocol every caller follows (topn/cuda/topn_mma.cu, topn/cpu/topn_select_emulated.cpp):
// offers of one round; a barrier; every lane of a run's group reads
// needs_flush(); a barrier before the next round's offers can move nbuf
// (or, as the scan does, one barrier after the flushes); flush() and
// finish() are collective over the group.
//
// Also here: the split of a float32 query into terms of a half-precision
// corpus dtype, so a tensor-core GEMM of corpus-dtype inputs with float32
// accumulation scores a float32 query (the same split as
// rcn_fast/search/torch_backend.py).
#pragma once
#include <cstdint>

#include "common/dtypes.h"
#include "common/macros.h"
#include "topn/topn_order.h"

namespace rcn_fast::topn_select {

RCN_HD int next_pow2(int x) {
  int p = 1;
  while (p < x) p <<= 1;
  return p;
}

// Sizes of one query's selection.
struct Layout {
  int k;      // entries kept
  int list;   // slots of the kept list: k rounded up to a power of two
  int buf;    // slots of the buffer: >= 2 * round
  int slots;  // list + buf, a power of two (the sort's width)
  int round;  // candidates a run may gain between two flush checks
};

RCN_HD Layout layout(int k, int round) {
  Layout L{};
  L.k = k;
  L.list = next_pow2(k);
  L.round = round;
  L.slots = next_pow2(L.list + 2 * round);
  L.buf = L.slots - L.list;
  return L;
}

template <class Id>
struct Run {
  int count;  // entries in the list (<= k)
  int nbuf;   // candidates in the buffer
  float thr_s;  // the list's k-th entry once count == k
  Id thr_id;
};

template <class Id>
RCN_HD Id pad_id() {
  return Id(~Id(0)) > Id(0) ? Id(~Id(0)) : Id(-1);  // unsigned: the largest; signed: -1
}

template <class Id>
RCN_HD void init(Run<Id>& r) {
  r.count = 0;
  r.nbuf = 0;
  r.thr_s = -bits_to_float(0x7f800000u);
  r.thr_id = pad_id<Id>();
}

// Whether a candidate can still be among the k best.
template <class Id>
RCN_HD bool admits(const Run<Id>& r, int k, float s, Id id) {
  return topn_admissible(s) && (r.count < k || topn_better(s, id, r.thr_s, r.thr_id));
}

// One lane offers one candidate (not a collective call). `claim(&nbuf)`
// returns a fresh buffer slot (an atomic add on the device).
template <class G, class Id>
RCN_HD void offer(const G& g, Run<Id>& r, float* s, Id* id, const Layout& L, float score, Id i) {
  if (!admits(r, L.k, score, i)) return;
  const int slot = g.claim(&r.nbuf);
  s[L.list + slot] = score;
  id[L.list + slot] = i;
}

// Bitonic sort of n (a power of two) entries by (score desc, id asc); the
// group's lanes take the n / 2 compare-exchanges of each pass in turn.
template <class G, class Id>
RCN_HD void bitonic_sort(const G& g, float* s, Id* id, int n) {
  const int half = n >> 1;
  for (int size = 2; size <= n; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int p = g.rank(); p < half; p += g.size()) {
        const int i = 2 * stride * (p / stride) + (p % stride), j = i + stride;
        const bool best_first = (i & size) == 0;
        const bool swap = best_first ? topn_better(s[j], id[j], s[i], id[i])
                                     : topn_better(s[i], id[i], s[j], id[j]);
        if (swap) {
          const float ts = s[i];
          s[i] = s[j];
          s[j] = ts;
          const Id ti = id[i];
          id[i] = id[j];
          id[j] = ti;
        }
      }
      g.sync();
    }
  }
}

// Whether `r` must be flushed before the next round.
template <class Id>
RCN_HD bool needs_flush(const Run<Id>& r, const Layout& L) {
  return r.nbuf > L.buf - L.round;
}

// Collective: merge the buffer into the list (sort both, keep k).
template <class G, class Id>
RCN_HD void flush(const G& g, Run<Id>& r, float* s, Id* id, const Layout& L) {
  const int count = r.count, nbuf = r.nbuf;
  const float ninf = -bits_to_float(0x7f800000u);
  for (int i = g.rank(); i < L.slots; i += g.size()) {
    const bool used = i < count || (i >= L.list && i < L.list + nbuf);
    if (!used) {
      s[i] = ninf;
      id[i] = pad_id<Id>();
    }
  }
  g.sync();
  bitonic_sort(g, s, id, L.slots);
  if (g.rank() == 0) {
    const int c = count + nbuf < L.k ? count + nbuf : L.k;  // every buffered entry is admissible
    r.count = c;
    r.nbuf = 0;
    if (c == L.k) {
      r.thr_s = s[L.k - 1];
      r.thr_id = id[L.k - 1];
    }
  }
  g.sync();
}

// Collective: the final list into out_s / out_i [k] (ids + id_base), padded
// with (-inf, -1).
template <class G, class Id>
RCN_HD void finish(const G& g, Run<Id>& r, float* s, Id* id, const Layout& L, float* out_s, int64_t* out_i,
                   int64_t id_base) {
  if (r.nbuf > 0) flush(g, r, s, id, L);
  const int count = r.count;
  const float ninf = -bits_to_float(0x7f800000u);
  for (int i = g.rank(); i < L.k; i += g.size()) {
    const bool real = i < count;
    out_s[i] = real ? s[i] : ninf;
    out_i[i] = real ? id_base + int64_t(id[i]) : int64_t(-1);
  }
  g.sync();
}

// ---------------------------------------------------------------- query split
// A float32 query row scaled by the power of two that brings its largest
// finite magnitude below 1 (below 2 for magnitudes >= 2^127), then written
// as `terms` values of the corpus dtype, term t shifted by 2^(shift * t):
// q = sum_t scale_t * term_t with scale_t = row_scale * 2^(-shift * t), to
// within 2^-24 of the row's largest magnitude (float16, two terms) or
// exactly (bfloat16, three terms). A non-finite value (+-inf, NaN) is the
// first term as it is and zero in the others, so a GEMM of the terms
// scores it as a float32 GEMM would: +-inf times a corpus value is +-inf
// (NaN for 0), NaN stays NaN, whatever else the row holds. A query in the
// corpus dtype is one term with scale 1.
struct SplitSpec {
  int terms;
  int shift;
};

RCN_HD SplitSpec split_spec(DType corpus, DType query) {
  if (query == corpus || corpus == DType::F32) return SplitSpec{1, 0};
  return corpus == DType::F16 ? SplitSpec{2, 12} : SplitSpec{3, 9};
}

// 2^e for -149 <= e <= 127.
RCN_HD float pow2f(int e) {
  return e >= -126 ? bits_to_float(uint32_t(e + 127) << 23) : bits_to_float(1u << (e + 149));
}

// The row scale 2^e of a row whose largest finite magnitude is `maxabs`
// (0 when the row holds no finite nonzero value: scale 1).
RCN_HD float split_row_scale(float maxabs) {
  const uint32_t u = float_to_bits(maxabs) & 0x7FFFFFFFu;
  if (u == 0) return 1.0f;
  int e;
  const uint32_t E = u >> 23;
  if (E != 0) {
    e = int(E) - 126;  // maxabs = 1.m * 2^(E-127) = 0.1m * 2^(E-126)
  } else {
    int bits = 0;  // subnormal: maxabs = u * 2^-149
    for (uint32_t m = u; m; m >>= 1) ++bits;
    e = bits - 149;
  }
  return pow2f(e > 127 ? 127 : e);
}

template <DType T>
RCN_HD uint16_t to_half_bits(float x) {
  static_assert(T != DType::F32, "terms are float16 or bfloat16");
  return T == DType::F16 ? float_to_half_bits(x) : float_to_bf16_bits(x);
}

// Whether a magnitude counts for the row scale (finite).
RCN_HD float finite_magnitude(float x) {
  const float a = x < 0 ? -x : x;
  return a <= 3.402823466e38f ? a : 0.f;  // inf and NaN: 0
}

// The terms of one element x (already divided by the row scale), written to
// out[0], out[stride], ...
template <DType T>
RCN_HD void split_value(float x, const SplitSpec& sp, uint16_t* out, int64_t stride) {
  if (!(x - x == 0.f)) {  // +-inf or NaN: itself, then zeros
    out[0] = to_half_bits<T>(x);
    for (int t = 1; t < sp.terms; ++t) out[t * stride] = 0;
    return;
  }
  float r = x;
  for (int t = 0; t < sp.terms; ++t) {
    const float f = pow2f(sp.shift * t);
    const uint16_t h = to_half_bits<T>(r * f);
    out[t * stride] = h;
    r = r - load_as_float<T>(&h) * pow2f(-sp.shift * t);
  }
}

}  // namespace rcn_fast::topn_select
