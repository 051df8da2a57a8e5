// kernels/mla/mla_op_bench.cpp: k3bench_ops_gpu's MLA rows at one TP8 rank's shape (cases.h
// kMlaK3Tp8): absorbed decode and the fused mla_decode over an 8K context per sequence (fp8 and bf16
// latent caches, pages of 16 at shuffled ids), and the naive prefill of a 512-row chunk at 8K / 46K.
#include <algorithm>
#include <cmath>

#include "backends/cuda/device_tensor.h"
#include "kernels/mla/cases.h"
#include "kernels/testing/op_bench.h"

namespace k3::kernels {

using core::DType;
using core::Tensor;

namespace {

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
      // Tables: sequence i owns row i, sits at position S - 1 and holds its share of shuffled page ids.
      std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
      for (int64_t k = 0; k < num_blocks; ++k) ids[k] = static_cast<int32_t>(k);
      for (int64_t k = num_blocks - 1; k > 0; --k)
        std::swap(ids[k], ids[page_rng.next_u64() % static_cast<uint64_t>(k + 1)]);
      Tensor h_rows = Tensor::zeros(DType::i32, {3, B}), h_table = Tensor::zeros(DType::i32, {B, blocks_per_seq});
      for (int64_t i = 0; i < B; ++i) {
        h_rows.data<int32_t>()[i] = static_cast<int32_t>(i);              // row_begin
        h_rows.data<int32_t>()[B + i] = 1;                                // num_rows
        h_rows.data<int32_t>()[2 * B + i] = static_cast<int32_t>(S - 1);  // position
      }
      std::copy(ids.begin(), ids.end(), h_table.data<int32_t>());
      const Tensor d_rows = b.upload(h_rows);
      const Tensor d_table = b.upload(h_table);
      SeqBatch seqs;
      seqs.row_begin = d_rows.view().row(0);
      seqs.num_rows = d_rows.view().row(1);
      seqs.position = d_rows.view().row(2);
      seqs.block_table = d_table.view();
      seqs.num_seqs = static_cast<int>(B);
      seqs.max_rows = 1;
      seqs.max_tokens = S;
      // Spec §12 counting: the cache once per sequence, kv_b once per step, q and out, the tables.
      const double bytes = static_cast<double>(B) * (static_cast<double>(S * E * core::dtype_size(cache_t)) +
                                                     (H * (nope + rope) + H * vd) * 2.0) +
                           static_cast<double>(kv_b.weight.nbytes() + h_rows.nbytes() + h_table.nbytes());
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
      std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
      for (int64_t k = 0; k < num_blocks; ++k) ids[k] = static_cast<int32_t>(k);
      for (int64_t k = num_blocks - 1; k > 0; --k)
        std::swap(ids[k], ids[page_rng.next_u64() % static_cast<uint64_t>(k + 1)]);
      Tensor h_rows = Tensor::zeros(DType::i32, {3, 1}), h_table = Tensor::zeros(DType::i32, {1, num_blocks});
      h_rows.data<int32_t>()[0] = 0;                               // row_begin
      h_rows.data<int32_t>()[1] = static_cast<int32_t>(rows);      // num_rows
      h_rows.data<int32_t>()[2] = static_cast<int32_t>(S - rows);  // position
      std::copy(ids.begin(), ids.end(), h_table.data<int32_t>());
      const Tensor d_rows = b.upload(h_rows);
      const Tensor d_table = b.upload(h_table);
      SeqBatch seqs;
      seqs.row_begin = d_rows.view().row(0);
      seqs.num_rows = d_rows.view().row(1);
      seqs.position = d_rows.view().row(2);
      seqs.block_table = d_table.view();
      seqs.num_seqs = 1;
      seqs.max_rows = static_cast<int>(rows);
      seqs.max_tokens = S;
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

}  // namespace

void bench_mla_ops(OpBench& b) {
  bench_mla_decode(b);
  bench_mla_prefill(b);
}

}  // namespace k3::kernels
