// kernels/testing/pdl_ops_test.cpp: proof that every kernel launched as a programmatic dependent (PDL, rules in
// kernels/cuda_common.cuh) waits before it reads an input or writes an output. Each converted op runs
// behind the harness's slow producer (op_harness.h "the slow-producer run": a kernel that lets the op's
// kernels start at once, spins ~200 us, then writes the op's inputs, NaN until then, and NaN over its
// outputs) and must equal the plain device run BIT FOR BIT, outputs and in-place state alike:
//   multi_linear     cuda_multi_mma (TP8 KDA group of 6 at T = 1; odd widths at T = 3 and 9) and
//                    cuda_multi_rowdot (f32 x; bf16 x at an odd width);
//   attn_res_merge   cuda_merge_cluster (TP8 hidden, T = 1 and 5, in place too; odd hidden 97) and
//                    cuda_merge_rowwise (T = 33; hidden 17);
//   attn_res_bank    cuda_bank_per_mix (TP8: 9 rows, 24 mixes; odd: scalar path);
//   kda_decode       cuda_vsplit_cluster (batch 1: 8 slices, batch 3: 4 slices, a verify call) and
//                    cuda_head_cta (batch 8), TP8 heads;
//   mla_decode       cuda_decode_splitkv_mma (fp8 and bf16 caches) and cuda_decode_splitkv (f32), TP8 dims;
//   moe_tail_combine cuda_tail_one_launch (TP8 and odd at T = 1), cuda_tail_mma (TP8 at T = 8; odd at T = 3,
//                    and at T = 9 without shared experts) and cuda_tail_rowdot (f32).
// mla_w_uv (DCP) has its slow-producer case beside its op tests (OpsPdl.MlaCpWUv in mla_cp_w_uv_ops_test.cpp).
// Both modes where the op has a kernel per mode. Two CUDA-graph cases (mla_decode, kda_decode) capture the
// producer and the op once, replay twice, and must equal the eager run bit for bit. A probe checks first
// that a dependent kernel really starts before its producer ends on this GPU and driver (else the slow
// form would prove nothing). Every case asserts the CUDA implementation the registry selects. Without a
// GPU every test skips with the reason.
#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "kernels/testing/op_harness.h"

namespace k3::ops_test {
namespace {

// Runs `op` plain and behind the slow producer (and, with `graph`, as two replays of a captured slow
// form) and expects the same bytes every time; the plain run must have written something finite.
void expect_pdl_safe(PdlDevice* dev, const std::string& what, const OpBuffers& buffers, const std::function<void()>& op,
                     bool graph = false) {
  SCOPED_TRACE(what);
  const std::unique_ptr<StagedOp> staged = dev->stage(buffers);
  const std::vector<Tensor> plain = staged->run_plain(op);
  for (size_t b = 0; b < buffers.outputs.size(); ++b) {
    const Tensor f = to_f32(plain[b]);
    const auto finite = std::count_if(f.span<const float>().begin(), f.span<const float>().end(),
                                      [](float x) { return std::isfinite(x); });
    EXPECT_GT(finite, 0) << "output " << b << " of the plain run is all NaN: the op wrote nothing";
  }
  expect_same_bytes(what + " slow", staged->run_after_slow_producer(op), plain);
  if (graph) {
    const std::vector<std::vector<Tensor>> replays = staged->replay_after_slow_producer(op, 2);
    for (size_t r = 0; r < replays.size(); ++r)
      expect_same_bytes(what + " graph " + std::to_string(r), replays[r], plain);
  }
}

Tensor bf16_vector(core::Rng& rng, int64_t n, double mean, double std) {
  Tensor t = Tensor::zeros(DType::bf16, {n});
  for (uint16_t& b : t.span<uint16_t>()) b = core::f32_to_bf16_bits(static_cast<float>(rng.normal(mean, std)));
  return t;
}
Tensor i32_host(const std::vector<int32_t>& v, Shape shape) {
  Tensor t = Tensor::zeros(DType::i32, shape);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}
// Columns [c0, c0 + n) of a [T, W] tensor (same storage, row-strided).
TensorView cols(const Tensor& t, int64_t c0, int64_t n) {
  TensorView v = t.view();
  v.data = static_cast<char*>(v.data) + c0 * static_cast<int64_t>(core::dtype_size(v.dtype));
  v.shape = Shape{t.dim(0), n};
  return v;
}

TEST(OpsPdl, DependentStartsBeforeItsProducerEnds) {
  K3_REQUIRE_PDL_CUDA(dev);
  const PdlProbe p = dev->probe(200.0);
  std::printf("  pdl probe: dependent started %.1f us before the producer ended, left its wait %.1f us after\n",
              static_cast<double>(p.producer_end_ns - p.probe_start_ns) / 1e3,
              static_cast<double>(p.probe_after_wait_ns - p.producer_end_ns) / 1e3);
  EXPECT_LT(p.probe_start_ns, p.producer_end_ns)
      << "the dependent kernel did not start before its producer ended: programmatic dependent launch is not in "
         "effect here, so the slow-producer tests below prove nothing";
  EXPECT_GE(p.probe_after_wait_ns, p.producer_end_ns) << "pdl_wait() returned before the producer ended";
}

// ---------------------------------------------------------------- multi_linear

void pdl_multi_linear(PdlDevice* dev, Mode mode, int64_t T, int64_t in, const std::vector<int64_t>& outs,
                      bool f32_weights, const char* expect, uint64_t seed) {
  core::Rng rng(seed);
  std::vector<kernels::LinearWeight> ws(outs.size());
  for (size_t i = 0; i < outs.size(); ++i) {
    kernels::LinearWeight w;
    w.weight = f32_weights && i % 2 == 1 ? random_uniform_f32(rng, {outs[i], in}, 1.0 / std::sqrt(double(in)))
                                         : random_bf16_weight(rng, outs[i], in);
    ws[i] = dev->upload(w);
  }
  int64_t width = 0;
  for (int64_t o : outs) width += o + 3;  // gaps of 3 columns that must stay NaN
  const Tensor x = dev->act(random_act(rng, {T, in}, mode), mode);
  const Tensor y = dev->poisoned(act_dtype(mode), {T, width});
  const Tensor logits = dev->poisoned(DType::f32, {T, width});
  kernels::MultiLinearArgs args;
  args.x = x.view();
  args.precision = precision(mode);
  int64_t c0 = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    const bool is_logits = i == 2;  // an f32 router-like output beside rounded ones
    args.add(&ws[i], cols(is_logits ? logits : y, c0, outs[i]), !is_logits);
    c0 += outs[i] + 3;
  }
  ASSERT_EQ(dev->registry().multi_linear.select(args, dev->kind()).name, expect);
  expect_pdl_safe(dev,
                  std::string("multi_linear ") + expect + " " + mode_name(mode) + " T" + std::to_string(T) + " in" +
                      std::to_string(in),
                  {{x.view()}, {y.view(), logits.view()}},
                  [&] { dev->registry().multi_linear.run(args, dev->kind()); });
}

TEST(OpsPdl, MultiLinear) {
  K3_REQUIRE_PDL_CUDA(dev);
  // One TP8 rank's KDA group (q, k, v, g, f_a, b over hidden 7168: 6284 rows, the 16 MiB prefetch budget).
  const std::vector<int64_t> kda = {1536, 1536, 1536, 1536, 128, 12};
  pdl_multi_linear(dev, Mode::bf16, 1, 7168, kda, false, "cuda_multi_mma", 31000);
  pdl_multi_linear(dev, Mode::fp32, 2, 7168, kda, false, "cuda_multi_rowdot", 31001);
  // Odd widths: 1, 5, 54, 97 output rows (a 16-row tile cut short), T 3 and 9 (one and two n8 tiles).
  const std::vector<int64_t> odd = {1, 5, 54, 97};
  pdl_multi_linear(dev, Mode::bf16, 3, 96, odd, false, "cuda_multi_mma", 31002);
  pdl_multi_linear(dev, Mode::bf16, 9, 1000, odd, false, "cuda_multi_mma", 31003);
  pdl_multi_linear(dev, Mode::fp32, 3, 97, odd, true, "cuda_multi_rowdot", 31004);   // f32 and bf16 weights
  pdl_multi_linear(dev, Mode::bf16, 5, 17, odd, false, "cuda_multi_rowdot", 31005);  // bf16 x, odd width
}

// The MoE front with the router epilogue (one TP8 rank: 896 experts, top-16): the selection reads the
// logits the other CTAs stored, after its own wait; the graph's second replay proves the ticket is 0 again.
void pdl_moe_front(PdlDevice* dev, int64_t T, const char* expect, uint64_t seed) {
  core::Rng rng(seed);
  const int64_t in = 7168, E = 896, k = 16;
  const std::vector<int64_t> outs = {E, 3584, 768, 768};
  std::vector<kernels::LinearWeight> ws(outs.size());
  for (size_t i = 0; i < outs.size(); ++i)
    ws[i] = dev->upload(kernels::LinearWeight{random_bf16_weight(rng, outs[i], in), {}});
  const Tensor x = dev->act(random_act(rng, {T, in}, Mode::bf16), Mode::bf16);
  const Tensor bias = dev->upload(random_uniform_f32(rng, {E}, 0.05));
  const Tensor logits = dev->poisoned(DType::f32, {T, E}), y = dev->poisoned(DType::bf16, {T, 3584 + 768 + 768});
  const Tensor ids = dev->poisoned(DType::i32, {T, k}), weights = dev->poisoned(DType::f32, {T, k});
  kernels::MultiLinearArgs args;
  args.x = x.view();
  args.add(&ws[0], logits.view(), false).add(&ws[1], cols(y, 0, 3584)).add(&ws[2], cols(y, 3584, 768));
  args.add(&ws[3], cols(y, 3584 + 768, 768));
  args.router = {0, bias.view(), ids.view(), weights.view(), true, 2.5f};
  ASSERT_EQ(dev->registry().multi_linear.select(args, dev->kind()).name, expect);
  expect_pdl_safe(
      dev, std::string("moe front + router ") + expect + " T" + std::to_string(T),
      {{x.view(), bias.view()}, {logits.view(), y.view(), ids.view(), weights.view()}},
      [&] { dev->registry().multi_linear.run(args, dev->kind()); }, /*graph=*/true);
}

TEST(OpsPdl, MultiLinearRouterEpilogue) {
  K3_REQUIRE_PDL_CUDA(dev);
  pdl_moe_front(dev, 1, "cuda_multi_mma", 31100);  // the selection in the GEMM kernel
  pdl_moe_front(dev, 8, "cuda_multi_mma", 31101);  // the router kernel after the GEMM
}

// ---------------------------------------------------------------- attn_res_merge / attn_res_bank

void pdl_merge(PdlDevice* dev, Mode mode, int64_t T, int64_t D, bool in_place, const char* expect, uint64_t seed) {
  core::Rng rng(seed);
  const double q_std = 3.0 / std::sqrt(static_cast<double>(D));
  const Tensor query = dev->upload(bf16_vector(rng, D, 0.0, q_std)), norm = dev->upload(bf16_vector(rng, D, 1.0, 0.1));
  const Tensor weight = dev->upload(bf16_vector(rng, D, 1.0, 0.1));
  const Tensor prefix = dev->act(random_act(rng, {T, D}, mode, 0.0, 2.0), mode);
  const Tensor sub = dev->act(random_act(rng, {T, D}, mode), mode);
  const Tensor acc = dev->upload(random_act(rng, {T, D}, Mode::fp32, 0.0, 3.0));
  Tensor stats_h = f32_tensor({T, 2});
  for (int64_t t = 0; t < T; ++t) stats_h.data<float>()[2 * t] = 1.5f, stats_h.data<float>()[2 * t + 1] = 2.5f + t;
  const Tensor stats = dev->upload(stats_h);
  const Tensor p_out = dev->poisoned(act_dtype(mode), {T, D}), mixed = dev->poisoned(act_dtype(mode), {T, D});
  const Tensor normed = dev->poisoned(act_dtype(mode), {T, D});
  kernels::AttnResMergeArgs a;
  a.prefix = prefix.view();
  a.sublayer_out = sub.view();
  a.bank_acc = acc.view();
  a.bank_stats = stats.view();
  a.query = query.view();
  a.norm = norm.view();
  a.rmsnorm_weight = weight.view();
  a.prefix_out = in_place ? prefix.view() : p_out.view();
  a.mixed_out = mixed.view();
  a.normed_out = normed.view();
  a.precision = precision(mode);
  ASSERT_EQ(dev->registry().attn_res_merge.select(a, dev->kind()).name, expect);
  OpBuffers b{{prefix.view(), sub.view(), acc.view(), stats.view()}, {mixed.view(), normed.view()}};
  if (!in_place) b.outputs.push_back(p_out.view());
  expect_pdl_safe(dev,
                  std::string("attn_res_merge ") + expect + " " + mode_name(mode) + " T" + std::to_string(T) + " D" +
                      std::to_string(D) + (in_place ? " in place" : ""),
                  b, [&] { dev->registry().attn_res_merge.run(a, dev->kind()); });
}

TEST(OpsPdl, AttnResMerge) {
  K3_REQUIRE_PDL_CUDA(dev);
  uint64_t seed = 32000;
  for (Mode m : kModes) {
    pdl_merge(dev, m, 1, 7168, false, "cuda_merge_cluster", seed++);
    pdl_merge(dev, m, 5, 7168, true, "cuda_merge_cluster", seed++);
    pdl_merge(dev, m, 33, 7168, false, "cuda_merge_rowwise", seed++);
    pdl_merge(dev, m, 3, 97, true, "cuda_merge_cluster", seed++);   // odd hidden: the scalar path over 4 CTAs
    pdl_merge(dev, m, 2, 17, false, "cuda_merge_rowwise", seed++);  // too narrow to split: one CTA a row
  }
}

void pdl_bank(PdlDevice* dev, Mode mode, int64_t T, int64_t D, int n, int M, uint64_t seed) {
  core::Rng rng(seed);
  std::vector<Tensor> rows, qs, ns;
  std::vector<TensorView> rv, qv, nv;
  for (int j = 0; j < n; ++j) rows.push_back(dev->act(random_act(rng, {T, D}, mode, 0.0, 0.5 + j), mode));
  for (int m = 0; m < M; ++m) {
    qs.push_back(dev->upload(bf16_vector(rng, D, 0.0, 3.0 / std::sqrt(static_cast<double>(D)))));
    ns.push_back(dev->upload(bf16_vector(rng, D, 1.0, 0.1)));
  }
  for (int j = 0; j < n; ++j) rv.push_back(rows[j].view());
  for (int m = 0; m < M; ++m) qv.push_back(qs[m].view()), nv.push_back(ns[m].view());
  const Tensor acc = dev->poisoned(DType::f32, {M, T, D}), stats = dev->poisoned(DType::f32, {M, T, 2});
  const kernels::AttnResBankArgs a{rv, qv, nv, acc.view(), stats.view(), 1e-5f, precision(mode)};
  ASSERT_EQ(dev->registry().attn_res_bank.select(a, dev->kind()).name, "cuda_bank_per_mix");
  expect_pdl_safe(dev, std::string("attn_res_bank ") + mode_name(mode) + " " + shape_str({T, D, n, M}),
                  {rv, {acc.view(), stats.view()}}, [&] { dev->registry().attn_res_bank.run(a, dev->kind()); });
}

TEST(OpsPdl, AttnResBank) {
  K3_REQUIRE_PDL_CUDA(dev);
  for (Mode m : kModes) {
    pdl_bank(dev, m, 1, 7168, 9, 24, 33000);  // TP8: one mix per CTA, 24 CTAs
    pdl_bank(dev, m, 3, 97, 3, 5, 33001);     // odd hidden: the scalar path
  }
}

// ---------------------------------------------------------------- kda_decode

// One kda_decode call: sequence s has rows[s] rows at position positions[s], distinct shuffled slots out
// of rows.size() + 2.
void pdl_kda(PdlDevice* dev, Mode mode, int H, const std::vector<int64_t>& rows, bool no_commit, const char* expect,
             uint64_t seed, bool graph = false) {
  constexpr int D = 128, R = 128, K = 4;
  core::Rng rng(seed);
  const auto S = static_cast<int64_t>(rows.size());
  const int64_t slots = S + 2, P = int64_t{H} * D;
  std::vector<int32_t> begin, count, position, slot(static_cast<size_t>(slots));
  std::iota(slot.begin(), slot.end(), 0);
  for (int64_t i = slots - 1; i > 0; --i) std::swap(slot[i], slot[rng.next_u64() % static_cast<uint64_t>(i + 1)]);
  slot.resize(static_cast<size_t>(S));
  int64_t T = 0;
  int max_rows = 0;
  for (int64_t s = 0; s < S; ++s) {
    begin.push_back(static_cast<int32_t>(T));
    count.push_back(static_cast<int32_t>(rows[s]));
    position.push_back(static_cast<int32_t>(17 * s + 5));
    T += rows[s];
    max_rows = std::max(max_rows, static_cast<int>(rows[s]));
  }
  kernels::LinearWeight f_b;
  f_b.weight = random_bf16_weight(rng, P, R);
  const kernels::LinearWeight dfb = dev->upload(f_b);
  const Tensor q_conv = dev->upload(random_uniform_f32(rng, {P, 1, K}, 0.6));
  const Tensor k_conv = dev->upload(random_uniform_f32(rng, {P, 1, K}, 0.6));
  const Tensor v_conv = dev->upload(random_uniform_f32(rng, {P, 1, K}, 0.6));
  const Tensor a_log = dev->upload(random_act(rng, {int64_t{H}}, Mode::fp32, 0.0, 0.5));
  const Tensor dt_bias = dev->upload(random_act(rng, {P}, Mode::fp32));
  const Tensor o_norm = dev->upload(bf16_vector(rng, D, 1.0, 0.3));
  const Tensor proj = dev->act(random_act(rng, {T, 4 * P + R + H}, mode), mode);
  const Tensor conv = dev->upload(random_act(rng, {slots, 3, P, K - 1}, Mode::bf16), act_dtype(mode));
  const Tensor state = dev->upload(random_act(rng, {slots, H, D, D}, Mode::fp32, 0.0, 0.5));
  const Tensor rb = dev->upload(i32_host(begin, {S})), nr = dev->upload(i32_host(count, {S}));
  const Tensor pos = dev->upload(i32_host(position, {S})), sl = dev->upload(i32_host(slot, {S}));
  const Tensor out = dev->poisoned(act_dtype(mode), {T, P}), trace = dev->poisoned(act_dtype(mode), {T, P});
  kernels::KdaDecodeArgs a;
  a.q_in = cols(proj, 0, P), a.k_in = cols(proj, P, P), a.v_in = cols(proj, 2 * P, P), a.g = cols(proj, 3 * P, P);
  a.f_a = cols(proj, 4 * P, R), a.b = cols(proj, 4 * P + R, H), a.f_b = &dfb;
  a.q_conv = q_conv.view(), a.k_conv = k_conv.view(), a.v_conv = v_conv.view(), a.conv_state = conv.view();
  a.a_log = a_log.view(), a.dt_bias = dt_bias.view(), a.state = state.view(), a.o_norm = o_norm.view();
  a.out = out.view(), a.o_trace = trace.view();
  a.num_heads = H, a.head_dim = D, a.precision = precision(mode), a.no_commit = no_commit;
  a.seqs.row_begin = rb.view(), a.seqs.num_rows = nr.view(), a.seqs.position = pos.view(), a.seqs.slot = sl.view();
  a.seqs.num_seqs = static_cast<int>(S), a.seqs.max_rows = max_rows;
  for (int64_t s = 0; s < S; ++s) a.seqs.max_tokens = std::max<int64_t>(a.seqs.max_tokens, position[s] + rows[s]);
  ASSERT_EQ(dev->registry().kda_decode.select(a, dev->kind()).name, expect);
  expect_pdl_safe(
      dev,
      std::string("kda_decode ") + expect + " " + mode_name(mode) + " H" + std::to_string(H) + " seqs " +
          std::to_string(S) + " rows " + std::to_string(T) + (no_commit ? " verify" : ""),
      {{proj.view(), conv.view(), state.view(), rb.view(), nr.view(), pos.view(), sl.view()},
       {out.view(), trace.view()}},
      [&] { dev->registry().kda_decode.run(a, dev->kind()); }, graph);
}

// The V-split cluster form while 8 (or 4) slices x 12 heads x sequences fit twice on the SMs (batch 1-5 on
// the H200's 132), the head-CTA form beyond (kda_decode_ops_test.cpp has the rule).
TEST(OpsPdl, KdaDecode) {
  K3_REQUIRE_PDL_CUDA(dev);
  for (Mode m : kModes) {
    pdl_kda(dev, m, 12, {1}, false, "cuda_vsplit_cluster", 34000);                   // batch 1: 8 slices
    pdl_kda(dev, m, 12, {1, 1, 1}, false, "cuda_vsplit_cluster", 34001);             // batch 3: 4 slices
    pdl_kda(dev, m, 12, {4, 2}, true, "cuda_vsplit_cluster", 34002);                 // verify rows, no commit
    pdl_kda(dev, m, 12, std::vector<int64_t>(8, 1), false, "cuda_head_cta", 34003);  // batch 8
  }
}

// ---------------------------------------------------------------- mla_decode

// Sequences (S cache tokens after the step, T rows this step), pages of `bs` tokens from a shuffled pool.
struct MlaLayout {
  int64_t num_blocks = 0, max_blocks = 0, max_tokens = 0, tokens = 0, rows = 0;
  int max_rows = 0;
  std::vector<int32_t> begins, counts, positions, table, cache_rows;

  MlaLayout(const std::vector<std::pair<int64_t, int64_t>>& seqs, int64_t bs, core::Rng& rng) {
    const auto n = static_cast<int64_t>(seqs.size());
    int64_t blocks = 0;
    for (const auto& [S, T] : seqs) {
      blocks += (S + bs - 1) / bs;
      tokens += S;
      max_rows = std::max(max_rows, static_cast<int>(T) + 1);  // a slack slot per sequence
      max_tokens = std::max(max_tokens, S + 3);
    }
    max_blocks = (max_tokens + bs - 1) / bs;
    num_blocks = blocks + 2;
    std::vector<int32_t> pool(static_cast<size_t>(num_blocks));
    std::iota(pool.begin(), pool.end(), 0);
    for (int64_t i = num_blocks - 1; i > 0; --i)
      std::swap(pool[i], pool[rng.next_u64() % static_cast<uint64_t>(i + 1)]);
    table.assign(static_cast<size_t>(n * max_blocks), -1);
    size_t next = 0;
    for (int64_t k = 0; k < n; ++k) {
      const auto [S, T] = seqs[static_cast<size_t>(k)];
      begins.push_back(static_cast<int32_t>(rows));
      counts.push_back(static_cast<int32_t>(T));
      positions.push_back(static_cast<int32_t>(S - T));
      rows += T;
      for (int64_t b = 0; b * bs < S; ++b) table[k * max_blocks + b] = pool[next++];
      for (int64_t j = 0; j < S; ++j)
        cache_rows.push_back(static_cast<int32_t>(table[k * max_blocks + j / bs] * bs + j % bs));
    }
  }
};

// cache: "fp8", "bf16" or "f32"; TP8 dims (12 heads, nope 128, rope 64, v 128, kv_lora 512), gated.
void pdl_mla(PdlDevice* dev, Mode mode, const std::string& cache, const std::vector<std::pair<int64_t, int64_t>>& seqs,
             const char* expect, uint64_t seed, bool graph = false) {
  constexpr int H = 12, nope = 128, rope = 64, vd = 128, L = 512, E = L + rope;
  constexpr int64_t bs = 16;
  constexpr float k_scale = 0.5f;
  core::Rng rng(seed);
  const MlaLayout lay(seqs, bs, rng);
  const auto n = static_cast<int64_t>(seqs.size());
  const bool fp8 = cache == "fp8";
  Tensor host_pages = Tensor::zeros(fp8 ? DType::f8_e4m3 : DType::f32, {lay.num_blocks, bs, E});
  {
    const Tensor c_n = random_act(rng, {lay.tokens, L}, Mode::bf16),
                 k_pe = random_act(rng, {lay.tokens, rope}, Mode::bf16);
    const Tensor rows = i32_host(lay.cache_rows, {lay.tokens});
    cpu_registry().mla_cache_write.run({c_n.view(), k_pe.view(), host_pages.view(), rows.view(), k_scale},
                                       core::Device::cpu);
  }
  const Tensor pages = dev->upload(host_pages, fp8 ? DType::f8_e4m3 : cache == "bf16" ? DType::bf16 : DType::f32);
  kernels::LinearWeight kv_b;
  kv_b.weight = random_bf16_weight(rng, int64_t{H} * (nope + vd), L);
  const kernels::LinearWeight dkv_b = dev->upload(kv_b);
  const Tensor q = dev->act(random_act(rng, {lay.rows, int64_t{H} * (nope + rope)}, mode), mode);
  const Tensor gate = dev->act(random_act(rng, {lay.rows, int64_t{H} * vd}, mode, 0.0, 2.0), mode);
  const Tensor rb = dev->upload(i32_host(lay.begins, {n})), nr = dev->upload(i32_host(lay.counts, {n}));
  const Tensor pos = dev->upload(i32_host(lay.positions, {n}));
  const Tensor bt = dev->upload(i32_host(lay.table, {n, lay.max_blocks}));
  const Tensor out = dev->poisoned(act_dtype(mode), {lay.rows, int64_t{H} * vd});
  kernels::MlaDecodeArgs a;
  a.q = q.view();
  a.pages = pages.view();
  a.seqs.row_begin = rb.view(), a.seqs.num_rows = nr.view(), a.seqs.position = pos.view(),
  a.seqs.block_table = bt.view();
  a.seqs.num_seqs = static_cast<int>(n), a.seqs.max_rows = lay.max_rows, a.seqs.max_tokens = lay.max_tokens;
  a.k_scale = k_scale;
  a.kv_b = &dkv_b;
  a.gate = gate.view();
  a.out = out.view();
  a.num_heads = H, a.qk_nope = nope, a.qk_rope = rope, a.v_head_dim = vd, a.kv_lora = L;
  a.scale = 1.0f / std::sqrt(static_cast<float>(nope + rope));
  a.precision = precision(mode);
  ASSERT_EQ(dev->registry().mla_decode.select(a, dev->kind()).name, expect);
  std::string what = std::string("mla_decode ") + expect + " " + mode_name(mode) + " cache " + cache + " seqs";
  for (const auto& [S, T] : seqs) {  // appended piece by piece (GCC 12 warns falsely on chained operator+)
    what += ' ';
    what += std::to_string(S);
    what += '/';
    what += std::to_string(T);
  }
  expect_pdl_safe(
      dev, what, {{q.view(), gate.view(), pages.view(), rb.view(), nr.view(), pos.view(), bt.view()}, {out.view()}},
      [&] { dev->registry().mla_decode.run(a, dev->kind()); }, graph);
}

TEST(OpsPdl, MlaDecode) {
  K3_REQUIRE_PDL_CUDA(dev);
  // Contexts 1000 (many splits), 97 with 3 verify rows, 1 (one position).
  const std::vector<std::pair<int64_t, int64_t>> seqs = {{1000, 1}, {97, 3}, {1, 1}};
  pdl_mla(dev, Mode::bf16, "fp8", seqs, "cuda_decode_splitkv_mma", 35000);
  pdl_mla(dev, Mode::bf16, "bf16", seqs, "cuda_decode_splitkv_mma", 35001);
  pdl_mla(dev, Mode::fp32, "f32", seqs, "cuda_decode_splitkv", 35002);
  pdl_mla(dev, Mode::bf16, "fp8", {{8192, 1}}, "cuda_decode_splitkv_mma", 35003);  // batch 1 at 8K
}

// ---------------------------------------------------------------- moe_tail_combine

void pdl_tail(PdlDevice* dev, Mode mode, int64_t T, int64_t L, int64_t SI, int64_t hidden, bool shared,
              const char* expect, uint64_t seed) {
  core::Rng rng(seed);
  kernels::LinearWeight up, down;
  up.weight = random_bf16_weight(rng, hidden, L);
  down.weight = random_bf16_weight(rng, hidden, SI);
  const kernels::LinearWeight dup = dev->upload(up), ddown = dev->upload(down);
  const Tensor norm = dev->upload(bf16_vector(rng, L, 1.0, 0.1));
  const Tensor u = dev->act(random_act(rng, {T, L}, mode), mode);
  const Tensor g = dev->act(random_act(rng, {T, SI}, mode, 0.0, 2.0), mode);
  const Tensor v = dev->act(random_act(rng, {T, SI}, mode, 0.0, 2.0), mode);
  const Tensor out = dev->poisoned(act_dtype(mode), {T, hidden});
  kernels::MoeTailCombineArgs a;
  a.u = u.view();
  a.latent_norm = norm.view();
  a.latent_up = &dup;
  if (shared) {
    a.shared_gate = g.view();
    a.shared_up = v.view();
    a.shared_down = &ddown;
  }
  a.out = out.view();
  a.precision = precision(mode);
  ASSERT_EQ(dev->registry().moe_tail_combine.select(a, dev->kind()).name, expect);
  expect_pdl_safe(dev,
                  std::string("moe_tail_combine ") + expect + " " + mode_name(mode) + " " +
                      shape_str({T, L, SI, hidden}) + (shared ? "" : " no shared"),
                  {{u.view(), g.view(), v.view()}, {out.view()}},
                  [&] { dev->registry().moe_tail_combine.run(a, dev->kind()); });
}

TEST(OpsPdl, MoeTailCombine) {
  K3_REQUIRE_PDL_CUDA(dev);
  pdl_tail(dev, Mode::bf16, 1, 3584, 768, 7168, true, "cuda_tail_one_launch", 36000);  // one TP8 rank
  pdl_tail(dev, Mode::bf16, 8, 3584, 768, 7168, false, "cuda_tail_mma", 36005);
  pdl_tail(dev, Mode::fp32, 2, 3584, 768, 7168, true, "cuda_tail_rowdot", 36001);
  pdl_tail(dev, Mode::bf16, 1, 96, 40, 97, true, "cuda_tail_one_launch", 36006);  // odd hidden: a short tile
  pdl_tail(dev, Mode::bf16, 3, 96, 40, 97, true, "cuda_tail_mma", 36002);
  pdl_tail(dev, Mode::bf16, 9, 96, 40, 97, false, "cuda_tail_mma", 36003);    // no shared experts, 2 n8 tiles
  pdl_tail(dev, Mode::fp32, 3, 97, 17, 54, true, "cuda_tail_rowdot", 36004);  // odd widths
}

// ---------------------------------------------------------------- CUDA graphs

// The producer and the op captured once and replayed twice: the programmatic edges survive capture and
// every replay equals the eager run bit for bit (mla_decode: 3 dependent launches, the last a cluster
// launch, and graph-owned scratch; kda_decode: a state updated in place, restored by every replay's producer).
TEST(OpsPdl, GraphReplaysEqualTheEagerRun) {
  K3_REQUIRE_PDL_CUDA(dev);
  pdl_mla(dev, Mode::bf16, "fp8", {{1000, 1}, {97, 3}}, "cuda_decode_splitkv_mma", 37000, /*graph=*/true);
  pdl_kda(dev, Mode::bf16, 12, {1}, false, "cuda_vsplit_cluster", 37001, /*graph=*/true);
}

}  // namespace
}  // namespace k3::ops_test
