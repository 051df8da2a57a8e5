// kernels/mla/mla_cp.cpp: checks and CPU references of the four MLA steps under decode context
// parallelism (kernels/mla/mla_cp.h).
//
// The loops follow mla_absorbed_reference (absorbed.cpp) step for step: q_lat summed over nope in
// d order, scores as one fp32 sum (latent dims, then rope), softmax with a sequential normaliser,
// o = sum_j p_j c_n,j in j order, W_UV summed over kv_lora in index order. With cp = 1 the rescale
// weight is exactly e^0 / e^0 = 1 and the four steps give mla_absorbed_reference's bytes.
#include "kernels/mla/mla_cp.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "backends/cpu/thread_pool.h"
#include "kernels/mla/mla_internal.h"

namespace k3::kernels {

namespace {

using mla_detail::describe;
using mla_detail::is_rows;

std::string str(int64_t v) { return std::to_string(v); }
// "[i]", appended piecewise (GCC 12 warns falsely, -Wrestrict, on "[" + string).
std::string index_str(int64_t i) {
  std::string s(1, '[');
  s += str(i);
  s += ']';
  return s;
}

// A dense f32 tensor of exactly `shape` on `device`.
bool is_f32_dense(const core::TensorView& v, const core::Shape& shape, core::Device device) {
  return v.defined() && v.dtype == core::DType::f32 && v.shape == shape && v.device == device && v.is_contiguous();
}

// "a contiguous f32 [2, 3, 4] tensor on cpu": the expectation in check messages.
std::string expect_f32(const core::Shape& shape, core::Device device) {
  return "a contiguous f32 " + shape.str() + " tensor on " + std::string(core::device_name(device));
}

// A dense i32 vector [n] on `device`.
bool is_i32_vector(const core::TensorView& v, int64_t n, core::Device device) {
  return v.defined() && v.rank() == 1 && v.dtype == core::DType::i32 && v.dim(0) == n &&
         (n <= 1 || v.strides[0] == 1) && (n == 0 || v.device == device);
}

// The rows-only part of a SeqBatch (steps 1, 3 and 4 read row_begin / num_rows alone): shapes on
// `device`, and for CPU tables every sequence's rows inside [0, T) and the sequences disjoint.
std::string seq_rows_problem(const SeqBatch& b, int64_t T, core::Device device) {
  const std::string S = str(b.num_seqs);
  if (b.num_seqs < 0) return "seqs.num_seqs must be >= 0, got " + S;
  if (b.num_seqs == 0) return "";
  if (b.max_rows < 1) return "seqs.max_rows must be >= 1, got " + str(b.max_rows);
  const std::pair<const char*, const core::TensorView*> vectors[] = {{"seqs.row_begin", &b.row_begin},
                                                                     {"seqs.num_rows", &b.num_rows}};
  for (const auto& [name, v] : vectors)
    if (!is_i32_vector(*v, b.num_seqs, device))
      return std::string(name) + " must be a dense i32 [num_seqs = " + S + "] tensor on " +
             std::string(core::device_name(device)) + ", got " + describe(*v);
  if (device != core::Device::cpu) return "";  // device tables: values unchecked (mla.h)
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (int s = 0; s < b.num_seqs; ++s) {
    const int64_t begin = b.row_begin.as<const int32_t>()[s * b.row_begin.strides[0]];
    const int64_t rows = b.num_rows.as<const int32_t>()[s * b.num_rows.strides[0]];
    const std::string at = index_str(s);
    if (rows < 1 || rows > b.max_rows)
      return "seqs.num_rows" + at + " = " + str(rows) + " is outside [1, max_rows = " + str(b.max_rows) + "]";
    if (begin < 0 || begin + rows > T)
      return "seqs.row_begin" + at + " = " + str(begin) + " with " + str(rows) + " rows is outside the " + str(T) +
             " rows";
    spans.push_back({begin, begin + rows});
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].first < spans[i - 1].second)
      return "seqs.row_begin / seqs.num_rows: two sequences share row " + str(spans[i].first);
  return "";
}

// Local positions of this rank that global position P sees: j with j * cp + rank <= P.
int64_t visible_local(int64_t P, int cp, int rank) { return P < rank ? 0 : (P - rank) / cp + 1; }

// The SeqBatch of mla_partial_attention: global positions, local block tables and max_tokens.
// Shapes as seq_batch_problem; values (CPU) with each sequence's LOCAL extent, the local positions
// its last row sees, inside max_tokens and its pages valid.
std::string cp_seq_batch_problem(const MlaPartialAttentionArgs& a, int64_t T) {
  const SeqBatch& b = a.seqs;
  const core::Device device = a.qc.device;
  if (std::string why = seq_rows_problem(b, T, device); !why.empty() || b.num_seqs == 0) return why;
  const std::string S = str(b.num_seqs);
  if (b.max_tokens < 1) return "seqs.max_tokens must be >= 1, got " + str(b.max_tokens);
  if (!is_i32_vector(b.position, b.num_seqs, device))
    return "seqs.position must be a dense i32 [num_seqs = " + S + "] tensor on " +
           std::string(core::device_name(device)) + ", got " + describe(b.position);
  const core::TensorView& bt = b.block_table;
  if (!is_rows(bt) || bt.dtype != core::DType::i32 || bt.dim(0) != b.num_seqs || bt.dim(1) < 1 || bt.device != device)
    return "seqs.block_table must be i32 [num_seqs = " + S + ", max_blocks >= 1] with unit inner stride on " +
           std::string(core::device_name(device)) + ", got " + describe(bt);
  const int64_t block_size = a.pages.dim(1), num_blocks = a.pages.dim(0), max_blocks = bt.dim(1);
  if (b.max_tokens > max_blocks * block_size)
    return "seqs.max_tokens = " + str(b.max_tokens) + " (local positions) is more than seqs.block_table's " +
           str(max_blocks) + " blocks of " + str(block_size) + " tokens can hold";
  if (device != core::Device::cpu) return "";
  for (int s = 0; s < b.num_seqs; ++s) {
    const mla_detail::SeqRef r = mla_detail::seq_ref(b, s);
    const std::string at = index_str(s);
    if (r.position < 0) return "seqs.position" + at + " = " + str(r.position) + " is negative";
    const int64_t local_end = visible_local(r.end() - 1, a.cp_size, a.cp_rank);
    if (local_end > b.max_tokens)
      return "seqs.position" + at + " = " + str(r.position) + " plus " + str(r.num_rows) +
             " rows reaches local position " + str(local_end) + " of rank " + str(a.cp_rank) + " of " + str(a.cp_size) +
             ", outside max_tokens = " + str(b.max_tokens);
    for (int64_t blk = 0; blk * block_size < local_end; ++blk)
      if (r.block_table[blk] < 0 || r.block_table[blk] >= num_blocks)
        return "seqs.block_table" + at + "[" + str(blk) + "] = " + str(r.block_table[blk]) +
               " is not a page id in [0, " + str(num_blocks) + ")";
  }
  return "";
}

// The kv_b weight both W_UK and W_UV come from: dense [H * (nope + v), kv_lora] on `device`.
std::string kv_b_problem(const LinearWeight* kv_b, int64_t H, int64_t nope, int64_t vd, int64_t L,
                         core::Device device) {
  if (kv_b == nullptr || !kv_b->weight.defined()) return "kv_b is missing";
  const core::TensorView& w = kv_b->weight.view();
  if (kv_b->is_mxfp4() || (w.dtype != core::DType::bf16 && w.dtype != core::DType::f32))
    return "kv_b must be a dense bf16 or f32 weight, got " + describe(w) + (kv_b->is_mxfp4() ? " (MXFP4)" : "");
  if (w.rank() != 2 || w.dim(0) != H * (nope + vd) || w.dim(1) != L || !w.is_contiguous())
    return "kv_b must be contiguous [num_heads * (qk_nope + v_head_dim), kv_lora] = [" + str(H * (nope + vd)) + ", " +
           str(L) + "], got " + describe(w);
  if (w.device != device) return "kv_b must be on " + std::string(core::device_name(device)) + ", got " + describe(w);
  return "";
}

// Per-head W_UK / W_UV slices through mla_detail::load_all_head_weights (it reads only kv_b and the dims).
std::vector<mla_detail::HeadWeights> head_weights(const LinearWeight* kv_b, int H, int nope, int vd, int L,
                                                  backends::cpu::ThreadPool* pool) {
  MlaAttentionArgs w;
  w.kv_b = kv_b;
  w.num_heads = H;
  w.qk_nope = nope;
  w.v_head_dim = vd;
  w.kv_lora = L;
  return mla_detail::load_all_head_weights(w, pool);
}

// mla_w_uv's gate is given (an undefined view has no data).
bool has_gate(const MlaWUvArgs& a) { return a.gate.data != nullptr; }

// Two row views of the same elements (out == gate is the one overlap mla_w_uv allows).
bool same_row_view(const core::TensorView& a, const core::TensorView& b) {
  return a.data == b.data && a.dtype == b.dtype && a.shape == b.shape && a.strides[0] == b.strides[0];
}

// sigmoid_gate_reference's element (kernels/elementwise/reference.cpp), the same expression and rounding
// points: round(x * round(sigmoid(g))). Written out here because kernels_mla does not link the elementwise
// op; kernels/mla/mla_cp_w_uv_ops_test.cpp checks the two agree bit for bit.
float sigmoid_gated(float x, float g, Precision p) {
  const float s = round_act(1.0f / (1.0f + std::exp(-g)), p);
  return round_act(x * s, p);
}

// Runs fn(row) for every row of every sequence of a checked CPU SeqBatch.
template <class Fn>
void for_each_row(const SeqBatch& b, Fn fn) {
  for (int s = 0; s < b.num_seqs; ++s) {
    const mla_detail::SeqRef r = mla_detail::seq_ref(b, s);
    for (int64_t t = r.row_begin; t < r.row_begin + r.num_rows; ++t) fn(t);
  }
}

}  // namespace

// ---- step 1: q absorb ------------------------------------------------------------------------

core::Status mla_q_absorb_check(const MlaQAbsorbArgs& a) {
  const auto fail = [](const std::string& why) { return core::Status::fail("mla_q_absorb: " + why); };
  if (a.num_heads < 1 || a.qk_nope < 1 || a.qk_rope < 1 || a.v_head_dim < 1 || a.kv_lora < 1)
    return fail("num_heads, qk_nope, qk_rope, v_head_dim and kv_lora must all be >= 1, got " + str(a.num_heads) + ", " +
                str(a.qk_nope) + ", " + str(a.qk_rope) + ", " + str(a.v_head_dim) + ", " + str(a.kv_lora));
  const int64_t H = a.num_heads, q_width = H * (a.qk_nope + a.qk_rope);
  if (!is_rows(a.q) || !is_activation_dtype(a.q) || a.q.dim(1) != q_width)
    return fail("q must be f32 (or bf16 on CUDA) [T, num_heads * (qk_nope + qk_rope)] = [T, " + str(q_width) +
                "] with unit inner stride, got " + describe(a.q));
  const int64_t T = a.q.dim(0);
  const core::Device dev = a.q.device;
  const core::Shape qc_shape{T, H, int64_t{a.kv_lora} + a.qk_rope};
  if (!is_f32_dense(a.qc, qc_shape, dev))
    return fail("qc must be " + expect_f32(qc_shape, dev) + " ([T, num_heads, kv_lora + qk_rope]), got " +
                describe(a.qc));
  if (std::string why = kv_b_problem(a.kv_b, H, a.qk_nope, a.v_head_dim, a.kv_lora, dev); !why.empty())
    return fail(why);
  if (std::string why = seq_rows_problem(a.seqs, T, dev); !why.empty()) return fail(why);
  return core::Status::ok();
}

void mla_q_absorb_reference(const MlaQAbsorbArgs& a, backends::cpu::ThreadPool* pool) {
  const core::Status st = mla_q_absorb_check(a);
  K3_CHECK(st.is_ok(), st.reason());
  K3_CHECK(a.q.device == core::Device::cpu, "mla_q_absorb_reference: tensors must be on the CPU");
  if (a.seqs.num_seqs == 0) return;
  const std::vector<mla_detail::HeadWeights> w = head_weights(a.kv_b, a.num_heads, a.qk_nope, a.v_head_dim, a.kv_lora,
                                                              pool);
  const int64_t H = a.num_heads, L = a.kv_lora, nope = a.qk_nope, rope = a.qk_rope, E = L + rope;
  std::vector<int64_t> rows;
  for_each_row(a.seqs, [&](int64_t t) { rows.push_back(t); });
  backends::cpu::parallel_for(pool, static_cast<int64_t>(rows.size()) * H, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      const int64_t t = rows[static_cast<size_t>(k / H)], h = k % H;
      const float* q_nope = mla_detail::row_ptr(a.q, t) + h * (nope + rope);
      float* qc = a.qc.as<float>() + (t * H + h) * E;
      // q_lat[i] = sum_d W_UK[d][i] q_nope[d]: d outer keeps each i's sum in d order (absorbed.cpp).
      for (int64_t i = 0; i < L; ++i) qc[i] = 0.0f;
      for (int64_t d = 0; d < nope; ++d) {
        const float* wr = w[static_cast<size_t>(h)].w_uk.data() + d * L;
        const float qd = q_nope[d];
        for (int64_t i = 0; i < L; ++i) qc[i] += wr[i] * qd;
      }
      for (int64_t i = 0; i < L; ++i) qc[i] = round_act(qc[i], a.precision);
      for (int64_t r = 0; r < rope; ++r) qc[L + r] = q_nope[nope + r];
    }
  });
}

// ---- step 2: partial attention over this rank's tokens ---------------------------------------

core::Status mla_partial_attention_check(const MlaPartialAttentionArgs& a) {
  const auto fail = [](const std::string& why) { return core::Status::fail("mla_partial_attention: " + why); };
  if (a.cp_size < 1 || a.cp_rank < 0 || a.cp_rank >= a.cp_size)
    return fail("cp_rank must be in [0, cp_size) with cp_size >= 1, got cp_rank " + str(a.cp_rank) + " of cp_size " +
                str(a.cp_size));
  if (!(std::isfinite(a.scale) && a.scale > 0.0f))
    return fail("scale must be finite and > 0 (normally (qk_nope + qk_rope)^-1/2), got " + std::to_string(a.scale));
  if (!(std::isfinite(a.k_scale) && a.k_scale > 0.0f))
    return fail("k_scale must be finite and > 0, got " + std::to_string(a.k_scale));
  if (!a.qc.defined() || a.qc.rank() != 4 || a.qc.dtype != core::DType::f32 || !a.qc.is_contiguous() ||
      a.qc.numel() == 0)
    return fail("qc must be a contiguous, non-empty f32 [G, T, H, kv_lora + rope] tensor, got " + describe(a.qc));
  const int64_t G = a.qc.dim(0), T = a.qc.dim(1), H = a.qc.dim(2), E = a.qc.dim(3);
  const int64_t L = a.o_part.rank() == 4 ? a.o_part.dim(3) : -1;
  const core::Device dev = a.qc.device;
  if (L < 1 || L >= E || !is_f32_dense(a.o_part, core::Shape{G, T, H, L}, dev))
    return fail("o_part must be a contiguous f32 [G, T, H, kv_lora] = [" + str(G) + ", " + str(T) + ", " + str(H) +
                ", kv_lora < " + str(E) + "] tensor on " + std::string(core::device_name(dev)) + " (qc is " +
                describe(a.qc) + "), got " + describe(a.o_part));
  if (!is_f32_dense(a.lse, core::Shape{G, T, H}, dev))
    return fail("lse must be " + expect_f32(core::Shape{G, T, H}, dev) + " ([G, T, H] of qc), got " + describe(a.lse));
  if (a.pages.dtype != core::DType::f32 && a.pages.dtype != core::DType::f8_e4m3 &&
      !(a.pages.dtype == core::DType::bf16 && a.pages.device == core::Device::cuda))
    return fail("pages must be f32 or f8_e4m3 (or bf16 on CUDA), got " + describe(a.pages));
  if (!mla_detail::is_pages(a.pages) || a.pages.dim(2) != E || a.pages.dim(0) < 1 || a.pages.dim(1) < 1)
    return fail("pages must be [num_blocks >= 1, block_size >= 1, kv_lora + rope = " + str(E) +
                "] with dense rows, got " + describe(a.pages));
  if (a.pages.device != dev)
    return fail("qc, pages, o_part and lse must be on one device, pages is " + describe(a.pages));
  if (std::string why = cp_seq_batch_problem(a, T); !why.empty()) return fail(why);
  return core::Status::ok();
}

void mla_partial_attention_reference(const MlaPartialAttentionArgs& a, backends::cpu::ThreadPool* pool) {
  const core::Status st = mla_partial_attention_check(a);
  K3_CHECK(st.is_ok(), st.reason());
  K3_CHECK(a.qc.device == core::Device::cpu, "mla_partial_attention_reference: tensors must be on the CPU");
  const int64_t G = a.qc.dim(0), T = a.qc.dim(1), H = a.qc.dim(2), E = a.qc.dim(3), L = a.o_part.dim(3), rope = E - L;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int s = 0; s < a.seqs.num_seqs; ++s) {
    const mla_detail::SeqRef seq = mla_detail::seq_ref(a.seqs, s);
    // This rank's local positions the sequence's last row sees (the others see a prefix of them).
    const int64_t local_end = visible_local(seq.end() - 1, a.cp_size, a.cp_rank);
    const mla_detail::DequantCache cache = mla_detail::dequantize_sequence(a.pages, seq.block_table, local_end,
                                                                           a.k_scale, L, rope);
    // (owner g, head h) pairs are independent: each writes its own o_part / lse entries.
    backends::cpu::parallel_for(pool, G * H, [&](int64_t begin, int64_t end) {
      std::vector<float> p(static_cast<size_t>(local_end));
      for (int64_t gh = begin; gh < end; ++gh) {
        const int64_t g = gh / H, h = gh % H;
        for (int64_t t = 0; t < seq.num_rows; ++t) {
          const int64_t row = seq.row_begin + t, at = (g * T + row) * H + h;
          const float* qc = a.qc.as<const float>() + at * E;
          float* o = a.o_part.as<float>() + at * L;
          float* lse = a.lse.as<float>() + at;
          const int64_t visible = visible_local(seq.position + t, a.cp_size, a.cp_rank);
          for (int64_t i = 0; i < L; ++i) o[i] = 0.0f;
          if (visible == 0) {  // none of this rank's tokens is old enough: weight 0 in the rescale
            *lse = neg_inf;
            continue;
          }
          for (int64_t j = 0; j < visible; ++j) {
            const float* c = cache.c_n_row(j);
            const float* pe = cache.k_pe_row(j);
            float acc = 0.0f;
            for (int64_t i = 0; i < L; ++i) acc += qc[i] * c[i];
            for (int64_t r = 0; r < rope; ++r) acc += qc[L + r] * pe[r];
            p[j] = a.scale * acc;
          }
          float m = p[0];
          for (int64_t j = 1; j < visible; ++j) m = p[j] > m ? p[j] : m;
          float z = 0.0f;
          for (int64_t j = 0; j < visible; ++j) {
            p[j] = std::exp(p[j] - m);
            z += p[j];
          }
          for (int64_t j = 0; j < visible; ++j) p[j] = p[j] / z;
          *lse = m + std::log(z);
          for (int64_t j = 0; j < visible; ++j) {
            const float* c = cache.c_n_row(j);
            const float pj = p[j];
            for (int64_t i = 0; i < L; ++i) o[i] += pj * c[i];
          }
        }
      }
    });
  }
}

// ---- step 3: log-sum-exp rescale -------------------------------------------------------------

core::Status mla_lse_rescale_check(const MlaLseRescaleArgs& a) {
  const auto fail = [](const std::string& why) { return core::Status::fail("mla_lse_rescale: " + why); };
  if (!a.o_part.defined() || a.o_part.rank() != 4 || a.o_part.dtype != core::DType::f32 || !a.o_part.is_contiguous() ||
      a.o_part.numel() == 0)
    return fail("o_part must be a contiguous, non-empty f32 [G, T, H, kv_lora] tensor, got " + describe(a.o_part));
  const int64_t G = a.o_part.dim(0), T = a.o_part.dim(1), H = a.o_part.dim(2);
  const core::Device dev = a.o_part.device;
  const int64_t cp = a.lse_all.rank() == 4 ? a.lse_all.dim(0) : -1;
  if (cp < 1 || !is_f32_dense(a.lse_all, core::Shape{cp, G, T, H}, dev))
    return fail("lse_all must be a contiguous f32 [cp, G, T, H] = [cp, " + str(G) + ", " + str(T) + ", " + str(H) +
                "] tensor on " + std::string(core::device_name(dev)) + " (o_part is " + describe(a.o_part) + "), got " +
                describe(a.lse_all));
  if (a.cp_rank < 0 || a.cp_rank >= cp)
    return fail("cp_rank must be in [0, cp = " + str(cp) + ") (lse_all's first dim), got " + str(a.cp_rank));
  if (std::string why = seq_rows_problem(a.seqs, T, dev); !why.empty()) return fail(why);
  return core::Status::ok();
}

void mla_lse_rescale_reference(const MlaLseRescaleArgs& a) {
  const core::Status st = mla_lse_rescale_check(a);
  K3_CHECK(st.is_ok(), st.reason());
  K3_CHECK(a.o_part.device == core::Device::cpu, "mla_lse_rescale_reference: tensors must be on the CPU");
  const int64_t G = a.o_part.dim(0), T = a.o_part.dim(1), H = a.o_part.dim(2), L = a.o_part.dim(3);
  const int64_t cp = a.lse_all.dim(0), per_rank = G * T * H;  // lse_all[r] is [G, T, H]
  const float* lse = a.lse_all.as<const float>();
  for_each_row(a.seqs, [&](int64_t t) {
    for (int64_t g = 0; g < G; ++g)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t at = (g * T + t) * H + h;
        float m = lse[at];
        for (int64_t r = 1; r < cp; ++r) m = lse[r * per_rank + at] > m ? lse[r * per_rank + at] : m;
        float w = 0.0f;  // every rank -inf (no rank saw a token) cannot happen (mla_cp.h); give weight 0
        if (std::isfinite(m)) {
          float sum = 0.0f;
          for (int64_t r = 0; r < cp; ++r) sum += std::exp(lse[r * per_rank + at] - m);
          w = std::exp(lse[a.cp_rank * per_rank + at] - m) / sum;
        }
        float* o = a.o_part.as<float>() + at * L;
        for (int64_t i = 0; i < L; ++i) o[i] *= w;
      }
  });
}

// ---- step 4: W_UV ----------------------------------------------------------------------------

core::Status mla_w_uv_check(const MlaWUvArgs& a) {
  const auto fail = [](const std::string& why) { return core::Status::fail("mla_w_uv: " + why); };
  if (a.num_heads < 1 || a.qk_nope < 1 || a.v_head_dim < 1 || a.kv_lora < 1)
    return fail("num_heads, qk_nope, v_head_dim and kv_lora must all be >= 1, got " + str(a.num_heads) + ", " +
                str(a.qk_nope) + ", " + str(a.v_head_dim) + ", " + str(a.kv_lora));
  const int64_t H = a.num_heads, out_width = H * a.v_head_dim;
  if (!a.o_lat.defined() || a.o_lat.rank() != 3)
    return fail("o_lat must be a contiguous f32 [T, num_heads, kv_lora] tensor, got " + describe(a.o_lat));
  const int64_t T = a.o_lat.dim(0);
  const core::Device dev = a.o_lat.device;
  if (!is_f32_dense(a.o_lat, core::Shape{T, H, a.kv_lora}, dev))
    return fail("o_lat must be " + expect_f32(core::Shape{T, H, a.kv_lora}, dev) + " ([T, num_heads, kv_lora]), got " +
                describe(a.o_lat));
  if (!is_rows(a.out) || !is_activation_dtype(a.out) || a.out.dim(0) != T || a.out.dim(1) != out_width ||
      a.out.device != dev)
    return fail("out must be f32 (or bf16 on CUDA) [T, num_heads * v_head_dim] = [" + str(T) + ", " + str(out_width) +
                "] with unit inner stride on " + std::string(core::device_name(dev)) + ", got " + describe(a.out));
  // o_lat (contiguous, checked above) as the [T, H * kv_lora] rows it spans, for the overlap test.
  const core::TensorView o_lat_rows = core::TensorView::contiguous(a.o_lat.data, core::DType::f32, {T, H * a.kv_lora},
                                                                   dev);
  if (row_views_overlap(a.out, o_lat_rows)) return fail("out must not overlap o_lat");
  if (has_gate(a)) {
    if (!is_rows(a.gate) || a.gate.dtype != a.out.dtype || a.gate.dim(0) != T || a.gate.dim(1) != out_width)
      return fail("gate must be undefined (no gate) or " + std::string(core::dtype_name(a.out.dtype)) +
                  " (out's dtype) [T, num_heads * v_head_dim] = [" + str(T) + ", " + str(out_width) +
                  "] with unit inner stride, got " + describe(a.gate));
    if (a.gate.device != dev)
      return fail("gate must be on " + std::string(core::device_name(dev)) + " (o_lat's device), got " +
                  describe(a.gate));
    if (row_views_overlap(a.out, a.gate) && !same_row_view(a.out, a.gate))
      return fail("out overlaps gate without being the same view (only out == gate is allowed)");
  }
  if (std::string why = kv_b_problem(a.kv_b, H, a.qk_nope, a.v_head_dim, a.kv_lora, dev); !why.empty())
    return fail(why);
  if (std::string why = seq_rows_problem(a.seqs, T, dev); !why.empty()) return fail(why);
  return core::Status::ok();
}

void mla_w_uv_reference(const MlaWUvArgs& a, backends::cpu::ThreadPool* pool) {
  const core::Status st = mla_w_uv_check(a);
  K3_CHECK(st.is_ok(), st.reason());
  K3_CHECK(a.o_lat.device == core::Device::cpu, "mla_w_uv_reference: tensors must be on the CPU");
  if (a.seqs.num_seqs == 0) return;
  const std::vector<mla_detail::HeadWeights> w = head_weights(a.kv_b, a.num_heads, a.qk_nope, a.v_head_dim, a.kv_lora,
                                                              pool);
  const int64_t H = a.num_heads, L = a.kv_lora, vd = a.v_head_dim;
  const bool gated = has_gate(a);
  std::vector<int64_t> rows;
  for_each_row(a.seqs, [&](int64_t t) { rows.push_back(t); });
  // (t, h) pairs are independent: each reads its gate elements and writes the same out elements only.
  backends::cpu::parallel_for(pool, static_cast<int64_t>(rows.size()) * H, [&](int64_t begin, int64_t end) {
    std::vector<float> o_lat(static_cast<size_t>(L));
    for (int64_t k = begin; k < end; ++k) {
      const int64_t t = rows[static_cast<size_t>(k / H)], h = k % H;
      const float* src = a.o_lat.as<const float>() + (t * H + h) * L;
      for (int64_t i = 0; i < L; ++i) o_lat[i] = round_act(src[i], a.precision);
      float* out = mla_detail::mutable_row_ptr(a.out, t) + h * vd;
      const float* gate = gated ? mla_detail::row_ptr(a.gate, t) + h * vd : nullptr;  // may be `out` itself
      for (int64_t e = 0; e < vd; ++e) {
        const float* wr = w[static_cast<size_t>(h)].w_uv.data() + e * L;
        float acc = 0.0f;
        for (int64_t i = 0; i < L; ++i) acc += wr[i] * o_lat[i];
        const float o = round_act(acc, a.precision);  // what mla_w_uv stores without a gate
        out[e] = gated ? sigmoid_gated(o, gate[e], a.precision) : o;
      }
    }
  });
}

}  // namespace k3::kernels
