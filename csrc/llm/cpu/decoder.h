// The forward pass of a Llama-family decoder (Llama, Mistral, SmolLM, Qwen2)
// over GGML-format weights, for a ragged batch of tokens that each belong to
// one sequence slot of a key/value cache.
//
// A batch is a flat list of tokens with (slot, position) each; a token
// writes its key/value at cache[slot][position] and attends to positions
// [0, position] of its slot. Prompts of different lengths (prefill), single
// new tokens (decoding) and both at once run in one call with no padding.
// Every number a token gets depends only on its own slot's cache and
// inputs: the matrix products and attention are batch invariant
// (llm/isa/quant_isa.h), so a sequence decodes the same alone, in any batch
// and on any thread count.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "llm/cpu/quant_kernels.h"

namespace rcn_fast {

// A weight matrix [N, K] in a GGML format (rows of row_bytes bytes).
struct QMat {
  const uint8_t* data = nullptr;
  int qtype = 0;
  int64_t N = 0, K = 0, row_bytes = 0;
  const uint8_t* packed = nullptr;  // its interleaved copy for the 8-bit products (pack_weights), or nullptr
};

struct LlamaLayerWeights {
  const float* attn_norm = nullptr;
  QMat wq, wk, wv, wo;
  const float* bq = nullptr;  // biases (Qwen2), or nullptr
  const float* bk = nullptr;
  const float* bv = nullptr;
  const float* ffn_norm = nullptr;
  QMat gate, up, down;
};

struct LlamaHParams {
  int n_layer = 0, n_embd = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_ff = 0, n_vocab = 0, rope_dim = 0;
  float eps = 1e-5f, rope_base = 10000.0f;
  // linear rope scaling: positions are divided by it (1: none)
  float rope_scale = 1.0f;
  // true: rotate the pairs (i, i + rope_dim / 2) (NEOX, Qwen2's GGUF);
  // false: the pairs (2i, 2i + 1) (Llama's GGUF, whose q/k rows llama.cpp's
  // converter permuted to match)
  bool rope_neox = false;
};

struct LlamaWeights {
  LlamaHParams hp;
  QMat tok_embd;
  const float* out_norm = nullptr;
  QMat output;  // the LM head (the token embedding when tied)
  // rope frequency divisors [rope_dim / 2] (Llama 3.1's rope_freqs tensor), or nullptr
  const float* rope_freqs = nullptr;
  std::vector<LlamaLayerWeights> layers;
};

struct LlamaBatch {
  const int32_t* tokens = nullptr;
  const int32_t* slots = nullptr;
  const int32_t* pos = nullptr;
  int64_t n = 0;
  float* k_cache = nullptr;  // [n_layer, n_slots, ctx, n_head_kv * head_dim]
  float* v_cache = nullptr;
  int64_t n_slots = 0, ctx = 0;
  const int64_t* out_rows = nullptr;  // the tokens whose output is wanted
  int64_t n_out = 0;
  bool logits = true;  // logits [n_out, n_vocab], else the final normed hidden state [n_out, n_embd]
  float* out = nullptr;
  // llama.cpp's arithmetic: the inputs of products with block weights
  // quantised to 8 bits (llm/quant_blocks.h); false: float32 throughout
  bool q8 = false;
};

// Scratch memory of the forward pass, kept between calls (grown, never
// shrunk, never zeroed): a model's calls must not overlap.
class LlamaWorkspace {
 public:
  float* get(size_t floats) {
    if (floats > cap_) {
      buf_.reset(new float[floats]);
      cap_ = floats;
    }
    return buf_.get();
  }

 private:
  std::unique_ptr<float[]> buf_;
  size_t cap_ = 0;
};

// Checks the weights' shapes and formats; throws std::invalid_argument naming the tensor.
void llama_check_weights(const LlamaWeights& w);

// Checks the batch (ids, slots, positions, out rows in range; no (slot,
// position) written twice), then runs it: std::invalid_argument names the
// offending input.
void llama_forward(const LlamaWeights& w, const LlamaBatch& b, int num_threads, const QuantKernels& k,
                   LlamaWorkspace& ws);

}  // namespace rcn_fast
