// Bindings of the GGML-format matrix products (llm/cpu/quant_kernels.h) and the Llama
// forward pass (llm/cpu/decoder.h). The Python layer (rcn_fast/llm/backends/engine/)
// builds the arguments from a memory-mapped .gguf file; the checks here keep
// a direct call from crashing the interpreter.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "llm/quant_blocks.h"
#include "llm/cpu/decoder.h"
#include "llm/cpu/quant_kernels.h"

namespace nb = nanobind;
using namespace rcn_fast;

namespace {

using Bytes = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;
using F32In = nb::ndarray<const float, nb::ndim<2>, nb::device::cpu>;
using F32Out = nb::ndarray<float, nb::ndim<2>, nb::device::cpu>;
using F32Vec = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using I32Vec = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using I64Vec = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Cache = nb::ndarray<float, nb::ndim<4>, nb::c_contig, nb::device::cpu>;
using OutMat = nb::ndarray<float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

const QuantKernels& kernels_for(const std::string& isa) {
  if (isa.empty() || isa == "auto") return quant_kernels();
  const QuantKernels* k = quant_kernels_named(isa);
  if (k == nullptr)
    throw nb::value_error(("isa: '" + isa + "' is not compiled into this build or not supported by this CPU (compiled: " +
                           quant_compiled() + ")")
                              .c_str());
  return *k;
}

QType check_qtype(int qtype) {
  if (!qtype_known(qtype))
    throw nb::value_error(("qtype: expected a GGML type id among " + qtype_supported_names() + ", got " +
                           std::to_string(qtype))
                              .c_str());
  return QType(qtype);
}

// A weight matrix [N, K] of type qtype held in the bytes of `w` (any dtype, contiguous).
QMat weight_view(const Bytes& w, int qtype, int64_t N, int64_t K, const std::string& name) {
  const QType t = check_qtype(qtype);
  if (N < 0 || K < 1) throw nb::value_error((name + ": expected N >= 0 and K >= 1").c_str());
  if (K % qtype_block(t) != 0)
    throw nb::value_error((name + ": a " + qtype_name(t) + " row needs a multiple of " +
                           std::to_string(qtype_block(t)) + " elements, got K=" + std::to_string(K))
                              .c_str());
  const int64_t rb = qtype_row_bytes(t, K);
  if (int64_t(w.nbytes()) < rb * N)
    throw nb::value_error((name + ": holds " + std::to_string(w.nbytes()) + " bytes, a " + qtype_name(t) + " [" +
                           std::to_string(N) + ", " + std::to_string(K) + "] matrix needs " + std::to_string(rb * N))
                              .c_str());
  QMat m;
  m.data = static_cast<const uint8_t*>(w.data());
  m.qtype = qtype;
  m.N = N;
  m.K = K;
  m.row_bytes = rb;
  return m;
}

// "f32" -> false, "q8" -> true (llama.cpp's 8-bit activations)
bool check_activations(const std::string& activations) {
  if (activations != "f32" && activations != "q8")
    throw nb::value_error(("activations: expected 'f32' or 'q8', got '" + activations + "'").c_str());
  return activations == "q8";
}

void quant_matmul_py(const F32In& x, const Bytes& w, int qtype, int64_t K, F32Out y, nb::object bias_obj,
                     bool accumulate, int num_threads, const std::string& isa, const std::string& activations,
                     bool packed) {
  const bool q8 = check_activations(activations);
  const int64_t M = int64_t(x.shape(0));
  if (int64_t(x.shape(1)) != K) throw nb::value_error(("x: expected " + std::to_string(K) + " columns").c_str());
  if (K > 1 && x.stride(1) != 1) throw nb::value_error("x: the last dimension must be contiguous (stride 1)");
  const int64_t N = int64_t(y.shape(1));
  if (int64_t(y.shape(0)) != M) throw nb::value_error("y: expected M rows (those of x)");
  if (N > 1 && y.stride(1) != 1) throw nb::value_error("y: the last dimension must be contiguous (stride 1)");
  const QMat m = weight_view(w, qtype, N, K, "w");
  F32Vec bias;
  const float* b = nullptr;
  if (!bias_obj.is_none()) {
    bias = nb::cast<F32Vec>(bias_obj);
    if (int64_t(bias.shape(0)) != N) throw nb::value_error("bias: expected N values");
    b = bias.data();
  }
  const QuantKernels& k = kernels_for(isa);
  if (M == 0 || N == 0) return;
  QGemmArgs a{x.data(), M > 1 ? int64_t(x.stride(0)) : K, M, m.data, m.row_bytes, qtype, K,
              b, y.data(), M > 1 ? int64_t(y.stride(0)) : N, accumulate};
  nb::gil_scoped_release release;
  PackedCopy p;
  if (packed && q8) {
    p = pack_weights(qtype, m.data, N, K, m.row_bytes, num_threads);
    a.wp = p.data.get();
  }
  quant_matmul(a, N, num_threads, k, q8);
}

// The 8-bit activation blocks (XBlock32 / XBlock256 rows) of x for weights of type qtype.
nb::bytes quant_activations_py(const F32In& x, int qtype, const std::string& isa) {
  const QType t = check_qtype(qtype);
  const int64_t M = int64_t(x.shape(0)), K = int64_t(x.shape(1));
  if (!qtype_is_blocked(t)) throw nb::value_error("qtype: F32 and F16 weights multiply float32 activations");
  if (K % qtype_block(t) != 0)
    throw nb::value_error(("x: rows of a multiple of " + std::to_string(qtype_block(t)) + " elements expected").c_str());
  if (K > 1 && x.stride(1) != 1) throw nb::value_error("x: the last dimension must be contiguous (stride 1)");
  const QuantKernels& k = kernels_for(isa);
  const int64_t rb = xq_row_bytes(t, K);
  std::string out(size_t(rb * M), '\0');
  k.quantize_x(qtype, x.data(), M > 1 ? int64_t(x.stride(0)) : K, M, K, reinterpret_cast<uint8_t*>(out.data()), rb);
  return nb::bytes(out.data(), out.size());
}

void quant_dequantize_py(const Bytes& w, int qtype, int64_t K, OutMat out) {
  const int64_t N = int64_t(out.shape(0));
  if (int64_t(out.shape(1)) != K) throw nb::value_error(("out: expected " + std::to_string(K) + " columns").c_str());
  const QMat m = weight_view(w, qtype, N, K, "w");
  nb::gil_scoped_release release;
  for (int64_t r = 0; r < N; ++r) dequant_row_ref(QType(qtype), m.data + r * m.row_bytes, 0, K, out.data() + r * K);
}

// The GGML type table (llm/ggml_types.h): (name, id, elements per block,
// bytes per block, whether the engine multiplies it) per type.
nb::list ggml_type_table() {
  nb::list out;
  for (const GGMLTypeInfo& t : kGGMLTypes) out.append(nb::make_tuple(t.name, t.id, t.block, t.block_bytes, t.matmul));
  return out;
}

nb::dict quant_info() {
  nb::dict d;
  const QuantKernels& k = quant_kernels();
  d["isa"] = k.name;
  d["lanes"] = k.lanes;
  d["compiled"] = quant_compiled();
  d["note"] = quant_note();
  return d;
}

// The model: weights viewed in place (the Python object keeps the arrays alive).
class LlamaModel {
 public:
  LlamaModel(nb::dict hp, nb::list tensors, nb::object rope_freqs, bool pack) {
    LlamaHParams& h = w_.hp;
    auto geti = [&](const char* key) {
      const int64_t v = nb::cast<int64_t>(hp[key]);
      if (v < 0 || v > INT32_MAX) throw nb::value_error((std::string(key) + ": expected an int in [0, 2**31)").c_str());
      return int(v);
    };
    h.n_layer = geti("n_layer");
    h.n_embd = geti("n_embd");
    h.n_head = geti("n_head");
    h.n_head_kv = geti("n_head_kv");
    h.head_dim = geti("head_dim");
    h.n_ff = geti("n_ff");
    h.n_vocab = geti("n_vocab");
    h.rope_dim = geti("rope_dim");
    h.eps = nb::cast<float>(hp["eps"]);
    h.rope_base = nb::cast<float>(hp["rope_base"]);
    h.rope_neox = nb::cast<bool>(hp["rope_neox"]);
    h.rope_scale = nb::cast<float>(hp["rope_scale"]);
    if (h.n_layer < 1 || h.n_layer > 4096) throw nb::value_error("n_layer: expected 1..4096");
    const size_t want = 3 + size_t(h.n_layer) * 12;
    if (nb::len(tensors) != want)
      throw nb::value_error(("tensors: expected " + std::to_string(want) + " entries (3 + 12 per layer)").c_str());
    size_t i = 0;
    auto next_mat = [&](const std::string& name) { return next_mat_from(tensors[i++], name); };
    w_.tok_embd = next_mat("token_embd");
    w_.out_norm = vec(tensors[i++], "output_norm", h.n_embd, false);
    w_.output = next_mat("output");
    const int64_t Q = int64_t(h.n_head) * h.head_dim, D = int64_t(h.n_head_kv) * h.head_dim;
    for (int l = 0; l < h.n_layer; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      LlamaLayerWeights L;
      L.attn_norm = vec(tensors[i++], p + "attn_norm", h.n_embd, false);
      L.wq = next_mat(p + "attn_q");
      L.wk = next_mat(p + "attn_k");
      L.wv = next_mat(p + "attn_v");
      L.bq = vec(tensors[i++], p + "attn_q.bias", Q, true);
      L.bk = vec(tensors[i++], p + "attn_k.bias", D, true);
      L.bv = vec(tensors[i++], p + "attn_v.bias", D, true);
      L.wo = next_mat(p + "attn_output");
      L.ffn_norm = vec(tensors[i++], p + "ffn_norm", h.n_embd, false);
      L.gate = next_mat(p + "ffn_gate");
      L.up = next_mat(p + "ffn_up");
      L.down = next_mat(p + "ffn_down");
      w_.layers.push_back(L);
    }
    if (!rope_freqs.is_none()) {
      F32Vec f = nb::cast<F32Vec>(rope_freqs);
      if (int64_t(f.shape(0)) != h.rope_dim / 2)
        throw nb::value_error(("rope_freqs: expected " + std::to_string(h.rope_dim / 2) + " float32 values").c_str());
      keep_.push_back(nb::borrow(rope_freqs));
      w_.rope_freqs = f.data();
    }
    try {
      llama_check_weights(w_);
    } catch (const std::invalid_argument& e) {
      throw nb::value_error(e.what());
    }
    if (pack) {  // interleaved copies for the 8-bit products (the types that pack; the head of a tied model once)
      nb::gil_scoped_release release;
      auto pack_one = [&](QMat& m) {
        for (size_t i = 0; i < packed_.size(); ++i)
          if (packed_src_[i] == m.data) {
            m.packed = packed_[i].data.get();
            return;
          }
        PackedCopy p = pack_weights(m.qtype, m.data, m.N, m.K, m.row_bytes, 0);
        if (p.data == nullptr) return;
        m.packed = p.data.get();
        packed_src_.push_back(m.data);
        packed_.push_back(std::move(p));
      };
      pack_one(w_.tok_embd);
      pack_one(w_.output);
      for (LlamaLayerWeights& L : w_.layers)
        for (QMat* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.gate, &L.up, &L.down}) pack_one(*m);
    }
  }

  int64_t packed_bytes() const {
    int64_t n = 0;
    for (const PackedCopy& p : packed_) n += p.bytes;
    return n;
  }

  void forward(const I32Vec& tokens, const I32Vec& slots, const I32Vec& pos, Cache k_cache, Cache v_cache,
               const I64Vec& out_rows, bool logits, OutMat out, int num_threads, const std::string& isa,
               const std::string& activations) {
    const bool q8 = check_activations(activations);
    const LlamaHParams& h = w_.hp;
    const int64_t n = int64_t(tokens.shape(0));
    if (int64_t(slots.shape(0)) != n || int64_t(pos.shape(0)) != n)
      throw nb::value_error("slots, positions: expected one per token");
    const int64_t D = int64_t(h.n_head_kv) * h.head_dim;
    for (const Cache* c : {&k_cache, &v_cache})
      if (int64_t(c->shape(0)) != h.n_layer || int64_t(c->shape(3)) != D ||
          c->shape(1) != k_cache.shape(1) || c->shape(2) != k_cache.shape(2))
        throw nb::value_error(("k_cache, v_cache: expected float32 [n_layer=" + std::to_string(h.n_layer) +
                               ", slots, ctx, " + std::to_string(D) + "] arrays of one shape")
                                  .c_str());
    const int64_t n_out = int64_t(out_rows.shape(0));
    const int64_t width = logits ? h.n_vocab : h.n_embd;
    if (int64_t(out.shape(0)) != n_out || int64_t(out.shape(1)) != width)
      throw nb::value_error(("out: expected float32 [len(out_rows), " + std::to_string(width) + "]").c_str());
    const QuantKernels& k = kernels_for(isa);
    LlamaBatch b;
    b.tokens = tokens.data();
    b.slots = slots.data();
    b.pos = pos.data();
    b.n = n;
    b.k_cache = k_cache.data();
    b.v_cache = v_cache.data();
    b.n_slots = int64_t(k_cache.shape(1));
    b.ctx = int64_t(k_cache.shape(2));
    b.out_rows = out_rows.data();
    b.n_out = n_out;
    b.logits = logits;
    b.out = out.data();
    b.q8 = q8;
    try {
      nb::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mu_);  // one call at a time: the workspace is shared
      llama_forward(w_, b, num_threads, k, ws_);
    } catch (const std::invalid_argument& e) {
      throw nb::value_error(e.what());
    }
  }

 private:
  QMat next_mat_from(nb::handle e, const std::string& name) {
    nb::tuple t = nb::cast<nb::tuple>(e);
    if (nb::len(t) != 4) throw nb::value_error((name + ": expected (array, qtype, N, K)").c_str());
    keep_.push_back(nb::borrow(t[0]));
    return weight_view(nb::cast<Bytes>(t[0]), nb::cast<int>(t[1]), nb::cast<int64_t>(t[2]), nb::cast<int64_t>(t[3]), name);
  }
  const float* vec(nb::handle e, const std::string& name, int64_t len, bool optional) {
    if (e.is_none()) {
      if (optional) return nullptr;
      throw nb::value_error((name + ": missing").c_str());
    }
    const QMat m = next_mat_from(e, name);
    if (m.qtype != 0 || m.N * m.K != len)
      throw nb::value_error((name + ": expected " + std::to_string(len) + " float32 values").c_str());
    return reinterpret_cast<const float*>(m.data);
  }

  LlamaWeights w_;
  std::vector<PackedCopy> packed_;
  std::vector<const uint8_t*> packed_src_;
  LlamaWorkspace ws_;
  std::mutex mu_;
  std::vector<nb::object> keep_;
};

}  // namespace

void bind_llm_decoder(nb::module_& m) {
  m.def("quant_matmul", &quant_matmul_py, nb::arg("x"), nb::arg("w"), nb::arg("qtype"), nb::arg("K"),
        nb::arg("y"), nb::arg("bias").none() = nb::none(), nb::arg("accumulate") = false,
        nb::arg("num_threads") = 0, nb::arg("isa") = "", nb::arg("activations") = "f32", nb::arg("packed") = false,
        "y[M, N] (+)= x[M, K] . w^T (+ bias) with w [N, K] in a GGML format (its raw bytes). activations:\n"
        "'f32' (float32 activations and accumulation) or 'q8' (llama.cpp's arithmetic for block weights:\n"
        "x quantised to 8 bits per block, integer block sums). isa: '' (the variant chosen at load time),\n"
        "'generic', 'avx2', 'avx512', 'avx512vnni'. packed: with 'q8', multiply an interleaved copy of w\n"
        "(Q4_0, Q4_1, Q8_0; the same numbers).");
  m.def("quant_activations", &quant_activations_py, nb::arg("x"), nb::arg("qtype"), nb::arg("isa") = "",
        "The 8-bit activation blocks of x [M, K] for weights of GGML type qtype (csrc/llm/quant_blocks.h:\n"
        "XBlock32 rows for Q4_0/Q4_1/Q8_0, XBlock256 for the K-quants), as bytes.");
  m.def("quant_dequantize", &quant_dequantize_py, nb::arg("w"), nb::arg("qtype"), nb::arg("K"), nb::arg("out"),
        "The plain (reference) float32 values of a GGML-format matrix [N, K] into out.");
  m.def("ggml_type_table", &ggml_type_table,
        "The GGML tensor types (csrc/llm/ggml_types.h): (name, id, elements per block, bytes per block,\n"
        "multiplied by the engine) per type.");
  m.def("quant_info", &quant_info, "The quantised-weight kernels' variant in use and those compiled in.");
  nb::class_<LlamaModel>(m, "LlamaModel")
      .def(nb::init<nb::dict, nb::list, nb::object, bool>(), nb::arg("hparams"), nb::arg("tensors"),
           nb::arg("rope_freqs").none() = nb::none(), nb::arg("pack") = false,
           "A Llama-family decoder over GGML-format weights viewed in place (see rcn_fast/llm/backends/engine/);\n"
           "rope_freqs: float32 [rope_dim / 2] divisors of the rope frequencies, or None. pack: make\n"
           "interleaved copies of the Q4_0, Q4_1 and Q8_0 matrices for the 8-bit products (faster; the same\n"
           "numbers; as much memory again as those matrices).")
      .def_prop_ro("packed_bytes", &LlamaModel::packed_bytes, "Bytes of the interleaved copies.")
      .def("forward", &LlamaModel::forward, nb::arg("tokens"), nb::arg("slots"), nb::arg("positions"),
           nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("out_rows"), nb::arg("logits"), nb::arg("out"),
           nb::arg("num_threads") = 0, nb::arg("isa") = "", nb::arg("activations") = "f32",
           "Run a ragged batch of tokens (each at its (slot, position) of the caches); writes the logits\n"
           "(or the final normed hidden state) of the tokens out_rows names into out. activations: 'f32' or\n"
           "'q8' (llama.cpp's 8-bit arithmetic for the block weights; see quant_matmul).");
}
