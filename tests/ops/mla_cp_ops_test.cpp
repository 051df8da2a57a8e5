// tests/ops/mla_cp_ops_test.cpp: the four MLA ops of decode context parallelism (kernels/mla/mla_cp.h)
// on every device backend against the CPU reference, each case asserting the strategy that ran:
//   mla_q_absorb ("cuda_q_absorb"), mla_partial_attention ("cuda_partial_splitkv"; in bf16 mode at
//   tensor-core dims "cuda_partial_splitkv_mma"), mla_lse_rescale ("cuda_lse_rescale"); mla_w_uv
//   ("cuda_w_uv_rowdot", with and without the output gate) has its own file, mla_cp_w_uv_ops_test.cpp,
//   and runs here in the chains
// at odd dims (H 1/3/12, G = cp 1/2/4, ranks 0 and cp-1, pages of 7 and 16 tokens, f32 / bf16 / fp8
// caches, rows at global positions 0/17/54/97 with 1 or 3 verify rows, some rows seeing no local
// position) and at the per-GPU TP8 shape (H 12, kv_lora 512, rope 64, G 8, thousands of local
// positions), with NaN-poisoned outputs and rows of no sequence that must stay untouched. Two chains:
// cp = 1 on the device equals mla_absorbed's "cuda_split_kv" bit for bit (same kernels, weight 1),
// and cp = 2 / 8 with a hand-done rank-order all-gather / reduce-scatter on the host matches
// mla_absorbed_reference over the whole cache.
// The tensor-core partial attention runs by name at G * H = 12 / 17 / 24 / 48 heads (1-3 head groups), cp
// 1 / 2 / 4 and every rank, and is the registry's own choice at the TP2 / TP8 shapes in bf16 mode.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "tests/ops/op_harness.h"

namespace k3::ops_test {
namespace {

struct Dims {
  int heads, nope, rope, v, kv_lora;  // heads: per rank (the owner's H)
};
struct Seq {
  int64_t position, rows;  // global position of its first row, rows this step
};

const Dims kOdd{3, 17, 9, 13, 54};
const Dims kTp8{12, 128, 64, 128, 512};
constexpr const char* kQAbsorb = "cuda_q_absorb";
constexpr const char* kPartial = "cuda_partial_splitkv";
constexpr const char* kPartialMma = "cuda_partial_splitkv_mma";
constexpr const char* kRescale = "cuda_lse_rescale";
constexpr const char* kWUv = "cuda_w_uv_rowdot";
constexpr float kInf = std::numeric_limits<float>::infinity();

Tensor i32_host(const std::vector<int32_t>& v, Shape shape) {
  Tensor t = Tensor::zeros(DType::i32, shape);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}
Tensor i32_host(const std::vector<int32_t>& v) { return i32_host(v, {static_cast<int64_t>(v.size())}); }
float scale_of(const Dims& d) { return 1.0f / std::sqrt(static_cast<float>(d.nope + d.rope)); }
// Local positions of `rank` among global positions 0 .. end-1 (position p lives on rank p % cp).
int64_t local_count(int64_t end, int cp, int rank) { return end > rank ? (end - 1 - rank) / cp + 1 : 0; }

// Activation rows of a batch: row 0 belongs to no sequence, then the sequences in reverse order.
struct Rows {
  std::vector<int32_t> begins, counts, positions;
  int64_t total = 1;
  int max_rows = 0;
  explicit Rows(const std::vector<Seq>& seqs) : begins(seqs.size()) {
    for (size_t k = seqs.size(); k-- > 0;) {
      begins[k] = static_cast<int32_t>(total);
      total += seqs[k].rows;
    }
    for (const Seq& s : seqs) {
      counts.push_back(static_cast<int32_t>(s.rows));
      positions.push_back(static_cast<int32_t>(s.position));
      max_rows = std::max(max_rows, static_cast<int>(s.rows) + 1);  // one spare row slot per sequence
    }
  }
};

// One rank's pages of a batch (cp = 1: the whole cache). Spare slots hold NaN (f32 / bf16 caches) or
// the fp8 NaN code, so a kernel reading past a sequence's visible positions poisons its output.
struct Cache {
  Tensor pages;        // CPU: f32 (bf16 values for a "bf16" cache) or f8_e4m3 [blocks, bs, E]
  Tensor block_table;  // i32 [S, max_blocks], -1 past each sequence's pages
  int64_t max_tokens = 0;
};
// c_n[s] [n_s, L] and k_pe[s] [n_s, rope]: sequence s's cache entries in local order.
Cache build_cache(const std::vector<Tensor>& c_n, const std::vector<Tensor>& k_pe, int64_t bs, const std::string& kind,
                  float k_scale, core::Rng& rng) {
  const auto S = static_cast<int64_t>(c_n.size());
  const int64_t L = c_n[0].dim(1), rope = k_pe[0].dim(1);
  int64_t blocks = 0, n_max = 0;
  for (const Tensor& t : c_n) {
    blocks += (t.dim(0) + bs - 1) / bs;
    n_max = std::max(n_max, t.dim(0));
  }
  Cache c;
  c.max_tokens = n_max + 2;
  const int64_t max_blocks = (c.max_tokens + bs - 1) / bs, num_blocks = blocks + 2;
  std::vector<int32_t> pool(static_cast<size_t>(num_blocks));
  for (int64_t i = 0; i < num_blocks; ++i) pool[i] = static_cast<int32_t>(i);
  for (int64_t i = num_blocks - 1; i > 0; --i) std::swap(pool[i], pool[rng.next_u64() % static_cast<uint64_t>(i + 1)]);
  std::vector<int32_t> table(static_cast<size_t>(S * max_blocks), -1), rows;
  size_t next = 0;
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t b = 0; b * bs < c_n[s].dim(0); ++b) table[s * max_blocks + b] = pool[next++];
    for (int64_t j = 0; j < c_n[s].dim(0); ++j)
      rows.push_back(static_cast<int32_t>(table[s * max_blocks + j / bs] * bs + j % bs));
  }
  const bool fp8 = kind == "fp8";
  c.pages = Tensor::zeros(fp8 ? DType::f8_e4m3 : DType::f32, {num_blocks, bs, L + rope});
  if (fp8)
    std::memset(c.pages.data<uint8_t>(), 0x7f, static_cast<size_t>(c.pages.numel()));
  else
    std::fill(c.pages.span<float>().begin(), c.pages.span<float>().end(), std::numeric_limits<float>::quiet_NaN());
  const auto n = static_cast<int64_t>(rows.size());
  Tensor all_c = f32_tensor({n, L}), all_pe = f32_tensor({n, rope});
  int64_t at = 0;
  for (int64_t s = 0; s < S; ++s) {
    std::copy_n(c_n[s].data<const float>(), c_n[s].numel(), all_c.data<float>() + at * L);
    std::copy_n(k_pe[s].data<const float>(), k_pe[s].numel(), all_pe.data<float>() + at * rope);
    at += c_n[s].dim(0);
  }
  const Tensor cache_rows = i32_host(rows);
  cpu_registry().mla_cache_write.run({all_c.view(), all_pe.view(), c.pages.view(), cache_rows.view(), k_scale},
                                     core::Device::cpu);
  c.block_table = i32_host(table, {S, max_blocks});
  return c;
}
// Rows rank, rank + cp, ... of a CPU f32 [N, W] tensor (the entries a rank stores).
Tensor take_local(const Tensor& t, int cp, int rank) {
  const int64_t n = local_count(t.dim(0), cp, rank), W = t.dim(1);
  Tensor out = f32_tensor({n, W});
  for (int64_t j = 0; j < n; ++j) std::copy_n(t.data<const float>() + (j * cp + rank) * W, W, out.data<float>() + j * W);
  return out;
}
// The device copy of a CPU cache's pages ("bf16": real bf16 pages, else the same bytes).
Tensor device_pages(Device* dev, const Cache& c, const std::string& kind) {
  return kind == "bf16" ? dev->upload(c.pages, DType::bf16) : dev->upload(c.pages);
}

// A batch's tables, on the CPU (dev null) or uploaded to a device; block_table may be undefined
// (the ops that read row_begin / num_rows only).
struct Tables {
  Tensor row_begin, num_rows, position, block_table;
  Tables(const Rows& r, const Tensor& bt, Device* dev)
      : row_begin(i32_host(r.begins)), num_rows(i32_host(r.counts)), position(i32_host(r.positions)), block_table(bt) {
    if (dev == nullptr) return;
    row_begin = dev->upload(row_begin);
    num_rows = dev->upload(num_rows);
    position = dev->upload(position);
    if (block_table.defined()) block_table = dev->upload(block_table);
  }
  kernels::SeqBatch seqs(const Rows& r, int64_t max_tokens) const {
    kernels::SeqBatch b;
    b.row_begin = row_begin.view();
    b.num_rows = num_rows.view();
    b.position = position.view();
    if (block_table.defined()) b.block_table = block_table.view();
    b.num_seqs = static_cast<int>(r.counts.size());
    b.max_rows = r.max_rows;
    b.max_tokens = max_tokens;
    return b;
  }
};

// Rows 1.. of a [R, ...] tensor viewed as [R, inner] and flattened (the owned rows), and the check
// that row 0 (no sequence) still holds `row0` (NaN poison, or the input for in-place ops).
Tensor owned_rows(const Tensor& t, int64_t R) {
  const int64_t inner = t.numel() / R;
  Tensor out = f32_tensor({(R - 1) * inner});
  std::copy_n(t.data<const float>() + inner, (R - 1) * inner, out.data<float>());
  return out;
}
// For [G, R, inner] tensors: every g's rows 1.., and row 0 of every g must be NaN.
Tensor owned_rows_g(const Tensor& t, int64_t G, int64_t R, const char* what) {
  const int64_t inner = t.numel() / (G * R);
  Tensor out = f32_tensor({G * (R - 1) * inner});
  for (int64_t g = 0; g < G; ++g) {
    const float* src = t.data<const float>() + g * R * inner;
    for (int64_t i = 0; i < inner; ++i) EXPECT_TRUE(std::isnan(src[i])) << what << ": row 0 of owner " << g << " written";
    std::copy_n(src + inner, (R - 1) * inner, out.data<float>() + g * (R - 1) * inner);
  }
  return out;
}
void expect_row0_nan(const Tensor& t, int64_t R, const char* what) {
  const int64_t inner = t.numel() / R;
  for (int64_t i = 0; i < inner; ++i) ASSERT_TRUE(std::isnan(t.data<const float>()[i])) << what << ": row 0 written";
}

// ---------------------------------------------------------------- mla_q_absorb

void check_q_absorb(Device* dev, Mode mode, const Dims& d, const std::vector<Seq>& seqs, DType w_dtype, uint64_t seed) {
  core::Rng rng(seed);
  const Rows rows(seqs);
  const int64_t R = rows.total, H = d.heads, E = d.kv_lora + d.rope;
  const Tensor q = random_act(rng, {R, H * (d.nope + d.rope)}, mode);
  kernels::LinearWeight kv_b;
  kv_b.weight = w_dtype == DType::bf16 ? random_bf16_weight(rng, H * (d.nope + d.v), d.kv_lora)
                                       : random_uniform_f32(rng, {H * (d.nope + d.v), d.kv_lora}, 1.0 / std::sqrt(d.kv_lora));
  const Tables cpu(rows, Tensor(), nullptr);
  Tensor want = nan_tensor({R, H, E});
  cpu_registry().mla_q_absorb.run({q.view(), cpu.seqs(rows, 0), &kv_b, want.view(), d.heads, d.nope, d.rope, d.v,
                                   d.kv_lora, precision(mode)},
                                  core::Device::cpu);
  const Tables dt(rows, Tensor(), dev);
  const Tensor dq = dev->act(q, mode);
  const kernels::LinearWeight dkv_b = dev->upload(kv_b);
  Tensor qc = dev->poisoned(DType::f32, {R, H, E});
  const kernels::MlaQAbsorbArgs args{dq.view(), dt.seqs(rows, 0), &dkv_b, qc.view(), d.heads, d.nope, d.rope, d.v,
                                     d.kv_lora, precision(mode)};
  expect_device_impl(dev->registry().mla_q_absorb, args, dev);
  ASSERT_EQ(dev->registry().mla_q_absorb.select(args, dev->kind()).name, kQAbsorb);
  dev->registry().mla_q_absorb.run(args, dev->kind());
  const Tensor got = dev->to_host_f32(qc.view());
  expect_row0_nan(got, R, "mla_q_absorb qc");
  expect_close("mla_q_absorb", shape_str({R, H, d.nope, d.kv_lora}), mode, "kv_b_" + std::string(core::dtype_name(w_dtype)),
               owned_rows(got, R), owned_rows(want, R), tol_reduction(mode));
}

const std::vector<Seq> kOddBatch = {{0, 1}, {17, 3}, {54, 1}, {97, 3}, {0, 3}};

TEST(OpsOdd, MlaCpQAbsorb) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 9100;
  for (Mode m : kModes)
    for (int H : {1, 3, 12}) check_q_absorb(dev, m, {H, 17, 9, 13, 54}, kOddBatch, DType::bf16, ++seed);
  check_q_absorb(dev, Mode::fp32, {3, 17, 9, 13, 56}, kOddBatch, DType::f32, ++seed);  // f32 weight, 8-wide columns
}
TEST(OpsTp8, MlaCpQAbsorb) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes) check_q_absorb(dev, m, kTp8, {{8191, 1}, {3000, 4}, {0, 1}}, DType::bf16, 9150);
}

// ---------------------------------------------------------------- mla_partial_attention

// How a partial-attention case runs: which strategy must run, the precision the call declares (bf16:
// qc holds bf16 values, as mla_q_absorb leaves it in bf16 mode) and whether the strategy runs by name
// (asserting that it supports the case) or through the registry (asserting that it is the one chosen).
struct PartialRun {
  const char* impl = kPartial;
  Precision precision = Precision::fp32;
  bool by_name = false;
};
const kernels::OpImpl<kernels::MlaPartialAttentionArgs>& partial_impl_named(Device* dev, const std::string& name) {
  for (const auto& impl : dev->registry().mla_partial_attention.impls())
    if (impl.name == name && impl.device == dev->kind()) return impl;
  throw core::Error("no mla_partial_attention implementation " + name + " registered");
}

// qc [G, R, H, E] random; this rank's local cache of random entries; o_part / lse against the CPU.
// Tolerances: the CUDA-core strategy is fp32 throughout (tol_attention(fp32) for every cache); the tensor-core
// one rounds P to f16 (fp8 cache) or bf16 (bf16 cache) for its P.V mma and l sums the same rounded P, so
// o_part is a weighted mean with weights off by <= 2^-11 / 2^-8 relative: ~2e-3 relative at most, checked at
// tol_attention(bf16) as the decode op's tensor-core cases; lse = m + log l moves by <= 2^-8 absolute.
// The tensor-core strategy also runs twice: the same bytes both times.
void check_partial(Device* dev, const Dims& d, int G, int rank, const std::vector<Seq>& seqs, const std::string& kind,
                   float k_scale, int64_t bs, uint64_t seed, const PartialRun& run = {}) {
  core::Rng rng(seed);
  const int cp = G;
  const Rows rows(seqs);
  const int64_t R = rows.total, H = d.heads, L = d.kv_lora, E = L + d.rope;
  std::vector<Tensor> c_n, k_pe;
  for (const Seq& s : seqs) {
    const int64_t n = std::max<int64_t>(1, local_count(s.position + s.rows, cp, rank));  // >= 1 page per sequence
    c_n.push_back(random_act(rng, {n, L}, Mode::bf16));
    k_pe.push_back(random_act(rng, {n, d.rope}, Mode::bf16));
  }
  const Cache cache = build_cache(c_n, k_pe, bs, kind, k_scale, rng);
  const Tensor qc = random_act(rng, {G, R, H, E}, kind == "f32" ? Mode::fp32 : Mode::bf16);
  const float scale = scale_of(d);
  const Tables cpu(rows, cache.block_table, nullptr);
  Tensor want_o = nan_tensor({G, R, H, L}), want_lse = nan_tensor({G, R, H});
  cpu_registry().mla_partial_attention.run({qc.view(), cache.pages.view(), cpu.seqs(rows, cache.max_tokens), k_scale,
                                            want_o.view(), want_lse.view(), cp, rank, scale},
                                           core::Device::cpu);
  const Tables dt(rows, cache.block_table, dev);
  const Tensor dqc = dev->upload(qc), dpages = device_pages(dev, cache, kind);
  Tensor o_part = dev->poisoned(DType::f32, {G, R, H, L}), lse = dev->poisoned(DType::f32, {G, R, H});
  kernels::MlaPartialAttentionArgs args{dqc.view(), dpages.view(), dt.seqs(rows, cache.max_tokens), k_scale,
                                        o_part.view(), lse.view(), cp, rank, scale};
  args.precision = run.precision;
  auto& table = dev->registry().mla_partial_attention;
  expect_device_impl(table, args, dev);
  const bool mma = std::string(run.impl) == kPartialMma;
  if (!mma) {  // the tensor-core strategy must refuse the case with its reason (precision, cache, dims)
    const core::Status why = partial_impl_named(dev, kPartialMma).supports(args);
    ASSERT_FALSE(why.is_ok()) << "cuda_partial_splitkv_mma accepts a case meant for " << run.impl;
    EXPECT_NE(why.reason().find("tensor-core partial split_kv: "), std::string::npos) << why.reason();
  }
  const auto run_once = [&](const kernels::MlaPartialAttentionArgs& a) {
    if (run.by_name) {
      const auto& impl = partial_impl_named(dev, run.impl);
      const core::Status s = impl.supports(a);
      ASSERT_TRUE(s.is_ok()) << run.impl << ": " << s.reason();
      impl.run(a);
    } else {
      ASSERT_EQ(table.select(a, dev->kind()).name, run.impl);
      table.run(a, dev->kind());
    }
  };
  run_once(args);
  if (::testing::Test::HasFatalFailure()) return;
  const Tensor got_o = dev->to_host_f32(o_part.view()), got_lse = dev->to_host_f32(lse.view());
  if (mma) {  // deterministic: a second run into fresh poisoned buffers gives the same bytes
    Tensor o2 = dev->poisoned(DType::f32, {G, R, H, L}), lse2 = dev->poisoned(DType::f32, {G, R, H});
    kernels::MlaPartialAttentionArgs again = args;
    again.o_part = o2.view();
    again.lse = lse2.view();
    run_once(again);
    if (::testing::Test::HasFatalFailure()) return;
    const Tensor o2h = dev->to_host_f32(o2.view()), lse2h = dev->to_host_f32(lse2.view());
    EXPECT_EQ(std::memcmp(o2h.data<const float>(), got_o.data<const float>(), static_cast<size_t>(got_o.nbytes())), 0)
        << "o_part differs between two runs";
    EXPECT_EQ(std::memcmp(lse2h.data<const float>(), got_lse.data<const float>(), static_cast<size_t>(got_lse.nbytes())),
              0)
        << "lse differs between two runs";
  }
  const Tensor go = owned_rows_g(got_o, G, R, "o_part"), wo = owned_rows_g(want_o, G, R, "o_part (cpu)");
  const Tensor gl = owned_rows_g(got_lse, G, R, "lse"), wl = owned_rows_g(want_lse, G, R, "lse (cpu)");
  // Rows that see no local position: lse exactly -inf and o_part exactly 0, on both sides.
  std::vector<float> got_finite, want_finite;
  int empty = 0;
  for (int64_t k = 0; k < wl.numel(); ++k) {
    const float w = wl.data<const float>()[k], g = gl.data<const float>()[k];
    if (w == -kInf) {
      ++empty;
      ASSERT_EQ(g, -kInf) << "lse of a row with no visible local position, entry " << k;
      for (int64_t i = 0; i < L; ++i) ASSERT_EQ(go.data<const float>()[k * L + i], 0.0f) << "o_part of an empty row";
    } else {
      got_finite.push_back(g), want_finite.push_back(w);
    }
  }
  const std::string shape = shape_str({G, rank, H, L, bs}) + " empty " + std::to_string(empty);  // G rank H L bs
  const Mode m = kind == "f32" ? Mode::fp32 : Mode::bf16;  // f32 caches: the tight fp32 tolerance
  const Tol tight = tol_attention(Mode::fp32);
  const Tol o_tol = mma ? tol_attention(Mode::bf16) : tight, lse_tol = mma ? Tol{2e-3, 1 - 1e-5} : tight;
  const std::string tag = mma ? "_mma" : "";
  expect_close("mla_partial_attention", shape, m, "o_part_cache_" + kind + tag, go, wo, o_tol);
  const auto n = static_cast<int64_t>(got_finite.size());
  Tensor gf = f32_tensor({n}), wf = f32_tensor({n});
  std::copy(got_finite.begin(), got_finite.end(), gf.data<float>());
  std::copy(want_finite.begin(), want_finite.end(), wf.data<float>());
  if (n > 0) expect_close("mla_partial_attention", shape, m, "lse_cache_" + kind + tag, gf, wf, lse_tol);
}

TEST(OpsOdd, MlaCpPartialAttention) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 9200;
  for (int G : {1, 2, 4})
    for (int rank : G == 1 ? std::vector<int>{0} : std::vector<int>{0, G - 1}) {
      for (int H : {1, 3, 12})
        for (int64_t bs : {7, 16}) {
          const Dims d{H, 17, 9, 13, 54};
          check_partial(dev, d, G, rank, kOddBatch, "f32", 1.0f, bs, ++seed);
          check_partial(dev, d, G, rank, kOddBatch, "bf16", 1.0f, bs, ++seed);
          check_partial(dev, d, G, rank, kOddBatch, "fp8", 0.5f, bs, ++seed);
        }
    }
}
// G = cp = 8 ranks of 12 heads, rank 0 and 7: contexts of 24K / 16K global tokens (3000 / 2000 local)
// with verify rows, a short one, and a lone decode row (many splits per query).
TEST(OpsTp8, MlaCpPartialAttention) {
  K3_REQUIRE_CUDA(dev);
  for (int rank : {0, 7}) {
    check_partial(dev, kTp8, 8, rank, {{23999, 1}, {15997, 3}, {5, 1}}, "bf16", 1.0f, 64, 9300 + rank);
    check_partial(dev, kTp8, 8, rank, {{23999, 1}}, "fp8", 1.0f, 16, 9310 + rank);
  }
  check_partial(dev, kTp8, 8, 3, {{9000, 2}, {700, 1}}, "f32", 1.0f, 16, 9320);
}

// The tensor-core strategy by name: cp 1 / 2 / 4 and every rank; G * H = 12, 24, 17 and 48 heads (one group,
// 2 x 12, 9 + 8, 3 x 16); fp8 (k_scale 0.75) and bf16 pages of 7 and 16 tokens; kv_lora 64 (rope 16) and
// 128 (rope 64); contexts of up to 1004 local positions that end mid-stage (64) and mid-page, verify rows
// (max_rows 5 with spare slots), and sequences at global positions 0 .. 2 that rank 3 of 4 never stores
// (lse -inf, o_part 0).
const std::vector<Seq> kMmaBatch = {{0, 1}, {17, 3}, {300, 1}, {97, 3}, {1000, 4}, {0, 3}, {2, 1}};
TEST(OpsOdd, MlaCpPartialAttentionMma) {
  K3_REQUIRE_CUDA(dev);
  const PartialRun mma{kPartialMma, Precision::bf16, true};
  uint64_t seed = 9250;
  for (int G : {1, 2, 4})
    for (int rank = 0; rank < G; ++rank)
      for (int heads : {12, 24, 17, 48}) {
        if (heads % G != 0) continue;
        const int H = heads / G;
        const Dims d = heads % 12 == 0 && heads != 48 ? Dims{H, 17, 16, 13, 64} : Dims{H, 17, 64, 13, 128};
        const int64_t bs = (rank + heads) % 2 == 0 ? 7 : 16;
        check_partial(dev, d, G, rank, kMmaBatch, "fp8", 0.75f, bs, ++seed, mma);
        check_partial(dev, d, G, rank, kMmaBatch, "bf16", 1.0f, 23 - bs, ++seed, mma);
      }
}
// In bf16 mode at the K3 shapes the registry picks the tensor-core strategy itself: TP2 + DCP (G 2 x 12 =
// 24 heads: 2 groups of 12; 12K local positions) and TP8 + DCP (G 8 x 12 = 96 heads: 6 groups of 16).
// Where it cannot be exact or its dims do not fit (precision fp32, an f32 cache, kv_lora 54) it refuses
// with its reason and the CUDA-core strategy runs.
TEST(OpsTp8, MlaCpPartialAttentionMma) {
  K3_REQUIRE_CUDA(dev);
  const PartialRun selected{kPartialMma, Precision::bf16, false};
  for (int rank : {0, 1}) {
    check_partial(dev, kTp8, 2, rank, {{23999, 1}, {15997, 3}, {5, 1}}, "fp8", 0.5f, 64, 9330 + rank, selected);
    check_partial(dev, kTp8, 2, rank, {{8191, 1}, {3000, 4}, {0, 1}}, "bf16", 1.0f, 16, 9340 + rank, selected);
  }
  check_partial(dev, kTp8, 8, 7, {{23999, 1}, {900, 3}, {2, 1}}, "fp8", 0.5f, 64, 9350, selected);
  check_partial(dev, kTp8, 2, 1, {{3000, 4}, {0, 1}}, "fp8", 0.5f, 64, 9360, PartialRun{kPartial, Precision::fp32});
  check_partial(dev, kTp8, 2, 1, {{3000, 4}, {0, 1}}, "f32", 1.0f, 16, 9361, PartialRun{kPartial, Precision::bf16});
  check_partial(dev, kOdd, 2, 0, kOddBatch, "bf16", 1.0f, 16, 9362, PartialRun{kPartial, Precision::bf16});
}

// ---------------------------------------------------------------- mla_lse_rescale

void check_rescale(Device* dev, int G, int rank, int H, int L, const std::vector<Seq>& seqs, uint64_t seed) {
  core::Rng rng(seed);
  const int cp = G;
  const Rows rows(seqs);
  const int64_t R = rows.total;
  const Tensor o_part = random_act(rng, {G, R, H, L}, Mode::fp32);
  Tensor lse_all = random_act(rng, {cp, G, R, H}, Mode::fp32, 2.0, 3.0);
  // Ranks > 0 sometimes saw no position (-inf); rank 0 always saw position 0.
  for (int64_t k = static_cast<int64_t>(G) * R * H; k < lse_all.numel(); ++k)
    if (rng.next_u64() % 4 == 0) lse_all.data<float>()[k] = -kInf;
  const Tables cpu(rows, Tensor(), nullptr);
  Tensor want = copy(o_part);
  cpu_registry().mla_lse_rescale.run({want.view(), lse_all.view(), cpu.seqs(rows, 0), rank}, core::Device::cpu);
  const Tables dt(rows, Tensor(), dev);
  Tensor d_o = dev->upload(o_part);
  const Tensor d_lse = dev->upload(lse_all);
  const kernels::MlaLseRescaleArgs args{d_o.view(), d_lse.view(), dt.seqs(rows, 0), rank};
  expect_device_impl(dev->registry().mla_lse_rescale, args, dev);
  ASSERT_EQ(dev->registry().mla_lse_rescale.select(args, dev->kind()).name, kRescale);
  dev->registry().mla_lse_rescale.run(args, dev->kind());
  const Tensor got = dev->to_host_f32(d_o.view());
  // Row 0 of every owner belongs to no sequence: untouched, bit for bit.
  const int64_t inner = static_cast<int64_t>(H) * L;
  for (int64_t g = 0; g < G; ++g)
    ASSERT_EQ(std::memcmp(got.data<const float>() + g * R * inner, o_part.data<const float>() + g * R * inner,
                          static_cast<size_t>(inner) * sizeof(float)),
              0)
        << "row 0 of owner " << g << " changed";
  expect_close("mla_lse_rescale", shape_str({G, rank, R, H, L}), Mode::fp32, "o_part", got, want,
               tol_elementwise(Mode::fp32));
}

TEST(OpsOdd, MlaCpLseRescale) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 9400;
  for (int G : {1, 2, 4})
    for (int rank : G == 1 ? std::vector<int>{0} : std::vector<int>{0, G - 1})
      for (int H : {1, 3, 12}) check_rescale(dev, G, rank, H, 54, kOddBatch, ++seed);
}
TEST(OpsTp8, MlaCpLseRescale) {
  K3_REQUIRE_CUDA(dev);
  for (int rank : {0, 7}) check_rescale(dev, 8, rank, 12, 512, {{8191, 1}, {3000, 4}, {0, 1}}, 9450 + rank);
}

// ---------------------------------------------------------------- chains

// Columns [c0, c0 + w) of a CPU f32 [R, W] tensor.
Tensor columns(const Tensor& t, int64_t c0, int64_t w) {
  const int64_t R = t.dim(0), W = t.dim(1);
  Tensor out = f32_tensor({R, w});
  for (int64_t r = 0; r < R; ++r) std::copy_n(t.data<const float>() + r * W + c0, w, out.data<float>() + r * w);
  return out;
}
// Rows [r0, r0 + n) of a weight (any dtype) as a new weight.
kernels::LinearWeight weight_rows(const kernels::LinearWeight& w, int64_t r0, int64_t n) {
  const TensorView v = w.weight.view();
  const size_t row_bytes = static_cast<size_t>(v.dim(1)) * core::dtype_size(v.dtype);
  kernels::LinearWeight out;
  out.weight = Tensor::zeros(v.dtype, {n, v.dim(1)});
  std::memcpy(out.weight.data<uint8_t>(), static_cast<const uint8_t*>(v.data) + r0 * row_bytes, n * row_bytes);
  return out;
}

// The whole DCP step for cp ranks of H heads each (cp * H heads in all) on one device, the
// collectives done on the host in rank order, against mla_absorbed_reference of the whole cache.
// mma: the partial attention declares precision bf16 and must run on the tensor cores.
void check_chain(Device* dev, Mode mode, const Dims& d, int cp, const std::vector<Seq>& seqs, const std::string& kind,
                 int64_t bs, uint64_t seed, bool mma = false) {
  core::Rng rng(seed);
  const Rows rows(seqs);
  const int64_t R = rows.total, H = d.heads, L = d.kv_lora, E = L + d.rope, qw = H * (d.nope + d.rope), vw = H * d.v;
  const Precision p = precision(mode);
  const float scale = scale_of(d), k_scale = kind == "fp8" ? 0.5f : 1.0f;
  std::vector<Tensor> c_n, k_pe;  // every sequence's global entries
  for (const Seq& s : seqs) {
    c_n.push_back(random_act(rng, {s.position + s.rows, L}, Mode::bf16));
    k_pe.push_back(random_act(rng, {s.position + s.rows, d.rope}, Mode::bf16));
  }
  const Tensor q = random_act(rng, {R, cp * qw}, mode);
  kernels::LinearWeight kv_b;
  kv_b.weight = random_bf16_weight(rng, cp * H * (d.nope + d.v), L);

  const Cache full = build_cache(c_n, k_pe, bs, kind, k_scale, rng);
  const Tables cpu(rows, full.block_table, nullptr);
  Tensor want = nan_tensor({R, cp * vw});
  cpu_registry().mla_absorbed.run({q.view(), full.pages.view(), cpu.seqs(rows, full.max_tokens), k_scale, &kv_b,
                                   want.view(), static_cast<int>(cp * H), d.nope, d.rope, d.v, d.kv_lora, scale, p},
                                  core::Device::cpu);

  // 1. q_absorb on every rank, all_gather -> qc [cp, R, H, E] (rank-major, as a host concatenation).
  const Tables rows_only(rows, Tensor(), dev);
  Tensor qc_all = f32_tensor({cp, R, H, E});
  std::vector<kernels::LinearWeight> dkv(static_cast<size_t>(cp));
  for (int r = 0; r < cp; ++r) {
    dkv[r] = dev->upload(weight_rows(kv_b, r * H * (d.nope + d.v), H * (d.nope + d.v)));
    const Tensor dq = dev->act(columns(q, r * qw, qw), mode);
    Tensor qc = dev->poisoned(DType::f32, {R, H, E});
    const kernels::MlaQAbsorbArgs a{dq.view(), rows_only.seqs(rows, 0), &dkv[r], qc.view(), d.heads, d.nope, d.rope,
                                    d.v, d.kv_lora, p};
    ASSERT_EQ(dev->registry().mla_q_absorb.select(a, dev->kind()).name, kQAbsorb);
    dev->registry().mla_q_absorb.run(a, dev->kind());
    const Tensor h = dev->to_host_f32(qc.view());
    std::copy_n(h.data<const float>(), h.numel(), qc_all.data<float>() + r * h.numel());
  }
  const Tensor dqc = dev->upload(qc_all);
  // 2. partial attention on every rank over its own pages; all_gather(lse) -> [cp, cp, R, H].
  std::vector<Tensor> o_part(static_cast<size_t>(cp));
  Tensor lse_all = f32_tensor({cp, cp, R, H});
  for (int r = 0; r < cp; ++r) {
    std::vector<Tensor> lc, lp;
    for (size_t s = 0; s < seqs.size(); ++s) {
      lc.push_back(take_local(c_n[s], cp, r));
      lp.push_back(take_local(k_pe[s], cp, r));
    }
    const Cache local = build_cache(lc, lp, bs, kind, k_scale, rng);
    const Tables dt(rows, local.block_table, dev);
    const Tensor dpages = device_pages(dev, local, kind);
    o_part[r] = dev->poisoned(DType::f32, {cp, R, H, L});
    Tensor lse = dev->poisoned(DType::f32, {cp, R, H});
    kernels::MlaPartialAttentionArgs a{dqc.view(), dpages.view(), dt.seqs(rows, local.max_tokens), k_scale,
                                       o_part[r].view(), lse.view(), cp, r, scale};
    if (mma) a.precision = p;
    ASSERT_EQ(dev->registry().mla_partial_attention.select(a, dev->kind()).name, mma ? kPartialMma : kPartial);
    dev->registry().mla_partial_attention.run(a, dev->kind());
    const Tensor h = dev->to_host_f32(lse.view());
    std::copy_n(h.data<const float>(), h.numel(), lse_all.data<float>() + r * h.numel());
  }
  // 3. rescale in place on every rank; reduce_scatter_sum over the owner axis in rank order.
  const Tensor dlse_all = dev->upload(lse_all);
  std::vector<Tensor> parts;
  for (int r = 0; r < cp; ++r) {
    const kernels::MlaLseRescaleArgs a{o_part[r].view(), dlse_all.view(), rows_only.seqs(rows, 0), r};
    ASSERT_EQ(dev->registry().mla_lse_rescale.select(a, dev->kind()).name, kRescale);
    dev->registry().mla_lse_rescale.run(a, dev->kind());
    parts.push_back(dev->to_host_f32(o_part[r].view()));
  }
  const int64_t owner = R * H * L;  // o_part[r][g] is [R, H, L]
  for (int g = 0; g < cp; ++g) {
    Tensor o_lat = f32_tensor({R, H, L});
    for (int64_t i = 0; i < owner; ++i) {
      float sum = parts[0].data<const float>()[g * owner + i];
      for (int r = 1; r < cp; ++r) sum += parts[r].data<const float>()[g * owner + i];
      o_lat.data<float>()[i] = sum;
    }
    // 4. W_UV on the owner of heads g * H ..
    const Tensor d_lat = dev->upload(o_lat);
    Tensor out = dev->poisoned(act_dtype(mode), {R, vw});
    const kernels::MlaWUvArgs a{d_lat.view(), rows_only.seqs(rows, 0), &dkv[g], {}, out.view(), d.heads, d.nope, d.v,
                                d.kv_lora, p};
    ASSERT_EQ(dev->registry().mla_w_uv.select(a, dev->kind()).name, kWUv);
    dev->registry().mla_w_uv.run(a, dev->kind());
    const Tensor got = dev->to_host_f32(out.view());
    expect_row0_nan(got, R, "chain out");
    expect_close("mla_cp_chain", "cp" + std::to_string(cp) + " rank" + std::to_string(g) + " H" + std::to_string(H) +
                 " bs" + std::to_string(bs), mode, "cache_" + kind, owned_rows(got, R),
                 owned_rows(columns(want, g * vw, vw), R), tol_attention(mode));
  }
}

TEST(OpsOdd, MlaCpChainMatchesAbsorbedReference) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 9600;
  for (Mode m : kModes)
    for (int64_t bs : {7, 16}) {
      check_chain(dev, m, kOdd, 2, kOddBatch, m == Mode::bf16 ? "bf16" : "f32", bs, ++seed);
      check_chain(dev, m, kOdd, 2, kOddBatch, "fp8", bs, ++seed);
    }
  check_chain(dev, Mode::bf16, kOdd, 4, kOddBatch, "fp8", 16, ++seed);
}
// DCP8 at the K3 shape: 8 ranks of 12 heads (96 in all), contexts of up to 1500 tokens.
TEST(OpsTp8, MlaCpChainMatchesAbsorbedReference) {
  K3_REQUIRE_CUDA(dev);
  check_chain(dev, Mode::bf16, kTp8, 8, {{1499, 1}, {900, 3}, {2, 1}}, "fp8", 64, 9700);
}
// The same chain in bf16 mode with the tensor-core partial attention (the model's choice): DCP2 (24 heads)
// over fp8 and bf16 caches and DCP8 (96 heads).
TEST(OpsTp8, MlaCpChainMmaMatchesAbsorbedReference) {
  K3_REQUIRE_CUDA(dev);
  check_chain(dev, Mode::bf16, kTp8, 2, {{2999, 1}, {900, 3}, {2, 1}}, "fp8", 64, 9710, /*mma=*/true);
  check_chain(dev, Mode::bf16, kTp8, 2, {{1499, 2}, {63, 1}}, "bf16", 16, 9711, /*mma=*/true);
  check_chain(dev, Mode::bf16, kTp8, 8, {{1499, 1}, {900, 3}, {2, 1}}, "fp8", 64, 9712, /*mma=*/true);
}

// cp = 1: the four CUDA ops give the bytes of mla_absorbed's "cuda_split_kv" (same kernels, same split
// plan, the rescale weight e^0 / e^0 = 1 exactly, o_lat rounded at the same point; mla_w_uv's own kernel
// sums each W_UV row in the lane order of the absorbed form's w_uv_kernel and takes the same vector /
// scalar path when the absorbed form's o_lat scratch is 16-byte aligned, as for these shapes: L not a
// multiple of 8, or H even).
void check_cp1_bitwise(Device* dev, Mode mode, const Dims& d, const std::vector<Seq>& seqs, const std::string& kind,
                       int64_t bs, uint64_t seed) {
  core::Rng rng(seed);
  const Rows rows(seqs);
  const int64_t R = rows.total, H = d.heads, L = d.kv_lora, E = L + d.rope;
  const Precision p = precision(mode);
  const float scale = scale_of(d), k_scale = kind == "fp8" ? 0.5f : 1.0f;
  std::vector<Tensor> c_n, k_pe;
  for (const Seq& s : seqs) {
    c_n.push_back(random_act(rng, {s.position + s.rows, L}, Mode::bf16));
    k_pe.push_back(random_act(rng, {s.position + s.rows, d.rope}, Mode::bf16));
  }
  const Cache cache = build_cache(c_n, k_pe, bs, kind, k_scale, rng);
  kernels::LinearWeight kv_b;
  kv_b.weight = random_bf16_weight(rng, H * (d.nope + d.v), L);
  const Tensor q = random_act(rng, {R, H * (d.nope + d.rope)}, mode);
  const Tables dt(rows, cache.block_table, dev);
  const kernels::SeqBatch sb = dt.seqs(rows, cache.max_tokens);
  const Tensor dq = dev->act(q, mode), dpages = device_pages(dev, cache, kind);
  const kernels::LinearWeight dkv_b = dev->upload(kv_b);
  kernels::Registry& reg = dev->registry();

  Tensor want = dev->poisoned(act_dtype(mode), {R, H * d.v});
  const kernels::MlaAttentionArgs absorbed{dq.view(), dpages.view(), sb, k_scale, &dkv_b, want.view(), d.heads, d.nope,
                                           d.rope, d.v, d.kv_lora, scale, p};
  // The CUDA-core strategy whose kernels the DCP ops share (a higher-priority tensor-core strategy may
  // be the one select() picks for some of these calls).
  const auto& impls = reg.mla_absorbed.impls();
  const auto split_kv = std::find_if(impls.begin(), impls.end(), [](const auto& i) { return i.name == "cuda_split_kv"; });
  ASSERT_NE(split_kv, impls.end());
  ASSERT_TRUE(kernels::mla_attention_check(absorbed).is_ok());
  ASSERT_TRUE(split_kv->supports(absorbed).is_ok()) << split_kv->supports(absorbed).reason();
  split_kv->run(absorbed);

  Tensor qc = dev->poisoned(DType::f32, {1, R, H, E}), o_part = dev->poisoned(DType::f32, {1, R, H, L});
  Tensor lse = dev->poisoned(DType::f32, {1, R, H}), out = dev->poisoned(act_dtype(mode), {R, H * d.v});
  const auto as = [](const Tensor& t, Shape shape) {
    return TensorView::contiguous(t.view().data, t.dtype(), shape, t.view().device);
  };
  reg.mla_q_absorb.run({dq.view(), sb, &dkv_b, as(qc, {R, H, E}), d.heads, d.nope, d.rope, d.v, d.kv_lora, p}, dev->kind());
  reg.mla_partial_attention.run({qc.view(), dpages.view(), sb, k_scale, o_part.view(), lse.view(), 1, 0, scale},
                                dev->kind());
  reg.mla_lse_rescale.run({o_part.view(), as(lse, {1, 1, R, H}), sb, 0}, dev->kind());
  reg.mla_w_uv.run({as(o_part, {R, H, L}), sb, &dkv_b, {}, out.view(), d.heads, d.nope, d.v, d.kv_lora, p},
                   dev->kind());
  const Tensor a = dev->to_host(want.view()), b = dev->to_host(out.view());
  ASSERT_EQ(a.nbytes(), b.nbytes());
  EXPECT_EQ(std::memcmp(a.data<const uint8_t>(), b.data<const uint8_t>(), static_cast<size_t>(a.nbytes())), 0)
      << "cp = 1 differs from mla_absorbed on CUDA (" << mode_name(mode) << ", cache " << kind << ", H " << H << ")";
}

TEST(OpsOdd, MlaCpOneRankIsAbsorbedBitwise) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 9800;
  for (Mode m : kModes)
    for (int H : {1, 3, 12}) {
      check_cp1_bitwise(dev, m, {H, 17, 9, 13, 54}, kOddBatch, m == Mode::bf16 ? "bf16" : "f32", 7, ++seed);
      check_cp1_bitwise(dev, m, {H, 17, 9, 13, 54}, kOddBatch, "fp8", 16, ++seed);
    }
}
TEST(OpsTp8, MlaCpOneRankIsAbsorbedBitwise) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes) check_cp1_bitwise(dev, m, kTp8, {{4000, 1}, {1000, 4}}, "fp8", 64, 9900);
}

}  // namespace
}  // namespace k3::ops_test
