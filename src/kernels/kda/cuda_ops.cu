// kernels/kda/cuda_ops.cu: the kda family's CUDA implementations, registered in the order that
// breaks the ties the tuning tables leave (see ops.h).
#include "kernels/kda/ops.h"

namespace k3::kernels {

void KdaOps::register_cuda(const CudaOps& cuda) {
  register_kda_conv_cuda(*this, cuda);
  register_kda_recurrent_cuda(*this, cuda);
  register_kda_chunked_cuda(*this, cuda);
  register_kda_output_gate_cuda(*this, cuda);
  register_kda_decode_cuda(*this, cuda);
}

}  // namespace k3::kernels
