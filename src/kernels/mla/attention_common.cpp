// kernels/mla/attention_common.cpp: argument checks (attention, pages, sequence tables) and helpers
// shared by both MLA attention forms.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "backends/cpu/thread_pool.h"
#include "kernels/mla/mla.h"
#include "kernels/mla/mla_internal.h"

namespace k3::kernels {

namespace mla_detail {

bool is_rows(const core::TensorView& v) {
  if (v.rank() != 2 || !v.defined()) return false;
  if (v.numel() == 0) return true;
  return (v.dim(1) <= 1 || v.strides[1] == 1) && (v.dim(0) <= 1 || v.strides[0] >= v.dim(1));
}

bool is_pages(const core::TensorView& v) {
  if (v.rank() != 3 || !v.defined()) return false;
  if (v.numel() == 0) return true;
  return (v.dim(2) <= 1 || v.strides[2] == 1) && (v.dim(1) <= 1 || v.strides[1] >= v.dim(2)) &&
         (v.dim(0) <= 1 || v.strides[0] >= (v.dim(1) - 1) * v.strides[1] + v.dim(2));
}

std::string describe(const core::TensorView& v) {
  if (!v.defined() || v.rank() == 0) return "undefined";
  return std::string(core::dtype_name(v.dtype)) + " " + v.shape.str() + " on " +
         std::string(core::device_name(v.device));
}

namespace {

// A dense i32 vector [n] on `device`.
bool is_i32_vector(const core::TensorView& v, int64_t n, core::Device device) {
  return v.defined() && v.rank() == 1 && v.dtype == core::DType::i32 && v.dim(0) == n &&
         (n <= 1 || v.strides[0] == 1) && (n == 0 || v.device == device);
}

}  // namespace

std::string seq_batch_problem(const SeqBatch& b, int64_t T, const core::TensorView& pages, core::Device device) {
  const std::string S = std::to_string(b.num_seqs);
  if (b.num_seqs < 0) return "seqs.num_seqs must be >= 0, got " + S;
  if (b.num_seqs == 0) return "";  // nothing to do: the tables are not read
  if (b.max_rows < 1) return "seqs.max_rows must be >= 1, got " + std::to_string(b.max_rows);
  if (b.max_tokens < 1) return "seqs.max_tokens must be >= 1, got " + std::to_string(b.max_tokens);
  const std::pair<const char*, const core::TensorView*> vectors[] = {
      {"seqs.row_begin", &b.row_begin}, {"seqs.num_rows", &b.num_rows}, {"seqs.position", &b.position}};
  for (const auto& [name, v] : vectors)
    if (!is_i32_vector(*v, b.num_seqs, device))
      return std::string(name) + " must be a dense i32 [num_seqs = " + S + "] tensor on " +
             std::string(core::device_name(device)) + ", got " + describe(*v);
  const core::TensorView& bt = b.block_table;
  if (!is_rows(bt) || bt.dtype != core::DType::i32 || bt.dim(0) != b.num_seqs || bt.dim(1) < 1 || bt.device != device)
    return "seqs.block_table must be i32 [num_seqs = " + S + ", max_blocks >= 1] with unit inner stride on " +
           std::string(core::device_name(device)) + ", got " + describe(bt);
  const int64_t block_size = pages.dim(1), num_blocks = pages.dim(0), max_blocks = bt.dim(1);
  if (b.max_tokens > max_blocks * block_size)
    return "seqs.max_tokens = " + std::to_string(b.max_tokens) + " is more than seqs.block_table's " +
           std::to_string(max_blocks) + " blocks of " + std::to_string(block_size) + " tokens can hold";
  if (device != core::Device::cpu) return "";  // device tables: values unchecked (no sync), see mla.h

  // Values (CPU tables): every sequence's rows and pages in range, rows of sequences disjoint.
  std::vector<std::pair<int64_t, int64_t>> spans;  // [row_begin, row_end) per sequence
  for (int s = 0; s < b.num_seqs; ++s) {
    const SeqRef r = seq_ref(b, s);
    const std::string at = "[" + std::to_string(s) + "]";
    if (r.num_rows < 1 || r.num_rows > b.max_rows)
      return "seqs.num_rows" + at + " = " + std::to_string(r.num_rows) +
             " is outside [1, max_rows = " + std::to_string(b.max_rows) + "]";
    if (r.row_begin < 0 || r.row_begin + r.num_rows > T)
      return "seqs.row_begin" + at + " = " + std::to_string(r.row_begin) + " with " + std::to_string(r.num_rows) +
             " rows is outside the " + std::to_string(T) + " rows of q";
    if (r.position < 0 || r.end() > b.max_tokens)
      return "seqs.position" + at + " = " + std::to_string(r.position) + " plus " + std::to_string(r.num_rows) +
             " rows is outside [0, max_tokens = " + std::to_string(b.max_tokens) + "]";
    for (int64_t blk = 0; blk * block_size < r.end(); ++blk)
      if (r.block_table[blk] < 0 || r.block_table[blk] >= num_blocks)
        return "seqs.block_table" + at + "[" + std::to_string(blk) + "] = " + std::to_string(r.block_table[blk]) +
               " is not a page id in [0, " + std::to_string(num_blocks) + ")";
    spans.push_back({r.row_begin, r.row_begin + r.num_rows});
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].first < spans[i - 1].second)
      return "seqs.row_begin / seqs.num_rows: two sequences share q row " + std::to_string(spans[i].first);
  return "";
}

HeadWeights load_head_weights(const MlaAttentionArgs& a, int h) {
  // kv_b rows per head: [h*(nope+v), h*(nope+v)+nope) = W_UK[h], the next v rows = W_UV[h].
  const int64_t L = a.kv_lora, first = static_cast<int64_t>(h) * (a.qk_nope + a.v_head_dim);
  HeadWeights w;
  w.w_uk.resize(static_cast<size_t>(a.qk_nope * L));
  w.w_uv.resize(static_cast<size_t>(a.v_head_dim * L));
  for (int64_t d = 0; d < a.qk_nope; ++d) a.kv_b->load_row(first + d, w.w_uk.data() + d * L);
  for (int64_t e = 0; e < a.v_head_dim; ++e) a.kv_b->load_row(first + a.qk_nope + e, w.w_uv.data() + e * L);
  return w;
}

std::vector<HeadWeights> load_all_head_weights(const MlaAttentionArgs& a, backends::cpu::ThreadPool* pool) {
  std::vector<HeadWeights> w(static_cast<size_t>(a.num_heads));
  backends::cpu::parallel_for(pool, a.num_heads, [&](int64_t begin, int64_t end) {
    for (int64_t h = begin; h < end; ++h) w[static_cast<size_t>(h)] = load_head_weights(a, static_cast<int>(h));
  });
  return w;
}

void softmax_inplace(float* s, int64_t n) {
  float m = s[0];
  for (int64_t j = 1; j < n; ++j) m = s[j] > m ? s[j] : m;
  float z = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    s[j] = std::exp(s[j] - m);
    z += s[j];
  }
  for (int64_t j = 0; j < n; ++j) s[j] = s[j] / z;
}

}  // namespace mla_detail

using mla_detail::describe;
using mla_detail::is_rows;

core::Status mla_attention_check(const MlaAttentionArgs& a) {
  const auto fail = [](const std::string& why) { return core::Status::fail("mla_attention: " + why); };
  if (a.num_heads < 1 || a.qk_nope < 1 || a.qk_rope < 1 || a.v_head_dim < 1 || a.kv_lora < 1)
    return fail("num_heads, qk_nope, qk_rope, v_head_dim and kv_lora must all be >= 1, got " +
                std::to_string(a.num_heads) + ", " + std::to_string(a.qk_nope) + ", " + std::to_string(a.qk_rope) +
                ", " + std::to_string(a.v_head_dim) + ", " + std::to_string(a.kv_lora));
  if (!(std::isfinite(a.scale) && a.scale > 0.0f))
    return fail("scale must be finite and > 0 (normally (qk_nope + qk_rope)^-1/2), got " + std::to_string(a.scale));
  if (!(std::isfinite(a.k_scale) && a.k_scale > 0.0f))
    return fail("k_scale must be finite and > 0, got " + std::to_string(a.k_scale));
  const int64_t H = a.num_heads, q_width = H * (a.qk_nope + a.qk_rope);
  const int64_t entry = a.kv_lora + a.qk_rope, out_width = H * a.v_head_dim;
  if (!is_rows(a.q) || !is_activation_dtype(a.q) || a.q.dim(1) != q_width)
    return fail("q must be f32 (or bf16 on CUDA) [T, num_heads * (qk_nope + qk_rope)] = [T, " +
                std::to_string(q_width) + "] with unit inner stride, got " + describe(a.q));
  const int64_t T = a.q.dim(0);
  if (a.pages.dtype != core::DType::f32 && a.pages.dtype != core::DType::f8_e4m3 &&
      !(a.pages.dtype == core::DType::bf16 && a.pages.device == core::Device::cuda))
    return fail("pages must be f32 or f8_e4m3 (or bf16 on CUDA), got " + describe(a.pages));
  if (!mla_detail::is_pages(a.pages) || a.pages.dim(2) != entry || a.pages.dim(0) < 1 || a.pages.dim(1) < 1)
    return fail("pages must be [num_blocks >= 1, block_size >= 1, kv_lora + qk_rope = " + std::to_string(entry) +
                "] with dense rows, got " + describe(a.pages));
  if (a.kv_b == nullptr || !a.kv_b->weight.defined()) return fail("kv_b is missing");
  const int64_t kv_b_rows = H * (a.qk_nope + a.v_head_dim);
  const core::TensorView& w = a.kv_b->weight.view();
  if (a.kv_b->is_mxfp4() || (w.dtype != core::DType::bf16 && w.dtype != core::DType::f32))
    return fail("kv_b must be a dense bf16 or f32 weight, got " + describe(w) + (a.kv_b->is_mxfp4() ? " (MXFP4)" : ""));
  if (w.rank() != 2 || w.dim(0) != kv_b_rows || w.dim(1) != a.kv_lora || !w.is_contiguous())
    return fail("kv_b must be contiguous [num_heads * (qk_nope + v_head_dim), kv_lora] = [" +
                std::to_string(kv_b_rows) + ", " + std::to_string(a.kv_lora) + "], got " + describe(w));
  if (!is_rows(a.out) || !is_activation_dtype(a.out) || a.out.dim(0) != T || a.out.dim(1) != out_width)
    return fail("out must be f32 (or bf16 on CUDA) [T, num_heads * v_head_dim] = [" + std::to_string(T) + ", " +
                std::to_string(out_width) + "] with unit inner stride, got " + describe(a.out));
  if (a.pages.device != a.q.device || a.out.device != a.q.device || w.device != a.q.device)
    return fail("q, pages, kv_b and out must be on one device");
  if (std::string why = mla_detail::seq_batch_problem(a.seqs, T, a.pages, a.q.device); !why.empty()) return fail(why);
  return core::Status::ok();
}

}  // namespace k3::kernels
