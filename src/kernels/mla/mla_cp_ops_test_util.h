// kernels/mla/mla_cp_ops_test_util.h: what the decode-context-parallel op tests (mla_cp_ops_test.cpp,
// mla_cp_chain_ops_test.cpp) share: the case tables' types (kernels/mla/cases.h), a batch's rows and
// tables, one rank's paged cache built through the CPU cache-write reference, and the owned-rows checks.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "kernels/mla/cases.h"
#include "kernels/testing/op_harness.h"

namespace k3::ops_test::mla_cp {

using Dims = kernels::MlaShape;  // heads: per rank (the owner's H)
using Seq = kernels::MlaSeq;     // S tokens after the step, T rows at global positions S - T .. S - 1
using Group = kernels::MlaCpGroup;

// A case table as a vector.
template <class T, size_t N>
std::vector<T> as_vector(const T (&a)[N]) {
  return std::vector<T>(std::begin(a), std::end(a));
}

inline constexpr const char* kQAbsorb = "cuda_q_absorb";
inline constexpr const char* kPartial = "cuda_partial_splitkv";
inline constexpr const char* kPartialMma = "cuda_partial_splitkv_mma";
inline constexpr const char* kRescale = "cuda_lse_rescale";
inline constexpr const char* kWUv = "cuda_w_uv_rowdot";
inline constexpr float kInf = std::numeric_limits<float>::infinity();

inline Tensor i32_host(const std::vector<int32_t>& v, Shape shape) {
  Tensor t = Tensor::zeros(DType::i32, shape);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}
inline Tensor i32_host(const std::vector<int32_t>& v) { return i32_host(v, {static_cast<int64_t>(v.size())}); }
inline float scale_of(const Dims& d) { return 1.0f / std::sqrt(static_cast<float>(d.nope + d.rope)); }
// Local positions of `rank` among global positions 0 .. end-1 (position p lives on rank p % cp).
inline int64_t local_count(int64_t end, int cp, int rank) { return end > rank ? (end - 1 - rank) / cp + 1 : 0; }

// Activation rows of a batch: row 0 belongs to no sequence, then the sequences in reverse order.
struct Rows {
  std::vector<int32_t> begins, counts, positions;
  int64_t total = 1;
  int max_rows = 0;
  explicit Rows(const std::vector<Seq>& seqs) : begins(seqs.size()) {
    for (size_t k = seqs.size(); k-- > 0;) {
      begins[k] = static_cast<int32_t>(total);
      total += seqs[k].T;
    }
    for (const Seq& s : seqs) {
      counts.push_back(static_cast<int32_t>(s.T));
      positions.push_back(static_cast<int32_t>(s.S - s.T));
      max_rows = std::max(max_rows, static_cast<int>(s.T) + 1);  // one spare row slot per sequence
    }
  }
};

// One rank's pages of a batch (cp = 1: the whole cache). Spare slots hold NaN (f32 / bf16 caches) or
// the fp8 NaN code, so a kernel reading past a sequence's visible positions poisons its output.
struct Cache {
  Tensor pages;        // CPU: f32 (bf16 values for a "bf16" cache) or f8_e4m3 [blocks, bs, E]
  Tensor block_table;  // i32 [S, max_blocks], -1 past each sequence's pages
  int64_t max_tokens = 0;
};
// c_n[s] [n_s, L] and k_pe[s] [n_s, rope]: sequence s's cache entries in local order.
inline Cache build_cache(const std::vector<Tensor>& c_n, const std::vector<Tensor>& k_pe, int64_t bs,
                         const std::string& kind, float k_scale, core::Rng& rng) {
  const auto S = static_cast<int64_t>(c_n.size());
  const int64_t L = c_n[0].dim(1), rope = k_pe[0].dim(1);
  int64_t blocks = 0, n_max = 0;
  for (const Tensor& t : c_n) {
    blocks += (t.dim(0) + bs - 1) / bs;
    n_max = std::max(n_max, t.dim(0));
  }
  Cache c;
  c.max_tokens = n_max + 2;
  const int64_t max_blocks = (c.max_tokens + bs - 1) / bs, num_blocks = blocks + 2;
  std::vector<int32_t> pool(static_cast<size_t>(num_blocks));
  for (int64_t i = 0; i < num_blocks; ++i) pool[i] = static_cast<int32_t>(i);
  for (int64_t i = num_blocks - 1; i > 0; --i) std::swap(pool[i], pool[rng.next_u64() % static_cast<uint64_t>(i + 1)]);
  std::vector<int32_t> table(static_cast<size_t>(S * max_blocks), -1), rows;
  size_t next = 0;
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t b = 0; b * bs < c_n[s].dim(0); ++b) table[s * max_blocks + b] = pool[next++];
    for (int64_t j = 0; j < c_n[s].dim(0); ++j)
      rows.push_back(static_cast<int32_t>(table[s * max_blocks + j / bs] * bs + j % bs));
  }
  const bool fp8 = kind == "fp8";
  c.pages = Tensor::zeros(fp8 ? DType::f8_e4m3 : DType::f32, {num_blocks, bs, L + rope});
  if (fp8) std::memset(c.pages.data<uint8_t>(), 0x7f, static_cast<size_t>(c.pages.numel()));
  else std::fill(c.pages.span<float>().begin(), c.pages.span<float>().end(), std::numeric_limits<float>::quiet_NaN());
  const auto n = static_cast<int64_t>(rows.size());
  Tensor all_c = f32_tensor({n, L}), all_pe = f32_tensor({n, rope});
  int64_t at = 0;
  for (int64_t s = 0; s < S; ++s) {
    std::copy_n(c_n[s].data<const float>(), c_n[s].numel(), all_c.data<float>() + at * L);
    std::copy_n(k_pe[s].data<const float>(), k_pe[s].numel(), all_pe.data<float>() + at * rope);
    at += c_n[s].dim(0);
  }
  const Tensor cache_rows = i32_host(rows);
  cpu_registry().mla_cache_write.run({all_c.view(), all_pe.view(), c.pages.view(), cache_rows.view(), k_scale},
                                     core::Device::cpu);
  c.block_table = i32_host(table, {S, max_blocks});
  return c;
}
// Rows rank, rank + cp, ... of a CPU f32 [N, W] tensor (the entries a rank stores).
inline Tensor take_local(const Tensor& t, int cp, int rank) {
  const int64_t n = local_count(t.dim(0), cp, rank), W = t.dim(1);
  Tensor out = f32_tensor({n, W});
  for (int64_t j = 0; j < n; ++j)
    std::copy_n(t.data<const float>() + (j * cp + rank) * W, W, out.data<float>() + j * W);
  return out;
}
// The device copy of a CPU cache's pages ("bf16": real bf16 pages, else the same bytes).
inline Tensor device_pages(Device* dev, const Cache& c, const std::string& kind) {
  return kind == "bf16" ? dev->upload(c.pages, DType::bf16) : dev->upload(c.pages);
}

// A batch's tables, on the CPU (dev null) or uploaded to a device; block_table may be undefined
// (the ops that read row_begin / num_rows only).
struct Tables {
  Tensor row_begin, num_rows, position, block_table;
  Tables(const Rows& r, const Tensor& bt, Device* dev)
      : row_begin(i32_host(r.begins)), num_rows(i32_host(r.counts)), position(i32_host(r.positions)), block_table(bt) {
    if (dev == nullptr) return;
    row_begin = dev->upload(row_begin);
    num_rows = dev->upload(num_rows);
    position = dev->upload(position);
    if (block_table.defined()) block_table = dev->upload(block_table);
  }
  kernels::SeqBatch seqs(const Rows& r, int64_t max_tokens) const {
    kernels::SeqBatch b;
    b.row_begin = row_begin.view();
    b.num_rows = num_rows.view();
    b.position = position.view();
    if (block_table.defined()) b.block_table = block_table.view();
    b.num_seqs = static_cast<int>(r.counts.size());
    b.max_rows = r.max_rows;
    b.max_tokens = max_tokens;
    return b;
  }
};

// Rows 1.. of a [R, ...] tensor viewed as [R, inner] and flattened (the owned rows), and the check
// that row 0 (no sequence) still holds `row0` (NaN poison, or the input for in-place ops).
inline Tensor owned_rows(const Tensor& t, int64_t R) {
  const int64_t inner = t.numel() / R;
  Tensor out = f32_tensor({(R - 1) * inner});
  std::copy_n(t.data<const float>() + inner, (R - 1) * inner, out.data<float>());
  return out;
}
// For [G, R, inner] tensors: every g's rows 1.., and row 0 of every g must be NaN.
inline Tensor owned_rows_g(const Tensor& t, int64_t G, int64_t R, const char* what) {
  const int64_t inner = t.numel() / (G * R);
  Tensor out = f32_tensor({G * (R - 1) * inner});
  for (int64_t g = 0; g < G; ++g) {
    const float* src = t.data<const float>() + g * R * inner;
    for (int64_t i = 0; i < inner; ++i)
      EXPECT_TRUE(std::isnan(src[i])) << what << ": row 0 of owner " << g << " written";
    std::copy_n(src + inner, (R - 1) * inner, out.data<float>() + g * (R - 1) * inner);
  }
  return out;
}
inline void expect_row0_nan(const Tensor& t, int64_t R, const char* what) {
  const int64_t inner = t.numel() / R;
  for (int64_t i = 0; i < inner; ++i) ASSERT_TRUE(std::isnan(t.data<const float>()[i])) << what << ": row 0 written";
}

}  // namespace k3::ops_test::mla_cp
