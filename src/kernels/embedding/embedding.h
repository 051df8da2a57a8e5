// kernels/embedding/embedding.h: token embedding lookup (spec §3, §10).
#pragma once
#include "core/error.h"
#include "kernels/common.h"

namespace k3::kernels {

struct EmbeddingArgs {
  core::TensorView ids;    // i32 [T]
  core::TensorView table;  // bf16 or f32 [V, D]: the rows of ids [vocab_begin, vocab_begin + V)
  core::TensorView out;    // f32 [T, D]; rows are exact copies (bf16 values)
  // Vocab-parallel lookup (spec §11): the table is one tensor-parallel rank's slice of a
  // vocabulary of vocab_size ids, starting at id vocab_begin. An id of the vocabulary outside the
  // slice gives a zero row (the all-reduce over the ranks fills it in from the rank that holds it).
  // vocab_size = 0: the table is the whole vocabulary (vocab_begin must be 0).
  int64_t vocab_begin = 0;
  int64_t vocab_size = 0;
};
// Shapes and dtypes, the slice inside the vocabulary, and (for host ids) every id in [0, vocab
// size) — the full vocabulary, not the slice.
core::Status embedding_check(const EmbeddingArgs& a);
void embedding_reference(const EmbeddingArgs& a);

}  // namespace k3::kernels
