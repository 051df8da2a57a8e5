// runner/tp_ep_test.cpp: expert parallelism on the CPU (ModelOptions::expert_parallel, config/shard.h,
// spec §11 "EP variant" in its all-reduce form): TP=2 and 4 with EP on k3-tiny (bf16 and MXFP4
// experts; MXFP4 at TP=4 too, which plain TP cannot cut) and TP=8 with one expert per rank give the
// logits of TP=1 over prefill and decode steps, greedy generations are identical in fp32, and a
// model whose weights and options disagree, or EP with one rank, fail naming the problem.
//
// Tolerances as tp_runner_test.cpp. fp32: the row-parallel sums and the routed sum are reassociated
// (each rank sums its own routes, then the ranks are summed): 1e-5 relative with the realistic
// init, 1e-4 with the sensitive one, same argmax everywhere. bf16: e_j is rounded exactly as TP1
// rounds it (whole experts), but the attention / shared-expert row-parallel sums are still TP's
// and the routed sum is reassociated before its one rounding, so rare one-ulp flips can move router
// choices downstream: cosine >= 0.98 and argmax agreement >= 0.95, as plain TP.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "checkpoint/test_util.h"
#include "comm/thread_comm.h"
#include "config/config_test_util.h"
#include "config/shard.h"
#include "engine/one_shot.h"
#include "runner/logits_diff_test_util.h"
#include "runner/model_runner.h"
#include "runner/tp_runner.h"

namespace k3::runner {
namespace {

using checkpoint::testing::TempDir;
using test_util::random_tokens;
using test_util::tp_test_options;
using Diff = test_util::LogitsDiff;
constexpr auto compare = test_util::compare_logits;

double fp32_tolerance(checkpoint::InitStyle init) { return init == checkpoint::InitStyle::realistic ? 1e-5 : 1e-4; }

class TpEp : public ::testing::Test {
 protected:
  std::filesystem::path write(const config::K3Config& cfg, bool mxfp4, checkpoint::InitStyle init,
                              const std::string& name) {
    checkpoint::WriteOptions w;
    w.seed = 21;
    w.mxfp4 = mxfp4;
    w.init = init;
    const auto dir = tmp_.path() / name;
    checkpoint::write_random_checkpoint(cfg, w, dir);
    return dir;
  }
  TempDir tmp_;
};

// Prefill `prefill` tokens, then decode the rest one at a time: TP=1 against TP=tp with EP.
Diff ep_against_tp1(const std::filesystem::path& dir, int tp, kernels::Precision p, int prefill, int decodes,
                    uint64_t seed) {
  const auto ref = TpRunner::open(dir, 1, tp_test_options(p));
  const auto tokens = random_tokens(prefill + decodes, ref->config().vocab_size, seed);
  const auto ep = TpRunner::open(dir, tp, tp_test_options(p, 1, true));
  EXPECT_TRUE(ep->expert_parallel());
  EXPECT_EQ(ep->rank_config().moe.held_experts(), ref->config().moe.num_experts / tp);
  return compare(engine::logits(*ep, tokens, prefill), engine::logits(*ref, tokens, prefill));
}

TEST_F(TpEp, Tp2And4MatchTp1Fp32) {
  for (bool mxfp4 : {false, true})
    for (auto init : {checkpoint::InitStyle::realistic, checkpoint::InitStyle::sensitive}) {
      const std::string name = std::string(mxfp4 ? "mxfp4" : "bf16") + std::to_string(int(init));
      const auto dir = write(config::builtin_config(mxfp4 ? "k3-tiny-mxfp4" : "k3-tiny"), mxfp4, init, name);
      for (int tp : {2, 4}) {  // MXFP4 at tp 4: whole experts need no 32-wide slice of I
        const Diff d = ep_against_tp1(dir, tp, kernels::Precision::fp32, 150, 8, 31);
        EXPECT_LT(d.rel, fp32_tolerance(init)) << name << " tp=" << tp;
        EXPECT_EQ(d.top1, 1.0) << name << " tp=" << tp;
      }
    }
}

TEST_F(TpEp, Tp2And4MatchTp1Bf16) {
  for (bool mxfp4 : {false, true}) {
    const auto dir = write(config::builtin_config(mxfp4 ? "k3-tiny-mxfp4" : "k3-tiny"), mxfp4,
                           checkpoint::InitStyle::realistic, mxfp4 ? "bf16-mxfp4" : "bf16");
    for (int tp : {2, 4}) {
      const Diff d = ep_against_tp1(dir, tp, kernels::Precision::bf16, 150, 8, 32);
      EXPECT_GE(d.min_cos, 0.98) << "tp=" << tp << " mxfp4=" << mxfp4;
      EXPECT_GE(d.top1, 0.95) << "tp=" << tp << " mxfp4=" << mxfp4;
    }
  }
}

TEST_F(TpEp, GreedyGenerationIsIdenticalFp32) {
  const auto dir = write(config::builtin_config("k3-tiny"), false, checkpoint::InitStyle::sensitive, "tiny");
  const auto prompt = random_tokens(30, 1024, 33);
  const auto fp32 = kernels::Precision::fp32;
  const std::vector<int32_t> want = engine::generate(*ModelRunner::open(dir, tp_test_options(fp32)), prompt, 12, {});
  ASSERT_EQ(want.size(), 12u);
  for (int tp : {2, 4})
    EXPECT_EQ(engine::generate(*TpRunner::open(dir, tp, tp_test_options(fp32, 1, true)), prompt, 12, {}), want)
        << "tp=" << tp;
}

// TP=8 with one whole expert per rank (an 8-head, 8-expert variant of k3-tiny-mxfp4).
TEST_F(TpEp, Tp8OneExpertPerRankMatchesTp1Fp32) {
  const config::K3Config cfg = config::test::tiny_tp8_config();
  const auto dir = write(cfg, true, checkpoint::InitStyle::sensitive, "tp8");
  EXPECT_EQ(config::shard_config(cfg, 8, {.expert_parallel = true}).moe.held_experts(), 1);
  const Diff d = ep_against_tp1(dir, 8, kernels::Precision::fp32, 70, 4, 34);
  EXPECT_LT(d.rel, fp32_tolerance(checkpoint::InitStyle::sensitive));
  EXPECT_EQ(d.top1, 1.0);
}

TEST_F(TpEp, ErrorsNameTheProblem) {
  const auto dir = write(config::builtin_config("k3-tiny"), false, checkpoint::InitStyle::realistic, "tiny");
  const auto expect_error = [](const std::function<void()>& fn, std::initializer_list<std::string> needles) {
    try {
      fn();
      ADD_FAILURE() << "no error";
    } catch (const core::Error& e) {
      for (const std::string& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
  };
  expect_error([&] { TpRunner::open(dir, 1, tp_test_options(kernels::Precision::bf16, 1, true)); },
               {"--enable-expert-parallel", "--tp > 1"});
  expect_error([&] { ModelRunner::open(dir, tp_test_options(kernels::Precision::bf16, 1, true)); }, {"--tp > 1"});
  // A rank model whose weights hold whole experts but whose options say plain TP (and the reverse).
  comm::ThreadGroup group(2);
  kernels::Registry ops;
  kernels::register_reference_ops(ops);
  const config::K3Config full = config::builtin_config("k3-tiny");
  const model::Weights ep_rank = checkpoint::load_weights(dir, full, config::TpShard{1, 2, true});
  const model::Weights tp_rank = checkpoint::load_weights(dir, full, config::TpShard{1, 2});
  expect_error(
      [&] {
        model::Model(config::shard_config(full, 2, {.expert_parallel = true}), ep_rank, ops,
                     tp_test_options(kernels::Precision::bf16), core::make_host_memory(), &group.rank(1));
      },
      {"whole experts", "options.expert_parallel is off"});
  expect_error(
      [&] {
        model::Model(config::shard_config(full, 2), tp_rank, ops, tp_test_options(kernels::Precision::bf16, 1, true),
                     core::make_host_memory(), &group.rank(1));
      },
      {"not split by expert", "options.expert_parallel is on"});
}

}  // namespace
}  // namespace k3::runner
