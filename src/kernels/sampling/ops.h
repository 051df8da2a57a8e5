// kernels/sampling/ops.h: the op tables of one family, sampling a step's logits.
// kernels/registry.h's Registry holds one of each family. Adding an op or an implementation of
// the family touches this folder only: its table here, its CPU reference in ops.cpp, its CUDA
// registration in cuda_ops.cu, its tuning rule (if it has rivals) in tuning/*.json.
#pragma once
#include "kernels/op_table.h"
#include "kernels/sampling/sampling.h"

namespace k3::kernels {

struct SamplingOps {
  OpTable<SampleArgs> sample{"sample", sample_check};  // tokens from the step's logits (runner/device_sampler.h)
  OpTable<TokenMaskArgs> token_mask{"token_mask", token_mask_check};  // constrained rows' grammar masks

  // Calls fn(table) for every op table of the family.
  template <class Fn>
  void for_each(Fn&& fn) {
    fn(sample);
    fn(token_mask);
  }
  // The CPU reference of every op (ops.cpp).
  void register_reference(const CpuOps& cpu);
  // Every CUDA implementation, in the order that breaks ties the tuning tables leave
  // (cuda_ops.cu; CUDA builds only).
  void register_cuda(const CudaOps& cuda);
};

// One registration function per CUDA source of the folder (cuda_*.cu).
void register_sampling_cuda(SamplingOps& r, const CudaOps& ops);

}  // namespace k3::kernels
