// kernels/elementwise/ops.h: the op tables of one family, elementwise ops.
// kernels/registry.h's Registry holds one of each family. Adding an op or an implementation of
// the family touches this folder only: its table here, its CPU reference in ops.cpp, its CUDA
// registration in cuda_ops.cu, its tuning rule (if it has rivals) in tuning/*.json.
#pragma once
#include "kernels/elementwise/elementwise.h"
#include "kernels/op_table.h"

namespace k3::kernels {

struct ElementwiseOps {
  OpTable<AddArgs> add{"add", add_check};
  OpTable<SigmoidGateArgs> sigmoid_gate{"sigmoid_gate", sigmoid_gate_check};
  OpTable<ToActivationArgs> to_activation{"to_activation", to_activation_check};  // TP: round a reduced sum

  // Calls fn(table) for every op table of the family.
  template <class Fn>
  void for_each(Fn&& fn) {
    fn(add);
    fn(sigmoid_gate);
    fn(to_activation);
  }
  // The CPU reference of every op (ops.cpp).
  void register_reference(const CpuOps& cpu);
  // Every CUDA implementation, in the order that breaks ties the tuning tables leave
  // (cuda_ops.cu; CUDA builds only).
  void register_cuda(const CudaOps& cuda);
};

// One registration function per CUDA source of the folder (cuda_*.cu).
void register_elementwise_cuda(ElementwiseOps& r, const CudaOps& ops);

}  // namespace k3::kernels
