// tests/model_test.cpp: the K3 model end to end on the CPU oracle: prefill/decode
// equivalence, batching, chunked vs recurrent KDA, caches, AttnRes schedule, other configs.
#include "model/model.h"

#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "core/rng.h"
#include "engine/one_shot.h"
#include "model/local_cache.h"
#include "runner/model_runner.h"
#include "test_util.h"

namespace k3 {
namespace {

using model::LogitRows;
using model::SequenceInput;
using model::StepKind;
using testing::compare;

using testing::random_tokens;

model::ModelOptions fp32_options() {
  model::ModelOptions o;
  o.precision = kernels::Precision::fp32;
  o.poison_buffers = true;
  return o;
}

class TinyModel : public ::testing::TestWithParam<checkpoint::InitStyle> {
 protected:
  std::unique_ptr<runner::ModelRunner> open(const model::ModelOptions& o, bool mxfp4 = false,
                                            model::KvCacheDtype kv = model::KvCacheDtype::bf16) {
    checkpoint::WriteOptions w;
    w.init = GetParam();
    w.mxfp4 = mxfp4;
    const auto dir = testing::write_checkpoint(tmp_, config::builtin_config("k3-tiny"), w, mxfp4 ? "mxfp4" : "bf16");
    return runner::ModelRunner::open(dir, o, kv);
  }
  testing::TempDir tmp_;
};

// Spec §14.1 test inputs: prefill(150) then 8 decode steps and one 4-token verify step must
// match prefill(150 + 12).
TEST_P(TinyModel, PrefillThenDecodeMatchesFullPrefillFp32) {
  auto r = open(fp32_options());
  const auto tokens = random_tokens(162, r->config().vocab_size, 1);
  const core::Tensor full = engine::logits(*r, tokens, 162);

  const model::Model& m = r->model();
  model::LocalCache cache(r->config(), 1, 162, model::KvCacheDtype::bf16, /*block_size=*/7);  // odd pages
  model::SequenceState s = cache.new_sequence();
  std::vector<core::Tensor> parts;
  SequenceInput in{std::span(tokens).first(150), &s, StepKind::prefill};
  parts.push_back(m.forward(cache.storage(), {&in, 1}, LogitRows::all));
  for (int t = 150; t < 158; ++t) {
    in = {std::span(tokens).subspan(static_cast<size_t>(t), 1), &s, StepKind::decode};
    parts.push_back(m.forward(cache.storage(), {&in, 1}, LogitRows::all));
  }
  in = {std::span(tokens).subspan(158, 4), &s, StepKind::decode};  // verify rows
  parts.push_back(m.forward(cache.storage(), {&in, 1}, LogitRows::all));
  EXPECT_EQ(s.num_tokens, 162);

  int64_t row = 0;
  for (const auto& p : parts) {
    const core::Tensor ref = model::row_slice(full, row, row + p.dim(0));
    const auto d = compare(p, ref);
    EXPECT_LT(d.rel(), 1e-4) << "rows " << row << ".." << row + p.dim(0);
    row += p.dim(0);
  }
}

TEST_P(TinyModel, DecodeFromMatchesPrefillInBf16) {
  auto r = open({});
  const auto tokens = random_tokens(60, r->config().vocab_size, 2);
  const auto d = compare(engine::logits(*r, tokens, 40), engine::logits(*r, tokens, 60));
  EXPECT_GT(d.cosine, 0.99);
  EXPECT_GE(d.top1_agreement, 0.9);
}

TEST_P(TinyModel, ChunkedAndRecurrentPrefillAgreeFp32) {
  auto chunked = open(fp32_options());
  model::ModelOptions o = fp32_options();
  o.kda_chunked_prefill = false;
  auto recurrent = open(o);
  const auto tokens = random_tokens(150, chunked->config().vocab_size, 3);
  EXPECT_LT(compare(engine::logits(*chunked, tokens, 150), engine::logits(*recurrent, tokens, 150)).rel(), 1e-4);
}

// Rows of one sequence never see another's: batching changes no bit.
TEST_P(TinyModel, BatchedSequencesEqualEachAlone) {
  auto r = open({});
  const model::Model& m = r->model();
  const int V = r->config().vocab_size;
  const auto a = random_tokens(23, V, 4), b = random_tokens(9, V, 5);

  model::LocalCache cache(r->config(), 4, 32);
  model::SequenceState sa = cache.new_sequence(), sb = cache.new_sequence();
  SequenceInput first[] = {{std::span(a).first(20), &sa, StepKind::prefill},
                           {std::span(b).first(4), &sb, StepKind::prefill}};
  const core::Tensor batch1 = m.forward(cache.storage(), first, LogitRows::all);
  SequenceInput second[] = {{std::span(a).subspan(20, 1), &sa, StepKind::decode},  // mixed step
                            {std::span(b).subspan(4, 5), &sb, StepKind::prefill}};
  const core::Tensor batch2 = m.forward(cache.storage(), second, LogitRows::last);

  model::SequenceState ra = cache.new_sequence(), rb = cache.new_sequence();
  SequenceInput in{std::span(a).first(20), &ra, StepKind::prefill};
  const core::Tensor alone_a1 = m.forward(cache.storage(), {&in, 1}, LogitRows::all);
  in = {std::span(b).first(4), &rb, StepKind::prefill};
  const core::Tensor alone_b1 = m.forward(cache.storage(), {&in, 1}, LogitRows::all);
  in = {std::span(a).subspan(20, 1), &ra, StepKind::decode};
  const core::Tensor alone_a2 = m.forward(cache.storage(), {&in, 1}, LogitRows::last);
  in = {std::span(b).subspan(4, 5), &rb, StepKind::prefill};
  const core::Tensor alone_b2 = m.forward(cache.storage(), {&in, 1}, LogitRows::last);

  EXPECT_EQ(compare(model::row_slice(batch1, 0, 20), alone_a1).max_abs, 0.0);
  EXPECT_EQ(compare(model::row_slice(batch1, 20, 24), alone_b1).max_abs, 0.0);
  EXPECT_EQ(compare(model::row_slice(batch2, 0, 1), alone_a2).max_abs, 0.0);
  EXPECT_EQ(compare(model::row_slice(batch2, 1, 2), alone_b2).max_abs, 0.0);
}

TEST_P(TinyModel, Fp8LatentCacheStaysClose) {
  auto fp8 = open({}, false, model::KvCacheDtype::fp8_e4m3);
  auto bf16 = open({});
  const auto tokens = random_tokens(40, bf16->config().vocab_size, 6);
  const auto d = compare(engine::logits(*fp8, tokens, 30), engine::logits(*bf16, tokens, 30));
  EXPECT_GT(d.cosine, 0.98);
  EXPECT_GT(d.max_abs, 0.0);  // the fp8 cache is really used
}

TEST_P(TinyModel, Mxfp4CheckpointRunsAndDecodesConsistently) {
  auto r = open(fp32_options(), /*mxfp4=*/true);
  const auto tokens = random_tokens(30, r->config().vocab_size, 7);
  EXPECT_LT(compare(engine::logits(*r, tokens, 20), engine::logits(*r, tokens, 30)).rel(), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Inits, TinyModel,
                         ::testing::Values(checkpoint::InitStyle::realistic, checkpoint::InitStyle::sensitive),
                         [](const auto& info) {
                           return info.param == checkpoint::InitStyle::realistic ? "realistic" : "sensitive";
                         });

// A K3-family config unlike k3-tiny: more layers, other block size, dense prefix of 2,
// other head counts and sizes, conv width 3, one shared expert, top-2 of 8.
config::K3Config other_family_config() {
  config::K3Config c = config::builtin_config("k3-tiny");
  c.num_hidden_layers = 7;
  c.hidden_size = 96;
  c.vocab_size = 300;
  c.bos_token_id = c.eos_token_id = c.pad_token_id = -1;  // k3-tiny's sit above 300
  c.intermediate_size = 160;
  c.first_k_dense_replace = 2;
  c.attn_res_block_size = 3;
  c.kda.num_heads = 3;
  c.kda.head_dim = 16;
  c.kda.short_conv_kernel_size = 3;
  c.kda.chunk_size = 16;
  c.mla.num_heads = 2;
  c.mla.q_lora_rank = 48;
  c.mla.kv_lora_rank = 24;
  c.mla.qk_nope_head_dim = 16;
  c.mla.qk_rope_head_dim = 8;
  c.mla.v_head_dim = 12;
  c.moe.num_experts = 8;
  c.moe.num_experts_per_token = 2;
  c.moe.num_shared_experts = 1;
  c.moe.moe_intermediate_size = 32;
  c.moe.routed_expert_hidden_size = 64;
  c.attn_kinds = {config::AttnKind::kda, config::AttnKind::mla, config::AttnKind::kda, config::AttnKind::kda,
                  config::AttnKind::mla, config::AttnKind::kda, config::AttnKind::mla};
  config::validate(c, "other_family_config");
  return c;
}

TEST(OtherConfig, AnyK3FamilyConfigLoadsAndDecodesConsistently) {
  testing::TempDir tmp;
  checkpoint::WriteOptions w;
  w.init = checkpoint::InitStyle::sensitive;
  auto r = runner::ModelRunner::open(testing::write_checkpoint(tmp, other_family_config(), w), fp32_options());
  const auto tokens = random_tokens(45, 300, 8);
  EXPECT_LT(compare(engine::logits(*r, tokens, 33), engine::logits(*r, tokens, 45)).rel(), 1e-4);
}

// Registry instrumentation: a higher-priority attn_res_mix that records the number of
// sources per call, then defers to the reference.
TEST(AttnResSchedule, SourceCountsPerLayerAndBankSnapshot) {
  config::K3Config c = other_family_config();
  c.num_hidden_layers = 26;  // spans three 12-layer blocks like K3's first 26 layers
  c.attn_res_block_size = 12;
  c.attn_kinds.assign(26, config::AttnKind::kda);
  for (int l = 3; l < 26; l += 4) c.attn_kinds[static_cast<size_t>(l)] = config::AttnKind::mla;
  config::validate(c, "attn_res_schedule");
  testing::TempDir tmp;
  const auto loaded = checkpoint::load_checkpoint(testing::write_checkpoint(tmp, c));

  kernels::Registry reg;
  std::vector<size_t> counts;
  std::vector<std::vector<float>> last_source;  // the prefix row each mix saw
  // Registered before the references: with no tuning rule, the first capable one runs.
  reg.attn_res_mix.add({"recording", core::Device::cpu, nullptr, [&](const kernels::AttnResMixArgs& a) {
                          counts.push_back(a.sources.size());
                          auto p = a.sources.back().span<const float>();
                          last_source.emplace_back(p.begin(), p.end());
                          kernels::attn_res_mix_reference(a);
                        }});
  kernels::register_reference_ops(reg);
  model::Model m(loaded.config, loaded.weights, reg, {});
  std::map<int, std::vector<float>> attn_out;
  model::TraceFn trace = [&](std::string_view name, int layer, const core::TensorView& v) {
    if (name == "attn.out") attn_out[layer].assign(v.span<const float>().begin(), v.span<const float>().end());
  };
  model::LocalCache cache(loaded.config, 1, 1);
  model::SequenceState s = cache.new_sequence();
  const std::vector<int32_t> tok = {5};
  SequenceInput in{tok, &s, StepKind::prefill};
  m.forward(cache.storage(), {&in, 1}, LogitRows::all, &trace);

  // Expected (spec §3): attention side ceil(l/12)+1 sources (no mix at l = 0), FFN side
  // floor(l/12)+2, final mix |bank|+1.
  std::vector<size_t> expected;
  for (int l = 0; l < 26; ++l) {
    if (l > 0) expected.push_back(static_cast<size_t>((l + 11) / 12 + 1));
    expected.push_back(static_cast<size_t>(l / 12 + 2));
  }
  expected.push_back(static_cast<size_t>((26 + 11) / 12 + 1));
  EXPECT_EQ(counts, expected);

  // Bank snapshot rule at the write layer 12: its FFN-side mix sees the attention output as
  // the restarted prefix (not prefix + output).
  size_t call = 0;  // index of layer 12's FFN-side call
  for (int l = 0; l < 12; ++l) call += (l > 0) + 1;
  call += 1;  // layer 12's attention-side call
  EXPECT_EQ(last_source.at(call), attn_out.at(12));
  EXPECT_NE(last_source.at(call - 1), attn_out.at(12));
}

}  // namespace
}  // namespace k3
