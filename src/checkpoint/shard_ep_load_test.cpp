// checkpoint/shard_ep_load_test.cpp: expert-parallel loads (config::TpShard::expert_parallel, spec §11
// "EP variant"): rank r of tp holds exactly the whole routed experts [r * E / tp, (r + 1) * E / tp)
// (count, expert_begin, num_experts, full intermediate, the same bytes as the TP=1 load), everything
// else as the plain TP rank holds it, and reads in only its own bytes (never another rank's experts).
#include <gtest/gtest.h>

#include <variant>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_test_util.h"
#include "config/shard.h"

namespace k3::checkpoint {
namespace {

using namespace k3::checkpoint::testing;
using core::Shape;

const model::MoeWeights& moe_of(const model::Weights& w, size_t layer) {
  return std::get<model::MoeWeights>(w.layers[layer].ffn);
}

TEST(ShardLoadEp, EachRankHoldsExactlyItsWholeExperts) {
  for (bool mxfp4 : {false, true}) {
    TempDir dir;
    const config::K3Config cfg = config::builtin_config(mxfp4 ? "k3-tiny-mxfp4" : "k3-tiny");
    write_random_checkpoint(cfg, {.seed = 12, .mxfp4 = mxfp4}, dir.path());
    const model::Weights full = load_weights(dir.path(), cfg);
    const int64_t E = cfg.moe.num_experts, I = cfg.moe.moe_intermediate_size, L = cfg.moe.routed_expert_hidden_size;
    for (int tp : {2, 4}) {
      const int64_t held = E / tp;
      for (int r = 0; r < tp; ++r) {
        const model::Weights w = load_weights(dir.path(), cfg, config::TpShard{r, tp, true});
        int moe_layers = 0;
        for (size_t l = 0; l < w.layers.size(); ++l) {
          if (!std::holds_alternative<model::MoeWeights>(w.layers[l].ffn)) continue;
          ++moe_layers;
          const model::MoeWeights& m = moe_of(w, l);
          const model::MoeWeights& f = moe_of(full, l);
          const std::string where = "mxfp4 " + std::to_string(mxfp4) + " tp " + std::to_string(tp) + " rank " +
                                    std::to_string(r) + " layer " + std::to_string(l);
          ASSERT_EQ(static_cast<int64_t>(m.w1.size()), held) << where;
          ASSERT_EQ(static_cast<int64_t>(m.w2.size()), held) << where;
          ASSERT_EQ(static_cast<int64_t>(m.w3.size()), held) << where;
          EXPECT_TRUE(m.expert_parallel()) << where;
          EXPECT_EQ(m.expert_begin, r * held) << where;
          EXPECT_EQ(m.num_experts, E) << where;
          for (int64_t i = 0; i < held; ++i) {
            const size_t e = static_cast<size_t>(r * held + i);
            EXPECT_EQ(m.w1[static_cast<size_t>(i)].out_features(), I) << where;  // whole intermediate
            EXPECT_EQ(m.w2[static_cast<size_t>(i)].in_features(), I) << where;
            EXPECT_EQ(m.w2[static_cast<size_t>(i)].out_features(), L) << where;
            for (const auto& [got, want] :
                 {std::pair{&m.w1, &f.w1}, std::pair{&m.w2, &f.w2}, std::pair{&m.w3, &f.w3}}) {
              const model::LinearWeight& g = (*got)[static_cast<size_t>(i)];
              const model::LinearWeight& x = (*want)[e];
              ASSERT_TRUE(same_bytes(g.weight, x.weight)) << where << " expert " << e;
              EXPECT_EQ(g.is_mxfp4(), mxfp4) << where;
              if (mxfp4) {
                ASSERT_TRUE(same_bytes(g.scale, x.scale)) << where << " expert " << e;
              }
            }
          }
          // Router, latent and shared experts as the plain TP rank holds them.
          EXPECT_EQ(m.router.weight.shape(), f.router.weight.shape()) << where;
          EXPECT_EQ(m.shared_gate.weight.shape(), Shape({2 * I / tp, cfg.hidden_size})) << where;
          EXPECT_EQ(m.shared_down.weight.shape(), Shape({cfg.hidden_size, 2 * I / tp})) << where;
        }
        EXPECT_EQ(moe_layers, 3);
        if (mxfp4 && tp == 4) continue;  // plain TP needs whole MXFP4 groups per rank (64 / 4 = 16 is none)
        const model::Weights plain_tp = load_weights(dir.path(), cfg, config::TpShard{r, tp});
        EXPECT_FALSE(moe_of(plain_tp, 1).expert_parallel());
        EXPECT_TRUE(same_bytes(moe_of(w, 1).shared_gate.weight, moe_of(plain_tp, 1).shared_gate.weight));
        EXPECT_TRUE(same_bytes(moe_of(w, 1).shared_down.weight, moe_of(plain_tp, 1).shared_down.weight));
      }
    }
  }
}

// With a progress callback a rank reads in only the bytes of the tensors it holds. E / tp whole
// experts are exactly as many bytes as a slice of I / tp of all E (bf16, or MXFP4 with whole scale
// groups), so the expert-parallel rank reads what the plain TP rank reads, to the byte (whose total
// shard_load_test.cpp checks against its tensors); one more expert of another rank would show.
TEST(ShardLoadEp, ProgressReadsOnlyTheRanksExperts) {
  struct Case {
    const char* config;
    bool mxfp4;
    int tp;
  };
  for (const Case c : {Case{"k3-tiny", false, 4}, Case{"k3-tiny-mxfp4", true, 2}}) {
    TempDir dir;
    const config::K3Config cfg = config::builtin_config(c.config);
    write_random_checkpoint(cfg, {.seed = 13, .mxfp4 = c.mxfp4}, dir.path());
    for (int r : {0, c.tp - 1}) {
      const auto total = [&](bool ep) {
        std::vector<LoadProgress> reports;
        (void)load_weights(dir.path(), cfg, config::TpShard{r, c.tp, ep},
                           [&](const LoadProgress& p) { reports.push_back(p); });
        EXPECT_GE(reports.size(), 2u);
        EXPECT_TRUE(reports.back().finished());
        return reports.back().bytes_total;
      };
      EXPECT_EQ(total(true), total(false)) << c.config << " rank " << r << " of " << c.tp;
    }
    // The held experts' bytes: 3 MoE layers x E / tp experts x (w1 + w3 + w2), codes + scales.
    const model::Weights w = load_weights(dir.path(), cfg, config::TpShard{c.tp - 1, c.tp, true});
    int64_t expert_bytes = 0;
    for (size_t l = 0; l < w.layers.size(); ++l)
      if (std::holds_alternative<model::MoeWeights>(w.layers[l].ffn))
        for (const auto* v : {&moe_of(w, l).w1, &moe_of(w, l).w2, &moe_of(w, l).w3})
          for (const model::LinearWeight& x : *v)
            expert_bytes += x.weight.nbytes() + (x.is_mxfp4() ? x.scale.nbytes() : 0);
    const int64_t per_expert = c.mxfp4 ? 2 * 64 * (64 + 4) + 128 * (32 + 2) : 3 * 64 * 128 * 2;
    EXPECT_EQ(expert_bytes, 3 * (16 / c.tp) * per_expert) << c.config;
  }
}

TEST(ShardLoadEp, ErrorsNameTheProblem) {
  TempDir dir;
  const config::K3Config cfg = config::builtin_config("k3-tiny");
  write_random_checkpoint(cfg, {.seed = 14}, dir.path());
  expect_error_naming([&] { load_weights(dir.path(), cfg, config::TpShard{0, 1, true}); }, {"--tp > 1"});
  nlohmann::json j = config::to_json(cfg);
  j["num_experts"] = 10;
  const config::K3Config ten = config::parse_config(j, "test:ten_experts");
  TempDir dir10;
  write_random_checkpoint(ten, {.seed = 15}, dir10.path());
  expect_error_naming(
      [&] {
        load_weights(dir10.path(), ten, config::TpShard{1, 4, true});
      },
      {"tp=4", "num_experts = 10"});
}

}  // namespace
}  // namespace k3::checkpoint
