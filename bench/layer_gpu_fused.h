// bench/layer_gpu_fused.h: the latency_specialized (fastpath/) side of bench/layer_gpu.cpp: one
// layer of FusedDecodePath::run_step (fastpath/fused_decode.cpp) on its own, its AttnRes stream and
// the model::Weights that stream reads, and the bank write timed apart.
//
// The fused step of layer l for one copy (as run_step's loop body for that layer):
//   P = prefix; x = merge(P, f_prev, attention(l), input_norm)   P += f_prev (the previous layer's FFN)
//   a = fused_attention(x); fx = merge(P, a, ffn(l), post_attn_norm); f = fused_moe(fx)
// and returns {f, P}. The stream's bank (8 rows at layers 85 / 87) is written before capture:
// write_bank runs once per block of attn_res_block_size layers, so the per-layer graph holds only
// the merges and the sublayers, and the bench times the bank write as its own graph. Closeness
// compares the two paths' outputs (--check).
#pragma once
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/cuda/device_tensor.h"
#include "bench/layer_gpu_weights.h"
#include "config/k3_config.h"
#include "fastpath/fused_layers.h"
#include "model/layers/context.h"
#include "model/weights.h"

namespace k3::bench {

// The last bank-write layer at or before `layer` (its bank serves `layer`).
inline int last_bank_write_layer(const config::K3Config& c, int layer) {
  return layer / c.attn_res_block_size * c.attn_res_block_size;
}

// Mix operators whose bank part the bank write at layer w computes (as AttnResStream::write_bank
// lists them): the FFN side of w, both sides of each later layer up to the attention side of the
// next write layer, or the output Mix.
inline int mixes_of_bank_write(const config::K3Config& c, int w) {
  int n = 1;
  for (int k = w + 1;; ++k) {
    if (k == c.num_hidden_layers) return n + 1;
    ++n;
    if (c.is_bank_write_layer(k)) return n;
    ++n;
  }
}

// The model::Weights an AttnResStream reads for the benched layer: num_hidden_layers entries,
// each with its own random attn_res / mlp_res (query bf16 [1, hidden], norm bf16 [hidden], as
// make_layer makes them; every bank write at 0, 12, ... reads its block's), output_res, and
// layers[layer] = the benched layer's weights (a copy of the struct: Tensors are shared handles,
// nothing is duplicated on the device). The other layers' attention / FFN weights stay empty:
// only the stream reads them. About 4 x 14 KB per layer: generated in well under a second.
inline model::Weights attn_res_weights(Filler& fl, const config::K3Config& c, int layer,
                                       const model::LayerWeights& lw) {
  const int64_t H = c.hidden_size;
  model::Weights w;
  w.layers.resize(static_cast<size_t>(c.num_hidden_layers));
  const auto res = [&](int l, const char* which) -> model::AttnResWeights {  // names "L<l>.<which>.q" / ".n"
    std::string name = "L";
    name += std::to_string(l);
    name += which;
    const std::string q = name + ".q", n = name + ".n";
    return {fl.make(DType::bf16, {1, H}, {Fill::bf16, 0.0f, 0.05f}, q.c_str()), fl.norm(H, DType::bf16, n.c_str())};
  };
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    if (l == layer) continue;
    w.layers[static_cast<size_t>(l)].attn_res = res(l, ".attn_res");
    w.layers[static_cast<size_t>(l)].mlp_res = res(l, ".mlp_res");
  }
  w.layers[static_cast<size_t>(layer)] = lw;
  w.output_res = res(c.num_hidden_layers, ".output_res");
  return w;
}

// One copy's fused-path state. The AttnResStream keeps references to `fctx` and to the Weights,
// and its bank rows, acc and stats buffers (allocated before capture) are read by the graph:
// this object and the Weights outlive every graph captured from it.
struct FusedCopy {
  std::unique_ptr<model::ForwardContext> fctx;
  std::unique_ptr<fastpath::AttnResStream> res;
  Tensor f_prev;  // bf16 [B, hidden]: stands for the previous layer's FFN output
};

// What one fused step returns: the FFN output and the running prefix after it (P + f_prev + a).
struct FusedOut {
  Tensor f, P;
};

// Writes the bank rows of every write layer w = 0, block, ... <= `up_to` (bank[j] at the j-th), in
// order, eagerly: the stream then holds the bank the standard step reads at `up_to`'s block.
inline void write_banks(const config::K3Config& c, fastpath::AttnResStream& res, const std::vector<Tensor>& bank,
                        int up_to) {
  size_t j = 0;
  for (int w = 0; w <= up_to; w += c.attn_res_block_size) {
    K3_CHECK(j < bank.size(), "layer_gpu fused: bank has " + std::to_string(bank.size()) + " rows, write layer " +
                                  std::to_string(w) + " needs row " + std::to_string(j));
    res.write_bank(w, bank[j++]);
  }
}

// One layer of the fused path (FusedDecodePath::run_step's body for layer l, the previous layer's
// FFN merge included). `prefix` is not written (merge replaces P by a new tensor).
inline FusedOut fused_layer_step(FusedCopy& fc, int l, const model::LayerWeights& lw, const Tensor& router_bias,
                                 const Tensor& prefix) {
  using fastpath::MixSite;
  const model::ForwardContext& ctx = *fc.fctx;
  Tensor P = prefix;
  const Tensor x = fc.res->merge(P, &fc.f_prev, false, MixSite::attention(l), lw.input_norm);
  const Tensor a = std::visit([&](const auto& w) { return fastpath::fused_attention(ctx, l, w, x); }, lw.attn);
  const Tensor fx = fc.res->merge(P, &a, /*restart=*/false, MixSite::ffn(l), lw.post_attn_norm);
  const Tensor f = fastpath::fused_moe(ctx, l, std::get<model::MoeWeights>(lw.ffn), router_bias, fx);
  return {f, P};
}

// Closeness of two paths' outputs (not bitwise: their bf16 rounding points differ), row by row over
// the copies: the cosine of each row, rows below 0.999, largest |a - b| relative to the largest |b|,
// non-finite count. Random weights leave the router nearly tied, so bf16 summation-order noise
// flips one of the 16 routes of an occasional row (as between the standard GPU path and the CPU
// oracle, tests/gpu/model_gpu_test.cpp); such a row lands below cosine 0.999 but above 0.9, every
// other row far above 0.999 (the rows seen on H200 machines: docs/perf/fastpath.md, 7c2e7f9 and
// 65cb581). The check passes when no value is non-finite, no row is below cosine 0.9 (one flipped
// route of 16 moves a row far less) and at most 5% of the rows, or at most 2, are below 0.999: a
// kernel bug moves every row, or a whole sequence's, not one in fifty; flips are rare independent
// events, so at 24 rows two of them are not a signal.
struct Closeness {
  double min_cosine = 1.0, max_abs_diff = 0, max_abs_ref = 0;  // min_cosine: the worst row
  int64_t nonfinite = 0, values = 0, rows = 0, rows_below = 0;
  void add(const Tensor& a, const Tensor& ref, cudaStream_t s) {
    const Tensor fa = backends::cuda::download_f32(a.view(), s), fb = backends::cuda::download_f32(ref.view(), s);
    K3_CHECK(fa.numel() == fb.numel() && a.dim(0) == ref.dim(0), "cross-path check: outputs of different sizes");
    const int64_t n = a.dim(0), width = fa.numel() / n;
    for (int64_t r = 0; r < n; ++r) {
      double dot = 0, na = 0, nb = 0;
      for (int64_t i = r * width; i < (r + 1) * width; ++i) {
        const double x = fa.data<float>()[i], y = fb.data<float>()[i];
        if (!std::isfinite(x) || !std::isfinite(y)) {
          ++nonfinite;
          continue;
        }
        dot += x * y, na += x * x, nb += y * y;
        max_abs_diff = std::max(max_abs_diff, std::fabs(x - y));
        max_abs_ref = std::max(max_abs_ref, std::fabs(y));
      }
      const double cos = na > 0 && nb > 0 ? dot / std::sqrt(na * nb) : (na == nb ? 1.0 : 0.0);
      min_cosine = std::min(min_cosine, cos);
      rows_below += cos < 0.999;
      ++rows;
    }
    values += fa.numel();
  }
  double max_rel_diff() const { return max_abs_ref > 0 ? max_abs_diff / max_abs_ref : max_abs_diff; }
  bool ok() const { return nonfinite == 0 && min_cosine >= 0.9 && (rows_below * 20 <= rows || rows_below <= 2); }
  nlohmann::json json() const {
    return {{"compared",
             "standard step's new prefix vs fused P + f, eager, from the same KDA state, prefix "
             "round(prefix + f_prev) for both; per row"},
            {"values", values},
            {"rows", rows},
            {"min_row_cosine", min_cosine},
            {"rows_below_0p999", rows_below},
            {"max_abs_diff", max_abs_diff},
            {"max_rel_diff", max_rel_diff()},
            {"nonfinite", nonfinite},
            {"pass", ok()}};
  }
};

}  // namespace k3::bench
