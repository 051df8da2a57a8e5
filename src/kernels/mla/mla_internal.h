// kernels/mla/mla_internal.h: helpers shared by the MLA reference forms (not a public API).
//
// Both forms (naive.cpp, absorbed.cpp) read the same dequantised cache and use the same
// softmax, so the only difference between them is where the kv_b product is applied and
// where bf16 rounding happens: that is what the naive-vs-absorbed test checks. Both run one
// sequence of the batch at a time over a dense copy of its cache rows 0 .. end-1, so a batched
// paged call gives exactly the bytes of one call per sequence over a contiguous cache.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/mla/mla.h"

namespace k3::kernels::mla_detail {

// The cache as f32 values (f8_e4m3 codes dequantised: fp8(code) * k_scale).
//   c_n  [S, kv_lora], k_pe [S, rope], both dense row-major.
struct DequantCache {
  int64_t positions = 0, kv_lora = 0, rope = 0;
  std::vector<float> c_n;   // [positions, kv_lora]
  std::vector<float> k_pe;  // [positions, rope]
  const float* c_n_row(int64_t j) const { return c_n.data() + j * kv_lora; }
  const float* k_pe_row(int64_t j) const { return k_pe.data() + j * rope; }
};
// Reads rows [S, kv_lora + rope] (f32 or f8_e4m3, rows may be strided) into a DequantCache.
DequantCache dequantize_cache(const core::TensorView& rows, float k_scale, int64_t kv_lora, int64_t rope);
// Reads token positions 0 .. tokens-1 of one sequence from pages [num_blocks, block_size, width]
// through its block table (page of position p = block_table[p / block_size]).
DequantCache dequantize_sequence(const core::TensorView& pages, const int32_t* block_table, int64_t tokens,
                                 float k_scale, int64_t kv_lora, int64_t rope);

// Element pointer of cache row `row` = page * block_size + offset of pages [num_blocks, block_size, width].
inline char* page_row_ptr(const core::TensorView& pages, int64_t row) {
  const int64_t bs = pages.dim(1);
  const int64_t elems = (row / bs) * pages.strides[0] + (row % bs) * pages.strides[1];
  return static_cast<char*>(pages.data) + elems * static_cast<int64_t>(core::dtype_size(pages.dtype));
}

// Sequence s of a CPU SeqBatch (tables already checked).
struct SeqRef {
  int64_t row_begin = 0, num_rows = 0, position = 0;
  const int32_t* block_table = nullptr;                // its row of the [S, max_blocks] table
  int64_t end() const { return position + num_rows; }  // cache positions it sees: 0 .. end-1
};
inline SeqRef seq_ref(const SeqBatch& b, int s) {
  SeqRef r;
  r.row_begin = b.row_begin.as<const int32_t>()[s * b.row_begin.strides[0]];
  r.num_rows = b.num_rows.as<const int32_t>()[s * b.num_rows.strides[0]];
  r.position = b.position.as<const int32_t>()[s * b.position.strides[0]];
  r.block_table = b.block_table.as<const int32_t>() + s * b.block_table.strides[0];
  return r;
}

// Per-head slices of kv_b as f32: W_UK[h] [nope, kv_lora] and W_UV[h] [v, kv_lora], row-major.
struct HeadWeights {
  std::vector<float> w_uk, w_uv;
};
HeadWeights load_head_weights(const MlaAttentionArgs& a, int h);
// Every head's slices, loaded once per call (heads in parallel).
std::vector<HeadWeights> load_all_head_weights(const MlaAttentionArgs& a, backends::cpu::ThreadPool* pool);

// In-place fp32 softmax over s[0..n): m = max, e_j = expf(s_j - m), Z = sequential sum of e_j,
// p_j = e_j / Z. n >= 1 (a query always sees at least its own position).
void softmax_inplace(float* s, int64_t n);

// True for a defined rank-2 view whose rows are dense (inner stride 1) and do not overlap.
bool is_rows(const core::TensorView& v);
// True for a defined rank-3 pages view [num_blocks, block_size, width] with dense, non-overlapping rows.
bool is_pages(const core::TensorView& v);
// "f32 [3, 4]" (or "undefined"), for check messages.
std::string describe(const core::TensorView& v);

// Shape / dtype / device checks of a SeqBatch for q rows [T, ...] and pages [num_blocks, block_size, ...]
// on `device`, plus (CPU tables) value checks; "" when fine, else the reason naming the argument.
std::string seq_batch_problem(const SeqBatch& b, int64_t T, const core::TensorView& pages, core::Device device);

// Row pointers into the [T, ...] f32 activations (innermost stride 1, row stride strides[0]).
inline const float* row_ptr(const core::TensorView& v, int64_t r) { return v.as<const float>() + r * v.strides[0]; }
inline float* mutable_row_ptr(const core::TensorView& v, int64_t r) { return v.as<float>() + r * v.strides[0]; }

}  // namespace k3::kernels::mla_detail
