// runner/tp_dcp_naive_test.cpp: under decode context parallelism the prefill sequences attend in the
// naive form over their whole context, gathered from every rank (model/layers/mla.cpp,
// kernels::MlaGatherPlan). The naive op then sees the entries and order the non-DCP cache gives, so on
// k3-tiny (whose one MLA layer is its last: every earlier layer is the same with and without DCP) the
// prefill rows' logits at TP = dcp = N equal TP = N without DCP BIT FOR BIT, in fp32 and bf16, with
// bf16-valued and fp8 caches, over chunked prefills (later chunks read earlier chunks' entries on other
// ranks) and mixed steps (whose decode rows keep the absorbed DCP form: close, not equal). The recorded
// op calls prove which form ran, and that pure decode steps kept their ops.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "checkpoint/test_util.h"
#include "model/local_cache.h"
#include "runner/logits_diff_test_util.h"
#include "runner/tp_runner.h"

namespace k3::runner {
namespace {

using checkpoint::testing::TempDir;
using model::StepKind;
using test_util::random_tokens;
using test_util::tp_test_options;

// One sequence's part of a step: tokens [from, from + n) of sequence `seq`.
struct Part {
  int seq;
  int64_t from, n;
  StepKind kind;
};
using Step = std::vector<Part>;

// Runs `steps` on every rank over caches of `tokens[s]` tokens per sequence (pages of 7: no length
// below is a multiple of cp * block_size), returning rank 0's logits [rows, vocab] of every step.
std::vector<core::Tensor> run_steps(const TpRunner& r, const std::vector<std::vector<int32_t>>& tokens,
                                    const std::vector<Step>& steps, const model::TraceFn* trace = nullptr) {
  std::vector<core::Tensor> out;
  r.run([&](int rank, const model::Model& m, comm::Communicator&) {
    int64_t longest = 0;
    for (const auto& t : tokens) longest = std::max<int64_t>(longest, static_cast<int64_t>(t.size()));
    model::LocalCache cache(r.rank_config(), static_cast<int32_t>(tokens.size()), (longest + r.dcp() - 1) / r.dcp(),
                            r.kv_cache(), /*block_size=*/7, core::make_host_memory(), m.options().precision);
    std::vector<model::SequenceState> states;
    for (size_t s = 0; s < tokens.size(); ++s) states.push_back(cache.new_sequence());
    for (const Step& step : steps) {
      std::vector<model::SequenceInput> batch;
      for (const Part& p : step)
        batch.push_back({std::span(tokens[static_cast<size_t>(p.seq)])
                             .subspan(static_cast<size_t>(p.from), static_cast<size_t>(p.n)),
                         &states[static_cast<size_t>(p.seq)], p.kind});
      const core::Tensor logits = m.forward(cache.storage(), batch, model::LogitRows::all, trace);
      if (rank == 0) out.push_back(logits);
    }
  });
  return out;
}

// Rows [begin, end) of a CPU f32 [rows, vocab] tensor, as a copy.
core::Tensor rows_of(const core::Tensor& t, int64_t begin, int64_t end) {
  const int64_t V = t.dim(1);
  core::Tensor out = core::Tensor::zeros(core::DType::f32, {end - begin, V});
  std::memcpy(out.data<float>(), t.data<const float>() + begin * V,
              static_cast<size_t>((end - begin) * V) * sizeof(float));
  return out;
}
bool same_bits(const core::Tensor& a, const core::Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.view().data, b.view().data, static_cast<size_t>(a.nbytes())) == 0;
}

class TpDcpNaive : public ::testing::Test {
 protected:
  std::filesystem::path write(const std::string& name) {
    checkpoint::WriteOptions w;
    w.seed = 29;
    w.init = checkpoint::InitStyle::realistic;
    const auto dir = tmp_.path() / name;
    checkpoint::write_random_checkpoint(config::builtin_config("k3-tiny"), w, dir);
    return dir;
  }
  TempDir tmp_;
};

const char* kv_name(model::KvCacheDtype kv) { return kv == model::KvCacheDtype::fp8_e4m3 ? "fp8" : "bf16"; }

// A 97-token prompt in three chunks at positions 0, 37 and 73 (not multiples of cp), then a second
// prompt of 1 token (ranks > 0 hold none of it) next to a 1-row chunk of the first.
TEST_F(TpDcpNaive, ChunkedPrefillRowsEqualNonDcpBitForBit) {
  const auto dir = write("chunked");
  const std::vector<std::vector<int32_t>> tokens = {random_tokens(98, 1024, 41), random_tokens(1, 1024, 42)};
  const std::vector<Step> steps = {{{0, 0, 37, StepKind::prefill}},
                                   {{0, 37, 36, StepKind::prefill}},
                                   {{0, 73, 24, StepKind::prefill}},
                                   {{1, 0, 1, StepKind::prefill}, {0, 97, 1, StepKind::prefill}}};
  for (auto precision : {kernels::Precision::fp32, kernels::Precision::bf16})
    for (auto kv : {model::KvCacheDtype::bf16, model::KvCacheDtype::fp8_e4m3})
      for (int tp : {2, 4}) {
        SCOPED_TRACE(std::string(precision == kernels::Precision::fp32 ? "fp32" : "bf16") + " " + kv_name(kv) +
                     " cache, tp " + std::to_string(tp));
        const auto want = run_steps(*TpRunner::open(dir, tp, tp_test_options(precision, 1), kv), tokens, steps);
        const auto got = run_steps(*TpRunner::open(dir, tp, tp_test_options(precision, tp), kv), tokens, steps);
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(same_bits(got[i], want[i])) << "step " << i;
      }
}

// Mixed steps: a prefill chunk next to decodes (and a prefill after decodes). The prefill rows equal the
// non-DCP ones bit for bit; the decode rows run the absorbed form over the split cache (the
// log-sum-exp combine reorders fp32 sums): close.
TEST_F(TpDcpNaive, MixedStepsPrefillRowsExactDecodeRowsClose) {
  const auto dir = write("mixed");
  const std::vector<std::vector<int32_t>> tokens = {random_tokens(40, 1024, 51), random_tokens(40, 1024, 52)};
  const std::vector<Step> steps = {
      {{0, 0, 20, StepKind::prefill}, {1, 0, 13, StepKind::prefill}},
      {{0, 20, 1, StepKind::decode}, {1, 13, 9, StepKind::prefill}},
      {{1, 22, 1, StepKind::decode}, {0, 21, 1, StepKind::decode}},
      {{1, 23, 1, StepKind::decode}, {0, 22, 11, StepKind::prefill}},
  };
  for (auto precision : {kernels::Precision::fp32, kernels::Precision::bf16})
    for (auto kv : {model::KvCacheDtype::bf16, model::KvCacheDtype::fp8_e4m3})
      for (int tp : {2, 4}) {
        SCOPED_TRACE(std::string(precision == kernels::Precision::fp32 ? "fp32" : "bf16") + " " + kv_name(kv) +
                     " cache, tp " + std::to_string(tp));
        const auto want = run_steps(*TpRunner::open(dir, tp, tp_test_options(precision, 1), kv), tokens, steps);
        const auto got = run_steps(*TpRunner::open(dir, tp, tp_test_options(precision, tp), kv), tokens, steps);
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < steps.size(); ++i) {
          int64_t row = 0;
          for (const Part& p : steps[i]) {
            const core::Tensor a = rows_of(got[i], row, row + p.n), b = rows_of(want[i], row, row + p.n);
            row += p.n;
            if (p.kind == StepKind::prefill) {
              EXPECT_TRUE(same_bits(a, b)) << "step " << i << " sequence " << p.seq;
              continue;
            }
            const test_util::LogitsDiff d = test_util::compare_logits(a, b);
            EXPECT_EQ(d.top1, 1.0) << "step " << i << " sequence " << p.seq;
            if (precision == kernels::Precision::fp32) EXPECT_LT(d.rel, 1e-4) << "step " << i << " sequence " << p.seq;
            else EXPECT_GE(d.min_cos, 0.99) << "step " << i << " sequence " << p.seq;
          }
        }
      }
}

// Which MLA ops ran, per step kind, on every rank of TP = dcp = 2 (k3-tiny: one MLA layer, with the
// output gate): prefill rows take mla_naive over the gathered cache (two mla_cache_gather calls), decode
// rows the four DCP ops, and a pure decode step exactly its former ops (the gate fused into mla_w_uv:
// no sigmoid_gate, no gather, no naive form).
TEST_F(TpDcpNaive, NaiveFormRunsForPrefillRowsAndDecodeStepsKeepTheirOps) {
  const auto dir = write("ops");
  const auto r = TpRunner::open(dir, 2, tp_test_options(kernels::Precision::bf16, 2));
  ASSERT_TRUE(r->config().mla.use_output_gate);
  const auto a = random_tokens(30, 1024, 61), b = random_tokens(30, 1024, 62);
  const std::vector<Step> steps = {{{0, 0, 17, StepKind::prefill}},                               // prefill
                                   {{0, 17, 1, StepKind::decode}, {1, 0, 9, StepKind::prefill}},  // mixed
                                   {{0, 18, 1, StepKind::decode}, {1, 9, 1, StepKind::decode}}};  // decode
  kernels::OpRecorder rec;
  r->set_op_recorder(&rec);
  std::vector<std::map<std::string, int>> counts(steps.size());
  r->run([&](int rank, const model::Model& m, comm::Communicator& comm) {
    model::LocalCache cache(r->rank_config(), 2, 15, r->kv_cache(), 7, core::make_host_memory(), m.options().precision);
    model::SequenceState sa = cache.new_sequence(), sb = cache.new_sequence();
    for (size_t i = 0; i < steps.size(); ++i) {
      std::vector<model::SequenceInput> batch;
      for (const Part& p : steps[i])
        batch.push_back({std::span(p.seq == 0 ? a : b).subspan(static_cast<size_t>(p.from), static_cast<size_t>(p.n)),
                         p.seq == 0 ? &sa : &sb, p.kind});
      // The barriers keep every rank's calls of this step (and only them) inside start .. stop.
      comm.barrier();
      if (rank == 0) rec.start();
      comm.barrier();
      m.forward(cache.storage(), batch, model::LogitRows::last);
      comm.barrier();
      if (rank == 0)
        for (const auto& call : rec.stop()) ++counts[i][call.op];
    }
  });
  r->set_op_recorder(nullptr);
  const int ranks = 2;  // one MLA layer on each rank
  // Prefill: the naive form over the gathered cache, nothing of the absorbed forms.
  EXPECT_EQ(counts[0]["mla_naive"], ranks);
  EXPECT_EQ(counts[0]["mla_cache_gather"], 2 * ranks);
  EXPECT_EQ(counts[0]["mla_partial_attention"], 0);
  EXPECT_EQ(counts[0]["mla_q_absorb"], 0);
  EXPECT_EQ(counts[0]["mla_w_uv"], 0);
  EXPECT_EQ(counts[0]["mla_absorbed"], 0);
  EXPECT_EQ(counts[0]["sigmoid_gate"], ranks);  // the gate after the naive form, as without DCP
  // Mixed: both, the decode rows' W_UV unfused (one sigmoid_gate over every row afterwards).
  EXPECT_EQ(counts[1]["mla_naive"], ranks);
  EXPECT_EQ(counts[1]["mla_cache_gather"], 2 * ranks);
  for (const char* op : {"mla_q_absorb", "mla_partial_attention", "mla_lse_rescale", "mla_w_uv", "sigmoid_gate"})
    EXPECT_EQ(counts[1][op], ranks) << op;
  // Pure decode: the DCP absorbed ops with the gate fused into mla_w_uv, nothing else.
  for (const char* op : {"mla_q_absorb", "mla_partial_attention", "mla_lse_rescale", "mla_w_uv", "mla_cache_write"})
    EXPECT_EQ(counts[2][op], ranks) << op;
  for (const char* op : {"mla_naive", "mla_cache_gather", "mla_absorbed", "sigmoid_gate"})
    EXPECT_EQ(counts[2][op], 0) << op;
}

// With a trace, a DCP prefill step emits "mla.o" (the ungated o of every row, as every path does) on
// every rank, equal to the non-DCP ones bit for bit, and the traced logits equal the untraced ones.
TEST_F(TpDcpNaive, TracedPrefillEmitsTheNonDcpMlaO) {
  const auto dir = write("traced");
  const std::vector<std::vector<int32_t>> tokens = {random_tokens(37, 1024, 71)};
  const std::vector<Step> steps = {{{0, 0, 37, StepKind::prefill}}};
  // Every rank's "mla.o" values (in the order the ranks emitted them: sorted afterwards).
  const auto emitted = [&](int dcp) {
    const auto r = TpRunner::open(dir, 2, tp_test_options(kernels::Precision::bf16, dcp));
    std::mutex mu;
    std::vector<std::vector<float>> mla_o;
    const model::TraceFn trace = [&](std::string_view name, int, const core::TensorView& v) {
      if (name != "mla.o") return;
      EXPECT_EQ(v.dim(0), 37);
      std::lock_guard<std::mutex> lock(mu);
      mla_o.emplace_back(v.as<const float>(), v.as<const float>() + v.numel());
    };
    const auto with = run_steps(*r, tokens, steps, &trace), without = run_steps(*r, tokens, steps);
    EXPECT_TRUE(same_bits(with[0], without[0])) << "dcp " << dcp;
    const auto bits_less = [](const std::vector<float>& x, const std::vector<float>& y) {
      return std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) < 0;
    };
    std::sort(mla_o.begin(), mla_o.end(), bits_less);
    return mla_o;
  };
  const auto split = emitted(2), whole = emitted(1);
  ASSERT_EQ(split.size(), 2u);  // one MLA layer on each of the two ranks
  ASSERT_EQ(whole.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_EQ(split[i].size(), whole[i].size());
    EXPECT_EQ(std::memcmp(split[i].data(), whole[i].data(), split[i].size() * sizeof(float)), 0) << "rank-sorted " << i;
  }
}

}  // namespace
}  // namespace k3::runner
