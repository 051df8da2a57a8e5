// kernels/kda/ops.h: the op tables of one family, Kimi Delta Attention: the short conv, recurrent
// and chunked attention, the output gate and the fused decode op.
// kernels/registry.h's Registry holds one of each family. Adding an op or an implementation of
// the family touches this folder only: its table here, its CPU reference in ops.cpp, its CUDA
// registration in cuda_ops.cu, its tuning rule (if it has rivals) in tuning/*.json.
#pragma once
#include "kernels/kda/kda.h"
#include "kernels/kda/kda_decode.h"
#include "kernels/op_table.h"

namespace k3::kernels {

struct KdaOps {
  OpTable<KdaConvArgs> kda_conv{"kda_conv", kda_conv_check};
  OpTable<KdaAttentionArgs> kda_recurrent{"kda_recurrent", kda_attention_check};
  OpTable<KdaAttentionArgs> kda_chunked{"kda_chunked", kda_attention_check};
  OpTable<KdaOutputGateArgs> kda_output_gate{"kda_output_gate", kda_output_gate_check};
  OpTable<KdaDecodeArgs> kda_decode{"kda_decode", kda_decode_check, {"head_seqs", [](const KdaDecodeArgs& a) {
                                                                       return int64_t{a.num_heads} *
                                                                              a.seqs.num_seqs;  // head x sequence pairs
                                                                     }}};

  // Calls fn(table) for every op table of the family.
  template <class Fn>
  void for_each(Fn&& fn) {
    fn(kda_conv);
    fn(kda_recurrent);
    fn(kda_chunked);
    fn(kda_output_gate);
    fn(kda_decode);
  }
  // The CPU reference of every op (ops.cpp).
  void register_reference(const CpuOps& cpu);
  // Every CUDA implementation, in the order that breaks ties the tuning tables leave
  // (cuda_ops.cu; CUDA builds only).
  void register_cuda(const CudaOps& cuda);
};

// One registration function per CUDA source of the folder (cuda_*.cu).
void register_kda_conv_cuda(KdaOps& r, const CudaOps& ops);
void register_kda_recurrent_cuda(KdaOps& r, const CudaOps& ops);
void register_kda_chunked_cuda(KdaOps& r, const CudaOps& ops);
void register_kda_output_gate_cuda(KdaOps& r, const CudaOps& ops);
void register_kda_decode_cuda(KdaOps& r, const CudaOps& ops);

}  // namespace k3::kernels
