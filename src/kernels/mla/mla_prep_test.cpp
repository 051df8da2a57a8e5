// kernels/mla/mla_prep_test.cpp: the fused mla_prep op against the standard op sequence of
// model::attention (registry rmsnorm of q_a; column copies of kv; rmsnorm of c; mla_cache_write; CPU
// reference) BIT FOR BIT in both precisions and both rmsnorm styles, over f32 and fp8 pages, on random
// odd shapes (rows 1, 17, 54; strided inputs; several sequences at different positions in shuffled
// pages, some rows -1 = no write; NaN-poisoned outputs and pages) and on one TP8 rank's shapes (q_lora
// 1536, kv_lora 512, rope 64); plus the argument checks.
#include "kernels/mla/mla_prep.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/rng.h"
#include "kernels/linear/linear_test_util.h"
#include "kernels/registry.h"

namespace k3::kernels {
namespace {

using core::DType;
using core::Tensor;
using core::TensorView;

using namespace linear_test;

constexpr Precision kPrecisions[] = {Precision::bf16, Precision::fp32};

// [T, width] N(0, std^2), rounded as a stored activation is in bf16 mode.
Tensor random_act(core::Rng& rng, int64_t T, int64_t width, double std, Precision p) {
  Tensor x = Tensor::zeros(DType::f32, {T, width});
  for (int64_t i = 0; i < T * width; ++i) x.data<float>()[i] = round_act(static_cast<float>(rng.normal(0.0, std)), p);
  return x;
}

// Norm weight [n] around 1 (as trained norms are), some negative entries; bf16 or f32 storage.
Tensor random_norm(core::Rng& rng, int64_t n, DType dtype) {
  Tensor w = Tensor::zeros(dtype, {n});
  for (int64_t i = 0; i < n; ++i) {
    const auto v = static_cast<float>(rng.normal(1.0, 0.5));
    if (dtype == DType::bf16) w.data<uint16_t>()[i] = core::f32_to_bf16_bits(v);
    else w.data<float>()[i] = v;
  }
  return w;
}

Tensor i32_tensor(const std::vector<int32_t>& v) {
  Tensor t = Tensor::zeros(DType::i32, {static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

// Pages [num_blocks, bs, width] filled with NaN (f32) or 0xff (fp8 e4m3: NaN) bytes.
Tensor poisoned_pages(DType dtype, int64_t num_blocks, int64_t bs, int64_t width) {
  Tensor t = Tensor::zeros(dtype, {num_blocks, bs, width});
  std::memset(t.data<void>(), 0xff, static_cast<size_t>(t.view().numel()) * core::dtype_size(dtype));
  return t;
}

// Cache rows of T decode / verify rows of a few sequences at different positions: each sequence owns
// pages from a shuffled pool and its rows sit at positions pos .. pos + rows - 1; every 5th row from
// the 4th on is -1 (padding, or another rank's token under decode context parallelism).
struct CacheLayout {
  int64_t num_blocks = 0;
  std::vector<int32_t> rows;
};
CacheLayout cache_layout(core::Rng& rng, int64_t T, int64_t bs) {
  CacheLayout lay;
  std::vector<int64_t> seq_rows;  // rows of each sequence, summing to T
  for (int64_t left = T; left > 0;) {
    const int64_t r = std::min<int64_t>(left, 1 + static_cast<int64_t>(rng.next_u64() % 4));
    seq_rows.push_back(r);
    left -= r;
  }
  std::vector<int64_t> ends;
  int64_t pages_needed = 0;
  for (int64_t r : seq_rows) {
    const int64_t end = r + static_cast<int64_t>(rng.next_u64() % 40);  // tokens after the step
    ends.push_back(end);
    pages_needed += (end + bs - 1) / bs;
  }
  lay.num_blocks = pages_needed + 2;  // two spare pages stay untouched
  std::vector<int32_t> pool(static_cast<size_t>(lay.num_blocks));
  for (int64_t i = 0; i < lay.num_blocks; ++i) pool[i] = static_cast<int32_t>(i);
  for (int64_t i = lay.num_blocks - 1; i > 0; --i)
    std::swap(pool[i], pool[rng.next_u64() % static_cast<uint64_t>(i + 1)]);
  size_t next = 0;
  for (size_t s = 0; s < seq_rows.size(); ++s) {
    std::vector<int32_t> table;
    for (int64_t b = 0; b * bs < ends[s]; ++b) table.push_back(pool[next++]);
    for (int64_t pos = ends[s] - seq_rows[s]; pos < ends[s]; ++pos) {
      const auto t = static_cast<int64_t>(lay.rows.size());
      lay.rows.push_back(t % 5 == 3 ? -1 : static_cast<int32_t>(table[pos / bs] * bs + pos % bs));
    }
  }
  return lay;
}

struct Case {
  int64_t T, q_lora, kv_lora, rope, bs;
  DType pages = DType::f32;
  float k_scale = 1.0f;
  RmsNormStyle style = RmsNormStyle::moonshot;
  DType norm_dtype = DType::bf16;
  int64_t pad = 0;  // > 0: q_a, kv and q_a_out are column slices of wider buffers
};

std::string name_of(const Case& c, Precision p) {
  return "T " + std::to_string(c.T) + " q_lora " + std::to_string(c.q_lora) + " kv_lora " + std::to_string(c.kv_lora) +
         " rope " + std::to_string(c.rope) + " bs " + std::to_string(c.bs) + " " +
         std::string(core::dtype_name(c.pages)) + " k_scale " + std::to_string(c.k_scale) +
         (c.style == RmsNormStyle::moonshot ? " moonshot" : " fused") + (p == Precision::bf16 ? " bf16" : " fp32");
}

// model::attention's ops before attention, through the reference registry: q = rmsnorm(q_a);
// c = column_copy(kv, 0, kv_lora), k_pe = column_copy(kv, kv_lora, width); c_n = rmsnorm(c);
// mla_cache_write(c_n, k_pe).
void run_standard(const MlaPrepArgs& a, const TensorView& q_out, const TensorView& pages) {
  const Registry& r = reference_registry();
  const core::Device cpu = core::Device::cpu;
  const int64_t T = a.kv.dim(0), L = a.kv_a_norm.dim(0), rope = a.kv.dim(1) - L;
  r.rmsnorm.run({a.q_a, a.q_a_norm, q_out, a.eps, a.style, a.precision}, cpu);
  Tensor c = nan_f32(T, L), k_pe = nan_f32(T, rope), c_n = nan_f32(T, L);
  for (int64_t t = 0; t < T; ++t) {
    const float* row = a.kv.as<const float>() + t * a.kv.strides[0];
    std::memcpy(c.data<float>() + t * L, row, sizeof(float) * static_cast<size_t>(L));
    std::memcpy(k_pe.data<float>() + t * rope, row + L, sizeof(float) * static_cast<size_t>(rope));
  }
  r.rmsnorm.run({c.view(), a.kv_a_norm, c_n.view(), a.eps, a.style, a.precision}, cpu);
  r.mla_cache_write.run({c_n.view(), k_pe.view(), pages, a.cache_rows, a.k_scale}, cpu);
}

bool same_bits(float a, float b) {
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

void expect_equals_standard(const Case& c, Precision p, uint64_t seed) {
  const std::string what = name_of(c, p);
  core::Rng rng(seed);
  const int64_t width = c.kv_lora + c.rope, pad = c.pad;
  const Tensor q_norm = random_norm(rng, c.q_lora, c.norm_dtype);
  const Tensor kv_norm = random_norm(rng, c.kv_lora, c.norm_dtype == DType::bf16 ? DType::f32 : DType::bf16);
  const Tensor q_full = random_act(rng, c.T, c.q_lora + pad, 1.0, p);
  Tensor kv_full = random_act(rng, c.T, width + pad, 3.0, p);
  // A few k_pe values beyond fp8's +-448 (saturation) at k_scale 1.
  for (int64_t t = 0; t < c.T; t += 3) kv_full.data<float>()[t * (width + pad) + c.kv_lora] = round_act(1000.5f, p);
  const CacheLayout lay = cache_layout(rng, c.T, c.bs);
  const Tensor cache_rows = i32_tensor(lay.rows);

  MlaPrepArgs a;
  a.q_a = columns(q_full, pad > 0 ? 1 : 0, c.q_lora);
  a.q_a_norm = q_norm.view();
  a.kv = columns(kv_full, pad, width);
  a.kv_a_norm = kv_norm.view();
  a.cache_rows = cache_rows.view();
  a.k_scale = c.k_scale;
  a.eps = 1e-6f;
  a.style = c.style;
  a.precision = p;
  // q_a_out is a column slice [T, q_lora] at column 2 of a NaN [T, q_lora + 5] buffer: the gaps stay NaN.
  const int64_t q_width = c.q_lora + 5;
  Tensor fused_q = nan_f32(c.T, q_width);
  a.q_a_out = columns(fused_q, 2, c.q_lora);
  Tensor fused_pages = poisoned_pages(c.pages, lay.num_blocks, c.bs, width);
  a.pages = fused_pages.view();
  ASSERT_TRUE(mla_prep_check(a)) << what << ": " << mla_prep_check(a).reason();
  ASSERT_EQ(reference_registry().mla_prep.select(a, core::Device::cpu).name, "reference");
  reference_registry().mla_prep.run(a, core::Device::cpu);

  Tensor standard_q = nan_f32(c.T, c.q_lora);
  Tensor standard_pages = poisoned_pages(c.pages, lay.num_blocks, c.bs, width);
  run_standard(a, standard_q.view(), standard_pages.view());

  int64_t mismatches = 0, unrounded = 0;
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t col = 0; col < q_width; ++col) {
      const float f = fused_q.data<float>()[t * q_width + col];
      if (col < 2 || col >= 2 + c.q_lora) {
        if (!std::isnan(f) && mismatches++ < 5) ADD_FAILURE() << what << ": gap column " << col << " written";
        continue;
      }
      const float s = standard_q.data<float>()[t * c.q_lora + col - 2];
      if ((!same_bits(f, s) || std::isnan(f)) && mismatches++ < 5)
        ADD_FAILURE() << what << ": q_a_out row " << t << " column " << col - 2 << " fused " << f << " standard " << s;
      unrounded += core::bf16_round(f) == f ? 0 : 1;
    }
  EXPECT_EQ(mismatches, 0) << what;
  if (p == Precision::bf16) {
    EXPECT_EQ(unrounded, 0) << what << ": q_a_out is stored rounded";
  } else if (c.T * c.q_lora >= 17) {
    EXPECT_GT(unrounded, 0) << what << ": fp32 mode rounds nothing";
  }
  // The pages byte for byte: written entries equal, every other row still poisoned in both.
  const size_t bytes = static_cast<size_t>(fused_pages.view().numel()) * core::dtype_size(c.pages);
  EXPECT_EQ(std::memcmp(fused_pages.data<void>(), standard_pages.data<void>(), bytes), 0) << what << ": pages differ";
  // And the writes really happened: every named row holds an entry (no finite value is all 0xff
  // bytes), every other row is still poison (-1 rows and spare pages wrote nothing).
  const int64_t esize = static_cast<int64_t>(core::dtype_size(c.pages));
  const auto poisoned = [&](int64_t r) {
    const auto* e = static_cast<const uint8_t*>(fused_pages.data<void>()) + r * width * esize;
    return std::all_of(e, e + width * esize, [](uint8_t b) { return b == 0xff; });
  };
  std::vector<bool> named(static_cast<size_t>(lay.num_blocks * c.bs), false);
  for (int32_t r : lay.rows)
    if (r >= 0) named[static_cast<size_t>(r)] = true;
  for (int64_t r = 0; r < lay.num_blocks * c.bs; ++r)
    EXPECT_EQ(poisoned(r), !named[static_cast<size_t>(r)]) << what << ": cache row " << r;
}

TEST(MlaPrep, EqualsStandardSequenceOnOddShapes) {
  uint64_t seed = 10;
  struct Dims {
    int64_t q_lora, kv_lora, rope;
  };
  for (Precision p : kPrecisions)
    for (int64_t T : {1, 17, 54})
      for (const Dims& d : {Dims{17, 54, 9}, Dims{97, 17, 1}, Dims{54, 9, 17}})
        for (RmsNormStyle style : {RmsNormStyle::moonshot, RmsNormStyle::fused}) {
          Case c{T, d.q_lora, d.kv_lora, d.rope, T % 2 ? 7 : 16};
          c.style = style;
          c.pad = T % 2 ? 3 : 0;
          c.norm_dtype = d.q_lora == 97 ? DType::f32 : DType::bf16;
          c.pages = style == RmsNormStyle::fused ? DType::f8_e4m3 : DType::f32;
          c.k_scale = T == 17 ? 0.37f : 1.0f;
          expect_equals_standard(c, p, ++seed);
        }
}

// One TP8 rank (spec §11): q_lora 1536, kv_lora 512, rope 64 (q_a and kv_a are replicated), decode rows
// 1, 3 and 64, f32 and fp8 pages, both precisions.
TEST(MlaPrep, EqualsStandardSequenceOnTp8Shapes) {
  uint64_t seed = 400;
  for (Precision p : kPrecisions)
    for (int64_t T : {1, 3, 64})
      for (DType pages : {DType::f32, DType::f8_e4m3}) {
        Case c{T, 1536, 512, 64, 64};
        c.pages = pages;
        c.style = T == 3 ? RmsNormStyle::fused : RmsNormStyle::moonshot;
        c.pad = T == 3 ? 8 : 0;
        expect_equals_standard(c, p, ++seed);
      }
}

TEST(MlaPrep, NoRowsWritesNothing) {
  MlaPrepArgs a;
  Tensor q = nan_f32(0, 17), q_out = nan_f32(0, 17), kv = nan_f32(0, 12), rows = i32_tensor({});
  core::Rng rng(5);
  Tensor qn = random_norm(rng, 17, DType::bf16), kn = random_norm(rng, 9, DType::bf16);
  Tensor pages = poisoned_pages(DType::f32, 2, 4, 12);
  a.q_a = q.view();
  a.q_a_norm = qn.view();
  a.q_a_out = q_out.view();
  a.kv = kv.view();
  a.kv_a_norm = kn.view();
  a.pages = pages.view();
  a.cache_rows = rows.view();
  ASSERT_TRUE(mla_prep_check(a)) << mla_prep_check(a).reason();
  reference_registry().mla_prep.run(a, core::Device::cpu);
  for (int64_t i = 0; i < pages.view().numel(); ++i) EXPECT_TRUE(std::isnan(pages.data<float>()[i]));
}

// ---- argument checks

struct CheckFixture {
  Tensor q, q_norm, q_out, kv, kv_norm, pages, rows;
  MlaPrepArgs a;
  CheckFixture() {
    core::Rng rng(7);
    q = random_act(rng, 3, 16, 1.0, Precision::bf16);
    q_norm = random_norm(rng, 16, DType::bf16);
    q_out = nan_f32(3, 16);
    kv = random_act(rng, 3, 12, 1.0, Precision::bf16);
    kv_norm = random_norm(rng, 8, DType::bf16);
    pages = poisoned_pages(DType::f32, 2, 4, 12);
    rows = i32_tensor({5, -1, 0});
    a.q_a = q.view();
    a.q_a_norm = q_norm.view();
    a.q_a_out = q_out.view();
    a.kv = kv.view();
    a.kv_a_norm = kv_norm.view();
    a.pages = pages.view();
    a.cache_rows = rows.view();
  }
};

void expect_fails_naming(const MlaPrepArgs& a, const std::string& needle) {
  const core::Status s = mla_prep_check(a);
  ASSERT_FALSE(s) << "expected a failure naming " << needle;
  EXPECT_NE(s.reason().find(needle), std::string::npos) << s.reason();
  // The registry wraps it in a core::Error naming the op.
  try {
    reference_registry().mla_prep.run(a, core::Device::cpu);
    ADD_FAILURE() << "run() accepted bad args (" << needle << ")";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("mla_prep"), std::string::npos) << e.what();
  }
}

TEST(MlaPrep, CheckNamesTheBadArgument) {
  {
    CheckFixture f;
    EXPECT_TRUE(mla_prep_check(f.a)) << mla_prep_check(f.a).reason();
  }
  {
    CheckFixture f;
    f.a.q_a_norm = f.kv_norm.view();
    expect_fails_naming(f.a, "q_a_norm must be bf16 or f32 [16]");
  }
  {
    CheckFixture f;
    f.a.q_a_out = columns(f.q_out, 0, 15);
    expect_fails_naming(f.a, "q_a_out must be");
  }
  {
    CheckFixture f;
    f.a.q_a_out = f.q.view();
    expect_fails_naming(f.a, "q_a_out overlaps q_a");
  }
  {
    CheckFixture f;
    f.a.kv = columns(f.kv, 0, 8);  // no rope columns
    expect_fails_naming(f.a, "kv must be");
  }
  {
    CheckFixture f;
    f.a.pages = TensorView::contiguous(f.pages.data<float>(), DType::f32, {2, 4, 11});
    expect_fails_naming(f.a, "pages must be [num_blocks >= 1, block_size >= 1, kv_lora + rope = 12]");
  }
  {
    CheckFixture f;
    f.a.pages = TensorView::contiguous(f.pages.data<void>(), DType::bf16, {2, 4, 12});  // bf16 pages: CUDA only
    expect_fails_naming(f.a, "pages must be f32 or f8_e4m3");
  }
  {
    CheckFixture f;
    Tensor two = i32_tensor({1, 2});
    f.a.cache_rows = two.view();
    expect_fails_naming(f.a, "cache_rows must be a dense i32 [T = 3]");
  }
  {
    CheckFixture f;
    Tensor out_of_range = i32_tensor({1, 8, 2});
    f.a.cache_rows = out_of_range.view();
    expect_fails_naming(f.a, "cache_rows[1] = 8");
  }
  {
    CheckFixture f;
    Tensor twice = i32_tensor({3, -1, 3});
    f.a.cache_rows = twice.view();
    expect_fails_naming(f.a, "names cache row 3 twice");
  }
  {
    CheckFixture f;
    f.a.k_scale = 0.0f;
    expect_fails_naming(f.a, "k_scale must be finite and > 0");
  }
  {
    CheckFixture f;
    f.a.eps = -1.0f;
    expect_fails_naming(f.a, "eps must be >= 0");
  }
}

}  // namespace
}  // namespace k3::kernels
