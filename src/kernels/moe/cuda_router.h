// kernels/moe/cuda_router.h: the router's CUDA top-k as a function, for ops that fuse the router
// (multi_linear's MoE front runs it after its GEMMs when its own epilogue does not): the strategy
// router_topk's registry picks for these arguments (cuda_router.cu).
#pragma once
#include "core/error.h"
#include "kernels/moe/router.h"
#include "kernels/op_table.h"

namespace k3::kernels {

// CUDA tensors and at most 8192 experts (the block form's shared memory), else why not.
core::Status router_topk_cuda_supports(const CudaOps& ops, const RouterTopkArgs& a);
// Queues the selection on ops' stream (a warp per token up to 1024 experts and k <= 32, else a block).
void router_topk_cuda(const CudaOps& ops, const RouterTopkArgs& a);

}  // namespace k3::kernels
