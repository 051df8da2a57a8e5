// kernels/mla/cuda_naive.cu: CUDA MLA attention in the naive (prefill) form (spec §6.1), every
// sequence of the batch in one launch per step, the cache read through the block tables:
//   1. the latent part of every sequence's cache, dequantised to f32 [num_seqs * max_tokens, kv_lora]
//      (sequence s at rows s * max_tokens ..; positions past its end are zeros);
//   2. keys and values per position, KV = round(c_n kv_b^T) [num_seqs * max_tokens, H*(nope+v)]
//      (row-dot kernel, f32; rows past a sequence's end are computed and never read);
//   3. one block per (row i, head h, sequence s): causal softmax over positions j <= position + i
//      in tiles of kTile with a running max and sum (online softmax), o = round(sum_j p_j v_j).
// score(t,j) = scale * (q_nope . k_nope[j] + q_pe . k_pe[j]) in fp32 (nope dims, then rope).
// Scratch and grids depend on num_seqs, max_rows, max_tokens and H only (graph-replayable).
#include "kernels/cuda_rowdot.cuh"
#include "kernels/mla/cuda_mla_common.cuh"
#include "kernels/mla/cuda_naive_flash.cuh"
#include "kernels/mla/ops.h"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

constexpr int kTile = 128;  // positions per tile = threads per block

// out[(s * max_tokens + j) * L + i] = c_n of position j of sequence s (0 past its end).
template <class CacheT>
__global__ void dequant_latent_kernel(SeqTables sq, const CacheT* pages, PagesRef pg, float k_scale, float* out,
                                      int64_t L) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= sq.num_seqs * sq.max_tokens * L) return;
  const int64_t slot = idx / L, i = idx % L;
  const int s = static_cast<int>(slot / sq.max_tokens);
  const int64_t j = slot % sq.max_tokens;
  const int64_t end = static_cast<int64_t>(sq.position[s]) + sq.num_rows[s];
  out[idx] = j < end ? cache_elem(pages, position_offset(pg, sq.block_table + s * sq.bt_ld, j) + i, k_scale) : 0.0f;
}

// Grid (max_rows, H, num_seqs); kv is the sequence-major expansion of step 2.
template <class T, class CacheT>
__global__ void __launch_bounds__(kTile)
    naive_attention_kernel(SeqTables sq, const T* q, int64_t q_ld, const float* kv, const CacheT* pages, PagesRef pg,
                           float k_scale, T* out, int64_t out_ld, int H, int nope, int rope, int vd, int L, float scale,
                           bool round) {
  extern __shared__ float q_s[];  // [padded_floats(nope + rope)], zeros past the end
  __shared__ float p_s[kTile];
  __shared__ float red[32];
  const int i_row = blockIdx.x, h = blockIdx.y, s = blockIdx.z, tid = threadIdx.x;
  if (i_row >= sq.num_rows[s]) return;  // the whole block: this sequence has fewer rows
  const int64_t t = static_cast<int64_t>(sq.row_begin[s]) + i_row;
  const int64_t visible = static_cast<int64_t>(sq.position[s]) + i_row + 1;  // positions 0 .. position + i
  const int32_t* table = sq.block_table + s * sq.bt_ld;
  const int qk = nope + rope, kv_width = H * (nope + vd);
  const float* kv_seq = kv + static_cast<int64_t>(s) * sq.max_tokens * kv_width;
  for (int d = tid; d < padded_floats(qk); d += blockDim.x)
    q_s[d] = d < qk ? to_f32(q[t * q_ld + static_cast<int64_t>(h) * qk + d]) : 0.0f;
  __syncthreads();
  float m = -INFINITY, l = 0.0f, acc[kMlaMaxV / kTile] = {};
  for (int64_t j0 = 0; j0 < visible; j0 += kTile) {
    const int64_t j = j0 + tid;
    float sc = -INFINITY;
    if (j < visible) {
      const float* kj = kv_seq + j * kv_width + static_cast<int64_t>(h) * (nope + vd);
      const CacheT* pe = pages + position_offset(pg, table, j) + L;
      float a = 0.0f;
      for (int d = 0; d < nope; ++d) a += q_s[d] * kj[d];
      for (int r = 0; r < rope; ++r) a += q_s[nope + r] * cache_elem(pe, r, k_scale);
      sc = scale * a;
    }
    const float m_new = fmaxf(m, block_max(sc, red));
    const float corr = expf(m - m_new);  // 0 on the first tile (m = -inf)
    const float pj = j < visible ? expf(sc - m_new) : 0.0f;
    p_s[tid] = pj;
    l = l * corr + block_sum(pj, red);  // block_sum's barriers also publish p_s
    m = m_new;
    const int n = static_cast<int>(visible - j0 < kTile ? visible - j0 : kTile);
#pragma unroll
    for (int u = 0; u < kMlaMaxV / kTile; ++u) {
      const int e = tid + u * kTile;
      if (e < vd) {
        const float* vcol = kv_seq + j0 * kv_width + static_cast<int64_t>(h) * (nope + vd) + nope + e;
        float a = acc[u] * corr;
        for (int jj = 0; jj < n; ++jj) a += p_s[jj] * vcol[static_cast<int64_t>(jj) * kv_width];
        acc[u] = a;
      }
    }
    __syncthreads();  // p_s is rewritten by the next tile
  }
#pragma unroll
  for (int u = 0; u < kMlaMaxV / kTile; ++u) {
    const int e = tid + u * kTile;
    if (e < vd) store_act(out + t * out_ld + static_cast<int64_t>(h) * vd + e, acc[u] / l, round);
  }
}

void naive_run(const CudaOps& ops, const MlaAttentionArgs& a) {
  const SeqTables sq = seq_tables(a.seqs);
  if (sq.num_seqs == 0) return;
  const int64_t L = a.kv_lora, rows = static_cast<int64_t>(sq.num_seqs) * sq.max_tokens;
  const int H = a.num_heads, nope = a.qk_nope, rope = a.qk_rope, vd = a.v_head_dim;
  const cudaStream_t stream = ops.ctx->stream();
  const bool round = a.precision == Precision::bf16;
  const int64_t kv_width = static_cast<int64_t>(H) * (nope + vd);
  const PagesRef pg = pages_ref(a.pages);
  std::shared_ptr<void> latent = ops.ctx->scratch(static_cast<size_t>(rows * L) * sizeof(float));
  std::shared_ptr<void> kv = ops.ctx->scratch(static_cast<size_t>(rows * kv_width) * sizeof(float));
  auto* latent_f = static_cast<float*>(latent.get());
  auto* kv_f = static_cast<float*>(kv.get());
  with_cache(a.pages, [&](const auto* pages) {
    dequant_latent_kernel<<<grid_for(rows * L, 256), 256, 0, stream>>>(sq, pages, pg, a.k_scale, latent_f, L);
    K3_CUDA_CHECK_LAUNCH("dequant_latent_kernel");
  });
  // Keys and values of every position, rounded like linear outputs (reference: round_act).
  launch_linear_rowdot<float, float>(weight_format(*a.kv_b), weight_ref(*a.kv_b), kv_width, L, latent_f, L, kv_f,
                                     kv_width, rows, round, stream);
  with_act(a.q.dtype, [&](auto tag) {
    using E = typename decltype(tag)::type;
    with_cache(a.pages, [&](const auto* pages) {
      const dim3 grid(static_cast<unsigned>(sq.max_rows), static_cast<unsigned>(H), static_cast<unsigned>(sq.num_seqs));
      const size_t smem = static_cast<size_t>(padded_floats(nope + rope)) * sizeof(float);
      naive_attention_kernel<<<grid, kTile, smem, stream>>>(sq, a.q.as<const E>(), a.q.strides[0], kv_f, pages, pg,
                                                            a.k_scale, a.out.as<E>(), a.out.strides[0], H, nope, rope,
                                                            vd, static_cast<int>(L), a.scale, round);
      K3_CUDA_CHECK_LAUNCH("naive_attention_kernel");
    });
  });
}

}  // namespace

void register_mla_naive_cuda(MlaOps& r, const CudaOps& ops) {
  r.mla_naive.add({"cuda_expand_online_softmax", core::Device::cuda,
                   [ops](const MlaAttentionArgs& a) {
                     if (auto s = mla_supports(ops, a); !s) return s;
                     if (a.num_heads > kMaxGridYZ || a.seqs.num_seqs > kMaxGridYZ)
                       return core::Status::fail("num_heads " + std::to_string(a.num_heads) + " or num_seqs " +
                                                 std::to_string(a.seqs.num_seqs) + " is above the CUDA grid limit " +
                                                 std::to_string(kMaxGridYZ));
                     const int64_t rows = static_cast<int64_t>(a.seqs.num_seqs) * a.seqs.max_tokens;
                     if ((rows + kRowdotInputs - 1) / kRowdotInputs > kMaxGridYZ)
                       return core::Status::fail("num_seqs * max_tokens = " + std::to_string(rows) +
                                                 " cache rows to expand is above the CUDA grid limit " +
                                                 std::to_string(kMaxGridYZ * kRowdotInputs));
                     if (a.v_head_dim > kMlaMaxV)
                       return core::Status::fail("v_head_dim " + std::to_string(a.v_head_dim) +
                                                 " is above the CUDA limit " + std::to_string(kMlaMaxV));
                     return core::Status::ok();
                   },
                   [ops](const MlaAttentionArgs& a) { naive_run(ops, a); }});
  // bf16 mode over bf16 / fp8 caches on tensor cores (cuda_naive_flash.cu), preferred where it applies.
  register_mla_naive_flash_cuda(r, ops);
}

}  // namespace k3::kernels
