// kernels/mla/mla_op_bench.cpp: k3bench_ops_gpu's MLA rows at one TP8 rank's shape (cases.h
// kMlaK3Tp8): absorbed decode and the fused mla_decode over an 8K context per sequence (fp8 and bf16
// latent caches, pages of 16 at shuffled ids), the naive prefill of a 512-row chunk at 8K / 46K, and
// the four decode context parallel ops (mla_cp.h) on one rank of the engine's DCP group (cases.h
// kMlaCpK3Dcp8) over the same 8K context split over its ranks.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backends/cuda/device_tensor.h"
#include "kernels/mla/cases.h"
#include "kernels/testing/op_bench.h"

namespace k3::kernels {

using core::DType;
using core::Tensor;

namespace {

// The step tables of B sequences of `rows` rows each over a paged cache at shuffled (non-contiguous)
// page ids: sequence i owns activation rows [i * rows, (i + 1) * rows) at positions from `position`
// and pages [i * pages, (i + 1) * pages) of the shuffled ids. `seqs` views the device tensors.
struct PagedTables {
  Tensor rows, table;  // device i32 [3, B] (row_begin, num_rows, position), [B, pages]
  SeqBatch seqs;
  double bytes() const { return static_cast<double>(rows.nbytes() + table.nbytes()); }
};

PagedTables paged_tables(OpBench& b, core::Rng& rng, int64_t B, int64_t rows, int64_t position, int64_t pages,
                         int64_t max_tokens) {
  const int64_t num_blocks = B * pages;
  std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
  for (int64_t k = 0; k < num_blocks; ++k) ids[k] = static_cast<int32_t>(k);
  for (int64_t k = num_blocks - 1; k > 0; --k) std::swap(ids[k], ids[rng.next_u64() % static_cast<uint64_t>(k + 1)]);
  Tensor h_rows = Tensor::zeros(DType::i32, {3, B}), h_table = Tensor::zeros(DType::i32, {B, pages});
  for (int64_t i = 0; i < B; ++i) {
    h_rows.data<int32_t>()[i] = static_cast<int32_t>(i * rows);          // row_begin
    h_rows.data<int32_t>()[B + i] = static_cast<int32_t>(rows);          // num_rows
    h_rows.data<int32_t>()[2 * B + i] = static_cast<int32_t>(position);  // position of the first row
  }
  std::copy(ids.begin(), ids.end(), h_table.data<int32_t>());
  PagedTables t{b.upload(h_rows), b.upload(h_table), {}};
  t.seqs.row_begin = t.rows.view().row(0);
  t.seqs.num_rows = t.rows.view().row(1);
  t.seqs.position = t.rows.view().row(2);
  t.seqs.block_table = t.table.view();
  t.seqs.num_seqs = static_cast<int>(B);
  t.seqs.max_rows = static_cast<int>(rows);
  t.seqs.max_tokens = max_tokens;
  return t;
}

void bench_mla_decode(OpBench& b) {
  const MlaShape& k3 = kMlaK3Tp8;
  const int H = k3.heads, nope = k3.nope, rope = k3.rope, vd = k3.v, L = k3.kv_lora;
  const int64_t S = kMlaBenchContext, E = L + rope;
  LinearWeight kv_b;
  kv_b.weight = b.empty(DType::bf16, {H * (nope + vd), L});
  b.fill(kv_b.weight, b.pat().bf16_weight);
  // The whole batch in one call over a paged cache: pages of 16 tokens (the engine's default block
  // size), every sequence's pages at shuffled (non-contiguous) ids, tables on the device.
  const int64_t block_size = kMlaBenchBlockSize, blocks_per_seq = S / block_size;
  core::Rng page_rng(0x3a7);
  for (DType cache_t : {DType::f8_e4m3, DType::bf16}) {
    for (int64_t B : b.batches()) {
      const int64_t num_blocks = B * blocks_per_seq;
      Tensor pages = b.empty(cache_t, {num_blocks, block_size, E});
      b.fill(pages, cache_t == DType::bf16 ? b.pat().bf16_act : b.pat().fp8_cache);
      Tensor q = b.empty(DType::bf16, {B, H * (nope + rope)}), out = b.empty(DType::bf16, {B, H * vd});
      b.fill(q, b.pat().bf16_act);
      // Sequence i owns row i at position S - 1 and its share of the shuffled page ids.
      const PagedTables tables = paged_tables(b, page_rng, B, 1, S - 1, blocks_per_seq, S);
      const SeqBatch& seqs = tables.seqs;
      // Spec §12 counting: the cache once per sequence, kv_b once per step, q and out, the tables.
      const double bytes = static_cast<double>(B) * (static_cast<double>(S * E * core::dtype_size(cache_t)) +
                                                     (H * (nope + rope) + H * vd) * 2.0) +
                           static_cast<double>(kv_b.weight.nbytes()) + tables.bytes();
      const MlaAttentionArgs a{q.view(), pages.view(), seqs, 1.0f,
                               &kv_b,    out.view(),   H,    nope,
                               rope,     vd,           L,    1.0f / std::sqrt(static_cast<float>(nope + rope))};
      // The strategy mla_absorbed selects is named in the shape (bf16 activations: cuda_absorbed_splitkv_mma).
      const std::string absorbed_impl = b.reg().mla_absorbed.select(a, core::Device::cuda).name;
      b.row("mla", std::string("mla_absorbed ") + (cache_t == DType::bf16 ? "bf16" : "fp8"),
            "ctx=" + std::to_string(S) + " H=" + std::to_string(H) + " paged16 " + absorbed_impl, B, bytes,
            [&] { b.reg().mla_absorbed.run(a, core::Device::cuda); });
      // The fused path's mla_decode (fastpath/: absorbed decode + W_UV + the output gate) at its own
      // split length and at fixed ones (MlaDecodeArgs::split_len) from one 32-position tile to 2048, to
      // measure the split choice (mla_decode.h "Splits"); bf16 activations select the tensor-core
      // strategy, named at the end of the shape ("mma"; "cuda": the CUDA-core one). The bf16 cache only
      // at the automatic split.
      Tensor gate = b.empty(DType::bf16, {B, H * vd}), gated = b.empty(DType::bf16, {B, H * vd});
      b.fill(gate, b.pat().bf16_act);
      MlaDecodeArgs d;
      d.q = q.view();
      d.pages = pages.view();
      d.seqs = seqs;
      d.kv_b = &kv_b;
      d.gate = gate.view();
      d.out = gated.view();
      d.num_heads = H, d.qk_nope = nope, d.qk_rope = rope, d.v_head_dim = vd, d.kv_lora = L;
      d.scale = 1.0f / std::sqrt(static_cast<float>(nope + rope));
      const std::string cache_name = cache_t == DType::bf16 ? "bf16" : "fp8";
      const std::vector<int64_t> split_lens = cache_t == DType::f8_e4m3
                                                  ? std::vector<int64_t>{0, 32, 64, 128, 256, 512, 1024, 2048}
                                                  : std::vector<int64_t>{0};
      for (int64_t split_len : split_lens) {
        d.split_len = split_len;
        const std::string impl = b.reg().mla_decode.select(d, core::Device::cuda).name;
        const std::string kind = impl.size() > 4 && impl.compare(impl.size() - 4, 4, "_mma") == 0 ? "mma" : "cuda";
        const std::string shape =
            "ctx=" + std::to_string(S) + " H=" + std::to_string(H) + " split " +
            (split_len ? std::to_string(split_len) : "auto " + std::to_string(mla_decode_split_len(d))) + " " + kind;
        b.row("mla", "mla_decode " + cache_name + " gate", shape, B, bytes + B * H * vd * 2.0 * 2,
              [&] { b.reg().mla_decode.run(d, core::Device::cuda); });
      }
    }
  }
}

void bench_mla_prefill(OpBench& b) {
  const MlaShape& k3 = kMlaK3Tp8;
  const int H = k3.heads, nope = k3.nope, rope = k3.rope, vd = k3.v, L = k3.kv_lora;
  const int64_t rows = 512, E = L + rope, block_size = kMlaBenchBlockSize;
  LinearWeight kv_b;
  kv_b.weight = b.empty(DType::bf16, {H * (nope + vd), L});
  b.fill(kv_b.weight, b.pat().bf16_weight);
  core::Rng page_rng(0x3a8);
  Tensor q = b.empty(DType::bf16, {rows, H * (nope + rope)}), out = b.empty(DType::bf16, {rows, H * vd});
  b.fill(q, b.pat().bf16_act);
  for (const int64_t S : {int64_t{8192}, int64_t{46080}})
    for (DType cache_t : {DType::f8_e4m3, DType::bf16}) {
      const int64_t num_blocks = S / block_size;
      Tensor pages = b.empty(cache_t, {num_blocks, block_size, E});
      b.fill(pages, cache_t == DType::bf16 ? b.pat().bf16_act : b.pat().fp8_cache);
      const PagedTables tables = paged_tables(b, page_rng, 1, rows, S - rows, num_blocks, S);
      const SeqBatch& seqs = tables.seqs;
      const double bytes = static_cast<double>(S * E * core::dtype_size(cache_t)) +
                           static_cast<double>(kv_b.weight.nbytes()) +
                           static_cast<double>(rows * (H * (nope + rope) + H * vd) * 2);
      const MlaAttentionArgs a{q.view(), pages.view(), seqs, 1.0f,
                               &kv_b,    out.view(),   H,    nope,
                               rope,     vd,           L,    1.0f / std::sqrt(static_cast<float>(nope + rope))};
      const std::string impl = b.reg().mla_naive.select(a, core::Device::cuda).name;
      b.row("mla", std::string("mla_naive ") + (cache_t == DType::bf16 ? "bf16" : "fp8"),
            "ctx=" + std::to_string(S) + " rows=512 " + impl, rows, bytes,
            [&] { b.reg().mla_naive.run(a, core::Device::cuda); });
    }
}

// The decode context parallel ops at rank 0 of kMlaCpK3Dcp8 (8 ranks of 12 heads, 96 in the group): B
// sequences of one decode row at global position S - 1 of an S = kMlaBenchContext context, so the rank
// holds S / cp local positions of each (pages of 16 at shuffled ids, tables on the device). The
// collectives between the ops (comm/) are not timed. Spec §12 counting per op: the weight rows it reads
// (W_UK for q_absorb, W_UV for w_uv), this rank's share of the cache, the activations in and out (f32
// scratch between the ops: qc, o_part, lse, o_lat), the tables; the partial attention's split partials
// (scratch inside the op) are not counted.
void bench_mla_cp(OpBench& b) {
  const MlaCpGroup& group = kMlaCpK3Dcp8;
  const MlaShape& k3 = group.shape;
  const int cp = group.cp, G = group.cp, H = k3.heads, nope = k3.nope, rope = k3.rope, vd = k3.v, L = k3.kv_lora;
  const int64_t S = kMlaBenchContext, E = L + rope, block_size = kMlaBenchBlockSize;
  const int64_t local = (S + cp - 1) / cp, blocks_per_seq = (local + block_size - 1) / block_size;
  const float scale = 1.0f / std::sqrt(static_cast<float>(nope + rope));
  LinearWeight kv_b;
  kv_b.weight = b.empty(DType::bf16, {H * (nope + vd), L});
  b.fill(kv_b.weight, b.pat().bf16_weight);
  const double w_uk_bytes = static_cast<double>(H) * nope * L * 2, w_uv_bytes = static_cast<double>(H) * vd * L * 2;
  const auto f32_as = [](const Tensor& t, core::Shape shape) {
    return core::TensorView::contiguous(t.view().data, DType::f32, shape, core::Device::cuda);
  };
  core::Rng page_rng(0x3a9);
  const std::string group_name = "dcp=" + std::to_string(cp) + " G*H=" + std::to_string(G * H);
  for (int64_t B : b.batches()) {
    // Sequence i owns row i at GLOBAL position S - 1; its local pages at shuffled ids.
    const int64_t num_blocks = B * blocks_per_seq;
    const PagedTables tables = paged_tables(b, page_rng, B, 1, S - 1, blocks_per_seq, local);
    const SeqBatch& seqs = tables.seqs;
    const double rows_bytes = static_cast<double>(2 * B * 4);  // row_begin, num_rows
    const double seq_bytes = tables.bytes();

    Tensor q = b.empty(DType::bf16, {B, H * (nope + rope)}), qc_all = b.empty(DType::f32, {G * B, H * E});
    b.fill(q, b.pat().bf16_act);
    // 1. mla_q_absorb into every owner's slice of the gathered qc (as the all-gather leaves it), so the
    //    partial attention reads bf16-valued qc, as in the model; the row times one call.
    const auto q_absorb = [&](int g) {
      return MlaQAbsorbArgs{q.view(), seqs, &kv_b,          f32_as(qc_all, {G, B, H, E}).row(g), H, nope, rope,
                            vd,       L,    Precision::bf16};
    };
    for (int g = 0; g < G; ++g) b.reg().mla_q_absorb.run(q_absorb(g), core::Device::cuda);
    const MlaQAbsorbArgs qa = q_absorb(0);
    b.row("mla", "mla_q_absorb",
          "H=" + std::to_string(H) + " " + b.reg().mla_q_absorb.select(qa, core::Device::cuda).name, B,
          B * (H * (nope + rope) * 2.0 + H * E * 4.0) + w_uk_bytes + rows_bytes,
          [&] { b.reg().mla_q_absorb.run(qa, core::Device::cuda); });

    // 2. mla_partial_attention: every owner's heads (G * H) over this rank's local cache; bf16 mode (the
    //    registry's choice: the tensor-core strategy), and fp32 mode on the fp8 cache (the CUDA-core one).
    Tensor o_part = b.empty(DType::f32, {G * B, H * L}), lse = b.empty(DType::f32, {G * B, H});
    const double part_act_bytes = static_cast<double>(G) * B * H * (E * 4.0 + L * 4.0 + 4.0);  // qc in, o_part, lse out
    for (DType cache_t : {DType::f8_e4m3, DType::bf16}) {
      Tensor pages = b.empty(cache_t, {num_blocks, block_size, E});
      b.fill(pages, cache_t == DType::bf16 ? b.pat().bf16_act : b.pat().fp8_cache);
      const double bytes = static_cast<double>(B * local * E * core::dtype_size(cache_t)) + part_act_bytes + seq_bytes;
      for (Precision precision : {Precision::bf16, Precision::fp32}) {
        if (cache_t == DType::bf16 && precision == Precision::fp32) continue;
        MlaPartialAttentionArgs pa;
        pa.qc = f32_as(qc_all, {G, B, H, E});
        pa.pages = pages.view();
        pa.seqs = seqs;
        pa.o_part = f32_as(o_part, {G, B, H, L});
        pa.lse = f32_as(lse, {G, B, H});
        pa.cp_size = cp, pa.cp_rank = 0, pa.scale = scale, pa.precision = precision;
        const std::string impl = b.reg().mla_partial_attention.select(pa, core::Device::cuda).name;
        b.row("mla", std::string("mla_partial_attention ") + (cache_t == DType::bf16 ? "bf16" : "fp8"),
              "ctx=" + std::to_string(S) + " local=" + std::to_string(local) + " " + group_name + " paged16 " + impl, B,
              bytes, [&] { b.reg().mla_partial_attention.run(pa, core::Device::cuda); });
      }
    }

    // 3. mla_lse_rescale: o_part scaled in place by the weights of every rank's lse.
    Tensor lse_all = b.empty(DType::f32, {cp * G * B, H});
    b.fill(lse_all, b.pat().f32_act);
    const MlaLseRescaleArgs ra{f32_as(o_part, {G, B, H, L}), f32_as(lse_all, {cp, G, B, H}), seqs, 0};
    b.row("mla", "mla_lse_rescale", group_name + " " + b.reg().mla_lse_rescale.select(ra, core::Device::cuda).name, B,
          static_cast<double>(G) * B * H * (2.0 * L * 4 + cp * 4.0) + rows_bytes,
          [&] { b.reg().mla_lse_rescale.run(ra, core::Device::cuda); });

    // 4. mla_w_uv with the output gate, on the reduce-scatter's o_lat of this rank's heads.
    Tensor o_lat = b.empty(DType::f32, {B, H * L}), gate = b.empty(DType::bf16, {B, H * vd});
    Tensor out = b.empty(DType::bf16, {B, H * vd});
    b.fill(o_lat, b.pat().f32_act);
    b.fill(gate, b.pat().bf16_act);
    const MlaWUvArgs wa{f32_as(o_lat, {B, H, L}), seqs, &kv_b, gate.view(), out.view(), H, nope, vd, L,
                        Precision::bf16};
    b.row("mla", "mla_w_uv gate", "H=" + std::to_string(H) + " " + b.reg().mla_w_uv.select(wa, core::Device::cuda).name,
          B, B * (H * L * 4.0 + 2 * H * vd * 2.0) + w_uv_bytes + rows_bytes,
          [&] { b.reg().mla_w_uv.run(wa, core::Device::cuda); });
  }
}

}  // namespace

void bench_mla_ops(OpBench& b) {
  bench_mla_decode(b);
  bench_mla_prefill(b);
  bench_mla_cp(b);
}

}  // namespace k3::kernels
