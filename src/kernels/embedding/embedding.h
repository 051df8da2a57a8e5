// kernels/embedding/embedding.h: token embedding lookup (spec §3, §10).
#pragma once
#include "core/error.h"
#include "kernels/common.h"

namespace k3::kernels {

struct EmbeddingArgs {
  core::TensorView ids;    // i32 [T]
  core::TensorView table;  // bf16 or f32 [V, D]
  core::TensorView out;    // f32 [T, D]; rows are exact copies (bf16 values)
};
core::Status embedding_check(const EmbeddingArgs& a);  // ids in [0, V) included
void embedding_reference(const EmbeddingArgs& a);

}  // namespace k3::kernels
