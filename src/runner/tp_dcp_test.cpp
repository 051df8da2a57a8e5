// runner/tp_dcp_test.cpp: decode context parallelism on the CPU (kernels/mla/mla_cp.h): TP=2 and 4
// with dcp = tp on k3-tiny (its layer 3 is MLA) give the logits of TP=1 over
// prefill, decode, verify + commit and mixed batches, greedy generation is identical in fp32, each
// rank's cache really holds only its 1/cp of the tokens (the right ones), and bad dcp values fail
// with a clear error.
//
// Tolerances as tp_runner_test.cpp: fp32 differs from TP1 only by the order of fp32 sums (the
// row-parallel sums, and for decode rows the two-level softmax of the log-sum-exp combine); prefill
// rows take the naive form over the gathered context as TP1 does (tp_dcp_naive_test.cpp: bit for bit
// the non-DCP prefill at the same TP). bf16 is compared by cosine and argmax agreement.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "checkpoint/test_util.h"
#include "core/rng.h"
#include "engine/one_shot.h"
#include "model/local_cache.h"
#include "runner/logits_diff_test_util.h"
#include "runner/model_runner.h"
#include "runner/tp_runner.h"

namespace k3::runner {
namespace {

using checkpoint::testing::TempDir;
using model::StepKind;

using test_util::random_tokens;
using test_util::tp_test_options;
using Diff = test_util::LogitsDiff;
constexpr auto compare = test_util::compare_logits;

// A cache on rank `rank` for `sequences` sequences of up to `tokens` tokens in pages of 7 (so no
// sequence length below is a multiple of cp * block_size): ceil(tokens / dcp) local positions each.
model::LocalCache rank_cache(const TpRunner& r, const model::Model& m, int sequences, int64_t tokens) {
  return model::LocalCache(r.rank_config(), sequences, (tokens + r.dcp() - 1) / r.dcp(), r.kv_cache(), /*block_size=*/7,
                           core::make_host_memory(), m.options().precision);
}

// Prefill `prefill` tokens, `decodes` single-token decodes, a 4-row verify step accepting 2 rows
// (commit_verified), then 2 decodes of new tokens at the rejected rows' positions (their MLA entries
// are overwritten): rank 0's logits of every row run, stacked.
constexpr int kExtra = 4 + 2;  // tokens past the prefill and decodes
core::Tensor staged_logits(const TpRunner& r, const std::vector<int32_t>& tokens, int prefill, int decodes) {
  const int64_t V = r.config().vocab_size, rows = static_cast<int64_t>(tokens.size());
  EXPECT_EQ(rows, prefill + decodes + kExtra);
  core::Tensor out = core::Tensor::zeros(core::DType::f32, {rows, V});
  r.run([&](int rank, const model::Model& m, comm::Communicator&) {
    model::LocalCache cache = rank_cache(r, m, 1, rows);
    model::SequenceState s = cache.new_sequence();
    int64_t next = 0;  // token index = logits row
    model::VerifyCapture capture;
    auto step = [&](int64_t n, StepKind kind, bool verify) {
      model::SequenceInput in{std::span(tokens).subspan(static_cast<size_t>(next), static_cast<size_t>(n)), &s, kind};
      in.verify = verify;
      const core::Tensor logits = m.forward(cache.storage(), {&in, 1}, model::LogitRows::all, nullptr,
                                            verify ? &capture : nullptr);
      if (rank == 0) std::copy_n(logits.data<const float>(), logits.numel(), out.data<float>() + next * V);
      next += n;
    };
    step(prefill, StepKind::prefill, false);
    for (int i = 0; i < decodes; ++i) step(1, StepKind::decode, false);
    step(4, StepKind::decode, true);
    const int32_t accepted[] = {2};
    m.commit_verified(cache.storage(), capture, accepted);
    EXPECT_EQ(s.num_tokens, prefill + decodes + 2);
    for (int i = 0; i < 2; ++i) step(1, StepKind::decode, false);
  });
  return out;
}

class TpDcp : public ::testing::Test {
 protected:
  std::filesystem::path write(checkpoint::InitStyle init, const std::string& name) {
    checkpoint::WriteOptions w;
    w.seed = 23;
    w.init = init;
    const auto dir = tmp_.path() / name;
    checkpoint::write_random_checkpoint(config::builtin_config("k3-tiny"), w, dir);
    return dir;
  }
  TempDir tmp_;
};

// Prompts of 1 (ranks > 0 hold nothing after the prefill), 37 and 97 tokens.
constexpr int kPrompts[] = {1, 37, 97};
constexpr int kDecodes = 3;

TEST_F(TpDcp, MatchesTp1Fp32) {
  for (auto init : {checkpoint::InitStyle::realistic, checkpoint::InitStyle::sensitive}) {
    SCOPED_TRACE(init == checkpoint::InitStyle::realistic ? "realistic init" : "sensitive init");
    const auto dir = write(init, "fp32-" + std::to_string(int(init)));
    // As tp_runner_test (observed values: docs/perf/kernel-notes.md, test tolerances).
    const double tolerance = init == checkpoint::InitStyle::realistic ? 1e-5 : 1e-4;
    const auto ref_runner = TpRunner::open(dir, 1, tp_test_options(kernels::Precision::fp32, 1));
    std::vector<std::unique_ptr<TpRunner>> runners;
    for (int tp : {2, 4}) runners.push_back(TpRunner::open(dir, tp, tp_test_options(kernels::Precision::fp32, tp)));
    for (int prompt : kPrompts) {
      const auto tokens = random_tokens(prompt + kDecodes + kExtra, 1024, 100 + prompt);
      const core::Tensor ref = staged_logits(*ref_runner, tokens, prompt, kDecodes);
      for (const auto& r : runners) {
        const Diff d = compare(staged_logits(*r, tokens, prompt, kDecodes), ref);
        EXPECT_LT(d.rel, tolerance) << "tp=dcp=" << r->tp() << " prompt=" << prompt;
        EXPECT_EQ(d.top1, 1.0) << "tp=dcp=" << r->tp() << " prompt=" << prompt;
      }
    }
  }
}

TEST_F(TpDcp, MatchesTp1Bf16) {
  const auto dir = write(checkpoint::InitStyle::realistic, "bf16");
  const auto ref_runner = TpRunner::open(dir, 1, tp_test_options(kernels::Precision::bf16, 1));
  for (int tp : {2, 4}) {
    const auto r = TpRunner::open(dir, tp, tp_test_options(kernels::Precision::bf16, tp));
    for (int prompt : kPrompts) {
      const auto tokens = random_tokens(prompt + kDecodes + kExtra, 1024, 200 + prompt);
      const Diff d = compare(staged_logits(*r, tokens, prompt, kDecodes),
                             staged_logits(*ref_runner, tokens, prompt, kDecodes));
      EXPECT_GE(d.min_cos, 0.98) << "tp=dcp=" << tp << " prompt=" << prompt;
      EXPECT_GE(d.top1, 0.95) << "tp=dcp=" << tp << " prompt=" << prompt;
    }
  }
}

// Two sequences in one batch with mixed kinds: a chunked prefill continuing next to a decode.
TEST_F(TpDcp, MixedBatchMatchesTp1Fp32) {
  const auto dir = write(checkpoint::InitStyle::sensitive, "mixed");
  const auto a = random_tokens(40, 1024, 31), b = random_tokens(40, 1024, 32);
  auto run = [&](const TpRunner& r) {
    std::vector<core::Tensor> out;
    r.run([&](int rank, const model::Model& m, comm::Communicator&) {
      model::LocalCache cache = rank_cache(r, m, 2, 40);
      model::SequenceState sa = cache.new_sequence(), sb = cache.new_sequence();
      auto step = [&](std::vector<model::SequenceInput> batch) {
        const core::Tensor logits = m.forward(cache.storage(), batch, model::LogitRows::all);
        if (rank == 0) out.push_back(logits);
      };
      auto in = [](const std::vector<int32_t>& t, int64_t from, int64_t n, model::SequenceState& s, StepKind k) {
        return model::SequenceInput{std::span(t).subspan(static_cast<size_t>(from), static_cast<size_t>(n)), &s, k};
      };
      step({in(a, 0, 20, sa, StepKind::prefill), in(b, 0, 13, sb, StepKind::prefill)});
      step({in(a, 20, 1, sa, StepKind::decode), in(b, 13, 9, sb, StepKind::prefill)});
      step({in(b, 22, 1, sb, StepKind::decode), in(a, 21, 1, sa, StepKind::decode)});
    });
    return out;
  };
  const auto ref = run(*TpRunner::open(dir, 1, tp_test_options(kernels::Precision::fp32, 1)));
  for (int tp : {2, 4}) {
    const auto got = run(*TpRunner::open(dir, tp, tp_test_options(kernels::Precision::fp32, tp)));
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      const Diff d = compare(got[i], ref[i]);
      EXPECT_LT(d.rel, 1e-4) << "tp=dcp=" << tp << " step " << i;
      EXPECT_EQ(d.top1, 1.0) << "tp=dcp=" << tp << " step " << i;
    }
  }
}

TEST_F(TpDcp, GreedyGenerationIsIdenticalFp32) {
  const auto dir = write(checkpoint::InitStyle::sensitive, "greedy");
  const auto prompt = random_tokens(30, 1024, 5);
  const std::vector<int32_t> want = engine::generate(
      *ModelRunner::open(dir, tp_test_options(kernels::Precision::fp32, 1)), prompt, 40, {});
  ASSERT_EQ(want.size(), 40u);  // no eos this early on this random model and prompt
  for (int tp : {2, 4}) {
    const auto r = TpRunner::open(dir, tp, tp_test_options(kernels::Precision::fp32, tp));
    EXPECT_EQ(engine::generate(*r, prompt, 40, {}), want) << "tp=dcp=" << tp;
  }
}

// Each rank's cache is sized for ceil(n / cp) positions, and after a prefill of n tokens rank r's
// local position j holds what TP1's cache holds at global position j * cp + r (fp32: equal up to
// the TP reassociation of the layer input); its positions past its share stay untouched (zero).
TEST_F(TpDcp, EachRankHoldsItsShareOfTheCache) {
  const auto dir = write(checkpoint::InitStyle::realistic, "share");
  constexpr int64_t n = 37;
  const int mla_layer = 3;  // k3-tiny: KDA, KDA, KDA, MLA
  const auto tokens = random_tokens(n, 1024, 77);
  // Every rank's layer-3 cache entries in local order: [local positions, width].
  auto entries = [&](const TpRunner& r) {
    std::vector<std::vector<float>> out(static_cast<size_t>(r.tp()));
    r.run([&](int rank, const model::Model& m, comm::Communicator&) {
      model::LocalCache cache = r.new_cache(rank, n);
      model::SequenceState s = cache.new_sequence();
      const int64_t local = (n + r.dcp() - 1) / r.dcp(), bs = cache.storage().storage_config().block_size;
      EXPECT_EQ(static_cast<int64_t>(s.block_table.size()), (local + bs - 1) / bs);
      EXPECT_EQ(cache.storage().storage_config().num_blocks, (local + bs - 1) / bs);
      const model::SequenceInput in{tokens, &s, StepKind::prefill};
      m.forward(cache.storage(), {&in, 1}, model::LogitRows::last);
      const core::Tensor& pages = cache.storage().mla_pages(mla_layer);
      const int64_t width = pages.dim(2);
      for (int64_t j = 0; j < local; ++j) {
        const float* e = pages.data<const float>() + (int64_t{s.block_table[j / bs]} * bs + j % bs) * width;
        out[static_cast<size_t>(rank)].insert(out[static_cast<size_t>(rank)].end(), e, e + width);
      }
    });
    return out;
  };
  const std::vector<float> whole = entries(*TpRunner::open(dir, 1, tp_test_options(kernels::Precision::fp32, 1)))[0];
  const int64_t width = static_cast<int64_t>(whole.size()) / n;
  for (int cp : {2, 4}) {
    const auto parts = entries(*TpRunner::open(dir, cp, tp_test_options(kernels::Precision::fp32, cp)));
    for (int r = 0; r < cp; ++r) {
      const auto& part = parts[static_cast<size_t>(r)];
      ASSERT_EQ(static_cast<int64_t>(part.size()), (n + cp - 1) / cp * width);
      double max_diff = 0, scale = 0;
      for (int64_t j = 0; j * width < static_cast<int64_t>(part.size()); ++j) {
        const int64_t p = j * cp + r;
        for (int64_t i = 0; i < width; ++i) {
          const float got = part[static_cast<size_t>(j * width + i)];
          if (p >= n) {  // rank r's share has fewer tokens than rank 0's: never written
            EXPECT_EQ(got, 0.0f) << "cp=" << cp << " rank " << r << " local " << j;
            continue;
          }
          const float want = whole[static_cast<size_t>(p * width + i)];
          max_diff = std::max(max_diff, std::fabs(double(got) - want));
          scale = std::max(scale, std::fabs(double(want)));
        }
      }
      EXPECT_LT(max_diff, 1e-5 * scale) << "cp=" << cp << " rank " << r;
    }
  }
}

// With a trace, the DCP attention runs W_UV and the gate as two ops so that it can emit the ungated
// "mla.o" (as every path does); without one, W_UV and the gate are one op. Both give the same bits.
TEST_F(TpDcp, TracedStepEmitsMlaOAndGivesTheUntracedLogits) {
  const auto dir = write(checkpoint::InitStyle::realistic, "traced");
  const auto r = TpRunner::open(dir, 2, tp_test_options(kernels::Precision::bf16, 2));
  const auto tokens = random_tokens(38, 1024, 7);
  std::mutex mu;
  std::vector<std::pair<int, int>> mla_o;  // (rank, layer) of each "mla.o" emitted
  const auto logits_of = [&](bool traced) {
    const int64_t V = r->config().vocab_size;
    core::Tensor out = core::Tensor::zeros(core::DType::f32, {2, V});
    r->run([&](int rank, const model::Model& m, comm::Communicator&) {
      const model::TraceFn trace = [&](std::string_view name, int layer, const core::TensorView& value) {
        if (name != "mla.o") return;
        EXPECT_EQ(value.dim(0), 1);  // the decode step's one row
        std::lock_guard<std::mutex> lock(mu);
        mla_o.emplace_back(rank, layer);
      };
      model::LocalCache cache = rank_cache(*r, m, 1, 38);
      model::SequenceState s = cache.new_sequence();
      const model::SequenceInput prefill{std::span(tokens).first(37), &s, StepKind::prefill};
      const core::Tensor a = m.forward(cache.storage(), {&prefill, 1}, model::LogitRows::last);
      const model::SequenceInput decode{std::span(tokens).subspan(37, 1), &s, StepKind::decode};
      const core::Tensor b = m.forward(cache.storage(), {&decode, 1}, model::LogitRows::last,
                                       traced ? &trace : nullptr);
      if (rank == 0) {
        std::copy_n(a.data<const float>(), V, out.data<float>());
        std::copy_n(b.data<const float>(), V, out.data<float>() + V);
      }
    });
    return out;
  };
  const core::Tensor plain = logits_of(false);
  EXPECT_TRUE(mla_o.empty());
  const core::Tensor traced = logits_of(true);
  EXPECT_EQ(std::memcmp(plain.data<const float>(), traced.data<const float>(), plain.nbytes()), 0)
      << "the traced (unfused) step's logits differ from the fused one's";
  std::vector<int> ranks;
  for (const auto& [rank, layer] : mla_o) {
    EXPECT_EQ(r->config().attn_kind(layer), config::AttnKind::mla) << "layer " << layer;
    ranks.push_back(rank);
  }
  std::sort(ranks.begin(), ranks.end());
  EXPECT_FALSE(ranks.empty());
  EXPECT_EQ(std::count(ranks.begin(), ranks.end(), 0), std::count(ranks.begin(), ranks.end(), 1));
}

TEST_F(TpDcp, BadDcpValuesNameTheProblem) {
  const auto dir = write(checkpoint::InitStyle::realistic, "errors");
  const auto expect_error = [](const std::function<void()>& fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "no error";
    } catch (const core::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([&] { TpRunner::open(dir, 2, tp_test_options(kernels::Precision::bf16, 4)); },
               "dcp 4 must be 1 or the tensor-parallel size 2");
  expect_error([&] { TpRunner::open(dir, 4, tp_test_options(kernels::Precision::bf16, 2)); },
               "dcp 2 must be 1 or the tensor-parallel size 4");
  expect_error([&] { TpRunner::open(dir, 2, tp_test_options(kernels::Precision::bf16, 0)); },
               "dcp 0 must be 1 or the tensor-parallel size 2");
  expect_error([&] { ModelRunner::open(dir, tp_test_options(kernels::Precision::bf16, 2)); },
               "dcp 2 must be 1 or the tensor-parallel size 1");
  // A rank's block table must cover its share of the step's tokens (local positions), no more.
  const auto r = TpRunner::open(dir, 2, tp_test_options(kernels::Precision::fp32, 2));
  expect_error(
      [&] {
        r->run([&](int rank, const model::Model& m, comm::Communicator&) {
          model::LocalCache cache = r->new_cache(rank, 14);  // 7 local positions: one page of 16
          model::SequenceState s = cache.new_sequence();
          const auto tokens = random_tokens(40, 1024, 3);  // needs 20 local positions
          const model::SequenceInput in{tokens, &s, StepKind::prefill};
          m.forward(cache.storage(), {&in, 1}, model::LogitRows::last);
        });
      },
      "the step needs 20 (local positions of this rank)");
}

}  // namespace
}  // namespace k3::runner
