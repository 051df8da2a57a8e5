// kernels/registry/cuda_registry.cpp: registration of every op's CUDA implementation (K3_HAVE_CUDA).
#include <memory>
#include <string>

#include "backends/cuda/context.h"
#include "backends/cuda/device.h"
#include "kernels/cuda_ops.h"

namespace k3::kernels {

namespace {
void register_all(Registry& r, const CudaOps& ops) {
  register_embedding_cuda(r, ops);
  register_rmsnorm_cuda(r, ops);
  register_linear_cuda(r, ops);
  register_attn_res_cuda(r, ops);
  register_situ_cuda(r, ops);
  register_router_cuda(r, ops);
  register_moe_experts_cuda(r, ops);
  register_moe_experts_gemv_cuda(r, ops);
  register_moe_experts_grouped_cuda(r, ops);
  register_kda_conv_cuda(r, ops);
  register_kda_recurrent_cuda(r, ops);
  register_kda_chunked_cuda(r, ops);
  register_kda_output_gate_cuda(r, ops);
  register_mla_cache_cuda(r, ops);
  register_mla_naive_cuda(r, ops);
  register_mla_absorbed_cuda(r, ops);
  register_mla_absorbed_mma_cuda(r, ops);
  register_mla_cp_cuda(r, ops);
  register_mla_partial_mma_cuda(r, ops);
  register_elementwise_cuda(r, ops);
  register_sampling_cuda(r, ops);
  // fused ops (fastpath/), one line each:
  register_kda_decode_cuda(r, ops);
  register_multi_linear_cuda(r, ops);
  register_attn_res_fused_cuda(r, ops);
  register_mla_decode_cuda(r, ops);
  register_moe_tail_combine_cuda(r, ops);
  register_mla_prep_cuda(r, ops);
  // Which capable implementation runs: this GPU's table, then tuning/default.json (kernels/tuning.h).
  r.set_tuning(core::Device::cuda, builtin_tuning(ops.ctx ? ops.ctx->info().name : std::string()));
}
}  // namespace

void register_cuda_ops(Registry& r, std::shared_ptr<backends::cuda::Context> ctx) {
  K3_CHECK(ctx != nullptr, "register_cuda_ops: context is null");
  register_all(r, CudaOps{std::move(ctx), ""});
}

void register_cuda_ops(Registry& r) {
  CudaOps ops;
  std::string why;
  if (backends::cuda::device_count(&why) > 0) {
    try {
      ops.ctx = backends::cuda::Context::create(0);
    } catch (const core::Error& e) {
      ops.unavailable = e.what();
    }
  } else {
    ops.unavailable = why;
  }
  register_all(r, ops);
}

}  // namespace k3::kernels
