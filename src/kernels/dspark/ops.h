// kernels/dspark/ops.h: the op tables of one family, the DSpark draft's own ops (dspark.h).
// kernels/registry.h's Registry holds one of each family. Adding an op or an implementation of
// the family touches this folder only: its table here, its CPU reference in ops.cpp, its CUDA
// registration in cuda_ops.cu.
#pragma once
#include "kernels/dspark/dspark.h"
#include "kernels/op_table.h"

namespace k3::kernels {

struct DsparkOps {
  OpTable<RopePairsArgs> rope_pairs{"rope_pairs", rope_pairs_check};
  OpTable<MlaBlockAttentionArgs> mla_block_attention{"mla_block_attention", mla_block_attention_check};
  OpTable<MarkovDraftArgs> markov_draft{"markov_draft", markov_draft_check};

  // Calls fn(table) for every op table of the family.
  template <class Fn>
  void for_each(Fn&& fn) {
    fn(rope_pairs);
    fn(mla_block_attention);
    fn(markov_draft);
  }
  // The CPU reference of every op (ops.cpp).
  void register_reference(const CpuOps& cpu);
  // Every CUDA implementation (cuda_ops.cu; CUDA builds only).
  void register_cuda(const CudaOps& cuda);
};

// One registration function per CUDA source of the folder (cuda_*.cu).
void register_dspark_cuda(DsparkOps& r, const CudaOps& ops);

}  // namespace k3::kernels
