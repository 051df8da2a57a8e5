// kernels/mla/ops.h: the op tables of one family, gated MLA: the latent cache, naive and absorbed
// attention, the decode context parallel ops, the fused front and the fused decode op.
// kernels/registry.h's Registry holds one of each family. Adding an op or an implementation of
// the family touches this folder only: its table here, its CPU reference in ops.cpp, its CUDA
// registration in cuda_ops.cu, its tuning rule (if it has rivals) in tuning/*.json.
#pragma once
#include "kernels/mla/mla.h"
#include "kernels/mla/mla_cp.h"
#include "kernels/mla/mla_decode.h"
#include "kernels/mla/mla_prep.h"
#include "kernels/op_table.h"

namespace k3::kernels {

struct MlaOps {
  OpTable<MlaCacheWriteArgs> mla_cache_write{"mla_cache_write", mla_cache_write_check};
  OpTable<MlaAttentionArgs> mla_naive{"mla_naive", mla_attention_check};
  OpTable<MlaAttentionArgs> mla_absorbed{"mla_absorbed", mla_attention_check};
  // Decode context parallelism (mla_cp.h):
  OpTable<MlaQAbsorbArgs> mla_q_absorb{"mla_q_absorb", mla_q_absorb_check};
  OpTable<MlaPartialAttentionArgs> mla_partial_attention{"mla_partial_attention", mla_partial_attention_check};
  OpTable<MlaLseRescaleArgs> mla_lse_rescale{"mla_lse_rescale", mla_lse_rescale_check};
  OpTable<MlaWUvArgs> mla_w_uv{"mla_w_uv", mla_w_uv_check};
  OpTable<MlaCacheGatherArgs> mla_cache_gather{"mla_cache_gather", mla_cache_gather_check};  // DCP prefill (mla.h)
  // The fused decode path (fastpath/):
  OpTable<MlaPrepArgs> mla_prep{"mla_prep", mla_prep_check};
  OpTable<MlaDecodeArgs> mla_decode{"mla_decode", mla_decode_check};

  // Calls fn(table) for every op table of the family.
  template <class Fn>
  void for_each(Fn&& fn) {
    fn(mla_cache_write);
    fn(mla_naive);
    fn(mla_absorbed);
    fn(mla_q_absorb);
    fn(mla_partial_attention);
    fn(mla_lse_rescale);
    fn(mla_w_uv);
    fn(mla_cache_gather);
    fn(mla_prep);
    fn(mla_decode);
  }
  // The CPU reference of every op (ops.cpp).
  void register_reference(const CpuOps& cpu);
  // Every CUDA implementation, in the order that breaks ties the tuning tables leave
  // (cuda_ops.cu; CUDA builds only).
  void register_cuda(const CudaOps& cuda);
};

// One registration function per CUDA source of the folder (cuda_*.cu).
void register_mla_cache_cuda(MlaOps& r, const CudaOps& ops);
void register_mla_naive_cuda(MlaOps& r, const CudaOps& ops);
void register_mla_absorbed_cuda(MlaOps& r, const CudaOps& ops);
void register_mla_absorbed_mma_cuda(MlaOps& r, const CudaOps& ops);
void register_mla_cp_cuda(MlaOps& r, const CudaOps& ops);
void register_mla_partial_mma_cuda(MlaOps& r, const CudaOps& ops);
void register_mla_decode_cuda(MlaOps& r, const CudaOps& ops);
void register_mla_prep_cuda(MlaOps& r, const CudaOps& ops);

}  // namespace k3::kernels
