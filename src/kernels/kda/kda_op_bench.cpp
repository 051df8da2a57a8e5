// kernels/kda/kda_op_bench.cpp: k3bench_ops_gpu's KDA rows at one TP8 rank's decode shape
// (cases.h kKdaDecodeK3Tp8): the standard decode ops (conv, recurrence, output gate) and the fused
// kda_decode, each over B sequences with their own state slots at an 8K position.
#include "backends/cuda/device_tensor.h"
#include "kernels/kda/cases.h"
#include "kernels/testing/op_bench.h"

namespace k3::kernels {

using core::DType;
using core::Tensor;

void bench_kda_ops(OpBench& b) {
  const KdaDecodeShape& shape = kKdaDecodeK3Tp8;  // kernels/kda/cases.h
  const int H = shape.H, D = shape.D, R = shape.R, K = shape.K;
  const int64_t P = H * D, C = 3 * P;  // conv over q, k, v side by side
  Tensor conv_w = b.empty(DType::f32, {C, K}), a_log = b.empty(DType::f32, {H}), dt_bias = b.empty(DType::f32, {P});
  Tensor o_norm = b.empty(DType::f32, {D});
  b.fill(conv_w, b.pat().f32_act), b.fill(a_log, b.pat().f32_act), b.fill(dt_bias, b.pat().f32_act),
      b.fill(o_norm, b.pat().f32_act);
  for (int64_t B : b.batches()) {
    // Per sequence: its own state slot (so B sequences touch B distinct states, as in serving), in
    // a pool indexed by the SeqBatch tables; the whole batch is one call (one launch) per op.
    Tensor conv_state = b.empty(DType::bf16, {B, C, 3}), state = b.empty(DType::f32, {B, H, D, D});
    Tensor qkv = b.empty(DType::bf16, {B, C}), qkv_out = b.empty(DType::bf16, {B, C});
    Tensor f = b.empty(DType::bf16, {B, P}), beta = b.empty(DType::bf16, {B, H}), o = b.empty(DType::bf16, {B, P});
    Tensor gate = b.empty(DType::bf16, {B, P}), y = b.empty(DType::bf16, {B, P});
    for (const Tensor* t : {&conv_state, &qkv, &f, &beta, &gate}) b.fill(*t, b.pat().bf16_act);
    b.fill(state, b.pat().f32_act);
    // Decode tables: sequence i is row i, slot B-1-i (not the identity), position 8191 (8K context).
    Tensor tables = Tensor::zeros(DType::i32, {4, B});
    for (int64_t i = 0; i < B; ++i) {
      int32_t* t = tables.data<int32_t>();
      t[i] = static_cast<int32_t>(i), t[B + i] = 1, t[2 * B + i] = 8191, t[3 * B + i] = static_cast<int32_t>(B - 1 - i);
    }
    const Tensor d_tables = b.upload(tables);
    SeqBatch seqs;
    seqs.row_begin = d_tables.view().row(0), seqs.num_rows = d_tables.view().row(1);
    seqs.position = d_tables.view().row(2), seqs.slot = d_tables.view().row(3);
    seqs.num_seqs = static_cast<int>(B), seqs.max_rows = 1, seqs.max_tokens = 8192;
    const double conv_bytes = static_cast<double>(B) * (C * 3 * 2 * 2 + C * 2 * 2) + conv_w.nbytes();
    const KdaConvArgs conv{qkv.view(), conv_w.view(), conv_state.view(), qkv_out.view(), Precision::bf16, seqs};
    b.row("kda", "kda_conv decode", "C=4608 K=4", B, conv_bytes,
          [&] { b.reg().kda_conv.run(conv, core::Device::cuda); });
    const double rec_bytes = static_cast<double>(B) * (2.0 * H * D * D * 4 + (5.0 * P + H) * 2);
    const KdaAttentionArgs rec{backends::cuda::cols_of(qkv_out.view(), 0, P),
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
                               Precision::bf16,
                               seqs};
    b.row("kda", "kda_recurrent decode", "H=12 D=128", B, rec_bytes,
          [&] { b.reg().kda_recurrent.run(rec, core::Device::cuda); });
    const double gate_bytes = static_cast<double>(B) * P * 2 * 3;
    b.row("kda", "kda_output_gate", "H=12 D=128", B, gate_bytes, [&] {
      b.reg().kda_output_gate.run({o.view(), gate.view(), o_norm.view(), y.view(), H, D}, core::Device::cuda);
    });
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
    fused.state = state.view(), fused.o_norm = o_norm.view(), fused.out = y.view();
    fused.num_heads = H, fused.head_dim = D, fused.precision = Precision::bf16, fused.seqs = seqs;
    const double fused_bytes = static_cast<double>(B) *
                                   (2.0 * H * D * D * 4 + 2.0 * 3 * P * (K - 1) * 2 + (4.0 * P + R + H) * 2 + P * 2) +
                               static_cast<double>(f_b.weight.nbytes() + conv_w.nbytes());
    b.row("kda", "kda_decode (fused)", shape.name, B, fused_bytes,
          [&] { b.reg().kda_decode.run(fused, core::Device::cuda); });
  }
}

}  // namespace k3::kernels
