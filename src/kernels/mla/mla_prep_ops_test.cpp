// kernels/mla/mla_prep_ops_test.cpp: the fused mla_prep op (q_a RMSNorm, kv_a RMSNorm and the latent
// cache write in one launch on CUDA) on every device backend, both modes, over bf16 / f32 / fp8 e4m3
// pages: against the CPU reference (rmsnorm's tolerance for q_a_out and the cache entries: the block
// sums run in another order; the k_pe columns are copies, exact) and against the device's own
// standard op sequence (rmsnorm, rmsnorm of the copied c columns, mla_cache_write) BIT FOR BIT
// wherever both take the same vector width (mla_prep sums in the CUDA rmsnorm's order). Odd shapes
// (rows 1, 17, 54; strided inputs; q_a_out a column slice of a NaN-poisoned buffer; tokens of several
// sequences in shuffled pages, every 5th row -1) and one TP8 rank's shapes (q_lora 1536, kv_lora 512,
// rope 64) at 1, 2, 8 and 64 rows; every case asserts the CUDA implementation ran, that only the named
// cache rows were written, and that no element outside q_a_out changed.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "kernels/testing/op_harness.h"

namespace k3::ops_test {
namespace {

TensorView columns(const Tensor& t, int64_t c0, int64_t cols) {
  TensorView v = t.view();
  v.data = static_cast<char*>(v.data) + c0 * static_cast<int64_t>(core::dtype_size(v.dtype));
  v.shape[1] = cols;
  return v;
}

Tensor i32_host(const std::vector<int32_t>& v) {
  Tensor t = Tensor::zeros(DType::i32, {static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

struct PrepCase {
  std::string name;
  int64_t T, q_lora, kv_lora, rope, bs;
  DType cache = DType::bf16;  // device pages (the CPU keeps bf16 values in f32 pages)
  float k_scale = 1.0f;
  kernels::RmsNormStyle style = kernels::RmsNormStyle::moonshot;
  int64_t offset = 0;  // q_a, kv and q_a_out are columns [offset, offset + width) of buffers 2 * offset wider
};

// Cache rows of T decode / verify rows: sequences of 1..4 rows at positions up to ~40 in pages from a
// shuffled pool (two spare pages), every 5th row from the 4th on -1 (no write).
struct CacheRows {
  int64_t num_blocks = 0;
  std::vector<int32_t> rows;
};
CacheRows cache_rows(core::Rng& rng, int64_t T, int64_t bs) {
  std::vector<int64_t> lens, ends;
  int64_t blocks = 0;
  for (int64_t left = T; left > 0;) {
    const int64_t r = std::min<int64_t>(left, 1 + static_cast<int64_t>(rng.next_u64() % 4));
    lens.push_back(r);
    ends.push_back(r + static_cast<int64_t>(rng.next_u64() % 40));
    blocks += (ends.back() + bs - 1) / bs;
    left -= r;
  }
  CacheRows out;
  out.num_blocks = blocks + 2;
  std::vector<int32_t> pool(static_cast<size_t>(out.num_blocks));
  for (int64_t i = 0; i < out.num_blocks; ++i) pool[i] = static_cast<int32_t>(i);
  for (int64_t i = out.num_blocks - 1; i > 0; --i)
    std::swap(pool[i], pool[rng.next_u64() % static_cast<uint64_t>(i + 1)]);
  size_t next = 0;
  for (size_t s = 0; s < lens.size(); ++s) {
    std::vector<int32_t> table;
    for (int64_t b = 0; b * bs < ends[s]; ++b) table.push_back(pool[next++]);
    for (int64_t pos = ends[s] - lens[s]; pos < ends[s]; ++pos) {
      const auto t = static_cast<int64_t>(out.rows.size());
      out.rows.push_back(t % 5 == 3 ? -1 : static_cast<int32_t>(table[pos / bs] * bs + pos % bs));
    }
  }
  return out;
}

// cuda_detail::rows_vec8 of kernels/cuda_common.cuh, from the host: 8 elements per access possible.
bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
bool rows_vec8(const TensorView& v) {
  const size_t row_bytes = static_cast<size_t>(v.dim(0) > 1 ? v.strides[0] : 0) * core::dtype_size(v.dtype);
  return v.dim(1) % 8 == 0 && aligned16(v.data) && row_bytes % 16 == 0;
}

void check_prep(Device* dev, Mode mode, const PrepCase& c, uint64_t seed) {
  SCOPED_TRACE(c.name + " T " + std::to_string(c.T) + " " + mode_name(mode) + " " +
               std::string(core::dtype_name(c.cache)) +
               (c.style == kernels::RmsNormStyle::moonshot ? " moonshot" : " fused"));
  core::Rng rng(seed);
  const Precision p = precision(mode);
  const int64_t pad = 2 * c.offset, E = c.kv_lora + c.rope;
  const Tensor q_a = random_act(rng, {c.T, c.q_lora + pad}, mode);
  Tensor kv = random_act(rng, {c.T, E + pad}, mode, 0.0, 3.0);
  for (int64_t t = 0; t < c.T; t += 3)
    kv.data<float>()[t * (E + pad) + c.offset + c.kv_lora] = 1000.5f;  // fp8 saturates
  if (mode == Mode::bf16)
    for (int64_t i = 0; i < kv.view().numel(); ++i) kv.data<float>()[i] = core::bf16_round(kv.data<float>()[i]);
  Tensor q_norm = Tensor::zeros(DType::bf16, {c.q_lora}), kv_norm = Tensor::zeros(DType::f32, {c.kv_lora});
  for (int64_t i = 0; i < c.q_lora; ++i)
    q_norm.data<uint16_t>()[i] = core::f32_to_bf16_bits(static_cast<float>(rng.normal(1.0, 0.5)));
  for (int64_t i = 0; i < c.kv_lora; ++i) kv_norm.data<float>()[i] = static_cast<float>(rng.normal(1.0, 0.5));
  const CacheRows lay = cache_rows(rng, c.T, c.bs);
  const Tensor rows = i32_host(lay.rows);
  const int64_t capacity = lay.num_blocks * c.bs;

  const auto args_for = [&](const TensorView& qa, const TensorView& qn, const TensorView& qo, const TensorView& kvv,
                            const TensorView& kn, const TensorView& pages, const TensorView& cr) {
    kernels::MlaPrepArgs a;
    a.q_a = qa;
    a.q_a_norm = qn;
    a.q_a_out = qo;
    a.kv = kvv;
    a.kv_a_norm = kn;
    a.pages = pages;
    a.cache_rows = cr;
    a.k_scale = c.k_scale;
    a.eps = 1e-6f;
    a.style = c.style;
    a.precision = p;
    return a;
  };

  // CPU oracle: bf16 pages as f32 pages holding bf16 values.
  const DType cpu_cache = c.cache == DType::f8_e4m3 ? DType::f8_e4m3 : DType::f32;
  Tensor want_q = nan_tensor({c.T, c.q_lora + pad});
  Tensor want_pages = Tensor::zeros(cpu_cache, {lay.num_blocks, c.bs, E});
  cpu_registry().mla_prep.run(args_for(columns(q_a, c.offset, c.q_lora), q_norm.view(),
                                       columns(want_q, c.offset, c.q_lora), columns(kv, c.offset, E), kv_norm.view(),
                                       want_pages.view(), rows.view()),
                              core::Device::cpu);

  // Device: NaN-poisoned q_a_out buffer and pages.
  const Tensor dq = dev->act(q_a, mode), dkv = dev->act(kv, mode), drows = dev->upload(rows);
  const Tensor dqn = dev->upload(q_norm), dkn = dev->upload(kv_norm);
  const Tensor dq_out = dev->poisoned(act_dtype(mode), {c.T, c.q_lora + pad});
  const Tensor dpages = dev->poisoned(c.cache, {lay.num_blocks, c.bs, E});
  const kernels::MlaPrepArgs args = args_for(columns(dq, c.offset, c.q_lora), dqn.view(),
                                             columns(dq_out, c.offset, c.q_lora), columns(dkv, c.offset, E), dkn.view(),
                                             dpages.view(), drows.view());
  expect_device_impl(dev->registry().mla_prep, args, dev);
  EXPECT_EQ(dev->registry().mla_prep.select(args, dev->kind()).name, "cuda_rowwise");
  dev->registry().mla_prep.run(args, dev->kind());

  // q_a_out against the CPU; nothing outside it written.
  const Tensor got_q_all = dev->to_host_f32(dq_out.view());
  expect_close("mla_prep", shape_str({c.T, c.q_lora, c.kv_lora, c.rope}), mode, c.name + " q_a_out",
               copy_rows(columns(got_q_all, c.offset, c.q_lora)), copy_rows(columns(want_q, c.offset, c.q_lora)),
               tol_reduction(mode));
  int64_t stray = 0;
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t col = 0; col < c.q_lora + pad; ++col)
      if ((col < c.offset || col >= c.offset + c.q_lora) &&
          !std::isnan(got_q_all.data<float>()[t * (c.q_lora + pad) + col]))
        ++stray;
  EXPECT_EQ(stray, 0) << "elements written outside q_a_out";

  // The cache: named rows against the CPU (c_n at rmsnorm's tolerance, k_pe exact), every other row NaN.
  const Tensor got_pages = dev->to_host_f32(
      TensorView::contiguous(dpages.view().data, c.cache, {capacity, E}, dpages.view().device));
  const Tensor want_f = to_f32(want_pages);
  std::vector<bool> named(static_cast<size_t>(capacity), false);
  for (int32_t r : lay.rows)
    if (r >= 0) named[static_cast<size_t>(r)] = true;
  std::vector<float> got_c, want_c;
  int64_t pe_mismatch = 0, unwritten_touched = 0, named_nan = 0;
  for (int64_t r = 0; r < capacity; ++r)
    for (int64_t i = 0; i < E; ++i) {
      const float g = got_pages.data<float>()[r * E + i], w = want_f.data<float>()[r * E + i];
      if (!named[static_cast<size_t>(r)]) {
        unwritten_touched += std::isnan(g) ? 0 : 1;
        continue;
      }
      named_nan += std::isnan(g) ? 1 : 0;
      if (i < c.kv_lora) {
        got_c.push_back(g);
        want_c.push_back(w);
      } else if (g != w) {
        ++pe_mismatch;
      }
    }
  EXPECT_EQ(unwritten_touched, 0) << "cache elements written outside the named rows";
  EXPECT_EQ(named_nan, 0) << "named cache rows left unwritten";
  EXPECT_EQ(pe_mismatch, 0) << "k_pe entries differ from the CPU (a copy: exact)";
  if (!got_c.empty()) {
    const auto n = static_cast<int64_t>(got_c.size());
    Tensor g = Tensor::zeros(DType::f32, {n, 1}), w = Tensor::zeros(DType::f32, {n, 1});
    std::copy(got_c.begin(), got_c.end(), g.data<float>());
    std::copy(want_c.begin(), want_c.end(), w.data<float>());
    // fp8 entries: a code may flip where the device's inv_rms differs in its last bit (one E4M3 step).
    const Tol tol = c.cache == DType::f8_e4m3 ? Tol{3e-2, 0.999} : tol_reduction(mode);
    expect_close("mla_prep", shape_str({c.T, c.q_lora, c.kv_lora, c.rope}), mode,
                 c.name + " c_n " + std::string(core::dtype_name(c.cache)), g, w, tol);
  }

  // The device's standard op sequence on the same inputs, into fresh NaN buffers: rmsnorm(q_a); c and
  // k_pe as contiguous copies (column_copy); rmsnorm(c); mla_cache_write. Equal bit for bit where the
  // standard rmsnorm takes the vector width mla_prep takes (both then sum in one order).
  const Tensor host_c = copy_rows(columns(kv, c.offset, c.kv_lora));
  const Tensor host_pe = copy_rows(columns(kv, c.offset + c.kv_lora, c.rope));
  const Tensor dc = dev->act(host_c, mode), dpe = dev->act(host_pe, mode);
  const Tensor std_q = dev->poisoned(act_dtype(mode), {c.T, c.q_lora}),
               std_cn = dev->poisoned(act_dtype(mode), {c.T, c.kv_lora});
  const Tensor std_pages = dev->poisoned(c.cache, {lay.num_blocks, c.bs, E});
  const kernels::RmsNormArgs norm_q{args.q_a, dqn.view(), std_q.view(), 1e-6f, c.style, p};
  const kernels::RmsNormArgs norm_c{dc.view(), dkn.view(), std_cn.view(), 1e-6f, c.style, p};
  dev->registry().rmsnorm.run(norm_q, dev->kind());
  dev->registry().rmsnorm.run(norm_c, dev->kind());
  dev->registry().mla_cache_write.run({std_cn.view(), dpe.view(), std_pages.view(), drows.view(), c.k_scale},
                                      dev->kind());
  // The vector-width choices of mla_prep (kernels/mla/cuda_mla_prep.cu) and rmsnorm (kernels/norm/cuda.cu).
  const bool prep_vec = rows_vec8(args.q_a) && rows_vec8(args.q_a_out) && aligned16(dqn.view().data) &&
                        rows_vec8(args.kv) && c.kv_lora % 8 == 0 && aligned16(dkn.view().data) &&
                        aligned16(dpages.view().data) &&
                        (E * static_cast<int64_t>(core::dtype_size(c.cache))) % 16 == 0;
  const bool std_q_vec = rows_vec8(args.q_a) && rows_vec8(std_q.view()) && aligned16(dqn.view().data);
  const bool std_c_vec = rows_vec8(dc.view()) && rows_vec8(std_cn.view()) && aligned16(dkn.view().data);
  if (prep_vec == std_q_vec) {
    // bf16 -> f32 widening is exact and one-to-one, so equal f32 bits are equal stored bits.
    const Tensor want_bits = dev->to_host_f32(std_q.view());
    int64_t differ = 0;
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t i = 0; i < c.q_lora; ++i) {
        const float a = want_bits.data<float>()[t * c.q_lora + i];
        const float b = got_q_all.data<float>()[t * (c.q_lora + pad) + c.offset + i];
        differ += std::memcmp(&a, &b, sizeof(float)) == 0 ? 0 : 1;
      }
    EXPECT_EQ(differ, 0) << "q_a_out differs from the device's rmsnorm (same vector width)";
  }
  if (prep_vec == std_c_vec) {
    const auto raw = [&](const Tensor& pages) {
      return dev->to_host(TensorView::contiguous(pages.view().data, c.cache, {capacity, E}, pages.view().device));
    };
    const Tensor a = raw(std_pages), b = raw(dpages);
    EXPECT_EQ(
        std::memcmp(a.data<void>(), b.data<void>(), static_cast<size_t>(capacity * E) * core::dtype_size(c.cache)), 0)
        << "pages differ from the device's rmsnorm + mla_cache_write (same vector width)";
  }
}

TEST(OpsOdd, MlaPrep) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 9300;
  struct Dims {
    int64_t q_lora, kv_lora, rope;
  };
  // Odd widths (the scalar kernel), and widths that are multiples of 8 (the vector kernel when aligned:
  // offset 8 keeps column slices 16-byte aligned, offset 3 does not).
  for (const Dims& d : {Dims{17, 54, 9}, Dims{97, 17, 1}, Dims{54, 9, 17}, Dims{96, 48, 16}, Dims{40, 52, 12}})
    for (Mode m : kModes)
      for (int64_t T : {1, 17, 54}) {
        PrepCase c{"odd", T, d.q_lora, d.kv_lora, d.rope, T % 2 ? 7 : 16};
        c.offset = d.q_lora % 8 == 0 ? (T == 17 ? 3 : 8) : (T % 2 ? 3 : 0);
        c.style = T == 17 ? kernels::RmsNormStyle::fused : kernels::RmsNormStyle::moonshot;
        c.cache = m == Mode::bf16 ? DType::bf16 : DType::f32;
        check_prep(dev, m, c, ++seed);
        c.cache = DType::f8_e4m3;
        c.k_scale = T == 54 ? 1.0f : 0.37f;
        check_prep(dev, m, c, ++seed);
      }
}

TEST(OpsTp8, MlaPrep) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 9500;
  for (Mode m : kModes)
    for (int64_t T : {1, 2, 8, 64}) {
      PrepCase c{"tp8", T, 1536, 512, 64, T == 8 ? 16 : 64};
      c.style = T == 2 ? kernels::RmsNormStyle::fused : kernels::RmsNormStyle::moonshot;
      c.cache = m == Mode::bf16 ? DType::bf16 : DType::f32;
      check_prep(dev, m, c, ++seed);
      c.cache = DType::f8_e4m3;
      check_prep(dev, m, c, ++seed);
    }
}

}  // namespace
}  // namespace k3::ops_test
