// Llama forward pass (llm/cpu/decoder.h). One parallel region per call: every
// thread walks the same sequence of steps (embedding, then per layer: norm,
// q/k/v, rope + cache write, attention, output projection, norm, gate/up
// with SiLU, down projection; then the final norm and the LM head) and
// takes its share of each step from a per-step counter (rows of a weight
// matrix, tokens, or (token, kv head) pairs), with a spinning barrier where
// a step needs the previous one complete. Work is taken dynamically, so a
// thread the OS pauses on a busy machine holds the others up only by the
// chunk it is in.
#include "llm/cpu/decoder.h"

#include <algorithm>
#include <initializer_list>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "llm/quant_blocks.h"
#include "common/cpu/parallel.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define RCN_CPU_RELAX() _mm_pause()
#else
#define RCN_CPU_RELAX() ((void)0)
#endif

namespace rcn_fast {
namespace {

// Generation-counting barrier: spins first (the wait is usually a few
// microseconds when every thread has a core), then sleeps on a condition
// variable, so on a machine with more runnable threads than cores a waiting
// thread gives its core to the one it waits for instead of burning it.
class SpinBarrier {
 public:
  explicit SpinBarrier(int n) : n_(n) {}
  void wait() {
    if (n_ <= 1) return;
    const int gen = gen_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) == n_ - 1) {
      count_.store(0, std::memory_order_relaxed);
      {
        std::lock_guard<std::mutex> lock(m_);
        gen_.fetch_add(1, std::memory_order_acq_rel);
      }
      if (sleepers_.load(std::memory_order_acquire) > 0) cv_.notify_all();
      return;
    }
    for (int spins = 0; spins < kSpins; ++spins) {
      if (gen_.load(std::memory_order_acquire) != gen) return;
      RCN_CPU_RELAX();
    }
    std::unique_lock<std::mutex> lock(m_);
    sleepers_.fetch_add(1, std::memory_order_acq_rel);
    cv_.wait(lock, [&] { return gen_.load(std::memory_order_acquire) != gen; });
    sleepers_.fetch_sub(1, std::memory_order_acq_rel);
  }

 private:
  static constexpr int kSpins = 2000;  // some tens of microseconds of pause instructions
  const int n_;
  alignas(64) std::atomic<int> count_{0};
  alignas(64) std::atomic<int> gen_{0};
  std::atomic<int> sleepers_{0};
  std::mutex m_;
  std::condition_variable cv_;
};

void need(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument(what);
}

void check_mat(const QMat& m, int64_t N, int64_t K, const std::string& name) {
  need(m.data != nullptr, name + ": missing");
  need(qtype_known(m.qtype), name + ": unsupported GGML type " + std::to_string(m.qtype) +
                                 " (supported: " + qtype_supported_names() + ")");
  need(m.N == N && m.K == K, name + ": expected shape [" + std::to_string(N) + ", " + std::to_string(K) + "], got [" +
                                 std::to_string(m.N) + ", " + std::to_string(m.K) + "]");
  const int64_t block = qtype_block(QType(m.qtype));
  need(K % block == 0, name + ": a " + qtype_name(QType(m.qtype)) + " row needs a multiple of " +
                           std::to_string(block) + " elements, got " + std::to_string(K));
  need(m.row_bytes == qtype_row_bytes(QType(m.qtype), K), name + ": row size does not match its type");
}

}  // namespace

void llama_check_weights(const LlamaWeights& w) {
  const LlamaHParams& h = w.hp;
  need(h.n_layer >= 1 && h.n_embd >= 1 && h.n_head >= 1 && h.n_head_kv >= 1 && h.n_ff >= 1 && h.n_vocab >= 1,
       "hparams: expected positive sizes");
  need(h.n_head % h.n_head_kv == 0 && h.n_head / h.n_head_kv <= 64,
       "hparams: n_head must be a multiple of n_head_kv, at most 64 times it");
  need(h.head_dim >= 1 && h.head_dim <= 512, "hparams: head_dim must be in [1, 512]");
  need(h.rope_dim >= 0 && h.rope_dim <= h.head_dim && h.rope_dim % 2 == 0,
       "hparams: rope_dim must be even and at most head_dim");
  need(std::isfinite(h.rope_scale) && h.rope_scale > 0.0f && std::isfinite(h.rope_base) && h.rope_base > 0.0f &&
           std::isfinite(h.eps) && h.eps >= 0.0f,
       "hparams: rope_base, rope_scale and eps must be finite and positive");
  need(int64_t(w.layers.size()) == h.n_layer, "layers: expected n_layer layers");
  if (w.rope_freqs != nullptr)
    for (int j = 0; j < h.rope_dim / 2; ++j)
      need(std::isfinite(w.rope_freqs[j]) && w.rope_freqs[j] > 0.0f, "rope_freqs: expected finite values > 0");
  need(w.out_norm != nullptr, "output_norm: missing");
  const int64_t H = h.n_embd, Q = int64_t(h.n_head) * h.head_dim, D = int64_t(h.n_head_kv) * h.head_dim;
  check_mat(w.tok_embd, h.n_vocab, H, "token_embd");
  check_mat(w.output, h.n_vocab, H, "output");
  for (int l = 0; l < h.n_layer; ++l) {
    const LlamaLayerWeights& L = w.layers[size_t(l)];
    const std::string p = "blk." + std::to_string(l) + ".";
    need(L.attn_norm != nullptr && L.ffn_norm != nullptr, p + "attn_norm/ffn_norm: missing");
    check_mat(L.wq, Q, H, p + "attn_q");
    check_mat(L.wk, D, H, p + "attn_k");
    check_mat(L.wv, D, H, p + "attn_v");
    check_mat(L.wo, H, Q, p + "attn_output");
    check_mat(L.gate, h.n_ff, H, p + "ffn_gate");
    check_mat(L.up, h.n_ff, H, p + "ffn_up");
    check_mat(L.down, H, h.n_ff, p + "ffn_down");
  }
}

void llama_forward(const LlamaWeights& w, const LlamaBatch& b, int num_threads, const QuantKernels& k,
                   LlamaWorkspace& ws) {
  const LlamaHParams& h = w.hp;
  const int64_t n = b.n, H = h.n_embd, HD = h.head_dim, NH = h.n_head, KVH = h.n_head_kv;
  const int64_t Q = NH * HD, D = KVH * HD, FF = h.n_ff, G = NH / KVH, half = h.rope_dim / 2;
  need(n >= 1, "tokens: expected at least one token");
  need(b.n_out >= 0 && b.n_out <= n, "out_rows: expected at most one per token");
  for (int64_t i = 0; i < n; ++i) {
    need(b.tokens[i] >= 0 && b.tokens[i] < h.n_vocab,
         "tokens[" + std::to_string(i) + "]: expected an id in [0, " + std::to_string(h.n_vocab) + "), got " +
             std::to_string(b.tokens[i]));
    need(b.slots[i] >= 0 && b.slots[i] < b.n_slots,
         "slots[" + std::to_string(i) + "]: expected a slot in [0, " + std::to_string(b.n_slots) + ")");
    need(b.pos[i] >= 0 && b.pos[i] < b.ctx,
         "positions[" + std::to_string(i) + "]: expected a position in [0, " + std::to_string(b.ctx) + ")");
  }
  {
    std::vector<int64_t> cells(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) cells[size_t(i)] = int64_t(b.slots[i]) * b.ctx + b.pos[i];
    std::sort(cells.begin(), cells.end());
    need(std::adjacent_find(cells.begin(), cells.end()) == cells.end(),
         "positions: two tokens of the batch write the same (slot, position)");
  }
  for (int64_t j = 0; j < b.n_out; ++j)
    need(b.out_rows[j] >= 0 && b.out_rows[j] < n, "out_rows: expected token indices in [0, n)");

  int threads = num_threads > 0 ? num_threads : default_num_threads();
  threads = int(std::max<int64_t>(1, std::min<int64_t>(threads, 64)));

  // Every buffer is carved from the workspace here, before the threads
  // start; the workspace only grows, so steady decoding allocates nothing
  // (fresh pages would be zeroed by the kernel on every call).
  int64_t maxpos = 0;
  for (int64_t i = 0; i < n; ++i) maxpos = std::max<int64_t>(maxpos, b.pos[i]);
  const int64_t kmax = std::max<int64_t>({H, FF, Q});
  const int64_t per_thread = (qgemm_scratch_floats(kmax) + G * (maxpos + 1) + 16 + 15) / 16 * 16;
  const int64_t hr = n * std::max<int64_t>(half, 1);
  // this thread's 8-bit copies of a product's input (llama.cpp's arithmetic), both block formats
  const int64_t xq32 = b.q8 ? n * xq_row_bytes(QType::Q8_0, kmax / 32 * 32) : 0;
  const int64_t xq256 = b.q8 ? n * xq_row_bytes(QType::Q4_K, kmax / 256 * 256) : 0;
  const int64_t xq_floats = (xq32 + xq256 + 63) / 64 * 16;
  const int64_t sizes[] = {n * H, n * Q, n * D, n * D, n * Q, n * FF, n * FF, hr, hr, per_thread * threads,
                           int64_t(threads) * n * H, half, xq_floats * threads};
  constexpr int kBufs = int(sizeof sizes / sizeof sizes[0]);
  int64_t total = 0;
  for (int64_t sz : sizes) total += (sz + 15) / 16 * 16;
  float* base = ws.get(size_t(total));
  float* bufs[kBufs];
  for (int i = 0; i < kBufs; ++i) {
    bufs[i] = base;
    base += (sizes[i] + 15) / 16 * 16;
  }
  float *x = bufs[0], *q = bufs[1], *kb = bufs[2], *vb = bufs[3], *att = bufs[4], *gb = bufs[5], *ub = bufs[6];
  float *rc = bufs[7], *rs = bufs[8], *scratch = bufs[9], *xn = bufs[10], *inv = bufs[11], *xqb = bufs[12];
  // the parallel steps (calls of `each` below, one counter each): the
  // embedding; per layer q/k/v, attention, output projection, gate/up, down;
  // the LM head (logits only)
  const int steps = 2 + h.n_layer * 5;
  std::unique_ptr<std::atomic<int64_t>[]> counters(new std::atomic<int64_t>[size_t(steps)]);
  for (int s = 0; s < steps; ++s) counters[size_t(s)].store(0, std::memory_order_relaxed);
  SpinBarrier barrier(threads);

  // rope angles per token (as transformers computes them: float32 inverse
  // frequencies, divided by the rope_freqs entry and the linear scale where
  // the model has them, times the float32 position)
  for (int64_t j = 0; j < half; ++j) {
    inv[j] = 1.0f / std::pow(h.rope_base, float(2 * j) / float(h.rope_dim));
    if (w.rope_freqs != nullptr) inv[j] /= w.rope_freqs[j];
    if (h.rope_scale != 1.0f) inv[j] /= h.rope_scale;
  }
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < half; ++j) {
      const float th = float(b.pos[i]) * inv[j];
      rc[i * half + j] = std::cos(th);
      rs[i * half + j] = std::sin(th);
    }

  const float scale = 1.0f / std::sqrt(float(HD));
  auto rmsnorm = [&](const float* in, const float* wt, float* out) {
    float ss = 0.0f;
    for (int64_t i = 0; i < H; ++i) ss += in[i] * in[i];
    const float r = 1.0f / std::sqrt(ss / float(H) + h.eps);
    for (int64_t i = 0; i < H; ++i) out[i] = wt[i] * (in[i] * r);
  };
  auto rope = [&](float* v, int64_t i) {
    const float* c = rc + i * half;
    const float* s = rs + i * half;
    for (int64_t j = 0; j < half; ++j) {
      const int64_t a = h.rope_neox ? j : 2 * j, bb = h.rope_neox ? j + half : 2 * j + 1;
      const float x0 = v[a], x1 = v[bb];
      v[a] = x0 * c[j] - x1 * s[j];
      v[bb] = x1 * c[j] + x0 * s[j];
    }
  };

  run_threads_together(threads, [&](int t) {
    float* scr = scratch + int64_t(t) * per_thread;
    float* scores = scr + qgemm_scratch_floats(kmax);
    int step = 0;
    // items [0, count) in chunks of `chunk`, taken from this step's counter
    auto each = [&](int64_t count, int64_t chunk, auto&& fn) {
      std::atomic<int64_t>& c = counters[size_t(step++)];
      for (;;) {
        const int64_t i0 = c.fetch_add(chunk, std::memory_order_relaxed);
        if (i0 >= count) break;
        fn(i0, std::min(count, i0 + chunk));
      }
    };
    // the 8-bit copies of `in` (M rows of K, ins apart) the products with `mats` need, made by this thread
    uint8_t* q32 = reinterpret_cast<uint8_t*>(xqb + int64_t(t) * xq_floats);
    uint8_t* q256 = q32 + xq32;
    auto quantize_for = [&](std::initializer_list<const QMat*> mats, const float* in, int64_t ins, int64_t M,
                            int64_t K) {
      if (!b.q8) return;
      bool need32 = false, need256 = false;
      for (const QMat* m : mats) {
        need32 = need32 || xq_block(QType(m->qtype)) == kQuantBlock;
        need256 = need256 || xq_block(QType(m->qtype)) == kSuperBlock;
      }
      if (need32) k.quantize_x(int(QType::Q8_0), in, ins, M, K, q32, xq_row_bytes(QType::Q8_0, K));
      if (need256) k.quantize_x(int(QType::Q4_K), in, ins, M, K, q256, xq_row_bytes(QType::Q4_K, K));
    };
    auto args = [&](const QMat& m, const float* in, int64_t ins, int64_t M, const float* bias, float* out,
                    int64_t outs, bool acc) {
      QGemmArgs a{in, ins, M, m.data, m.row_bytes, m.qtype, m.K, bias, out, outs, acc};
      const int64_t blk = b.q8 ? xq_block(QType(m.qtype)) : 0;
      if (blk != 0) {
        a.xq = blk == kQuantBlock ? q32 : q256;
        a.xq_stride = xq_row_bytes(QType(m.qtype), m.K);
        a.wp = m.packed;
      }
      return a;
    };
    auto matmul = [&](const QMat& m, const float* in, int64_t ins, int64_t M, float* out, int64_t outs,
                      const float* bias, bool acc) {
      quantize_for({&m}, in, ins, M, m.K);
      const QGemmArgs a = args(m, in, ins, M, bias, out, outs, acc);
      each(m.N, quant_chunk_rows(m.N, threads), [&](int64_t n0, int64_t n1) { run_qgemm(k, a, n0, n1, scr); });
    };

    float* xn_t = xn + int64_t(t) * n * H;  // this thread's normed copy of x
    auto norm_all = [&](const float* wt) {
      for (int64_t i = 0; i < n; ++i) rmsnorm(x + i * H, wt, xn_t + i * H);
    };

    each(n, 1, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i)
        dequant_row_ref(QType(w.tok_embd.qtype), w.tok_embd.data + int64_t(b.tokens[i]) * w.tok_embd.row_bytes, 0, H,
                        x + i * H);
    });
    barrier.wait();
    for (int l = 0; l < h.n_layer; ++l) {
      const LlamaLayerWeights& L = w.layers[size_t(l)];
      float* kc = b.k_cache + int64_t(l) * b.n_slots * b.ctx * D;
      float* vc = b.v_cache + int64_t(l) * b.n_slots * b.ctx * D;
      // every thread norms all tokens itself (cheap next to the products), so
      // no barrier is needed between the norm and the products that read it
      norm_all(L.attn_norm);
      quantize_for({&L.wq, &L.wk, &L.wv}, xn_t, H, n, H);
      {  // q, k, v one head of rows at a time; each head's rope and cache write right after
        const QGemmArgs qa = args(L.wq, xn_t, H, n, L.bq, q, Q, false);
        const QGemmArgs ka = args(L.wk, xn_t, H, n, L.bk, kb, D, false);
        const QGemmArgs va = args(L.wv, xn_t, H, n, L.bv, vb, D, false);
        each(NH + 2 * KVH, 1, [&](int64_t j0, int64_t j1) {
          for (int64_t j = j0; j < j1; ++j) {
            const int kind = j < NH ? 0 : j < NH + KVH ? 1 : 2;
            const int64_t hh = kind == 0 ? j : kind == 1 ? j - NH : j - NH - KVH;
            run_qgemm(k, kind == 0 ? qa : kind == 1 ? ka : va, hh * HD, (hh + 1) * HD, scr);
            for (int64_t i = 0; i < n; ++i) {
              const int64_t cell = (int64_t(b.slots[i]) * b.ctx + b.pos[i]) * D + hh * HD;
              if (kind == 0) {
                rope(q + i * Q + hh * HD, i);
              } else if (kind == 1) {
                float* r = kb + i * D + hh * HD;
                rope(r, i);
                std::copy(r, r + HD, kc + cell);
              } else {
                const float* r = vb + i * D + hh * HD;
                std::copy(r, r + HD, vc + cell);
              }
            }
          }
        });
      }
      barrier.wait();
      each(n * KVH, 1, [&](int64_t j0, int64_t j1) {
        for (int64_t j = j0; j < j1; ++j) {
          const int64_t i = j / KVH, g = j % KVH;
          const int64_t base = int64_t(b.slots[i]) * b.ctx * D + g * HD;
          AttnArgs a{q + i * Q + g * G * HD, HD, int(G), kc + base, vc + base, D, int64_t(b.pos[i]) + 1,
                     int(HD), scale, att + i * Q + g * G * HD, HD, scores};
          k.attend(a);
        }
      });
      barrier.wait();
      matmul(L.wo, att, Q, n, x, H, nullptr, true);
      barrier.wait();
      norm_all(L.ffn_norm);
      quantize_for({&L.gate, &L.up}, xn_t, H, n, H);
      {  // gate and up for the same rows, then SiLU(gate) * up on them: no barrier between
        const QGemmArgs ga = args(L.gate, xn_t, H, n, nullptr, gb, FF, false);
        const QGemmArgs ua = args(L.up, xn_t, H, n, nullptr, ub, FF, false);
        each(FF, quant_chunk_rows(FF, threads), [&](int64_t n0, int64_t n1) {
          run_qgemm(k, ga, n0, n1, scr);
          run_qgemm(k, ua, n0, n1, scr);
          for (int64_t i = 0; i < n; ++i) k.silu_mul(gb + i * FF + n0, ub + i * FF + n0, n1 - n0);
        });
      }
      barrier.wait();
      matmul(L.down, gb, FF, n, x, H, nullptr, true);
      barrier.wait();
    }
    if (b.n_out == 0) return;
    float* hid_t = xn_t;  // the final norm of the out rows, again per thread
    for (int64_t j = 0; j < b.n_out; ++j) rmsnorm(x + b.out_rows[j] * H, w.out_norm, hid_t + j * H);
    if (b.logits) {
      matmul(w.output, hid_t, H, b.n_out, b.out, h.n_vocab, nullptr, false);
    } else if (t == 0) {
      std::copy(hid_t, hid_t + b.n_out * H, b.out);
    }
  });
}

}  // namespace rcn_fast
