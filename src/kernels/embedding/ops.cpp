// kernels/embedding/ops.cpp: the embedding family's CPU references (see ops.h).
#include "kernels/embedding/ops.h"

namespace k3::kernels {

void EmbeddingOps::register_reference(const CpuOps& cpu) { add_reference(embedding, cpu, embedding_reference); }

}  // namespace k3::kernels
