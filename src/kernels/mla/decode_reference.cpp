// kernels/mla/decode_reference.cpp: checks, split sizing and the CPU reference of the fused MLA decode
// op: mla_absorbed_reference then sigmoid_gate_reference, so it equals the standard op pair bit for bit.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/elementwise/elementwise.h"
#include "kernels/mla/mla_decode.h"
#include "kernels/mla/mla_internal.h"

namespace k3::kernels {

namespace {

bool has(const core::TensorView& v) { return v.data != nullptr; }

// Byte span [first, last) covered by a rank-2 row view or a dense view of any rank.
std::pair<const char*, const char*> byte_span(const core::TensorView& v) {
  const auto* p = static_cast<const char*>(v.data);
  int64_t last = v.numel();
  if (v.rank() == 2) last = (v.dim(0) - 1) * v.strides[0] + v.dim(1);
  if (v.rank() == 3) last = (v.dim(0) - 1) * v.strides[0] + (v.dim(1) - 1) * v.strides[1] + v.dim(2);
  return {p, p + last * static_cast<int64_t>(core::dtype_size(v.dtype))};
}
bool overlap(const core::TensorView& a, const core::TensorView& b) {
  if (!has(a) || !has(b) || a.numel() == 0 || b.numel() == 0) return false;
  const auto [a0, a1] = byte_span(a);
  const auto [b0, b1] = byte_span(b);
  return a0 < b1 && b0 < a1;
}
bool same_view(const core::TensorView& a, const core::TensorView& b) {
  return a.data == b.data && a.dtype == b.dtype && a.shape == b.shape && a.strides == b.strides;
}

// A [1, D] contiguous f32 view of row r of a [T, D] row view (D from the view).
core::TensorView row_view(const core::TensorView& v, int64_t r) {
  return core::TensorView::contiguous(v.as<float>() + r * v.strides[0], core::DType::f32, {1, v.dim(1)}, v.device);
}

}  // namespace

MlaDecodeSplitRule mla_decode_split_rule(const MlaDecodeArgs& a) {
  return a.q.dtype == core::DType::bf16 ? MlaDecodeSplitRule::tensor_core : MlaDecodeSplitRule::cuda_core;
}

int64_t mla_decode_split_len(MlaDecodeSplitRule rule, int64_t query_slots, int64_t max_tokens) {
  const int64_t q = std::max<int64_t>(1, query_slots), tokens = std::max<int64_t>(1, max_tokens);
  const int64_t unit = rule == MlaDecodeSplitRule::tensor_core ? kMlaDecodeMmaStage : kMlaDecodeTile;
  // Rounded down: q * splits stays within one wave of kMlaDecodeTargetCtas (a second, partial wave
  // would leave most SMs idle while it runs).
  const int64_t wanted_splits = std::max<int64_t>(1, kMlaDecodeTargetCtas / q);
  const int64_t len = (tokens + wanted_splits - 1) / wanted_splits;
  return std::max<int64_t>(unit, (len + unit - 1) / unit * unit);
}

int64_t mla_decode_num_splits(MlaDecodeSplitRule rule, int64_t query_slots, int64_t max_tokens) {
  const int64_t len = mla_decode_split_len(rule, query_slots, max_tokens);
  return std::max<int64_t>(1, (std::max<int64_t>(1, max_tokens) + len - 1) / len);
}

int64_t mla_decode_split_len(const MlaDecodeArgs& a) {
  const int64_t Q = static_cast<int64_t>(std::max(0, a.seqs.num_seqs)) * std::max(0, a.seqs.max_rows);
  return a.split_len > 0 ? a.split_len : mla_decode_split_len(mla_decode_split_rule(a), Q, a.seqs.max_tokens);
}

int64_t mla_decode_num_splits(const MlaDecodeArgs& a) {
  const int64_t len = mla_decode_split_len(a);
  return std::max<int64_t>(1, (std::max<int64_t>(1, a.seqs.max_tokens) + len - 1) / len);
}

int64_t mla_decode_workspace_floats(const MlaDecodeArgs& a) {
  const int64_t Q = static_cast<int64_t>(std::max(0, a.seqs.num_seqs)) * std::max(0, a.seqs.max_rows);
  const int64_t H = a.num_heads, L = a.kv_lora, splits = mla_decode_num_splits(a);
  return Q * H * (L + a.qk_rope) + Q * H * splits * (L + 2);
}

MlaAttentionArgs mla_decode_attention_args(const MlaDecodeArgs& a, core::TensorView out) {
  MlaAttentionArgs m;
  m.q = a.q;
  m.pages = a.pages;
  m.seqs = a.seqs;
  m.k_scale = a.k_scale;
  m.kv_b = a.kv_b;
  m.out = out;
  m.num_heads = a.num_heads;
  m.qk_nope = a.qk_nope;
  m.qk_rope = a.qk_rope;
  m.v_head_dim = a.v_head_dim;
  m.kv_lora = a.kv_lora;
  m.scale = a.scale;
  m.precision = a.precision;
  return m;
}

core::Status mla_decode_check(const MlaDecodeArgs& a) {
  const auto fail = [](const std::string& why) { return core::Status::fail("mla_decode: " + why); };
  if (core::Status s = mla_attention_check(mla_decode_attention_args(a, a.out)); !s) {
    std::string why = s.reason();
    const std::string prefix = "mla_attention: ";
    if (why.rfind(prefix, 0) == 0) why = why.substr(prefix.size());
    return fail(why);
  }
  if (a.split_len < 0 || a.split_len % kMlaDecodeTile != 0)
    return fail("split_len must be 0 (automatic) or a positive multiple of " + std::to_string(kMlaDecodeTile) +
                ", got " + std::to_string(a.split_len));
  const int64_t T = a.q.dim(0), width = static_cast<int64_t>(a.num_heads) * a.v_head_dim;
  if (has(a.gate)) {
    if (!mla_detail::is_rows(a.gate) || a.gate.dtype != a.out.dtype || a.gate.dim(0) != T || a.gate.dim(1) != width)
      return fail("gate must be undefined (no gate) or " + std::string(core::dtype_name(a.out.dtype)) +
                  " (out's dtype) [T, num_heads * v_head_dim] = [" + std::to_string(T) + ", " + std::to_string(width) +
                  "] with unit inner stride, got " + mla_detail::describe(a.gate));
    if (a.gate.device != a.q.device) return fail("gate must be on q's device, got " + mla_detail::describe(a.gate));
    if (overlap(a.out, a.gate) && !same_view(a.out, a.gate))
      return fail("out overlaps gate without being the same view (only out == gate is allowed)");
  }
  if (overlap(a.out, a.q)) return fail("out must not overlap q");
  if (overlap(a.out, a.pages)) return fail("out must not overlap pages");
  if (has(a.workspace)) {
    const int64_t need = mla_decode_workspace_floats(a);
    if (a.workspace.dtype != core::DType::f32 || !a.workspace.is_contiguous() || a.workspace.numel() < need)
      return fail("workspace must be undefined or a contiguous f32 tensor of >= mla_decode_workspace_floats = " +
                  std::to_string(need) + " floats, got " + mla_detail::describe(a.workspace));
    if (a.workspace.device != a.q.device)
      return fail("workspace must be on q's device, got " + mla_detail::describe(a.workspace));
    if (overlap(a.out, a.workspace) || overlap(a.workspace, a.q) || overlap(a.workspace, a.pages) ||
        overlap(a.workspace, a.gate))
      return fail("workspace must not overlap q, pages, gate or out");
  }
  return core::Status::ok();
}

void mla_decode_reference(const MlaDecodeArgs& a, backends::cpu::ThreadPool* pool) {
  const core::Status st = mla_decode_check(a);
  K3_CHECK(st.is_ok(), st.reason());
  K3_CHECK(a.q.device == core::Device::cpu, "mla_decode_reference: tensors must be on the CPU");
  if (a.seqs.num_seqs == 0) return;
  // The standard pair: o = mla_absorbed (into an f32 temporary), then out = sigmoid_gate(o, gate) row by
  // row for the sequences' rows only (rows of no sequence stay untouched, as in the standard path).
  const int64_t T = a.q.dim(0), width = a.out.dim(1);
  core::Tensor o = core::Tensor::zeros(core::DType::f32, {T, width});
  mla_absorbed_reference(mla_decode_attention_args(a, o.view()), pool);
  for (int s = 0; s < a.seqs.num_seqs; ++s) {
    const mla_detail::SeqRef seq = mla_detail::seq_ref(a.seqs, s);
    for (int64_t t = seq.row_begin; t < seq.row_begin + seq.num_rows; ++t) {
      if (has(a.gate)) {
        sigmoid_gate_reference({row_view(o.view(), t), row_view(a.gate, t), row_view(a.out, t), a.precision});
      } else {
        std::memcpy(mla_detail::mutable_row_ptr(a.out, t), o.data<const float>() + t * width,
                    static_cast<size_t>(width) * sizeof(float));
      }
    }
  }
}

}  // namespace k3::kernels
