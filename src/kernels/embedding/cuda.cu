// kernels/embedding/cuda.cu: CUDA token embedding lookup (spec §3, §10): one block per token copies
// its table row. Ids live on the device, so the range check the CPU check does cannot run before
// the launch: a token whose id is outside the vocabulary [0, vocab) gets a NaN row instead (never a
// read past the table), which every comparison and the next norm make visible. Vocab-parallel
// (spec §11): the table holds ids [vocab_begin, vocab_begin + V); other ids of the vocabulary get a
// zero row.
#include <cmath>

#include "kernels/cuda_common.cuh"
#include "kernels/embedding/embedding.h"
#include "kernels/embedding/ops.h"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

constexpr int kThreads = 256;

template <class TableT, class OutT>
__global__ void embedding_kernel(const int32_t* ids, const TableT* table, int64_t table_ld, int64_t V, int64_t D,
                                 int64_t vocab_begin, int64_t vocab, OutT* out, int64_t out_ld) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  OutT* dst = out + t * out_ld;
  const bool valid = id >= 0 && id < vocab;
  const int64_t local = static_cast<int64_t>(id) - vocab_begin;
  const bool here = valid && local >= 0 && local < V;
  const TableT* src = table + (here ? local : 0) * table_ld;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x)
    store_act(dst + d, here ? to_f32(src[d]) : valid ? 0.0f : NAN, false);  // an exact copy: no rounding asked
}

}  // namespace

void register_embedding_cuda(EmbeddingOps& r, const CudaOps& ops) {
  r.embedding.add({"cuda_gather", core::Device::cuda,
                   [ops](const EmbeddingArgs& a) {
                     return all_of({ops.usable(), on_cuda({{"ids", &a.ids}, {"table", &a.table}, {"out", &a.out}})});
                   },
                   [ops](const EmbeddingArgs& a) {
                     const int64_t T = a.ids.dim(0), V = a.table.dim(0), D = a.table.dim(1);
                     const int64_t vocab = a.vocab_size == 0 ? V : a.vocab_size;
                     if (T == 0) return;
                     with_act(a.table.dtype, [&](auto tt) {
                       using TableT = typename decltype(tt)::type;
                       with_act(a.out.dtype, [&](auto ot) {
                         using OutT = typename decltype(ot)::type;
                         embedding_kernel<TableT, OutT><<<static_cast<unsigned>(T), kThreads, 0, ops.ctx->stream()>>>(
                             a.ids.as<const int32_t>(), a.table.as<const TableT>(), a.table.strides[0], V, D,
                             a.vocab_begin, vocab, a.out.as<OutT>(), T > 1 ? a.out.strides[0] : D);
                         K3_CUDA_CHECK_LAUNCH("embedding_kernel");
                       });
                     });
                   }});
}

}  // namespace k3::kernels
