// kernels/kda/kda_decode_ops_test.cpp: the fused KDA decode op (kernels/kda_decode) on every device
// backend against the CPU reference: out, the o trace, the conv storage and the state pool (used
// and spare slots), in bf16 and fp32 modes, at odd shapes and at one TP8 rank's K3 shapes, for
// decode steps (1 row per sequence) and verify sequences (several rows) with and without no_commit.
// Inputs are row-strided column slices of one fused projection buffer, as the fast path passes them;
// with no_commit both pools must come back byte-identical.
#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "kernels/kda/cases.h"
#include "kernels/testing/op_harness.h"

namespace k3::ops_test {
namespace {

struct Seq {
  int64_t row_begin, rows, slot, position;
};

// The sequences of a call: rows in a shuffled sequence order, distinct slots drawn from a pool with
// two spare slots (which must stay untouched), positions cycled from `positions`.
struct Batch {
  std::vector<Seq> seqs;
  int64_t T = 0, num_slots = 0;
  int max_rows = 0;
  Tensor h_row_begin, h_num_rows, h_position, h_slot;  // host i32 tables
  Tensor d_row_begin, d_num_rows, d_position, d_slot;  // the same on the device

  Batch(Device* dev, core::Rng& rng, const std::vector<int64_t>& rows, const std::vector<int64_t>& positions) {
    const int64_t S = static_cast<int64_t>(rows.size());
    num_slots = S + 2;
    std::vector<int64_t> order(S), slots(num_slots);
    std::iota(order.begin(), order.end(), 0);
    std::iota(slots.begin(), slots.end(), 0);
    for (int64_t i = S - 1; i > 0; --i) std::swap(order[i], order[rng.next_u64() % (i + 1)]);
    for (int64_t i = num_slots - 1; i > 0; --i) std::swap(slots[i], slots[rng.next_u64() % (i + 1)]);
    seqs.resize(S);
    for (int64_t i : order) {
      seqs[i] = {T, rows[i], slots[i], positions[static_cast<size_t>(i) % positions.size()]};
      T += rows[i];
      max_rows = std::max(max_rows, static_cast<int>(rows[i]));
    }
    for (Tensor* t : {&h_row_begin, &h_num_rows, &h_position, &h_slot}) *t = Tensor::zeros(DType::i32, {S});
    for (int64_t s = 0; s < S; ++s) {
      h_row_begin.data<int32_t>()[s] = static_cast<int32_t>(seqs[s].row_begin);
      h_num_rows.data<int32_t>()[s] = static_cast<int32_t>(seqs[s].rows);
      h_position.data<int32_t>()[s] = static_cast<int32_t>(seqs[s].position);
      h_slot.data<int32_t>()[s] = static_cast<int32_t>(seqs[s].slot);
    }
    d_row_begin = dev->upload(h_row_begin), d_num_rows = dev->upload(h_num_rows);
    d_position = dev->upload(h_position), d_slot = dev->upload(h_slot);
  }
  kernels::SeqBatch host() const { return make(h_row_begin, h_num_rows, h_position, h_slot); }
  kernels::SeqBatch device() const { return make(d_row_begin, d_num_rows, d_position, d_slot); }
  std::string str() const {  // "rows 1@9 3@0 ..." (appended piece by piece: GCC 12 warns falsely otherwise)
    std::string s = "rows";
    for (const Seq& q : seqs) {
      s += ' ';
      s += std::to_string(q.rows);
      s += '@';
      s += std::to_string(q.position);
    }
    return s;
  }

 private:
  kernels::SeqBatch make(const Tensor& rb, const Tensor& nr, const Tensor& pos, const Tensor& slot) const {
    kernels::SeqBatch b;
    b.row_begin = rb.view(), b.num_rows = nr.view(), b.position = pos.view(), b.slot = slot.view();
    b.num_seqs = static_cast<int>(seqs.size());
    b.max_rows = max_rows;
    for (const Seq& q : seqs) b.max_tokens = std::max(b.max_tokens, q.position + q.rows);
    return b;
  }
};

// Columns [c0, c0+n) of a [T, W] tensor: a row-strided view of the same storage (host or device).
TensorView cols(const Tensor& t, int64_t c0, int64_t n) {
  TensorView v = t.view();
  v.data = static_cast<char*>(v.data) + c0 * static_cast<int64_t>(core::dtype_size(v.dtype));
  v.shape = Shape{t.dim(0), n};
  return v;
}

// Zeroes slot `slot` of a contiguous host pool (a new sequence starts from zero states).
void zero_slot(Tensor& pool, int64_t slot) {
  const int64_t per = pool.numel() / pool.dim(0);
  std::fill_n(pool.data<float>() + slot * per, per, 0.0f);
}

// One call on host and device alike. Everything the op reads is built once on the host; views of
// the fused projection buffer [T, 4P + R + H + 3] give q_in, k_in, v_in, g, f_a and b.
// A shape of kernels/kda/cases.h, and how the call is made.
struct DecodeCase : kernels::KdaDecodeShape {
  bool no_commit;
  bool f32_weights = false;  // f_b and o_norm f32 (else bf16)
};

void check_decode(Device* dev, Mode mode, const DecodeCase& c, const std::vector<int64_t>& rows,
                  const std::vector<int64_t>& positions, uint64_t seed, const char* expect_impl = nullptr) {
  core::Rng rng(seed);
  const Batch batch(dev, rng, rows, positions);
  const int64_t T = batch.T, N = batch.num_slots, P = int64_t{c.H} * c.D;
  const Precision p = precision(mode);
  const Tensor proj = random_act(rng, {T, 4 * P + c.R + c.H + 3}, mode);
  kernels::LinearWeight f_b;
  f_b.weight = random_bf16_weight(rng, P, c.R);
  if (c.f32_weights) f_b.weight = to_f32(f_b.weight);
  const Tensor q_conv = random_uniform_f32(rng, {P, 1, c.K}, 0.6), k_conv = random_uniform_f32(rng, {P, 1, c.K}, 0.6),
               v_conv = random_uniform_f32(rng, {P, 1, c.K}, 0.6);
  const Tensor a_log = random_act(rng, {int64_t{c.H} + 2}, Mode::fp32, 0.0, 0.5);  // junk past H
  const Tensor dt_bias = random_act(rng, {P}, Mode::fp32);
  Tensor o_norm = random_act(rng, {int64_t{c.D}}, Mode::bf16, 1.0, 0.3);
  if (!c.f32_weights) {  // the checkpoint's bf16 o_norm.weight (same values)
    Tensor w = Tensor::zeros(DType::bf16, {int64_t{c.D}});
    for (int64_t i = 0; i < c.D; ++i) w.data<uint16_t>()[i] = core::f32_to_bf16_bits(o_norm.data<float>()[i]);
    o_norm = w;
  }
  Tensor conv0 = random_act(rng, {N, 3, P, int64_t{c.K} - 1}, Mode::bf16);  // the conv state holds bf16 values
  Tensor state0 = random_act(rng, {N, c.H, c.D, c.D}, Mode::fp32, 0.0, 0.5);
  for (const Seq& s : batch.seqs)
    if (s.position == 0) zero_slot(conv0, s.slot), zero_slot(state0, s.slot);

  const auto make_args = [&](const Tensor& pr, const kernels::LinearWeight& w, const Tensor& qc, const Tensor& kc,
                             const Tensor& vc, const Tensor& conv, const Tensor& al, const Tensor& dt,
                             const Tensor& state, const Tensor& on, const Tensor& out, const Tensor& trace,
                             const kernels::SeqBatch& seqs) {
    kernels::KdaDecodeArgs a;
    a.q_in = cols(pr, 0, P), a.k_in = cols(pr, P, P), a.v_in = cols(pr, 2 * P, P), a.g = cols(pr, 3 * P, P);
    a.f_a = cols(pr, 4 * P, c.R), a.b = cols(pr, 4 * P + c.R, c.H), a.f_b = &w;
    a.q_conv = qc.view(), a.k_conv = kc.view(), a.v_conv = vc.view(), a.conv_state = conv.view();
    a.a_log = al.view(), a.dt_bias = dt.view(), a.state = state.view(), a.o_norm = on.view();
    a.out = out.view(), a.o_trace = trace.view();
    a.num_heads = c.H, a.head_dim = c.D, a.lower_bound = -5.0f, a.rms_eps = 1e-5f, a.precision = p;
    a.seqs = seqs, a.no_commit = c.no_commit;
    return a;
  };

  // CPU reference (the oracle).
  Tensor want = nan_tensor({T, P}), want_trace = nan_tensor({T, P}), want_conv = copy(conv0), want_state = copy(state0);
  cpu_registry().kda_decode.run(make_args(proj, f_b, q_conv, k_conv, v_conv, want_conv, a_log, dt_bias, want_state,
                                          o_norm, want, want_trace, batch.host()),
                                core::Device::cpu);

  // Device: activations and the conv state in the mode's dtype (bf16 values either way). Every
  // device implementation that takes these arguments runs (the V-split cluster form and the
  // head-CTA form where both apply), each on fresh copies of the pools; the one run() picks must be
  // `expect_impl` when given (proves which kernel the registry chooses at this batch size).
  const Tensor dproj = dev->act(proj, mode);
  const kernels::LinearWeight dfb = dev->upload(f_b);
  const Tensor dqc = dev->upload(q_conv), dkc = dev->upload(k_conv), dvc = dev->upload(v_conv);
  const Tensor dal = dev->upload(a_log), ddt = dev->upload(dt_bias), don = dev->upload(o_norm);
  const kernels::SeqBatch dseqs = batch.device();
  std::string shape = c.name;
  shape += c.no_commit ? " verify " : " ";
  shape += batch.str();
  const auto& table = dev->registry().kda_decode;
  int ran = 0;
  bool selection_checked = false;
  for (const auto& impl : table.impls()) {
    if (impl.device != dev->kind()) continue;
    const Tensor dconv = dev->upload(conv0, act_dtype(mode)), dstate = dev->upload(state0);
    const Tensor out = dev->poisoned(act_dtype(mode), {T, P}), trace = dev->poisoned(act_dtype(mode), {T, P});
    const kernels::KdaDecodeArgs args = make_args(dproj, dfb, dqc, dkc, dvc, dconv, dal, ddt, dstate, don, out, trace,
                                                  dseqs);
    if (!selection_checked) {
      selection_checked = true;
      expect_device_impl(table, args, dev);
      if (expect_impl != nullptr) {
        EXPECT_EQ(table.select(args, dev->kind()).name, expect_impl) << shape;
      }
    }
    if (impl.supports && !impl.supports(args)) continue;
    ++ran;
    impl.run(args);
    const std::string at = shape + " [" + impl.name + "]";
    expect_close("kda_decode", at, mode, "out", dev->to_host_f32(out.view()), want, tol_attention(mode));
    expect_close("kda_decode", at, mode, "o_trace", dev->to_host_f32(trace.view()), want_trace, tol_attention(mode));
    // The conv window only moves values: exact. no_commit: both pools exactly as uploaded.
    const Tol exact{0.0, 1 - 1e-12};
    expect_close("kda_decode", at, mode, "conv_state", dev->to_host_f32(dconv.view()), want_conv, exact);
    expect_close("kda_decode", at, mode, "state", dev->to_host_f32(dstate.view()), want_state,
                 c.no_commit ? exact : tol_attention(mode));
    if (c.no_commit) {
      expect_close("kda_decode", at, mode, "conv_untouched", dev->to_host_f32(dconv.view()), conv0, exact);
      expect_close("kda_decode", at, mode, "state_untouched", dev->to_host_f32(dstate.view()), state0, exact);
      // Untraced (o_trace absent, as the fused path runs without a trace): the same out.
      kernels::KdaDecodeArgs untraced = args;
      const Tensor out2 = dev->poisoned(act_dtype(mode), {T, P});
      untraced.out = out2.view();
      untraced.o_trace = {};
      impl.run(untraced);
      expect_close("kda_decode", at, mode, "out_untraced", dev->to_host_f32(out2.view()), want, tol_attention(mode));
    }
  }
  EXPECT_GE(ran, 1) << shape;
}

std::vector<int64_t> repeat(int64_t rows, int n) { return std::vector<int64_t>(static_cast<size_t>(n), rows); }

TEST(OpsOdd, KdaDecode) {
  K3_REQUIRE_CUDA(dev);
  const auto& odd = kernels::kKdaDecodeOddShapes;
  uint64_t seed = 9100;
  for (Mode m : kModes)
    for (bool no_commit : {false, true}) {
      // Every odd shape of the table at one mixed batch (decode and verify rows, a fresh slot, a long
      // position); then layouts that matter for particular shapes.
      for (const kernels::KdaDecodeShape& sh : odd)
        check_decode(dev, m, {sh, no_commit}, {1, 3, 5, 1}, {9, 0, 33, 1000}, seed++);
      check_decode(dev, m, {odd[0], no_commit}, {1}, {0}, seed++);
      check_decode(dev, m, {odd[1], no_commit, true}, {2, 1, 8}, {5, 0, 70}, seed++);
      check_decode(dev, m, {odd[2], no_commit}, repeat(1, 17), {7}, seed++);
      check_decode(dev, m, {odd[4], no_commit, true}, {1, 4}, {0, 3}, seed++);  // unaligned f_b rows
      check_decode(dev, m, {odd[5], no_commit}, {1, 2}, {4, 1}, seed++);        // K = 2, vector f_b
    }
}

// Which CUDA kernel the registry picks (cuda_kda_decode.cu, split_slices): the V-split cluster form
// while 4 * H * num_seqs <= 2 * SMs, the head-CTA form beyond. The expectations hold on any GPU of
// 72 to 407 SMs (the H200 has 132): H * num_seqs <= 36 splits, H * num_seqs >= 204 does not.
constexpr const char* kSplit = "cuda_vsplit_cluster";
constexpr const char* kHeadCta = "cuda_head_cta";

TEST(OpsTp8, KdaDecode) {
  // One TP8 rank of K3 (spec §11, §14.2): 12 heads of 128, R = 128, K = 4, bf16 f_b and o_norm.
  K3_REQUIRE_CUDA(dev);
  const kernels::KdaDecodeShape& tp8 = kernels::kKdaDecodeK3Tp8;
  uint64_t seed = 9300;
  for (Mode m : kModes) {
    check_decode(dev, m, {tp8, false}, repeat(1, 64), {8191}, seed++, kHeadCta);  // decode step of 64
    check_decode(dev, m, {tp8, false}, {1}, {511}, seed++, kSplit);               // batch 1
    check_decode(dev, m, {tp8, true}, repeat(4, 8), {100}, seed++);               // verify, K = 3 drafts
    check_decode(dev, m, {tp8, false}, repeat(4, 8), {100}, seed++);              // the same rows committed
    check_decode(dev, m, {tp8, true, true}, {1, 8, 1}, {0, 7, 300}, seed++, kSplit);
  }
}

TEST(OpsTp8, KdaDecodeVSplit) {
  // The split form at batch 1 (8 slices of 16 value rows), 2 (8) and 3 (4 slices of 32) of a TP8
  // rank, decode and verify rows; batch 17 of a TP8 rank takes the head-CTA form; one head (as a
  // TP64-like shard) splits at batch 1 and 17. Every case also runs the head-CTA kernel (the test
  // runs all implementations that accept the arguments), so both are held to the oracle.
  K3_REQUIRE_CUDA(dev);
  const kernels::KdaDecodeShape &tp8 = kernels::kKdaDecodeK3Tp8, &one_head = kernels::kKdaDecodeK3OneHead,
                                &one_head_r1024 = kernels::kKdaDecodeK3OneHeadR1024;
  uint64_t seed = 9500;
  for (Mode m : kModes) {
    check_decode(dev, m, {tp8, false}, {1}, {0}, seed++, kSplit);                  // fresh slot
    check_decode(dev, m, {tp8, true}, {4}, {63}, seed++, kSplit);                  // verify 4 rows
    check_decode(dev, m, {tp8, false}, {4}, {63}, seed++, kSplit);                 // committed
    check_decode(dev, m, {tp8, false}, {1, 1}, {5, 900}, seed++, kSplit);          // batch 2
    check_decode(dev, m, {tp8, false}, repeat(1, 3), {40, 0, 7}, seed++, kSplit);  // batch 3: 4 slices
    check_decode(dev, m, {tp8, true}, {2, 5, 1}, {3, 9, 0}, seed++, kSplit);       // batch 3 verify
    check_decode(dev, m, {tp8, false}, repeat(1, 17), {31}, seed++, kHeadCta);     // batch 17: no split
    check_decode(dev, m, {one_head, false}, {1}, {12}, seed++, kSplit);
    check_decode(dev, m, {one_head, false}, repeat(1, 17), {12, 0}, seed++, kSplit);
    check_decode(dev, m, {one_head, true}, {3, 1, 6}, {2, 0, 50}, seed++, kSplit);
    check_decode(dev, m, {one_head_r1024, false, true}, {2}, {6}, seed++, kSplit);  // R = 1024: uncached f_b chunks
  }
}

}  // namespace
}  // namespace k3::ops_test
