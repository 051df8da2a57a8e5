// kernels/kda/kda_op_bench.cpp: k3bench_ops_gpu's KDA rows at one TP8 rank's shapes (cases.h
// kKdaDecodeK3Tp8, kKdaAttnK3Tp8): the standard decode ops (conv, recurrence, output gate) and the
// fused kda_decode, each over B sequences with their own state slots at an 8K position; the
// recurrence over verify steps of B sequences (no_commit, as the standard path verifies); the
// chunked prefill (chunk 64) over the prefills of kKdaChunkedBenchSteps.
#include <string>

#include "backends/cuda/device_tensor.h"
#include "kernels/kda/cases.h"
#include "kernels/testing/op_bench.h"

namespace k3::kernels {

using core::DType;
using core::Tensor;

namespace {

// The recurrence reads the conv's q, k, v outputs: both tables name one rank's heads.
static_assert(kKdaAttnK3Tp8.H == kKdaDecodeK3Tp8.H && kKdaAttnK3Tp8.D == kKdaDecodeK3Tp8.D);

// The device SeqBatch of n sequences of `rows` rows each at `position`: sequence i owns rows
// [i * rows, (i + 1) * rows) and slot n-1-i (not the identity), as a pool indexed by the tables.
struct BenchSeqs {
  Tensor tables;  // i32 [4, n] on the device: row_begin, num_rows, position, slot
  SeqBatch seqs;
};
BenchSeqs bench_seqs(OpBench& b, int64_t n, int64_t rows, int64_t position) {
  Tensor host = Tensor::zeros(DType::i32, {4, n});
  int32_t* t = host.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    t[i] = static_cast<int32_t>(i * rows), t[n + i] = static_cast<int32_t>(rows);
    t[2 * n + i] = static_cast<int32_t>(position), t[3 * n + i] = static_cast<int32_t>(n - 1 - i);
  }
  BenchSeqs s{b.upload(host), {}};
  s.seqs.row_begin = s.tables.view().row(0), s.seqs.num_rows = s.tables.view().row(1);
  s.seqs.position = s.tables.view().row(2), s.seqs.slot = s.tables.view().row(3);
  s.seqs.num_seqs = static_cast<int>(n), s.seqs.max_rows = static_cast<int>(rows);
  s.seqs.max_tokens = position + rows;
  return s;
}

// The attention ops' own buffers over T rows: q, k, v as column slices of one [T, 3P] buffer (the
// conv's output, as the model passes it), f, b, o; a state pool of n slots.
struct AttnBuffers {
  Tensor qkv, f, beta, o, state;
  AttnBuffers(OpBench& b, int64_t T, int64_t n, int H, int D) {
    const int64_t P = int64_t{H} * D;
    qkv = b.empty(DType::bf16, {T, 3 * P}), f = b.empty(DType::bf16, {T, P}), beta = b.empty(DType::bf16, {T, H});
    o = b.empty(DType::bf16, {T, P}), state = b.empty(DType::f32, {n, H, D, D});
    for (const Tensor* t : {&qkv, &f, &beta}) b.fill(*t, b.pat().bf16_act);
    b.fill(state, b.pat().f32_act);
  }
  KdaAttentionArgs args(const Tensor& a_log, const Tensor& dt_bias, int H, int D, const SeqBatch& seqs) const {
    const int64_t P = int64_t{H} * D;
    KdaAttentionArgs a;
    a.q = backends::cuda::cols_of(qkv.view(), 0, P), a.k = backends::cuda::cols_of(qkv.view(), P, P);
    a.v = backends::cuda::cols_of(qkv.view(), 2 * P, P), a.f = f.view(), a.b = beta.view();
    a.a_log = a_log.view(), a.dt_bias = dt_bias.view(), a.state = state.view(), a.out = o.view();
    a.num_heads = H, a.head_dim = D, a.lower_bound = -5.0f, a.chunk_size = 64, a.precision = Precision::bf16;
    a.seqs = seqs;
    return a;
  }
};

// Bytes an attention call moves (spec §12 counting): a_log and dt_bias read; each sequence's state
// read, and written back unless no_commit; per row q, k, v, f and o (bf16 [P]) and b (bf16 [H]).
double attn_bytes(int H, int D, int64_t seqs, int64_t T, bool no_commit, const Tensor& a_log, const Tensor& dt_bias) {
  const double P = static_cast<double>(H) * D, slot = static_cast<double>(H) * D * D * 4;
  return static_cast<double>(seqs) * slot * (no_commit ? 1 : 2) + static_cast<double>(T) * (5 * P + H) * 2 +
         static_cast<double>(a_log.nbytes() + dt_bias.nbytes());
}

}  // namespace

void bench_kda_ops(OpBench& b) {
  const KdaDecodeShape& shape = kKdaDecodeK3Tp8;  // kernels/kda/cases.h
  const int H = shape.H, D = shape.D, R = shape.R, K = shape.K;
  const int64_t P = H * D, C = 3 * P;  // conv over q, k, v side by side
  const std::string heads = "H=" + std::to_string(H) + " D=" + std::to_string(D);
  Tensor conv_w = b.empty(DType::f32, {C, K}), a_log = b.empty(DType::f32, {H}), dt_bias = b.empty(DType::f32, {P});
  Tensor o_norm = b.empty(DType::f32, {D});
  b.fill(conv_w, b.pat().f32_act), b.fill(a_log, b.pat().f32_act), b.fill(dt_bias, b.pat().f32_act),
      b.fill(o_norm, b.pat().f32_act);
  for (int64_t B : b.batches()) {
    // Per sequence: its own state slot (so B sequences touch B distinct states, as in serving), in
    // a pool indexed by the SeqBatch tables; the whole batch is one call (one launch) per op.
    Tensor conv_state = b.empty(DType::bf16, {B, C, 3}), qkv_out = b.empty(DType::bf16, {B, C});
    AttnBuffers attn(b, B, B, H, D);
    Tensor gate = b.empty(DType::bf16, {B, P}), y = b.empty(DType::bf16, {B, P});
    for (const Tensor* t : {&conv_state, &gate}) b.fill(*t, b.pat().bf16_act);
    // Decode tables: sequence i is row i, slot B-1-i, position 8191 (8K context).
    const BenchSeqs decode = bench_seqs(b, B, 1, 8191);
    const SeqBatch& seqs = decode.seqs;
    const double conv_bytes = static_cast<double>(B) * (C * 3 * 2 * 2 + C * 2 * 2) + conv_w.nbytes();
    const KdaConvArgs conv{attn.qkv.view(), conv_w.view(), conv_state.view(), qkv_out.view(), Precision::bf16, seqs};
    b.row("kda", "kda_conv decode", "C=" + std::to_string(C) + " K=" + std::to_string(K), B, conv_bytes,
          [&] { b.reg().kda_conv.run(conv, core::Device::cuda); });
    const KdaAttentionArgs rec = attn.args(a_log, dt_bias, H, D, seqs);
    b.row("kda", "kda_recurrent decode", heads, B, attn_bytes(H, D, B, B, false, a_log, dt_bias),
          [&] { b.reg().kda_recurrent.run(rec, core::Device::cuda); });
    const double gate_bytes = static_cast<double>(B) * P * 2 * 3;
    b.row("kda", "kda_output_gate", heads, B, gate_bytes, [&] {
      b.reg().kda_output_gate.run({attn.o.view(), gate.view(), o_norm.view(), y.view(), H, D}, core::Device::cuda);
    });
    // Verify steps: B sequences of K + 1 rows each read their committed slot and leave it (no_commit).
    for (int64_t rows : kKdaBenchVerifyRows) {
      AttnBuffers vattn(b, B * rows, B, H, D);
      const BenchSeqs verify = bench_seqs(b, B, rows, 8191);
      KdaAttentionArgs va = vattn.args(a_log, dt_bias, H, D, verify.seqs);
      va.no_commit = true;
      b.row("kda", "kda_recurrent verify", heads + " rows=" + std::to_string(rows), B,
            attn_bytes(H, D, B, B * rows, true, a_log, dt_bias),
            [&] { b.reg().kda_recurrent.run(va, core::Device::cuda); });
    }
    // The fused decode op (kda_decode: f_b, the three convs, the recurrence and the output gate in one
    // launch), on one fused projection buffer [B, 4P + R + H] as the fast path passes it.
    Tensor proj = b.empty(DType::bf16, {B, 4 * P + R + H}), fused_conv = b.empty(DType::bf16, {B, 3, P, K - 1});
    for (const Tensor* t : {&proj, &fused_conv}) b.fill(*t, b.pat().bf16_act);
    LinearWeight f_b;
    f_b.weight = b.empty(DType::bf16, {P, R});
    b.fill(f_b.weight, b.pat().bf16_weight);
    KdaDecodeArgs fused;
    const auto col = [&](int64_t c0, int64_t n) { return backends::cuda::cols_of(proj.view(), c0, n); };
    fused.q_in = col(0, P), fused.k_in = col(P, P), fused.v_in = col(2 * P, P), fused.g = col(3 * P, P);
    fused.f_a = col(4 * P, R), fused.b = col(4 * P + R, H), fused.f_b = &f_b;
    fused.q_conv = backends::cuda::rows_of(conv_w.view(), 0, P),
    fused.k_conv = backends::cuda::rows_of(conv_w.view(), P, P);
    fused.v_conv = backends::cuda::rows_of(conv_w.view(), 2 * P, P);
    fused.conv_state = fused_conv.view(), fused.a_log = a_log.view(), fused.dt_bias = dt_bias.view();
    fused.state = attn.state.view(), fused.o_norm = o_norm.view(), fused.out = y.view();
    fused.num_heads = H, fused.head_dim = D, fused.precision = Precision::bf16, fused.seqs = seqs;
    const double fused_bytes = static_cast<double>(B) *
                                   (2.0 * H * D * D * 4 + 2.0 * 3 * P * (K - 1) * 2 + (4.0 * P + R + H) * 2 + P * 2) +
                               static_cast<double>(f_b.weight.nbytes() + conv_w.nbytes());
    b.row("kda", "kda_decode (fused)", shape.name, B, fused_bytes,
          [&] { b.reg().kda_decode.run(fused, core::Device::cuda); });
  }
  // Chunked prefill at chunk 64: each sequence continues its slot from position 0; the row's batch
  // is the token count.
  const KdaAttnShape& k3 = kKdaAttnK3Tp8;
  for (const KdaAttnStep& step : kKdaChunkedBenchSteps) {
    const int64_t T = step.seqs * step.rows;
    AttnBuffers attn(b, T, step.seqs, k3.H, k3.D);
    const BenchSeqs prefill = bench_seqs(b, step.seqs, step.rows, step.position);
    const KdaAttentionArgs a = attn.args(a_log, dt_bias, k3.H, k3.D, prefill.seqs);
    b.row("kda", "kda_chunked prefill", std::string(k3.name) + " c64 " + step.name, T,
          attn_bytes(k3.H, k3.D, step.seqs, T, false, a_log, dt_bias),
          [&] { b.reg().kda_chunked.run(a, core::Device::cuda); });
  }
}

}  // namespace k3::kernels
