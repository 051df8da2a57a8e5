// tests/kv_storage_test.cpp: the model over paged MLA caches and KDA slots: a prefix restored
// from shared pages + a KDA checkpoint computes exactly what an unsplit prefill computes.
#include <gtest/gtest.h>

#include <numeric>

#include "core/rng.h"
#include "model/model.h"
#include "runner/model_runner.h"
#include "test_util.h"

namespace k3 {
namespace {

using model::LogitRows;
using model::SequenceInput;
using model::SequenceState;
using model::StepKind;

class PagedModel : public ::testing::TestWithParam<kernels::Precision> {
 protected:
  void SetUp() override {
    checkpoint::WriteOptions w;
    w.init = checkpoint::InitStyle::sensitive;
    model::ModelOptions o;
    o.precision = GetParam();
    runner_ = runner::ModelRunner::open(testing::write_checkpoint(tmp_, config::builtin_config("k3-tiny"), w), o);
    core::Rng rng(42);
    for (auto& t : tokens_) t = static_cast<int32_t>(rng.next_u64() % 1024);
  }
  testing::TempDir tmp_;
  std::unique_ptr<runner::ModelRunner> runner_;
  std::vector<int32_t> tokens_ = std::vector<int32_t>(150);
};

TEST_P(PagedModel, PrefixHitFromCheckpointEqualsUnsplitPrefillBitForBit) {
  const model::Model& m = runner_->model();
  model::KvStorage kv(runner_->config(), {.num_blocks = 40, .block_size = 16, .num_slots = 3, .num_checkpoints = 2});
  std::vector<int32_t> pages(40);  // the block tables view it: sequences take runs of it
  std::iota(pages.begin(), pages.end(), 0);
  auto fresh = [&](int32_t slot, int32_t first_block, int32_t blocks) {
    SequenceState s;
    s.kda_slot = slot;
    kv.reset_slot(slot);
    s.block_table = std::span<const int32_t>(pages).subspan(static_cast<size_t>(first_block),
                                                            static_cast<size_t>(blocks));
    return s;
  };
  // Unsplit: all 150 tokens in one prefill.
  SequenceState full = fresh(0, 0, 10);
  SequenceInput in{tokens_, &full, StepKind::prefill};
  const core::Tensor ref = m.forward(kv, {&in, 1}, LogitRows::all);

  // A computes the first 128 tokens (a multiple of the KDA chunk and of the page size) and
  // saves its KDA state; B restores it, shares A's 8 pages, and computes the rest.
  SequenceState a = fresh(1, 10, 8);
  in = {std::span(tokens_).first(128), &a, StepKind::prefill};
  m.forward(kv, {&in, 1}, LogitRows::all);
  kv.save_checkpoint(a.kda_slot, 0);
  kv.reset_slot(a.kda_slot);  // A's slot is gone; only the checkpoint remains

  SequenceState b;
  b.kda_slot = 2;
  kv.restore_checkpoint(0, b.kda_slot);
  std::vector<int32_t> b_table(a.block_table.begin(), a.block_table.end());  // A's pages, then two of its own
  b_table.insert(b_table.end(), {30, 31});
  b.block_table = b_table;
  b.num_tokens = 128;
  in = {std::span(tokens_).subspan(128), &b, StepKind::prefill};
  const core::Tensor hit = m.forward(kv, {&in, 1}, LogitRows::all);
  EXPECT_EQ(testing::compare(hit, model::row_slice(ref, 128, 150)).max_abs, 0.0);

  // And a chunked prefill split on the chunk grid (64) is bit-identical too.
  SequenceState c = fresh(1, 20, 10);
  in = {std::span(tokens_).first(64), &c, StepKind::prefill};
  const core::Tensor first = m.forward(kv, {&in, 1}, LogitRows::all);
  in = {std::span(tokens_).subspan(64), &c, StepKind::prefill};
  const core::Tensor rest = m.forward(kv, {&in, 1}, LogitRows::all);
  EXPECT_EQ(testing::compare(first, model::row_slice(ref, 0, 64)).max_abs, 0.0);
  EXPECT_EQ(testing::compare(rest, model::row_slice(ref, 64, 150)).max_abs, 0.0);
}

TEST_P(PagedModel, BlockTableTooShortIsAClearError) {
  model::KvStorage kv(runner_->config(), {.num_blocks = 4, .block_size = 16, .num_slots = 1});
  SequenceState s;
  s.kda_slot = 0;
  const std::vector<int32_t> two{0, 1}, three{0, 1, 2};
  s.block_table = two;
  SequenceInput in{std::span(tokens_).first(40), &s, StepKind::prefill};
  try {
    runner_->model().forward(kv, {&in, 1}, LogitRows::last);
    FAIL() << "expected an error";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("block table covers 32 tokens"), std::string::npos) << e.what();
  }
  s.kda_slot = 5;
  s.block_table = three;
  EXPECT_THROW(runner_->model().forward(kv, {&in, 1}, LogitRows::last), core::Error);
}

TEST(KvStorageSizes, BytesPerBlockAndStateFollowTheConfig) {
  const config::K3Config k3 = config::builtin_config("k3");
  // 24 MLA layers x 576 values: 1152 B/token/layer in bf16 (spec §1.2), 576 in fp8.
  EXPECT_EQ(model::KvStorage::bytes_per_block(k3, 1, model::KvCacheDtype::bf16), 24 * 1152);
  EXPECT_EQ(model::KvStorage::bytes_per_block(k3, 16, model::KvCacheDtype::fp8_e4m3), 16 * 24 * 576);
  // 69 KDA layers x (6 MiB fp32 state + 216 KiB bf16 conv state) per sequence.
  EXPECT_EQ(model::KvStorage::bytes_per_kda_state(k3), 69 * (6 * 1024 * 1024 + 216 * 1024));
}

INSTANTIATE_TEST_SUITE_P(Precisions, PagedModel, ::testing::Values(kernels::Precision::bf16, kernels::Precision::fp32),
                         [](const auto& info) { return info.param == kernels::Precision::bf16 ? "bf16" : "fp32"; });

}  // namespace
}  // namespace k3
