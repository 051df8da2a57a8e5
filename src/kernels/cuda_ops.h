// kernels/cuda_ops.h: registration of the CUDA implementation of every op (K3_HAVE_CUDA builds).
//
// Activation convention on CUDA: the op Args' "f32 [T, D]" activations are bf16 device tensors in
// engine mode (Precision::bf16) or f32 device tensors (either precision; f32 + Precision::fp32 is
// the exact mode the tests compare tightly). Weights stay as in the checkpoint (bf16 / f32 / MXFP4
// packed codes + E8M0 scales, uploaded as they are); router and lm_head logits are f32; the KDA
// recurrent state is f32 V-major; the KDA conv state is bf16 or f32; the MLA cache is bf16, f32 or
// fp8 e4m3. Each implementation's supports() names what it cannot handle.
#pragma once
#include <memory>
#include <string>

#include "core/error.h"
#include "kernels/registry.h"

namespace k3::backends::cuda {
class Context;
}

namespace k3::kernels {

// What every CUDA op captures: the context it runs on, or (no usable device) why there is none,
// so the implementations are registered either way and supports() explains a missing GPU.
struct CudaOps {
  std::shared_ptr<backends::cuda::Context> ctx;
  std::string unavailable;  // set when ctx is null
  core::Status usable() const {
    return ctx ? core::Status::ok() : core::Status::fail("no usable CUDA device: " + unavailable);
  }
};

// Registers every op's CUDA implementation on `ctx` (see registry.h for the context-free form).
void register_cuda_ops(Registry& r, std::shared_ptr<backends::cuda::Context> ctx);

// One registration function per op folder (kernels/<op>/cuda*.cu).
void register_embedding_cuda(Registry& r, const CudaOps& ops);
void register_rmsnorm_cuda(Registry& r, const CudaOps& ops);
void register_linear_cuda(Registry& r, const CudaOps& ops);
void register_attn_res_cuda(Registry& r, const CudaOps& ops);
void register_situ_cuda(Registry& r, const CudaOps& ops);
void register_router_cuda(Registry& r, const CudaOps& ops);
void register_moe_experts_cuda(Registry& r, const CudaOps& ops);
void register_moe_experts_gemv_cuda(Registry& r, const CudaOps& ops);
void register_moe_experts_grouped_cuda(Registry& r, const CudaOps& ops);
void register_kda_conv_cuda(Registry& r, const CudaOps& ops);
void register_kda_recurrent_cuda(Registry& r, const CudaOps& ops);
void register_kda_chunked_cuda(Registry& r, const CudaOps& ops);
void register_kda_output_gate_cuda(Registry& r, const CudaOps& ops);
void register_mla_cache_cuda(Registry& r, const CudaOps& ops);
void register_mla_naive_cuda(Registry& r, const CudaOps& ops);
void register_mla_absorbed_cuda(Registry& r, const CudaOps& ops);
void register_mla_absorbed_mma_cuda(Registry& r, const CudaOps& ops);  // kernels/mla_decode: mla_decode's tensor cores
void register_mla_cp_cuda(Registry& r, const CudaOps& ops);  // the four DCP ops of kernels/mla/mla_cp.h
void register_mla_partial_mma_cuda(Registry& r, const CudaOps& ops);  // kernels/mla_decode: DCP partial on tensor cores
void register_elementwise_cuda(Registry& r, const CudaOps& ops);
void register_sampling_cuda(Registry& r, const CudaOps& ops);
// fused ops (fastpath/), one line each:
void register_multi_linear_cuda(Registry& r, const CudaOps& ops);
void register_attn_res_fused_cuda(Registry& r, const CudaOps& ops);  // attn_res_bank, attn_res_merge
void register_kda_decode_cuda(Registry& r, const CudaOps& ops);
void register_mla_decode_cuda(Registry& r, const CudaOps& ops);
void register_moe_tail_combine_cuda(Registry& r, const CudaOps& ops);
void register_mla_prep_cuda(Registry& r, const CudaOps& ops);

}  // namespace k3::kernels
