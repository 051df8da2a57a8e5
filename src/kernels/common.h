// kernels/common.h: what every op shares: precision mode, activation rounding, linear weights.
//
// CPU reference convention: activations are f32 tensors. In Precision::bf16 ("engine mode")
// every value stored between ops is rounded to bf16 at the rounding points of spec §2; in
// Precision::fp32 ("exact mode") nothing is rounded. Weights keep their checkpoint dtype.
#pragma once
#include <cstdint>
#include <string>

#include "core/bf16.h"
#include "core/tensor.h"

namespace k3::backends::cpu {
class ThreadPool;  // a reference implementation's threads (backends/cpu/thread_pool.h); nullptr: inline
}

namespace k3::kernels {

enum class Precision : uint8_t { bf16, fp32 };

// The value an activation takes when stored between ops.
inline float round_act(float x, Precision p) { return p == Precision::bf16 ? core::bf16_round(x) : x; }

// A linear layer's weight y = x W^T with W [out, in]:
//   dense:  weight bf16 or f32 [out, in], scale undefined;
//   MXFP4:  weight u8 [out, in/2] (two E2M1 codes per byte, even index low nibble) and
//           scale u8 [out, in/32] (E8M0), spec §9.
struct LinearWeight {
  core::Tensor weight;
  core::Tensor scale;
  bool is_mxfp4() const { return scale.defined(); }
  int64_t out_features() const { return weight.dim(0); }
  int64_t in_features() const { return is_mxfp4() ? weight.dim(1) * 2 : weight.dim(1); }
  // Decodes row r into out[0..in) as f32 (exact for every stored dtype).
  void load_row(int64_t r, float* out) const;
};

// Activation dtypes an op check accepts: f32 everywhere (the CPU convention), and bf16 on the CUDA
// device, where the engine stores activations between ops as bf16 (values rounded at the same
// points; see kernels/op_table.h, CudaOps). CPU implementations only ever see f32.
inline bool is_activation_dtype(const core::TensorView& v) {
  return v.dtype == core::DType::f32 || (v.dtype == core::DType::bf16 && v.device == core::Device::cuda);
}

// An activation [rows, cols] (is_activation_dtype) with unit inner stride and rows that do not overlap.
inline bool is_activation_rows(const core::TensorView& v, int64_t rows, int64_t cols) {
  return v.defined() && is_activation_dtype(v) && v.rank() == 2 && v.strides[1] == 1 && v.dim(0) == rows &&
         v.dim(1) == cols && (rows <= 1 || v.strides[0] >= cols);
}

// For op check messages: "bf16 [17, 96] on cuda" ("undefined" for an undefined or rank-0 view), and
// "[rows, cols]".
std::string describe_view(const core::TensorView& v);
std::string rows_cols_str(int64_t rows, int64_t cols);
// Whether the bytes spanned by two rank-2 row views (strided rows allowed) overlap; empty views never do.
bool row_views_overlap(const core::TensorView& a, const core::TensorView& b);

// The sequences of one batched attention-op call (KDA conv/recurrent/chunked, MLA attention).
// Each sequence owns a run of rows of the op's [T, ...] activations and a state slot (KDA) or a
// block table (MLA). The i32 tables live on the op's device (host memory for the CPU reference),
// so a CUDA graph captured once replays for any slot, position or table contents; launch grids
// may depend only on the host integers below, never on the tables' values.
struct SeqBatch {
  core::TensorView row_begin;    // i32 [S]: first activation row of sequence s
  core::TensorView num_rows;     // i32 [S]: its rows this call (>= 1)
  core::TensorView position;     // i32 [S]: tokens already folded into its state / cache
  core::TensorView slot;         // i32 [S]: KDA state slot (KDA ops; may be undefined for MLA)
  core::TensorView block_table;  // i32 [S, max_blocks]: MLA page ids in token order (MLA ops)
  int num_seqs = 0;              // S
  int max_rows = 0;              // >= every num_rows[s] (1 for plain decode, K+1 for verify)
  int64_t max_tokens = 0;        // >= every position[s] + num_rows[s] (MLA: <= max_blocks * block_size)
};

// How activations are stored between ops: f32 on the CPU (the oracle's convention); on CUDA bf16
// in engine mode (Precision::bf16) and f32 in exact mode (kernels/op_table.h, CudaOps).
inline core::DType activation_dtype(core::Device device, Precision precision) {
  return device == core::Device::cuda && precision == Precision::bf16 ? core::DType::bf16 : core::DType::f32;
}

// Reads element i of a rank-1 bf16 or f32 tensor as f32 (norm weights, biases).
float load_f32(const core::TensorView& v, int64_t i);

}  // namespace k3::kernels
