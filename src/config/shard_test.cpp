// config/shard_test.cpp: the per-rank config of tensor parallelism: which sizes are divided (and
// which stay), the K3 TP8/TP16 numbers of spec §11, and errors naming the field and tp.
#include "config/shard.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "config/config_test_util.h"

namespace k3::config {
namespace {

using test::expect_error;

TEST(ShardConfig, Tp1IsTheFullConfig) {
  const K3Config full = builtin_config("k3-tiny");
  test::expect_same_config(shard_config(full, 1), full);
}

TEST(ShardConfig, DividesTheShardedSizesAndKeepsTheRest) {
  const K3Config full = builtin_config("k3-tiny");
  for (int tp : {2, 4}) {
    const K3Config c = shard_config(full, tp);
    EXPECT_EQ(c.vocab_size, 1024 / tp);
    EXPECT_EQ(c.kda.num_heads, 4 / tp);
    EXPECT_EQ(c.mla.num_heads, 4 / tp);
    EXPECT_EQ(c.intermediate_size, 512 / tp);
    EXPECT_EQ(c.moe.moe_intermediate_size, 64 / tp);
    EXPECT_EQ(c.moe.shared_intermediate(), 2 * 64 / tp);  // shared experts follow the expert split
    // Replicated: widths of the router, latent, LoRA ranks, head dims, norms and the layer schedule.
    EXPECT_EQ(c.hidden_size, full.hidden_size);
    EXPECT_EQ(c.kda.head_dim, full.kda.head_dim);
    EXPECT_EQ(c.mla.q_lora_rank, full.mla.q_lora_rank);
    EXPECT_EQ(c.mla.kv_lora_rank, full.mla.kv_lora_rank);
    EXPECT_EQ(c.mla.qk_nope_head_dim, full.mla.qk_nope_head_dim);
    EXPECT_EQ(c.mla.v_head_dim, full.mla.v_head_dim);
    EXPECT_EQ(c.moe.num_experts, full.moe.num_experts);
    EXPECT_EQ(c.moe.num_experts_per_token, full.moe.num_experts_per_token);
    EXPECT_EQ(c.moe.routed_expert_hidden_size, full.moe.routed_expert_hidden_size);
    EXPECT_EQ(c.attn_kinds, full.attn_kinds);
    EXPECT_EQ(c.num_hidden_layers, full.num_hidden_layers);
    // Token facts stay global (they may lie above the rank's vocabulary slice).
    EXPECT_EQ(c.eos_token_id, full.eos_token_id);
    EXPECT_EQ(c.pad_token_id, full.pad_token_id);
  }
}

TEST(ShardConfig, K3PerGpuShapesOfSpec11) {
  const K3Config k3 = builtin_config("k3");
  const K3Config tp8 = shard_config(k3, 8), tp16 = shard_config(k3, 16);
  EXPECT_EQ(tp8.kda.num_heads, 12);
  EXPECT_EQ(tp8.kda.proj_dim(), 1536);
  EXPECT_EQ(tp8.mla.num_heads, 12);
  EXPECT_EQ(tp8.moe.moe_intermediate_size, 384);
  EXPECT_EQ(tp8.moe.shared_intermediate(), 768);
  EXPECT_EQ(tp8.intermediate_size, 4224);
  EXPECT_EQ(tp8.vocab_size, 20480);
  EXPECT_EQ(tp16.kda.num_heads, 6);
  EXPECT_EQ(tp16.moe.moe_intermediate_size, 192);
  EXPECT_EQ(tp16.moe.shared_intermediate(), 384);
  EXPECT_EQ(tp16.intermediate_size, 2112);
  EXPECT_EQ(tp16.vocab_size, 10240);
  EXPECT_TRUE(k3.mxfp4.enabled);  // 192 and 384 are whole MXFP4 groups
}

TEST(ShardConfig, ErrorsNameTheFieldAndTp) {
  const K3Config tiny = builtin_config("k3-tiny");
  expect_error([&] { shard_config(tiny, 8); }, {"tp=8", "linear_attn_config.num_heads", "4"});
  expect_error([&] { shard_config(tiny, 3); }, {"tp=3", "vocab_size", "1024"});
  expect_error([&] { shard_config(tiny, 0); }, {"tp must be >= 1", "0"});
  // MLA heads: only KDA heads divisible.
  nlohmann::json j = to_json(tiny);
  j["num_attention_heads"] = 2;
  j["num_key_value_heads"] = 2;
  expect_error([&] { shard_config(parse_config(j), 4); }, {"tp=4", "num_attention_heads", "= 2", "MLA heads"});
  j = to_json(tiny);
  j["intermediate_size"] = 510;
  expect_error([&] { shard_config(parse_config(j), 4); }, {"tp=4", "intermediate_size", "510"});
  j = to_json(tiny);
  j["moe_intermediate_size"] = 66;
  expect_error([&] { shard_config(parse_config(j), 4); }, {"tp=4", "moe_intermediate_size", "66"});
  // MXFP4: 64 / 2 = 32 is one whole group, 64 / 4 = 16 is not.
  const K3Config mxfp4 = builtin_config("k3-tiny-mxfp4");
  EXPECT_EQ(shard_config(mxfp4, 2).moe.moe_intermediate_size, 32);
  expect_error([&] { shard_config(mxfp4, 4); }, {"tp=4", "moe_intermediate_size = 64", "16", "MXFP4", "32"});
  // A size no layer uses is not checked: MLA heads of an all-KDA model.
  j = to_json(tiny);
  j["num_attention_heads"] = 3;
  j["num_key_value_heads"] = 3;
  j["linear_attn_config"]["kda_layers"] = {1, 2, 3, 4};
  j["linear_attn_config"]["full_attn_layers"] = nlohmann::json::array();
  EXPECT_EQ(shard_config(parse_config(j), 2).mla.num_heads, 3);
}

// Expert parallelism: whole routed experts per rank (E / tp of them, moe_intermediate_size kept), the
// shared experts still split; the rest exactly as plain TP.
TEST(ShardConfig, ExpertParallelKeepsWholeExpertsAndSplitsTheShared) {
  const K3Config tiny = builtin_config("k3-tiny");
  for (int tp : {2, 4}) {
    const K3Config tp_cfg = shard_config(tiny, tp), ep = shard_config(tiny, tp, {.expert_parallel = true});
    EXPECT_EQ(ep.moe.moe_intermediate_size, 64);
    EXPECT_EQ(ep.moe.expert_parallel_size, tp);
    EXPECT_EQ(ep.moe.held_experts(), 16 / tp);
    EXPECT_EQ(ep.moe.num_experts, 16);  // ids and the router stay global
    EXPECT_EQ(ep.moe.shared_intermediate(), tp_cfg.moe.shared_intermediate());
    EXPECT_EQ(ep.vocab_size, tp_cfg.vocab_size);
    EXPECT_EQ(ep.kda.num_heads, tp_cfg.kda.num_heads);
    EXPECT_EQ(ep.intermediate_size, tp_cfg.intermediate_size);
    EXPECT_EQ(tp_cfg.moe.expert_parallel_size, 0);
    EXPECT_EQ(tp_cfg.moe.held_experts(), 16);
  }
  // K3 at EP8: 112 whole experts of I 3072 per GPU, shared 6144 / 8 (spec §11 "EP variant").
  const K3Config k3 = shard_config(builtin_config("k3"), 8, {.expert_parallel = true});
  EXPECT_EQ(k3.moe.held_experts(), 112);
  EXPECT_EQ(k3.moe.moe_intermediate_size, 3072);
  EXPECT_EQ(k3.moe.shared_intermediate(), 768);
  // MXFP4: the 32-group check is about a slice of I, which EP never cuts (64 / 4 = 16 fails as TP).
  const K3Config mx = shard_config(builtin_config("k3-tiny-mxfp4"), 4, {.expert_parallel = true});
  EXPECT_EQ(mx.moe.moe_intermediate_size, 64);
  EXPECT_EQ(mx.moe.held_experts(), 4);
}

TEST(ShardConfig, ExpertParallelErrorsNameTheProblem) {
  const K3Config tiny = builtin_config("k3-tiny");
  expect_error([&] { shard_config(tiny, 1, {.expert_parallel = true}); },
               {"--enable-expert-parallel", "--tp > 1", "--tp 1"});
  expect_error([] { check_expert_parallel(true, 1); }, {"--tp > 1"});
  check_expert_parallel(false, 1);
  check_expert_parallel(true, 2);
  nlohmann::json j = to_json(tiny);
  j["num_experts"] = 12;  // 3 whole experts per rank at tp 4
  EXPECT_EQ(shard_config(parse_config(j), 4, {.expert_parallel = true}).moe.held_experts(), 3);
  j["num_experts"] = 10;
  expect_error([&] { shard_config(parse_config(j), 4, {.expert_parallel = true}); },
               {"tp=4", "num_experts = 10", "routed experts"});
  EXPECT_EQ(shard_config(parse_config(j), 4).moe.moe_intermediate_size, 16);  // plain TP does not need it
}

TEST(ShardConfig, CheckShard) {
  check_shard({0, 1});
  check_shard({3, 4});
  expect_error([] { check_shard({4, 4}); }, {"rank 4", "4 ranks"});
  expect_error([] { check_shard({-1, 2}); }, {"rank -1"});
  expect_error([] { check_shard({0, 0}); }, {"0 ranks"});
  const TpShard s{2, 4};
  EXPECT_EQ(s.begin(1024), 512);
  EXPECT_EQ(s.extent(1024), 256);
}

}  // namespace
}  // namespace k3::config
