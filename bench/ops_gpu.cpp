// bench/ops_gpu.cpp: per-op CUDA timings at the K3 TP8 per-GPU shapes (spec §11, §14.2), batch 1, 8
// and 64: every linear of §11 (cuBLASLt), KDA decode (conv, recurrence, output gate), MLA absorbed
// decode over an 8K context (fp8 and bf16 latent cache), the MLA prefill of a 512-row chunk at 8K / 46K,
// the MXFP4 routed experts (top-16 of 896),
// the router, the token-parallel elementwise ops and the device sampler (`sample`). For each: median microseconds over timed runs
// (L2 flushed before each run, so reused weights are not served from cache), the bytes the run must
// move (spec §12 counting: weights read, state read + written, cache read, activations in and out;
// for the experts only the distinct experts the routes touch), achieved GB/s, and the time over the
// floor at 4.3 TB/s and at the device-to-device copy bandwidth measured in the same run.
//
//   k3bench_ops_gpu [--out FILE] [--iters N] [--batches 1,8,64] [--only linear,kda,mla,moe,elt,sample]
// Prints a table and writes a JSON result bundle (bench/bundle.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/cuda/check.h"
#include "backends/cuda/context.h"
#include "backends/cuda/device_tensor.h"
#include "bench/bundle.h"
#include "core/bf16.h"
#include "core/fp8.h"
#include "core/rng.h"
#include "evidence/environment.h"
#include "kernels/kda/cases.h"
#include "kernels/registry.h"

using namespace k3;
using core::DType;
using core::Tensor;

namespace {

constexpr double kFloorBytesPerSecond = 4.3e12;  // spec §12
constexpr int64_t kHidden = 7168;

struct Bench {
  std::shared_ptr<backends::cuda::Context> ctx;
  kernels::Registry reg;
  Tensor flush;  // written before each timed run: evicts L2
  int iters = 30;
  double copy_bytes_per_second = 0;
  nlohmann::json rows = nlohmann::json::array();

  cudaStream_t stream() const { return ctx->stream(); }
  Tensor empty(DType t, core::Shape s) { return backends::cuda::empty(ctx->pool(), t, s); }

  // Fills device memory with a repeating host pattern (16 MiB of valid values of the dtype).
  void fill(const Tensor& t, const std::vector<uint8_t>& pattern) {
    const size_t total = static_cast<size_t>(t.nbytes());
    for (size_t off = 0; off < total; off += pattern.size())
      K3_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(t.view().data) + off, pattern.data(),
                                    std::min(pattern.size(), total - off), cudaMemcpyHostToDevice, stream()));
    K3_CUDA_CHECK(cudaStreamSynchronize(stream()));
  }

  // Median microseconds of fn over `iters` runs, each after an L2 flush, timed with events.
  double time_us(const std::function<void()>& fn) {
    for (int i = 0; i < 2; ++i) fn();  // warm-up: plans, table uploads, lazy module loading
    backends::cuda::Event start, stop;
    std::vector<double> us;
    for (int i = 0; i < iters; ++i) {
      K3_CUDA_CHECK(cudaMemsetAsync(flush.view().data, i & 0xff, static_cast<size_t>(flush.nbytes()), stream()));
      start.record(stream());
      fn();
      stop.record(stream());
      stop.synchronize();
      us.push_back(1e3 * stop.elapsed_ms_since(start));
    }
    return bench::median(us);
  }

  void row(const std::string& group, const std::string& op, const std::string& shape, int64_t batch, double bytes,
           const std::function<void()>& fn) {
    const double us = time_us(fn);
    const double gbps = bytes / (us * 1e-6) / 1e9;
    const double floor_us = bytes / kFloorBytesPerSecond * 1e6;
    const double copy_floor_us = bytes / copy_bytes_per_second * 1e6;
    std::printf("%-6s %-22s %-26s %5lld %10.2f %12.3f %9.1f %8.2f %8.2f\n", group.c_str(), op.c_str(), shape.c_str(),
                static_cast<long long>(batch), us, bytes / 1e6, gbps, us / floor_us, us / copy_floor_us);
    std::fflush(stdout);
    rows.push_back({{"group", group},
                    {"op", op},
                    {"shape", shape},
                    {"batch", batch},
                    {"median_us", us},
                    {"bytes", bytes},
                    {"GBps", gbps},
                    {"floor_us_4p3TBps", floor_us},
                    {"ratio_to_4p3TBps_floor", us / floor_us},
                    {"ratio_to_measured_copy", us / copy_floor_us}});
  }
};

std::vector<uint8_t> pattern_of(size_t bytes, const std::function<void(uint8_t*, size_t)>& gen) {
  std::vector<uint8_t> p(bytes);
  gen(p.data(), bytes);
  return p;
}

struct Patterns {
  std::vector<uint8_t> bf16_weight, bf16_act, f32_act, fp4_codes, e8m0, fp8_cache;
  explicit Patterns(core::Rng& rng) {
    const size_t n = size_t{16} << 20;
    const auto bf16 = [&](double std) {
      return pattern_of(n, [&](uint8_t* p, size_t b) {
        for (size_t i = 0; i < b / 2; ++i) {
          const uint16_t v = core::f32_to_bf16_bits(static_cast<float>(rng.uniform(-std, std) * 1.7320508));
          std::memcpy(p + 2 * i, &v, 2);
        }
      });
    };
    bf16_weight = bf16(0.02);
    bf16_act = bf16(1.0);
    f32_act = pattern_of(n, [&](uint8_t* p, size_t b) {
      for (size_t i = 0; i < b / 4; ++i) {
        const float v = static_cast<float>(rng.uniform(-2.0, 2.0));
        std::memcpy(p + 4 * i, &v, 4);
      }
    });
    fp4_codes = pattern_of(n, [&](uint8_t* p, size_t b) {
      for (size_t i = 0; i < b; ++i) p[i] = static_cast<uint8_t>(rng.next_u64());
    });
    e8m0 = pattern_of(n, [&](uint8_t* p, size_t b) {  // 2^-9 .. 2^-1: no NaN (0xff), sane magnitudes
      for (size_t i = 0; i < b; ++i) p[i] = static_cast<uint8_t>(118 + rng.next_u64() % 9);
    });
    fp8_cache = pattern_of(n, [&](uint8_t* p, size_t b) {
      for (size_t i = 0; i < b; ++i) p[i] = core::f32_to_fp8_e4m3(static_cast<float>(rng.uniform(-3.0, 3.0)));
    });
  }
};

double measure_copy_bandwidth(Bench& b) {
  const int64_t bytes = int64_t{1} << 31;  // 2 GiB each way
  Tensor src = b.empty(DType::u8, {bytes}), dst = b.empty(DType::u8, {bytes});
  K3_CUDA_CHECK(cudaMemsetAsync(src.view().data, 1, static_cast<size_t>(bytes), b.stream()));
  const double us = b.time_us([&] {
    K3_CUDA_CHECK(cudaMemcpyAsync(dst.view().data, src.view().data, static_cast<size_t>(bytes),
                                  cudaMemcpyDeviceToDevice, b.stream()));
  });
  return 2.0 * static_cast<double>(bytes) / (us * 1e-6);  // read + write
}

// ---------------------------------------------------------------- linear (spec §11 TP8 shapes)

void bench_linears(Bench& b, const Patterns& pat, const std::vector<int64_t>& batches) {
  struct S {
    const char* name;
    int64_t out, in;
    bool logits;
  };
  const S shapes[] = {{"kda.qkvg", 6144, 7168, false},      {"kda.f_a", 128, 7168, false},
                      {"kda.f_b", 1536, 128, false},        {"kda.b", 12, 7168, false},
                      {"attn.o_proj", 7168, 1536, false},   {"mla.q_a+kv_a", 2112, 7168, false},
                      {"mla.q_b", 2304, 1536, false},       {"mla.g", 1536, 7168, false},
                      {"moe.router", 896, 7168, true},      {"moe.latent_down", 3584, 7168, false},
                      {"moe.latent_up", 7168, 3584, false}, {"shared.gate_up", 1536, 7168, false},
                      {"shared.down", 7168, 768, false},    {"dense0.gate_up", 8448, 7168, false},
                      {"dense0.down", 7168, 4224, false},   {"lm_head", 20480, 7168, true}};
  for (const S& s : shapes) {
    kernels::LinearWeight w;
    w.weight = b.empty(DType::bf16, {s.out, s.in});
    b.fill(w.weight, pat.bf16_weight);
    for (int64_t T : batches) {
      Tensor x = b.empty(DType::bf16, {T, s.in}), y = b.empty(s.logits ? DType::f32 : DType::bf16, {T, s.out});
      b.fill(x, pat.bf16_act);
      const kernels::LinearArgs a{x.view(), &w, y.view(), !s.logits, kernels::Precision::bf16};
      const std::string impl = b.reg.linear.select(a, core::Device::cuda).name;
      const double bytes = static_cast<double>(w.weight.nbytes() + x.nbytes() + y.nbytes());
      b.row("linear", std::string(s.name) + (impl == "cuda_cublaslt" ? "" : " (" + impl + ")"),
            std::to_string(s.out) + "x" + std::to_string(s.in), T, bytes,
            [&] { b.reg.linear.run(a, core::Device::cuda); });
    }
  }
}

}  // namespace

namespace {

// ---------------------------------------------------------------- KDA decode (12 heads of 128)

void bench_kda_decode(Bench& b, const Patterns& pat, const std::vector<int64_t>& batches) {
  const kernels::KdaDecodeShape& shape = kernels::kKdaDecodeK3Tp8;  // kernels/kda/cases.h
  const int H = shape.H, D = shape.D, R = shape.R, K = shape.K;
  const int64_t P = H * D, C = 3 * P;  // conv over q, k, v side by side
  Tensor conv_w = b.empty(DType::f32, {C, K}), a_log = b.empty(DType::f32, {H}), dt_bias = b.empty(DType::f32, {P});
  Tensor o_norm = b.empty(DType::f32, {D});
  b.fill(conv_w, pat.f32_act), b.fill(a_log, pat.f32_act), b.fill(dt_bias, pat.f32_act), b.fill(o_norm, pat.f32_act);
  for (int64_t B : batches) {
    // Per sequence: its own state slot (so B sequences touch B distinct states, as in serving), in
    // a pool indexed by the SeqBatch tables; the whole batch is one call (one launch) per op.
    Tensor conv_state = b.empty(DType::bf16, {B, C, 3}), state = b.empty(DType::f32, {B, H, D, D});
    Tensor qkv = b.empty(DType::bf16, {B, C}), qkv_out = b.empty(DType::bf16, {B, C});
    Tensor f = b.empty(DType::bf16, {B, P}), beta = b.empty(DType::bf16, {B, H}), o = b.empty(DType::bf16, {B, P});
    Tensor gate = b.empty(DType::bf16, {B, P}), y = b.empty(DType::bf16, {B, P});
    for (const Tensor* t : {&conv_state, &qkv, &f, &beta, &gate}) b.fill(*t, pat.bf16_act);
    b.fill(state, pat.f32_act);
    // Decode tables: sequence i is row i, slot B-1-i (not the identity), position 8191 (8K context).
    Tensor tables = Tensor::zeros(DType::i32, {4, B});
    for (int64_t i = 0; i < B; ++i) {
      int32_t* t = tables.data<int32_t>();
      t[i] = static_cast<int32_t>(i), t[B + i] = 1, t[2 * B + i] = 8191, t[3 * B + i] = static_cast<int32_t>(B - 1 - i);
    }
    const Tensor d_tables = backends::cuda::upload(tables.view(), b.ctx->pool(), b.stream());
    kernels::SeqBatch seqs;
    seqs.row_begin = d_tables.view().row(0), seqs.num_rows = d_tables.view().row(1);
    seqs.position = d_tables.view().row(2), seqs.slot = d_tables.view().row(3);
    seqs.num_seqs = static_cast<int>(B), seqs.max_rows = 1, seqs.max_tokens = 8192;
    const double conv_bytes = static_cast<double>(B) * (C * 3 * 2 * 2 + C * 2 * 2) + conv_w.nbytes();
    const kernels::KdaConvArgs conv{
        qkv.view(), conv_w.view(), conv_state.view(), qkv_out.view(), kernels::Precision::bf16, seqs};
    b.row("kda", "kda_conv decode", "C=4608 K=4", B, conv_bytes, [&] { b.reg.kda_conv.run(conv, core::Device::cuda); });
    const double rec_bytes = static_cast<double>(B) * (2.0 * H * D * D * 4 + (5.0 * P + H) * 2);
    const kernels::KdaAttentionArgs rec{backends::cuda::cols_of(qkv_out.view(), 0, P),
                                        backends::cuda::cols_of(qkv_out.view(), P, P),
                                        backends::cuda::cols_of(qkv_out.view(), 2 * P, P),
                                        f.view(),
                                        beta.view(),
                                        a_log.view(),
                                        dt_bias.view(),
                                        state.view(),
                                        o.view(),
                                        H,
                                        D,
                                        -5.0f,
                                        64,
                                        kernels::Precision::bf16,
                                        seqs};
    b.row("kda", "kda_recurrent decode", "H=12 D=128", B, rec_bytes,
          [&] { b.reg.kda_recurrent.run(rec, core::Device::cuda); });
    const double gate_bytes = static_cast<double>(B) * P * 2 * 3;
    b.row("kda", "kda_output_gate", "H=12 D=128", B, gate_bytes, [&] {
      b.reg.kda_output_gate.run({o.view(), gate.view(), o_norm.view(), y.view(), H, D}, core::Device::cuda);
    });
    // The fused decode op (kda_decode: f_b, the three convs, the recurrence and the output gate in one
    // launch), on one fused projection buffer [B, 4P + R + H] as the fast path passes it.
    Tensor proj = b.empty(DType::bf16, {B, 4 * P + R + H}), fused_conv = b.empty(DType::bf16, {B, 3, P, K - 1});
    for (const Tensor* t : {&proj, &fused_conv}) b.fill(*t, pat.bf16_act);
    kernels::LinearWeight f_b;
    f_b.weight = b.empty(DType::bf16, {P, R});
    b.fill(f_b.weight, pat.bf16_weight);
    kernels::KdaDecodeArgs fused;
    const auto col = [&](int64_t c0, int64_t n) { return backends::cuda::cols_of(proj.view(), c0, n); };
    fused.q_in = col(0, P), fused.k_in = col(P, P), fused.v_in = col(2 * P, P), fused.g = col(3 * P, P);
    fused.f_a = col(4 * P, R), fused.b = col(4 * P + R, H), fused.f_b = &f_b;
    fused.q_conv = backends::cuda::rows_of(conv_w.view(), 0, P),
    fused.k_conv = backends::cuda::rows_of(conv_w.view(), P, P);
    fused.v_conv = backends::cuda::rows_of(conv_w.view(), 2 * P, P);
    fused.conv_state = fused_conv.view(), fused.a_log = a_log.view(), fused.dt_bias = dt_bias.view();
    fused.state = state.view(), fused.o_norm = o_norm.view(), fused.out = y.view();
    fused.num_heads = H, fused.head_dim = D, fused.precision = kernels::Precision::bf16, fused.seqs = seqs;
    const double fused_bytes = static_cast<double>(B) *
                                   (2.0 * H * D * D * 4 + 2.0 * 3 * P * (K - 1) * 2 + (4.0 * P + R + H) * 2 + P * 2) +
                               static_cast<double>(f_b.weight.nbytes() + conv_w.nbytes());
    b.row("kda", "kda_decode (fused)", shape.name, B, fused_bytes,
          [&] { b.reg.kda_decode.run(fused, core::Device::cuda); });
  }
}

// ---------------------------------------------------------------- MLA absorbed decode at 8K

void bench_mla_decode(Bench& b, const Patterns& pat, const std::vector<int64_t>& batches) {
  const int H = 12, nope = 128, rope = 64, vd = 128, L = 512;
  const int64_t S = 8192, E = L + rope;
  kernels::LinearWeight kv_b;
  kv_b.weight = b.empty(DType::bf16, {H * (nope + vd), L});
  b.fill(kv_b.weight, pat.bf16_weight);
  // The whole batch in one call over a paged cache: pages of 16 tokens (the engine's default block
  // size), every sequence's pages at shuffled (non-contiguous) ids, tables on the device.
  const int64_t block_size = 16, blocks_per_seq = S / block_size;
  core::Rng page_rng(0x3a7);
  for (DType cache_t : {DType::f8_e4m3, DType::bf16}) {
    for (int64_t B : batches) {
      const int64_t num_blocks = B * blocks_per_seq;
      Tensor pages = b.empty(cache_t, {num_blocks, block_size, E});
      b.fill(pages, cache_t == DType::bf16 ? pat.bf16_act : pat.fp8_cache);
      Tensor q = b.empty(DType::bf16, {B, H * (nope + rope)}), out = b.empty(DType::bf16, {B, H * vd});
      b.fill(q, pat.bf16_act);
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
      const Tensor d_rows = backends::cuda::upload(h_rows.view(), b.ctx->pool(), b.stream());
      const Tensor d_table = backends::cuda::upload(h_table.view(), b.ctx->pool(), b.stream());
      kernels::SeqBatch seqs;
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
      const kernels::MlaAttentionArgs a{q.view(), pages.view(), seqs, 1.0f, &kv_b, out.view(),
                                        H,        nope,         rope, vd,   L,     1.0f / std::sqrt(192.0f)};
      // The strategy mla_absorbed selects is named in the shape (bf16 activations: cuda_absorbed_splitkv_mma).
      const std::string absorbed_impl = b.reg.mla_absorbed.select(a, core::Device::cuda).name;
      b.row("mla", std::string("mla_absorbed ") + (cache_t == DType::bf16 ? "bf16" : "fp8"),
            "ctx=8192 H=12 paged16 " + absorbed_impl, B, bytes, [&] { b.reg.mla_absorbed.run(a, core::Device::cuda); });
      // The fused path's mla_decode (fastpath/: absorbed decode + W_UV + the output gate) at its own
      // split length and at fixed ones (MlaDecodeArgs::split_len) from one 32-position tile to 2048, to
      // measure the split choice (mla_decode.h "Splits"); bf16 activations select the tensor-core
      // strategy, named at the end of the shape ("mma"; "cuda": the CUDA-core one). The bf16 cache only
      // at the automatic split.
      Tensor gate = b.empty(DType::bf16, {B, H * vd}), gated = b.empty(DType::bf16, {B, H * vd});
      b.fill(gate, pat.bf16_act);
      kernels::MlaDecodeArgs d;
      d.q = q.view();
      d.pages = pages.view();
      d.seqs = seqs;
      d.kv_b = &kv_b;
      d.gate = gate.view();
      d.out = gated.view();
      d.num_heads = H, d.qk_nope = nope, d.qk_rope = rope, d.v_head_dim = vd, d.kv_lora = L;
      d.scale = 1.0f / std::sqrt(192.0f);
      const std::string cache_name = cache_t == DType::bf16 ? "bf16" : "fp8";
      const std::vector<int64_t> split_lens = cache_t == DType::f8_e4m3
                                                  ? std::vector<int64_t>{0, 32, 64, 128, 256, 512, 1024, 2048}
                                                  : std::vector<int64_t>{0};
      for (int64_t split_len : split_lens) {
        d.split_len = split_len;
        const std::string impl = b.reg.mla_decode.select(d, core::Device::cuda).name;
        const std::string kind = impl.size() > 4 && impl.compare(impl.size() - 4, 4, "_mma") == 0 ? "mma" : "cuda";
        const std::string shape = "ctx=8192 H=12 split " +
                                  (split_len ? std::to_string(split_len)
                                             : "auto " + std::to_string(kernels::mla_decode_split_len(d))) +
                                  " " + kind;
        b.row("mla", "mla_decode " + cache_name + " gate", shape, B, bytes + B * H * vd * 2.0 * 2,
              [&] { b.reg.mla_decode.run(d, core::Device::cuda); });
      }
    }
  }
}

// ---------------------------------------------------------------- MLA prefill (naive form), 512-row chunk

// One sequence's 512-row prefill chunk at the end of an 8K and a 46K context (pages of 16 tokens at shuffled
// ids), fp8 and bf16 caches, bf16 activations: the strategy mla_naive selects is named in the shape. Bytes:
// the cache once, kv_b, q and out (the expansion's scratch K/V traffic is not counted: time is the measure).
void bench_mla_prefill(Bench& b, const Patterns& pat) {
  const int H = 12, nope = 128, rope = 64, vd = 128, L = 512;
  const int64_t rows = 512, E = L + rope, block_size = 16;
  kernels::LinearWeight kv_b;
  kv_b.weight = b.empty(DType::bf16, {H * (nope + vd), L});
  b.fill(kv_b.weight, pat.bf16_weight);
  core::Rng page_rng(0x3a8);
  Tensor q = b.empty(DType::bf16, {rows, H * (nope + rope)}), out = b.empty(DType::bf16, {rows, H * vd});
  b.fill(q, pat.bf16_act);
  for (const int64_t S : {int64_t{8192}, int64_t{46080}})
    for (DType cache_t : {DType::f8_e4m3, DType::bf16}) {
      const int64_t num_blocks = S / block_size;
      Tensor pages = b.empty(cache_t, {num_blocks, block_size, E});
      b.fill(pages, cache_t == DType::bf16 ? pat.bf16_act : pat.fp8_cache);
      std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
      for (int64_t k = 0; k < num_blocks; ++k) ids[k] = static_cast<int32_t>(k);
      for (int64_t k = num_blocks - 1; k > 0; --k)
        std::swap(ids[k], ids[page_rng.next_u64() % static_cast<uint64_t>(k + 1)]);
      Tensor h_rows = Tensor::zeros(DType::i32, {3, 1}), h_table = Tensor::zeros(DType::i32, {1, num_blocks});
      h_rows.data<int32_t>()[0] = 0;                               // row_begin
      h_rows.data<int32_t>()[1] = static_cast<int32_t>(rows);      // num_rows
      h_rows.data<int32_t>()[2] = static_cast<int32_t>(S - rows);  // position
      std::copy(ids.begin(), ids.end(), h_table.data<int32_t>());
      const Tensor d_rows = backends::cuda::upload(h_rows.view(), b.ctx->pool(), b.stream());
      const Tensor d_table = backends::cuda::upload(h_table.view(), b.ctx->pool(), b.stream());
      kernels::SeqBatch seqs;
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
      const kernels::MlaAttentionArgs a{q.view(), pages.view(), seqs, 1.0f, &kv_b, out.view(),
                                        H,        nope,         rope, vd,   L,     1.0f / std::sqrt(192.0f)};
      const std::string impl = b.reg.mla_naive.select(a, core::Device::cuda).name;
      b.row("mla", std::string("mla_naive ") + (cache_t == DType::bf16 ? "bf16" : "fp8"),
            "ctx=" + std::to_string(S) + " rows=512 " + impl, rows, bytes,
            [&] { b.reg.mla_naive.run(a, core::Device::cuda); });
    }
}

// ---------------------------------------------------------------- routed experts, router

void bench_moe(Bench& b, const Patterns& pat, const std::vector<int64_t>& batches, core::Rng& rng) {
  const int64_t E = 896, k = 16, I = 384, L = 3584;
  // All experts in one slab each for codes and scales; per-expert views into them.
  const int64_t code_bytes[3] = {I * L / 2, I * L / 2, L * I / 2},
                scale_bytes[3] = {I * L / 32, I * L / 32, L * I / 32};
  Tensor codes = b.empty(DType::u8, {E * (code_bytes[0] * 3)}), scales = b.empty(DType::u8, {E * (scale_bytes[0] * 3)});
  b.fill(codes, pat.fp4_codes), b.fill(scales, pat.e8m0);
  // Views into the slabs; each keeps its slab alive through a copy of the slab tensor.
  const std::shared_ptr<void> hold_codes(codes.view().data, [codes](void*) {});
  const std::shared_ptr<void> hold_scales(scales.view().data, [scales](void*) {});
  std::vector<kernels::LinearWeight> w[3];
  const int64_t rows[3] = {I, I, L}, cols[3] = {L, L, I};
  for (int64_t e = 0; e < E; ++e)
    for (int m = 0; m < 3; ++m) {
      kernels::LinearWeight lw;
      char* c = static_cast<char*>(codes.view().data) + (e * 3 + m) * code_bytes[0];
      char* s = static_cast<char*>(scales.view().data) + (e * 3 + m) * scale_bytes[0];
      lw.weight = Tensor(core::TensorView::contiguous(c, DType::u8, {rows[m], cols[m] / 2}, core::Device::cuda),
                         hold_codes);
      lw.scale = Tensor(core::TensorView::contiguous(s, DType::u8, {rows[m], cols[m] / 32}, core::Device::cuda),
                        hold_scales);
      w[m].push_back(lw);
    }
  const double expert_bytes = static_cast<double>(3 * (code_bytes[0] + scale_bytes[0]));
  Tensor bias = b.empty(DType::f32, {E});
  b.fill(bias, pat.f32_act);
  for (int64_t T : batches) {
    Tensor ids_h = Tensor::zeros(DType::i32, {T, k}), wts_h = Tensor::zeros(DType::f32, {T, k});
    std::vector<bool> touched(E);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) {
        int32_t e;
        do e = static_cast<int32_t>(rng.next_u64() % E);
        while (std::find(ids_h.data<int32_t>() + t * k, ids_h.data<int32_t>() + t * k + j, e) !=
               ids_h.data<int32_t>() + t * k + j);
        ids_h.data<int32_t>()[t * k + j] = e;
        wts_h.data<float>()[t * k + j] = 1.0f / k;
        touched[e] = true;
      }
    const int64_t distinct = std::count(touched.begin(), touched.end(), true);
    Tensor ids = backends::cuda::upload(ids_h.view(), b.ctx->pool(), b.stream());
    Tensor wts = backends::cuda::upload(wts_h.view(), b.ctx->pool(), b.stream());
    Tensor z = b.empty(DType::bf16, {T, L}), u = b.empty(DType::bf16, {T, L});
    b.fill(z, pat.bf16_act);
    const kernels::MoeExpertsArgs a{z.view(), ids.view(), wts.view(), w[0], w[1], w[2], u.view()};
    const double bytes = distinct * expert_bytes +
                         static_cast<double>(z.nbytes() + u.nbytes() + ids.nbytes() + wts.nbytes());
    // Every CUDA strategy that takes this batch gets a row (name shortened: "gemv", "grouped",
    // "rowdot"); the one the registry picks is marked "*", so a faster strategy that is not picked shows.
    const std::string picked = b.reg.moe_experts.select(a, core::Device::cuda).name;
    for (const auto& impl : b.reg.moe_experts.impls()) {
      if (impl.device != core::Device::cuda || !impl.supports(a)) continue;
      const std::string strategy = impl.name.rfind("cuda_expert_", 0) == 0 ? impl.name.substr(12) : impl.name;
      b.row("moe", "moe_experts fp4 " + strategy + (impl.name == picked ? "*" : ""),
            "896x(384x3584) top16 d=" + std::to_string(distinct), T, bytes, [&] { impl.run(a); });
    }
    Tensor logits = b.empty(DType::f32, {T, E}), r_ids = b.empty(DType::i32, {T, k}), r_w = b.empty(DType::f32, {T, k});
    b.fill(logits, pat.f32_act);
    const kernels::RouterTopkArgs ra{logits.view(), bias.view(), r_ids.view(), r_w.view()};
    b.row("moe", "router_topk", "E=896 k=16", T,
          static_cast<double>(logits.nbytes() + bias.nbytes() + 2 * r_w.nbytes()),
          [&] { b.reg.router_topk.run(ra, core::Device::cuda); });
  }
}

// ---------------------------------------------------------------- token-parallel ops

void bench_elementwise(Bench& b, const Patterns& pat, const std::vector<int64_t>& batches) {
  Tensor norm_w = b.empty(DType::bf16, {kHidden}), query = b.empty(DType::bf16, {1, kHidden});
  b.fill(norm_w, pat.bf16_weight), b.fill(query, pat.bf16_weight);
  for (int64_t T : batches) {
    std::vector<Tensor> src;
    for (int j = 0; j < 9; ++j) src.push_back(b.empty(DType::bf16, {T, kHidden}));
    for (const Tensor& s : src) b.fill(s, pat.bf16_act);
    std::vector<core::TensorView> views;
    for (const Tensor& s : src) views.push_back(s.view());
    Tensor out = b.empty(DType::bf16, {T, kHidden});
    const double row = static_cast<double>(T * kHidden * 2);
    b.row("elt", "attn_res_mix 9 sources", "D=7168", T, 10 * row + 2 * norm_w.nbytes(), [&] {
      b.reg.attn_res_mix.run({views, query.view(), norm_w.view(), out.view()}, core::Device::cuda);
    });
    b.row("elt", "rmsnorm", "D=7168", T, 2 * row + norm_w.nbytes(), [&] {
      b.reg.rmsnorm.run({src[0].view(), norm_w.view(), out.view()}, core::Device::cuda);
    });
    b.row("elt", "add", "D=7168", T, 3 * row, [&] {
      b.reg.add.run({src[0].view(), src[1].view(), out.view()}, core::Device::cuda);
    });
    const core::TensorView g = backends::cuda::cols_of(src[2].view(), 0, 768),
                           up = backends::cuda::cols_of(src[3].view(), 0, 768);
    const core::TensorView act = backends::cuda::cols_of(out.view(), 0, 768);
    b.row("elt", "situ_glu", "I=768", T, 3.0 * T * 768 * 2, [&] {
      b.reg.situ_glu.run({g, up, act}, core::Device::cuda);
    });
    Tensor xg = b.empty(DType::bf16, {T, 1536}), gg = b.empty(DType::bf16, {T, 1536}),
           og = b.empty(DType::bf16, {T, 1536});
    b.fill(xg, pat.bf16_act), b.fill(gg, pat.bf16_act);
    b.row("elt", "sigmoid_gate", "D=1536", T, 3.0 * T * 1536 * 2, [&] {
      b.reg.sigmoid_gate.run({xg.view(), gg.view(), og.view()}, core::Device::cuda);
    });
  }
}

// ---------------------------------------------------------------- sampling (the `sample` op)

// The `sample` op on a decode step's logits: vocabulary 20480 (a TP8 shard) and 163840 (K3's, what
// the sampler sees after the all-gather), logits N(0, 3). Bytes: the logits read once.
void bench_sampling(Bench& b, const std::vector<int64_t>& batches, core::Rng& rng) {
  struct Setting {
    const char* name;
    float temperature, top_p;
    int top_k, num_top;
  };
  const Setting settings[] = {{"greedy", 0.0f, 1.0f, 0, 0},
                              {"greedy top20", 0.0f, 1.0f, 0, 20},
                              {"T0.7 top_p0.9", 0.7f, 0.9f, 0, 0},
                              {"T0.7 k50 p0.95 lp", 0.7f, 0.95f, 50, 1}};
  for (int64_t V : {int64_t{20480}, int64_t{163840}})
    for (int64_t R : batches) {
      Tensor host = Tensor::zeros(DType::f32, {R, V});
      for (float& v : host.span<float>()) v = static_cast<float>(rng.normal() * 3.0);
      Tensor logits = backends::cuda::upload(host.view(), b.ctx->pool(), b.stream());
      for (const Setting& s : settings) {
        std::vector<kernels::SampleRowParams> rows(static_cast<size_t>(R));
        for (int64_t r = 0; r < R; ++r) {
          kernels::SampleRowParams& p = rows[static_cast<size_t>(r)];
          p.logits_row = static_cast<int32_t>(r), p.temperature = s.temperature, p.top_p = s.top_p;
          p.top_k = s.top_k, p.num_top = s.num_top, p.want_logprob = s.num_top > 0, p.uniform = rng.uniform();
        }
        const Tensor params_h = kernels::pack_sample_params(rows);
        Tensor params = backends::cuda::upload(params_h.view(), b.ctx->pool(), b.stream());
        Tensor out = b.empty(DType::f32, {R, 2 + 2 * int64_t{s.num_top}});
        const kernels::SampleArgs a{logits.view(), params.view(), out.view()};
        b.row("sample", std::string("sample ") + s.name, "V=" + std::to_string(V), R,
              static_cast<double>(logits.nbytes() + params.nbytes() + out.nbytes()),
              [&] { b.reg.sample.run(a, core::Device::cuda); });
      }
    }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string out = "ops_gpu.json", batches_arg = "1,8,64", only = "linear,kda,mla,moe,elt,sample";
    int iters = 30;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      const auto value = [&](const char* flag) -> std::string {
        K3_CHECK(i + 1 < argc, std::string(flag) + " needs a value");
        return argv[++i];
      };
      if (a == "--out") out = value("--out");
      else if (a == "--iters") iters = std::stoi(value("--iters"));
      else if (a == "--batches") batches_arg = value("--batches");
      else if (a == "--only") only = value("--only");
      else if (a == "--help" || a == "-h") {
        std::cout
            << "k3bench_ops_gpu [--out FILE] [--iters N] [--batches 1,8,64] [--only linear,kda,mla,moe,elt,sample]\n";
        return 0;
      } else {
        throw core::Error("unknown option " + a + " (try --help)");
      }
    }
    K3_CHECK(iters >= 1, "--iters must be >= 1");
    const std::vector<int64_t> batches = k3::bench::parse_int_list(batches_arg, "--batches");
    Bench b;
    b.ctx = backends::cuda::Context::create(0);
    b.iters = iters;
    kernels::register_cuda_ops(b.reg, b.ctx);
    const auto& info = b.ctx->info();
    // Twice the L2, so a flush leaves nothing of the previous run in it.
    b.flush = b.empty(DType::u8, {static_cast<int64_t>(std::max<size_t>(info.l2_bytes * 2, size_t{256} << 20))});
    b.copy_bytes_per_second = measure_copy_bandwidth(b);
    std::printf("k3bench_ops_gpu on %s (%d SMs, L2 %zu MiB): device copy %.0f GB/s (read + write); floor 4300 GB/s\n",
                info.name.c_str(), info.sm_count, info.l2_bytes >> 20, b.copy_bytes_per_second / 1e9);
    std::printf("%-6s %-22s %-26s %5s %10s %12s %9s %8s %8s\n", "group", "op", "shape", "batch", "median_us",
                "MB moved", "GB/s", "x4.3TB/s", "xcopy");
    core::Rng rng(42);
    const Patterns pat(rng);
    const std::string only_list = "," + only + ",";  // (built once: GCC 12 -Wrestrict misfires on it in the lambda)
    const auto wanted = [&](const char* group) {
      std::string key = ",";
      key.append(group).append(",");
      return only_list.find(key) != std::string::npos;
    };
    if (wanted("linear")) bench_linears(b, pat, batches);
    if (wanted("kda")) bench_kda_decode(b, pat, batches);
    if (wanted("mla")) bench_mla_decode(b, pat, batches);
    if (wanted("mla")) bench_mla_prefill(b, pat);
    if (wanted("moe")) bench_moe(b, pat, batches, rng);
    if (wanted("elt")) bench_elementwise(b, pat, batches);
    if (wanted("sample")) bench_sampling(b, batches, rng);
    nlohmann::json env = evidence::environment();
    env["gpu"] = {{"name", info.name},
                  {"sm_count", info.sm_count},
                  {"l2_bytes", info.l2_bytes},
                  {"global_bytes", info.global_bytes},
                  {"cc", std::to_string(info.cc_major) + "." + std::to_string(info.cc_minor)},
                  {"driver_version", info.driver_version},
                  {"runtime_version", info.runtime_version}};
    const nlohmann::json bundle = {
        {"benchmark", "ops_gpu"},
        {"environment", env},
        {"config",
         {{"iters", iters},
          {"batches", batches},
          {"only", only},
          {"timing", "median of iters, L2 flushed before each, CUDA events"},
          {"bytes",
           "spec §12: weights read + state read/written + cache read + activations in/out; experts: distinct touched"}}},
        {"copy_GBps", b.copy_bytes_per_second / 1e9},
        {"floor_GBps", kFloorBytesPerSecond / 1e9},
        {"rows", b.rows}};
    std::ofstream(out) << bundle.dump(2) << "\n";
    std::cout << "wrote " << out << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
}
