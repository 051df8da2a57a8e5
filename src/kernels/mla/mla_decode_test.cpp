// kernels/mla/mla_decode_test.cpp: the fused MLA decode op on the CPU: equal bit for bit to the
// standard pair mla_absorbed + sigmoid_gate run through the reference registry (fp32 and bf16, with and
// without a gate, f32 and fp8 pages, batches of sequences with different positions, row counts and
// shuffled block tables, odd dims and one TP8 rank's shapes), the split-KV algorithm of the CUDA kernel
// against the direct form, the split sizing, and the argument checks.
#include "kernels/mla/mla_decode.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/rng.h"
#include "kernels/mla/cases.h"
#include "kernels/registry.h"

namespace k3::kernels {
namespace {

using core::DType;
using core::Tensor;

using Dims = MlaShape;  // kernels/mla/cases.h
using SeqShape = MlaSeq;
constexpr const Dims& kOdd = kMlaOdd;
constexpr const Dims& kTp8 = kMlaK3Tp8;

Registry& reference_registry() {
  static Registry r;
  static const bool registered = (register_reference_ops(r), true);
  (void)registered;
  return r;
}

Tensor nan_tensor(core::Shape shape) {
  Tensor t = Tensor::zeros(DType::f32, shape);
  std::fill(t.span<float>().begin(), t.span<float>().end(), std::numeric_limits<float>::quiet_NaN());
  return t;
}
Tensor i32(const std::vector<int32_t>& v, core::Shape shape) {
  Tensor t = Tensor::zeros(DType::i32, shape);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}
Tensor random_bf16_values(core::Rng& rng, core::Shape shape, double std = 1.0) {
  Tensor t = Tensor::zeros(DType::f32, shape);
  for (float& x : t.span<float>()) x = core::bf16_round(static_cast<float>(rng.normal(0.0, std)));
  return t;
}

// A decode / verify batch: sequences' pages drawn from a shuffled pool (plus never-written spares, all
// pages NaN-poisoned first), q and gate rows where row 0 belongs to no sequence and the sequences sit in
// reverse order, kv_b bf16 with std 1/sqrt(kv_lora).
struct Batch {
  Dims d;
  int64_t rows = 1, block_size;
  int max_rows = 0;
  int64_t max_tokens = 0;
  Tensor q, gate, pages, row_begin, num_rows, position, block_table;
  LinearWeight kv_b;
  float k_scale;

  Batch(Dims dims, const std::vector<SeqShape>& seqs, DType cache, float kscale, int64_t bs, uint64_t seed)
      : d(dims), block_size(bs), k_scale(kscale) {
    core::Rng rng(seed);
    const int64_t n = static_cast<int64_t>(seqs.size()), H = d.heads, E = d.kv_lora + d.rope;
    int64_t blocks = 0, tokens = 0;
    for (const SeqShape& s : seqs) {
      blocks += (s.S + bs - 1) / bs;
      tokens += s.S;
      rows += s.T;
      max_rows = std::max(max_rows, static_cast<int>(s.T) + 1);  // slack: max_rows above every count
      max_tokens = std::max(max_tokens, s.S + 5);
    }
    const int64_t max_blocks = (max_tokens + bs - 1) / bs, num_blocks = blocks + 2;
    std::vector<int32_t> pool(static_cast<size_t>(num_blocks));
    for (int64_t i = 0; i < num_blocks; ++i) pool[i] = static_cast<int32_t>(i);
    for (int64_t i = num_blocks - 1; i > 0; --i)
      std::swap(pool[i], pool[rng.next_u64() % static_cast<uint64_t>(i + 1)]);
    std::vector<int32_t> table(static_cast<size_t>(n * max_blocks), -1), begins(seqs.size()), counts, positions,
        cache_rows;
    int64_t next_row = 1;
    for (int64_t k = n - 1; k >= 0; --k) {
      begins[k] = static_cast<int32_t>(next_row);
      next_row += seqs[k].T;
    }
    size_t next_page = 0;
    for (int64_t k = 0; k < n; ++k) {
      for (int64_t b = 0; b * bs < seqs[k].S; ++b) table[k * max_blocks + b] = pool[next_page++];
      for (int64_t j = 0; j < seqs[k].S; ++j)
        cache_rows.push_back(static_cast<int32_t>(table[k * max_blocks + j / bs] * bs + j % bs));
      counts.push_back(static_cast<int32_t>(seqs[k].T));
      positions.push_back(static_cast<int32_t>(seqs[k].S - seqs[k].T));
    }
    row_begin = i32(begins, {n});
    num_rows = i32(counts, {n});
    position = i32(positions, {n});
    block_table = i32(table, {n, max_blocks});

    q = random_bf16_values(rng, {rows, H * (d.nope + d.rope)});
    gate = random_bf16_values(rng, {rows, H * d.v}, 2.0);
    kv_b.weight = Tensor::zeros(DType::bf16, {H * (d.nope + d.v), d.kv_lora});
    const double w_std = 1.0 / std::sqrt(static_cast<double>(d.kv_lora));
    for (uint16_t& w : kv_b.weight.span<uint16_t>())
      w = core::f32_to_bf16_bits(static_cast<float>(rng.normal(0.0, w_std)));
    pages = Tensor::zeros(cache, {num_blocks, bs, E});
    if (cache == DType::f32)
      std::fill(pages.span<float>().begin(), pages.span<float>().end(), std::numeric_limits<float>::quiet_NaN());
    else std::memset(pages.view().data, 0x7f, static_cast<size_t>(pages.nbytes()));  // the E4M3 NaN code
    const Tensor c_n = random_bf16_values(rng, {tokens, d.kv_lora}), k_pe = random_bf16_values(rng, {tokens, d.rope});
    const Tensor rows_t = i32(cache_rows, {tokens});
    mla_cache_write_reference({c_n.view(), k_pe.view(), pages.view(), rows_t.view(), k_scale});
  }

  SeqBatch seqs() const {
    SeqBatch b;
    b.row_begin = row_begin.view();
    b.num_rows = num_rows.view();
    b.position = position.view();
    b.block_table = block_table.view();
    b.num_seqs = static_cast<int>(row_begin.dim(0));
    b.max_rows = max_rows;
    b.max_tokens = max_tokens;
    return b;
  }
  MlaDecodeArgs args(const Tensor& out, bool gated, Precision p) const {
    MlaDecodeArgs a;
    a.q = q.view();
    a.pages = pages.view();
    a.seqs = seqs();
    a.k_scale = k_scale;
    a.kv_b = &kv_b;
    if (gated) a.gate = gate.view();
    a.out = out.view();
    a.num_heads = d.heads;
    a.qk_nope = d.nope;
    a.qk_rope = d.rope;
    a.v_head_dim = d.v;
    a.kv_lora = d.kv_lora;
    a.scale = 1.0f / std::sqrt(static_cast<float>(d.nope + d.rope));
    a.precision = p;
    return a;
  }
  Tensor new_out() const { return nan_tensor({rows, static_cast<int64_t>(d.heads) * d.v}); }

  // The standard path: mla_absorbed into o, then sigmoid_gate (or o itself), both from the registry.
  Tensor standard(bool gated, Precision p) const {
    Tensor o = new_out();
    reference_registry().mla_absorbed.run(mla_decode_attention_args(args(o, gated, p), o.view()), core::Device::cpu);
    if (!gated) return o;
    Tensor out = new_out();
    reference_registry().sigmoid_gate.run({o.view(), gate.view(), out.view(), p}, core::Device::cpu);
    return out;
  }
  Tensor fused(bool gated, Precision p) const {
    Tensor out = new_out();
    reference_registry().mla_decode.run(args(out, gated, p), core::Device::cpu);
    return out;
  }
};

// Rows 1.. equal bit for bit; row 0 (no sequence) never written.
void expect_bitwise(const Tensor& got, const Tensor& want, const std::string& what) {
  const int64_t W = got.dim(1);
  for (int64_t c = 0; c < W; ++c)
    ASSERT_TRUE(std::isnan(got.data<const float>()[c])) << what << ": unowned row 0 written";
  for (int64_t i = W; i < got.numel(); ++i) {
    const float g = got.data<const float>()[i], w = want.data<const float>()[i];
    ASSERT_FALSE(std::isnan(w)) << what << ": the standard pair left element " << i << " unwritten";
    ASSERT_EQ(std::memcmp(&g, &w, sizeof(float)), 0) << what << ": element " << i << " got " << g << " want " << w;
  }
}

std::string name_of(Precision p, DType cache, bool gated, int64_t bs) {
  return std::string(p == Precision::bf16 ? "bf16" : "fp32") + (cache == DType::f32 ? " f32 pages" : " fp8 pages") +
         (gated ? " gated" : " no gate") + " bs" + std::to_string(bs);
}

TEST(MlaDecode, EqualsAbsorbedThenSigmoidGateBitForBitOddShapes) {
  const std::vector<SeqShape> batch = std::vector<MlaSeq>(std::begin(kMlaDecodeOddBatch), std::end(kMlaDecodeOddBatch));
  uint64_t seed = 100;
  for (Precision p : {Precision::bf16, Precision::fp32})
    for (DType cache : {DType::f32, DType::f8_e4m3})
      for (int64_t bs : {7, 16})
        for (bool gated : {true, false}) {
          const Batch b(kOdd, batch, cache, cache == DType::f32 ? 1.0f : 0.25f, bs, ++seed);
          expect_bitwise(b.fused(gated, p), b.standard(gated, p), name_of(p, cache, gated, bs));
        }
}

TEST(MlaDecode, EqualsAbsorbedThenSigmoidGateBitForBitTp8Shapes) {
  const std::vector<SeqShape> batch = std::vector<MlaSeq>(std::begin(kMlaDecodeK3Batch), std::end(kMlaDecodeK3Batch));
  uint64_t seed = 200;
  for (Precision p : {Precision::bf16, Precision::fp32}) {
    const Batch b(kTp8, batch, DType::f8_e4m3, 1.0f, 16, ++seed);
    expect_bitwise(b.fused(true, p), b.standard(true, p), "tp8 " + name_of(p, DType::f8_e4m3, true, 16));
  }
  const Batch b(kTp8, {{97, 2}}, DType::f32, 1.0f, 64, ++seed);
  expect_bitwise(b.fused(false, Precision::bf16), b.standard(false, Precision::bf16), "tp8 f32 pages no gate");
}

TEST(MlaDecode, OutMayBeTheGateView) {
  const Batch b(kOdd, {{17, 2}, {5, 1}}, DType::f8_e4m3, 0.5f, 7, 300);
  const Tensor want = b.fused(true, Precision::bf16);
  Tensor inout = Tensor::copy_of(b.gate.view());
  MlaDecodeArgs a = b.args(inout, true, Precision::bf16);
  a.gate = inout.view();
  reference_registry().mla_decode.run(a, core::Device::cpu);
  // Row 0 keeps the gate logits; the sequences' rows equal the separate-output call.
  EXPECT_EQ(std::memcmp(inout.data<const float>(), b.gate.data<const float>(), sizeof(float) * inout.dim(1)), 0);
  EXPECT_EQ(std::memcmp(inout.data<const float>() + inout.dim(1), want.data<const float>() + want.dim(1),
                        sizeof(float) * (inout.numel() - inout.dim(1))),
            0);
}

TEST(MlaDecode, EmptyBatchWritesNothing) {
  const Batch b(kOdd, {{3, 1}}, DType::f32, 1.0f, 7, 400);
  Tensor out = b.new_out();
  MlaDecodeArgs a = b.args(out, true, Precision::bf16);
  a.seqs.num_seqs = 0;
  mla_decode_reference(a);
  for (float x : out.span<float>()) ASSERT_TRUE(std::isnan(x));
}

// ---------------------------------------------------------------- split-KV algorithm

// |got - want| <= abs + rel |want| elementwise on rows 1.., and row 0 untouched.
void expect_close(const Tensor& got, const Tensor& want, double abs, double rel, const std::string& what) {
  const int64_t W = got.dim(1);
  for (int64_t c = 0; c < W; ++c) ASSERT_TRUE(std::isnan(got.data<const float>()[c])) << what << ": row 0 written";
  double worst = 0;
  for (int64_t i = W; i < got.numel(); ++i) {
    const double g = got.data<const float>()[i], w = want.data<const float>()[i];
    ASSERT_TRUE(std::isfinite(g)) << what << ": element " << i << " is " << g;
    worst = std::max(worst, std::abs(g - w) / (abs + rel * std::abs(w)));
  }
  EXPECT_LE(worst, 1.0) << what << ": worst error / tolerance";
}

TEST(MlaDecode, SplitKvEqualsDirectFormForEverySplitLength) {
  // Contexts 1 .. 97 with verify rows; split lengths of 1 position, uneven last splits, exactly one
  // context, longer than any context, and the sizing the CUDA kernel uses.
  const std::vector<SeqShape> batch = {{1, 1}, {17, 4}, {54, 1}, {97, 3}, {64, 2}};
  uint64_t seed = 500;
  for (DType cache : {DType::f32, DType::f8_e4m3}) {
    const Batch b(kOdd, batch, cache, 0.5f, 7, ++seed);
    const int64_t Q = static_cast<int64_t>(batch.size()) * b.max_rows;
    for (int64_t split_len : {int64_t{1}, int64_t{7}, int64_t{32}, int64_t{54}, int64_t{64}, int64_t{1000},
                              mla_decode_split_len(MlaDecodeSplitRule::cuda_core, Q, b.max_tokens),
                              mla_decode_split_len(MlaDecodeSplitRule::tensor_core, Q, b.max_tokens)}) {
      for (Precision p : {Precision::fp32, Precision::bf16}) {
        const Tensor want = b.fused(true, p);
        Tensor got = b.new_out();
        mla_decode_split_reference(b.args(got, true, p), split_len);
        const std::string what = name_of(p, cache, true, 7) + " split_len " + std::to_string(split_len);
        // fp32: only the softmax summation order differs; bf16: a rounding point may flip one ulp
        // (2^-8 relative) and carry through W_UV and the gate.
        if (p == Precision::fp32) expect_close(got, want, 2e-5, 2e-5, what);
        else expect_close(got, want, 2e-2, 2e-2, what);
      }
    }
  }
}

TEST(MlaDecode, SplitKvTp8ShapesLongContext) {
  const Batch b(kTp8, {{1500, 1}, {700, 2}}, DType::f8_e4m3, 1.0f, 64, 600);
  const Tensor want = b.fused(false, Precision::fp32);
  for (int64_t split_len :
       {int64_t{64}, int64_t{448}, mla_decode_split_len(MlaDecodeSplitRule::tensor_core, 4, b.max_tokens)}) {
    Tensor got = b.new_out();
    mla_decode_split_reference(b.args(got, false, Precision::fp32), split_len);
    expect_close(got, want, 2e-5, 2e-5, "tp8 split_len " + std::to_string(split_len));
  }
}

TEST(MlaDecode, SplitSizingCoversTheContextInWholeTiles) {
  for (MlaDecodeSplitRule rule : {MlaDecodeSplitRule::cuda_core, MlaDecodeSplitRule::tensor_core}) {
    const int64_t unit = rule == MlaDecodeSplitRule::tensor_core ? kMlaDecodeMmaStage : kMlaDecodeTile;
    for (int64_t Q : {1, 2, 17, 64, 256, 1000})
      for (int64_t tokens : {1, 17, 64, 65, 97, 1000, 8192, 131072}) {
        const int64_t len = mla_decode_split_len(rule, Q, tokens), splits = mla_decode_num_splits(rule, Q, tokens);
        EXPECT_EQ(len % unit, 0) << Q << " " << tokens;  // whole tiles / stages
        EXPECT_EQ(len % kMlaDecodeTile, 0) << Q << " " << tokens;
        EXPECT_GE(len, unit);
        EXPECT_GE(splits * len, tokens);        // every position is in a split
        EXPECT_LT((splits - 1) * len, tokens);  // and no split is empty at max_tokens
        EXPECT_LE(Q * splits, std::max(Q, kMlaDecodeTargetCtas)) << Q << " " << tokens;  // one wave
        // Enough CTAs for the device (at least half the target), unless the context has fewer units.
        EXPECT_GE(Q * splits, std::min(kMlaDecodeTargetCtas, Q * ((tokens + unit - 1) / unit)) / 2)
            << Q << " " << tokens;
      }
  }
  // TP8 numbers stated in the header (8K context): CUDA-core 256 splits at batch 1; tensor core 128 (whole
  // 64-position stages); both 32 at batch 8 and 4 at batch 64 (256 CTAs).
  EXPECT_EQ(mla_decode_num_splits(MlaDecodeSplitRule::cuda_core, 1, 8192), 256);
  EXPECT_EQ(mla_decode_num_splits(MlaDecodeSplitRule::cuda_core, 64, 8192), 4);
  EXPECT_EQ(mla_decode_num_splits(MlaDecodeSplitRule::cuda_core, 8, 8192), 32);
  EXPECT_EQ(mla_decode_num_splits(MlaDecodeSplitRule::tensor_core, 1, 8192), 128);
  EXPECT_EQ(mla_decode_split_len(MlaDecodeSplitRule::tensor_core, 1, 8192), 64);
  EXPECT_EQ(mla_decode_num_splits(MlaDecodeSplitRule::tensor_core, 8, 8192), 32);
  EXPECT_EQ(mla_decode_num_splits(MlaDecodeSplitRule::tensor_core, 64, 8192), 4);
  const Batch b(kOdd, {{17, 2}, {3, 1}}, DType::f32, 1.0f, 7, 700);
  Tensor out = b.new_out();
  const MlaDecodeArgs a = b.args(out, true, Precision::bf16);
  const int64_t Q = 2 * b.max_rows, E = kOdd.kv_lora + kOdd.rope;
  // CPU args carry f32 q: the CUDA-core rule; bf16 q (the CUDA engine mode) takes the tensor-core rule.
  EXPECT_EQ(mla_decode_split_rule(a), MlaDecodeSplitRule::cuda_core);
  MlaDecodeArgs bf16_q = a;
  bf16_q.q.dtype = DType::bf16;  // only the dtype is looked at
  EXPECT_EQ(mla_decode_split_rule(bf16_q), MlaDecodeSplitRule::tensor_core);
  EXPECT_EQ(mla_decode_split_len(bf16_q), mla_decode_split_len(MlaDecodeSplitRule::tensor_core, Q, b.max_tokens));
  EXPECT_EQ(mla_decode_workspace_floats(a),
            Q * kOdd.heads * E + Q * kOdd.heads *
                                     mla_decode_num_splits(MlaDecodeSplitRule::cuda_core, Q, b.max_tokens) *
                                     (kOdd.kv_lora + 2));
  // An explicit split length replaces the choice, for the workspace too.
  MlaDecodeArgs fixed = a;
  fixed.split_len = 2 * kMlaDecodeTile;
  EXPECT_EQ(mla_decode_split_len(fixed), 2 * kMlaDecodeTile);
  EXPECT_EQ(mla_decode_num_splits(fixed), (b.max_tokens + 2 * kMlaDecodeTile - 1) / (2 * kMlaDecodeTile));
  EXPECT_EQ(mla_decode_workspace_floats(fixed),
            Q * kOdd.heads * E + Q * kOdd.heads * mla_decode_num_splits(fixed) * (kOdd.kv_lora + 2));
  EXPECT_EQ(mla_decode_split_len(a), mla_decode_split_len(MlaDecodeSplitRule::cuda_core, Q, b.max_tokens));
  EXPECT_TRUE(mla_decode_check(fixed).is_ok()) << mla_decode_check(fixed).reason();
  for (int64_t bad : {int64_t{-kMlaDecodeTile}, int64_t{kMlaDecodeTile + 1}}) {
    fixed.split_len = bad;
    const core::Status s = mla_decode_check(fixed);
    EXPECT_FALSE(s.is_ok()) << bad;
    EXPECT_NE(s.reason().find("split_len must be 0 (automatic) or a positive multiple of"), std::string::npos)
        << s.reason();
  }
}

// ---------------------------------------------------------------- checks

void expect_fail(const MlaDecodeArgs& a, const std::string& needle) {
  const core::Status s = mla_decode_check(a);
  ASSERT_FALSE(s.is_ok()) << "expected a failure naming " << needle;
  EXPECT_NE(s.reason().find("mla_decode: "), std::string::npos) << s.reason();
  EXPECT_NE(s.reason().find(needle), std::string::npos) << s.reason();
}

TEST(MlaDecode, ChecksNameTheBadArgument) {
  const Batch b(kOdd, {{17, 2}, {3, 1}}, DType::f32, 1.0f, 7, 800);
  Tensor out = b.new_out();
  const MlaDecodeArgs good = b.args(out, true, Precision::bf16);
  EXPECT_TRUE(mla_decode_check(good).is_ok()) << mla_decode_check(good).reason();
  MlaDecodeArgs a = good;
  a.gate.data = nullptr;  // no gate is fine
  EXPECT_TRUE(mla_decode_check(a).is_ok());

  Tensor narrow_gate = Tensor::zeros(DType::f32, {b.rows, 5});
  a = good;
  a.gate = narrow_gate.view();
  expect_fail(a, "gate must be");
  Tensor short_gate = Tensor::zeros(DType::f32, {b.rows - 1, out.dim(1)});
  a.gate = short_gate.view();
  expect_fail(a, "gate must be");
  Tensor bf16_gate = Tensor::zeros(DType::bf16, {b.rows, out.dim(1)});
  a.gate = bf16_gate.view();
  expect_fail(a, "gate must be");

  a = good;  // out overlapping the gate without being it
  Tensor big = Tensor::zeros(DType::f32, {b.rows + 1, out.dim(1)});
  a.out = core::TensorView::contiguous(big.data<float>(), DType::f32, {b.rows, out.dim(1)});
  a.gate = core::TensorView::contiguous(big.data<float>() + out.dim(1), DType::f32, {b.rows, out.dim(1)});
  expect_fail(a, "overlaps gate");

  a = good;  // out overlapping q
  Tensor qcopy = Tensor::copy_of(b.q.view());
  a.q = qcopy.view();
  a.out = core::TensorView::contiguous(qcopy.data<float>(), DType::f32, {b.rows, out.dim(1)});
  expect_fail(a, "out must not overlap q");

  a = good;
  Tensor ws = Tensor::zeros(DType::f32, {mla_decode_workspace_floats(good) - 1});
  a.workspace = ws.view();
  expect_fail(a, "workspace");
  Tensor ws_ok = Tensor::zeros(DType::f32, {mla_decode_workspace_floats(good)});
  a.workspace = ws_ok.view();
  EXPECT_TRUE(mla_decode_check(a).is_ok()) << mla_decode_check(a).reason();
  Tensor ws_i32 = Tensor::zeros(DType::i32, {mla_decode_workspace_floats(good)});
  a.workspace = ws_i32.view();
  expect_fail(a, "workspace");

  a = good;  // the attention checks, prefixed with this op's name
  a.kv_b = nullptr;
  expect_fail(a, "kv_b is missing");
  a = good;
  a.scale = 0.0f;
  expect_fail(a, "scale");
  a = good;
  a.num_heads = 2;
  expect_fail(a, "q must be");
  EXPECT_THROW(reference_registry().mla_decode.run(a, core::Device::cpu), core::Error);
}

}  // namespace
}  // namespace k3::kernels
