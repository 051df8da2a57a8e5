// model/layers/context.h: what a layer's forward sees: options, the batch's sequence
// segments, the op registry, and small helpers that allocate outputs and call ops.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>

#include "config/k3_config.h"
#include "kernels/registry.h"
#include "model/kv_storage.h"
#include "model/weights.h"

namespace k3::model {

struct ModelOptions {
  kernels::Precision precision = kernels::Precision::bf16;
  kernels::RmsNormStyle rmsnorm_style = kernels::RmsNormStyle::moonshot;
  float kv_k_scale = 1.0f;          // fp8 cache: stored = fp8(x / k_scale)
  bool kda_chunked_prefill = true;  // prefill steps use chunked KDA (decode steps: recurrent)
  bool poison_buffers = false;      // NaN-fill every new activation buffer (tests)
  core::Device device = core::Device::cpu;
};

enum class StepKind : uint8_t {
  prefill,  // chunked KDA, naive MLA
  decode,   // recurrent KDA, absorbed MLA; several tokens per sequence = speculative verify
};

struct SequenceInput {
  std::span<const int32_t> tokens;
  SequenceState* state = nullptr;
  StepKind kind = StepKind::prefill;
};

// Called with named intermediates ("kda.o", layer, [rows, width]) so eval can diff
// backends and paths layer by layer.
using TraceFn = std::function<void(std::string_view name, int layer, const core::TensorView& value)>;

// Rows [row_begin, row_end) of the batch belong to one sequence.
struct Segment {
  int64_t row_begin = 0, row_end = 0;
  SequenceState* state = nullptr;
  StepKind kind = StepKind::prefill;
  int64_t rows() const { return row_end - row_begin; }
};

struct ForwardContext {
  const config::K3Config& config;
  KvStorage& kv;
  const kernels::Registry& ops;
  const ModelOptions& options;
  std::span<const Segment> segments;
  const TraceFn* trace = nullptr;

  kernels::Precision precision() const { return options.precision; }
  core::Device device() const { return options.device; }
  // New f32 [rows, cols] activation (NaN-filled when options.poison_buffers).
  core::Tensor alloc(int64_t rows, int64_t cols) const;
  void emit(std::string_view name, int layer, const core::Tensor& t) const {
    if (trace && *trace) (*trace)(name, layer, t.view());
  }

  core::Tensor linear(const core::Tensor& x, const LinearWeight& w, bool round_output = true) const;
  core::Tensor rmsnorm(const core::Tensor& x, const core::Tensor& w, float eps) const;
  core::Tensor situ_glu(const core::Tensor& gate, const core::Tensor& up) const;
  core::Tensor add(const core::Tensor& a, const core::Tensor& b) const;
};

// Rows [begin, end) of a [rows, cols] activation, sharing its storage.
core::Tensor row_slice(const core::Tensor& t, int64_t begin, int64_t end);
// Columns [begin, end) of a [rows, cols] activation, copied into a new contiguous tensor.
core::Tensor column_copy(const core::Tensor& t, int64_t begin, int64_t end);

// Layer functions (one file each under model/layers/). x: the normed input [rows, hidden].
core::Tensor attention(const ForwardContext& ctx, int layer, const KdaWeights& w, const core::Tensor& x);
core::Tensor attention(const ForwardContext& ctx, int layer, const MlaWeights& w, const core::Tensor& x);
core::Tensor ffn(const ForwardContext& ctx, int layer, const DenseFfnWeights& w, const core::Tensor& x);
core::Tensor ffn(const ForwardContext& ctx, int layer, const MoeWeights& w, const core::Tensor& router_bias,
                 const core::Tensor& x);
// AttnRes Mix over bank ++ [prefix] (spec §3.1); with an empty bank returns the prefix.
core::Tensor attn_res_mix(const ForwardContext& ctx, std::span<const core::Tensor> bank,
                          const core::Tensor& prefix, const AttnResWeights& w);

}  // namespace k3::model
