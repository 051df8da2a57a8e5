// kernels/embedding/reference.cpp: CPU reference of the token embedding lookup (spec §3, §10).
#include <string>

#include "kernels/embedding/embedding.h"

namespace k3::kernels {

namespace {
// Rows of a rank-2 view may be strided, but each row must be contiguous.
bool rows_contiguous(const core::TensorView& v) { return v.rank() == 2 && v.strides[1] == 1; }
}  // namespace

core::Status embedding_check(const EmbeddingArgs& a) {
  if (a.ids.dtype != core::DType::i32 || a.ids.rank() != 1 || !a.ids.is_contiguous())
    return core::Status::fail("ids must be a contiguous i32 [T] tensor, got " +
                              std::string(core::dtype_name(a.ids.dtype)) + " " + a.ids.shape.str());
  if ((a.table.dtype != core::DType::bf16 && a.table.dtype != core::DType::f32) || !rows_contiguous(a.table))
    return core::Status::fail("table must be a bf16 or f32 [V, D] tensor with contiguous rows, got " +
                              std::string(core::dtype_name(a.table.dtype)) + " " + a.table.shape.str());
  const int64_t T = a.ids.dim(0), V = a.table.dim(0), D = a.table.dim(1);
  if (a.vocab_size == 0 ? a.vocab_begin != 0 : a.vocab_begin < 0 || a.vocab_begin + V > a.vocab_size)
    return core::Status::fail("the table's " + std::to_string(V) + " rows starting at vocab_begin " +
                              std::to_string(a.vocab_begin) + " do not lie inside the vocabulary of vocab_size " +
                              std::to_string(a.vocab_size) +
                              (a.vocab_size == 0 ? " (0: the table is the whole vocabulary)" : ""));
  const int64_t vocab = a.vocab_size == 0 ? V : a.vocab_size;
  if (!is_activation_dtype(a.out) || !rows_contiguous(a.out) || a.out.dim(0) != T || a.out.dim(1) != D)
    return core::Status::fail("out must be f32 (or bf16 on CUDA) [T, D] = [" + std::to_string(T) + ", " +
                              std::to_string(D) + "], got " + std::string(core::dtype_name(a.out.dtype)) + " " +
                              a.out.shape.str());
  // The ids are data, not shape, but an out-of-range id would read past the table: check
  // them here when they are readable from the host.
  if (a.ids.device == core::Device::cpu) {
    const int32_t* ids = a.ids.as<const int32_t>();
    for (int64_t t = 0; t < T; ++t)
      if (ids[t] < 0 || ids[t] >= vocab)
        return core::Status::fail("token id " + std::to_string(ids[t]) + " at position " + std::to_string(t) +
                                  " is outside the vocabulary of size " + std::to_string(vocab));
  }
  return core::Status::ok();
}

void embedding_reference(const EmbeddingArgs& a) {
  const int64_t T = a.ids.dim(0), V = a.table.dim(0), D = a.table.dim(1);
  const int32_t* ids = a.ids.as<const int32_t>();
  for (int64_t t = 0; t < T; ++t) {
    float* out = a.out.as<float>() + t * a.out.strides[0];
    const int64_t local = static_cast<int64_t>(ids[t]) - a.vocab_begin;
    if (local < 0 || local >= V) {  // another rank's slice of the vocabulary
      for (int64_t d = 0; d < D; ++d) out[d] = 0.0f;
      continue;
    }
    const int64_t row = local * a.table.strides[0];
    if (a.table.dtype == core::DType::bf16) {
      const uint16_t* src = a.table.as<const uint16_t>() + row;
      for (int64_t d = 0; d < D; ++d) out[d] = core::bf16_bits_to_f32(src[d]);
    } else {
      const float* src = a.table.as<const float>() + row;
      for (int64_t d = 0; d < D; ++d) out[d] = src[d];
    }
  }
}

}  // namespace k3::kernels
