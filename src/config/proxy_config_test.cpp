// config/proxy_config_test.cpp: the builtin "k3-proxy-tp8" (one TP8 rank's share of K3 as a
// 24-layer model, for single-GPU decode numbers): its shapes equal config::shard_config(k3, 8), its layer
// schedule follows K3's, and its size (spec §4 tensor list, MXFP4 experts) is the ~52 GB expected.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "config/k3_config.h"
#include "config/shard.h"

namespace k3::config {
namespace {

// Bytes of a checkpoint of `c` as the spec §4 inventory lays it out, counted here from the config
// fields alone (checkpoint/param_inventory.cpp is the other, independent count: random_init_test
// checks the two agree). BF16 linears and norms, F32 KDA conv/A_log/dt_bias/o_norm and router bias,
// MXFP4 experts (4 bits per value + one E8M0 byte per 32 along the input).
int64_t checkpoint_bytes(const K3Config& c) {
  const int64_t h = c.hidden_size, bf16 = 2, f32 = 4;
  int64_t n = 2 * int64_t{c.vocab_size} * h * bf16;  // embedding + untied lm_head
  n += 3 * h * bf16;                                 // final AttnRes norm + query, model.norm
  const auto mxfp4 = [](int64_t out, int64_t in) { return out * in / 2 + out * in / 32; };
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    n += 6 * h * bf16;  // input/post-attention norms, two AttnRes norms and two queries
    if (c.attn_kind(l) == AttnKind::kda) {
      const int64_t H = c.kda.num_heads, D = c.kda.head_dim, P = c.kda.proj_dim(), K = c.kda.short_conv_kernel_size;
      n += (4 * P * h + D * h + P * D + H * h + h * P) * bf16;  // q k v g, f_a, f_b, b, o_proj
      n += (3 * P * K + D + P + D) * f32;                       // convs, A_log [head_dim], dt_bias, o_norm
    } else {
      const MlaConfig& m = c.mla;
      const int64_t H = m.num_heads;
      n += (m.q_lora_rank * h + H * m.q_head_dim() * m.q_lora_rank + int64_t{m.cache_dim()} * h +
            H * (m.qk_nope_head_dim + m.v_head_dim) * m.kv_lora_rank + 2 * H * m.v_head_dim * h) *
           bf16;
      n += (m.q_lora_rank + m.kv_lora_rank) * bf16;  // q_a / kv_a norms
    }
    if (c.ffn_kind(l) == FfnKind::dense) {
      n += 3 * int64_t{c.intermediate_size} * h * bf16;
    } else {
      const MoeConfig& m = c.moe;
      const int64_t E = m.num_experts, L = m.routed_expert_hidden_size, I = m.moe_intermediate_size;
      n += (E * h + 2 * L * h + 3 * int64_t{m.shared_intermediate()} * h + L) * bf16 + E * f32;
      n += E * (2 * mxfp4(I, L) + mxfp4(L, I));
    }
  }
  return n;
}

TEST(ProxyTp8, IsOneTp8RankOfK3) {
  const K3Config p = builtin_config("k3-proxy-tp8");
  // The shapes of spec §11 / §14.2, one by one.
  EXPECT_EQ(p.hidden_size, 7168);
  EXPECT_EQ(p.vocab_size, 20480);
  EXPECT_EQ(p.intermediate_size, 4224);
  EXPECT_EQ(p.kda.num_heads, 12);
  EXPECT_EQ(p.kda.head_dim, 128);
  EXPECT_EQ(p.kda.proj_dim(), 1536);
  EXPECT_EQ(p.kda.short_conv_kernel_size, 4);
  EXPECT_EQ(p.mla.num_heads, 12);
  EXPECT_EQ(p.mla.q_lora_rank, 1536);
  EXPECT_EQ(p.mla.kv_lora_rank, 512);
  EXPECT_EQ(p.mla.qk_nope_head_dim, 128);
  EXPECT_EQ(p.mla.qk_rope_head_dim, 64);
  EXPECT_EQ(p.mla.v_head_dim, 128);
  EXPECT_EQ(p.mla.cache_dim(), 576);
  EXPECT_EQ(p.moe.num_experts, 896);
  EXPECT_EQ(p.moe.num_experts_per_token, 16);
  EXPECT_EQ(p.moe.moe_intermediate_size, 384);
  EXPECT_EQ(p.moe.routed_expert_hidden_size, 3584);
  EXPECT_EQ(p.moe.shared_intermediate(), 768);  // shared gate/up [768, 7168], down [7168, 768]
  EXPECT_TRUE(p.mxfp4.enabled);
  EXPECT_EQ(p.mxfp4.group_size, 32);
  EXPECT_EQ(p.attn_res_block_size, 12);
  // ... and exactly what shard_config makes of K3 at tp 8, except the depth (24 layers, not 93)
  // and the special ids (K3's lie outside one rank's vocabulary).
  K3Config rank = shard_config(builtin_config("k3"), 8);
  rank.num_hidden_layers = p.num_hidden_layers;
  rank.attn_kinds = p.attn_kinds;
  rank.bos_token_id = p.bos_token_id;
  rank.eos_token_id = p.eos_token_id;
  rank.pad_token_id = p.pad_token_id;
  EXPECT_EQ(to_json(rank), to_json(p));
  // The tiny tokenizer's slots for this vocabulary (K3's 163584 / 163586 / 163839 = V-256, V-254, V-1).
  EXPECT_EQ(p.bos_token_id, 20480 - 256);
  EXPECT_EQ(p.eos_token_id, 20480 - 254);
  EXPECT_EQ(p.pad_token_id, 20479);
  EXPECT_NO_THROW(validate(p, "k3-proxy-tp8"));
}

TEST(ProxyTp8, LayerScheduleFollowsK3) {
  const K3Config p = builtin_config("k3-proxy-tp8");
  const K3Config k3 = builtin_config("k3");
  ASSERT_EQ(p.num_hidden_layers, 24);
  ASSERT_EQ(p.attn_kinds.size(), 24u);
  int mla = 0;
  for (int l = 0; l < 24; ++l) {
    // 0-based l is MLA when l % 4 == 3 (1-based 4, 8, ..., 24), as in K3's first 92 layers.
    EXPECT_EQ(p.attn_kind(l), l % 4 == 3 ? AttnKind::mla : AttnKind::kda) << "layer " << l;
    EXPECT_EQ(p.attn_kind(l), k3.attn_kind(l)) << "layer " << l;
    EXPECT_EQ(p.ffn_kind(l), l == 0 ? FfnKind::dense : FfnKind::moe) << "layer " << l;
    EXPECT_EQ(p.is_bank_write_layer(l), l == 0 || l == 12) << "layer " << l;
    mla += p.attn_kind(l) == AttnKind::mla;
  }
  EXPECT_EQ(mla, 6);
  EXPECT_EQ(p.attn_kind(23), AttnKind::mla);  // the last layer is MLA, as K3's layer 92 is
  EXPECT_EQ(p.max_bank_rows(), 2);
  // The written lists (1-based, HF form).
  const nlohmann::json j = to_json(p);
  EXPECT_EQ(j["linear_attn_config"]["full_attn_layers"], nlohmann::json({4, 8, 12, 16, 20, 24}));
  EXPECT_EQ(j["linear_attn_config"]["kda_layers"].size(), 18u);
  EXPECT_EQ(j["linear_attn_config"]["kda_layers"][0], 1);
  EXPECT_EQ(j["linear_attn_config"]["kda_layers"][17], 23);
}

TEST(ProxyTp8, CheckpointIsAbout52GB) {
  const K3Config p = builtin_config("k3-proxy-tp8");
  const int64_t bytes = checkpoint_bytes(p);
  std::printf("k3-proxy-tp8 checkpoint: %lld bytes (%.2f GB, %.2f GiB)\n", static_cast<long long>(bytes),
              static_cast<double>(bytes) / 1e9, static_cast<double>(bytes) / (1 << 30));
  // 23 MoE layers x 896 experts x 2,193,408 B (MXFP4 w1 + w2 + w3 of [384, 3584]) = 45.20 GB, plus
  // 6.72 GB of BF16/F32 tensors.
  EXPECT_EQ(bytes, 51'925'337'600);
  const int64_t experts = int64_t{23} * 896 * 2'193'408;
  EXPECT_EQ(experts, 45'201'752'064);
  // The counting above is the spec's: one layer-85-like KDA+MoE layer is spec §12.2's 112.58 MB of
  // KDA weights + 115.61 MB router/latent + 33.03 MB shared + 896 x 2.19 MB experts.
  K3Config one = p;
  one.num_hidden_layers = 1;
  one.first_k_dense_replace = 0;
  one.attn_kinds = {AttnKind::kda};
  one.vocab_size = 0;  // no embedding / lm_head
  const int64_t layer = checkpoint_bytes(one) - 3 * 7168 * 2 - 6 * 7168 * 2;
  EXPECT_NEAR(static_cast<double>(layer - 896 * int64_t{2'193'408}) / 1e6, 112.58 + 115.61 + 33.03, 0.05);
}

}  // namespace
}  // namespace k3::config
