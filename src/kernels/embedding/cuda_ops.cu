// kernels/embedding/cuda_ops.cu: the embedding family's CUDA implementations, registered in the order that
// breaks the ties the tuning tables leave (see ops.h).
#include "kernels/embedding/ops.h"

namespace k3::kernels {

void EmbeddingOps::register_cuda(const CudaOps& cuda) { register_embedding_cuda(*this, cuda); }

}  // namespace k3::kernels
