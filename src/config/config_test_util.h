// config/config_test_util.h: helpers shared by the config tests (field-wise comparison, temp
// dirs, "throws core::Error whose message names X"), and the tiny config the TP8 / EP8 tests of
// runner/ and tests/gpu/ shard.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <initializer_list>
#include <string>

#include <nlohmann/json.hpp>

#include "config/k3_config.h"
#include "core/error.h"

namespace k3::config::test {

// k3-tiny-mxfp4 widened so that every sharded width divides by 8, for TP=8 (and EP=8) tests: 8 KDA
// and 8 MLA heads of 16 (rope 8), moe_intermediate 256 (32 per TP8 rank: one MXFP4 group), 8 experts
// (one per EP8 rank), shared intermediate 512, dense 512 and vocab 1024 as in k3-tiny.
inline K3Config tiny_tp8_config() {
  nlohmann::json j = to_json(builtin_config("k3-tiny-mxfp4"));
  j["linear_attn_config"]["num_heads"] = 8;
  j["linear_attn_config"]["head_dim"] = 16;
  j["num_attention_heads"] = 8;
  j["num_key_value_heads"] = 8;
  j["qk_nope_head_dim"] = 16;
  j["qk_rope_head_dim"] = 8;
  j["v_head_dim"] = 16;
  j["moe_intermediate_size"] = 256;
  j["num_experts"] = 8;
  return parse_config(j, "test:tiny_tp8");
}

// Every field of K3Config, one by one, so a failure names the field.
inline void expect_same_config(const K3Config& a, const K3Config& b) {
#define K3_EQ_FIELD(f) EXPECT_EQ(a.f, b.f) << #f
  K3_EQ_FIELD(model_type);
  K3_EQ_FIELD(vocab_size);
  K3_EQ_FIELD(hidden_size);
  K3_EQ_FIELD(num_hidden_layers);
  K3_EQ_FIELD(intermediate_size);
  K3_EQ_FIELD(rms_norm_eps);
  K3_EQ_FIELD(first_k_dense_replace);
  K3_EQ_FIELD(moe_layer_freq);
  K3_EQ_FIELD(situ_beta);
  K3_EQ_FIELD(situ_linear_beta);
  K3_EQ_FIELD(attn_res_block_size);
  K3_EQ_FIELD(tie_word_embeddings);
  K3_EQ_FIELD(bos_token_id);
  K3_EQ_FIELD(eos_token_id);
  K3_EQ_FIELD(pad_token_id);
  K3_EQ_FIELD(kda.num_heads);
  K3_EQ_FIELD(kda.head_dim);
  K3_EQ_FIELD(kda.short_conv_kernel_size);
  K3_EQ_FIELD(kda.gate_lower_bound);
  K3_EQ_FIELD(kda.use_full_rank_gate);
  K3_EQ_FIELD(kda.chunk_size);
  K3_EQ_FIELD(mla.num_heads);
  K3_EQ_FIELD(mla.q_lora_rank);
  K3_EQ_FIELD(mla.kv_lora_rank);
  K3_EQ_FIELD(mla.qk_nope_head_dim);
  K3_EQ_FIELD(mla.qk_rope_head_dim);
  K3_EQ_FIELD(mla.v_head_dim);
  K3_EQ_FIELD(mla.use_output_gate);
  K3_EQ_FIELD(moe.num_experts);
  K3_EQ_FIELD(moe.num_experts_per_token);
  K3_EQ_FIELD(moe.num_shared_experts);
  K3_EQ_FIELD(moe.moe_intermediate_size);
  K3_EQ_FIELD(moe.routed_expert_hidden_size);
  K3_EQ_FIELD(moe.latent_moe_use_norm);
  K3_EQ_FIELD(moe.renormalize);
  K3_EQ_FIELD(moe.routed_scaling_factor);
  K3_EQ_FIELD(moe.num_expert_group);
  K3_EQ_FIELD(moe.topk_group);
  K3_EQ_FIELD(mxfp4.enabled);
  if (a.mxfp4.enabled || b.mxfp4.enabled) {
    K3_EQ_FIELD(mxfp4.group_size);
  }
  K3_EQ_FIELD(attn_kinds);
#undef K3_EQ_FIELD
}

// Runs fn, expects a core::Error whose message contains every needle; returns the message.
inline std::string expect_error(const std::function<void()>& fn, std::initializer_list<std::string> needles) {
  try {
    fn();
  } catch (const core::Error& e) {
    const std::string msg = e.what();
    for (const std::string& n : needles)
      EXPECT_NE(msg.find(n), std::string::npos) << "message lacks \"" << n << "\": " << msg;
    return msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-core::Error exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no error thrown (expected one naming " << *needles.begin() << ")";
  return "";
}

// A fresh directory under the system temp dir, removed at scope exit.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() / ("k3_config_test_" + tag + "_" + (info ? info->name() : "x") +
                                                      "_" + std::to_string(static_cast<long>(::getpid())));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace k3::config::test
