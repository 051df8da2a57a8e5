// kernels/mla/cuda_ops.cu: the mla family's CUDA implementations, registered in the order that
// breaks the ties the tuning tables leave (see ops.h).
#include "kernels/mla/ops.h"

namespace k3::kernels {

void MlaOps::register_cuda(const CudaOps& cuda) {
  register_mla_cache_cuda(*this, cuda);
  register_mla_naive_cuda(*this, cuda);
  register_mla_absorbed_cuda(*this, cuda);
  register_mla_absorbed_mma_cuda(*this, cuda);
  register_mla_cp_cuda(*this, cuda);
  register_mla_partial_mma_cuda(*this, cuda);
  register_mla_decode_cuda(*this, cuda);
  register_mla_prep_cuda(*this, cuda);
}

}  // namespace k3::kernels
