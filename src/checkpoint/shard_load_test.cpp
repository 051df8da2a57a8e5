// checkpoint/shard_load_test.cpp: tensor-parallel loads (spec §11). Every tensor of a TP=2/4 rank
// load equals the matching block of the TP=1 load (rows of column-parallel weights, columns of
// row-parallel ones, MXFP4 codes and scales cut alike, replicated tensors whole, A_log the rank's
// heads of the first H whether stored [head_dim] or [num_heads]); row blocks are views and column
// blocks copies of the block only; progress counts the rank's bytes; errors name what is wrong.
#include <gtest/gtest.h>

#include <array>
#include <cstring>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_test_util.h"
#include "checkpoint/shard_slice.h"
#include "config/shard.h"

namespace k3::checkpoint {
namespace {

using namespace k3::checkpoint::testing;
using core::DType;
using core::Shape;
using core::Tensor;

// The block of `full` of shape `local` at rank `rank`, element by element through multi-indices
// (independent of shard_block's byte arithmetic): along the one axis whose extents differ, the
// rank's entries start at rank * local[axis].
Tensor naive_block(const Tensor& full, const Shape& local, int rank) {
  const Shape& fs = full.shape();
  EXPECT_EQ(fs.rank(), local.rank());
  int axis = -1;
  for (int d = 0; d < fs.rank(); ++d)
    if (fs[d] != local[d]) axis = d;
  Tensor out = Tensor::zeros(full.dtype(), local);
  const size_t es = core::dtype_size(full.dtype());
  std::array<int64_t, core::kMaxDims> idx{};
  for (int64_t i = 0; i < local.numel(); ++i) {
    int64_t rem = i, src = 0;
    for (int d = local.rank() - 1; d >= 0; --d) {
      idx[static_cast<size_t>(d)] = rem % local[d];
      rem /= local[d];
    }
    for (int d = 0; d < fs.rank(); ++d)
      src = src * fs[d] + idx[static_cast<size_t>(d)] + (d == axis ? rank * local[d] : 0);
    std::memcpy(out.data<char>() + i * es, full.data<char>() + src * es, es);
  }
  return out;
}

// k3-tiny with 8 KDA heads of 4 channels: A_log is stored [num_heads] (H > head_dim).
config::K3Config a_log_by_heads_config() {
  nlohmann::json j = config::to_json(config::builtin_config("k3-tiny"));
  j["linear_attn_config"]["num_heads"] = 8;
  j["linear_attn_config"]["head_dim"] = 4;
  return config::parse_config(j, "test:a_log_by_heads");
}

struct Counts {
  int replicated = 0, rows = 0, columns = 0, a_log = 0;
};

// Loads every rank of `tp` and checks each tensor against the TP=1 load; counts the kinds in `n`.
void check_rank_blocks(const fs::path& dir, const config::K3Config& cfg, int tp, Counts& n) {
  const auto full = flatten(load_weights(dir, cfg), cfg);
  const config::K3Config local_cfg = config::shard_config(cfg, tp);
  const std::vector<ParamSpec> local_specs = expected_params(local_cfg);
  for (int r = 0; r < tp; ++r) {
    const auto local = flatten(load_weights(dir, cfg, config::TpShard{r, tp}), local_cfg);
    EXPECT_EQ(local.size(), full.size());
    for (const ParamSpec& s : local_specs) {
      const Tensor& f = full.at(s.name);
      const Tensor& t = local.at(s.name);
      if (s.role == ParamRole::kda_a_log) {
        const int64_t h = cfg.kda.num_heads / tp;
        ASSERT_EQ(t.shape(), Shape({h})) << s.name;
        for (int64_t i = 0; i < h; ++i)
          ASSERT_EQ(t.data<float>()[i], f.data<float>()[r * h + i]) << s.name << " rank " << r;
        n.a_log += r == 0;
        continue;
      }
      ASSERT_EQ(t.shape(), s.shapes[0]) << s.name;
      ASSERT_TRUE(same_bytes(t, naive_block(f, s.shapes[0], r))) << s.name << " rank " << r << " of " << tp;
      if (r == 0) {
        if (f.shape() == t.shape()) ++n.replicated;
        else if (f.shape()[0] != t.shape()[0]) ++n.rows;
        else ++n.columns;
      }
    }
  }
}

Counts expect_rank_blocks(const fs::path& dir, const config::K3Config& cfg, int tp) {
  Counts n;
  check_rank_blocks(dir, cfg, tp, n);
  return n;
}

TEST(ShardLoad, EveryTensorIsTheRanksBlockOfTheTp1Load) {
  TempDir dir;
  const config::K3Config cfg = config::builtin_config("k3-tiny");
  write_random_checkpoint(cfg, {.seed = 3}, dir.path());
  for (int tp : {2, 4}) {
    const Counts n = expect_rank_blocks(dir.path(), cfg, tp);
    // Per KDA layer: q/k/v/g/f_b/b, 3 convs, dt_bias by rows; o_proj by columns. MLA: q_b, kv_b, g
    // rows; o_proj columns. Dense: gate/up rows, down columns. MoE: w1/w3 and shared gate/up rows,
    // w2 and shared down columns. Embedding and lm_head rows.
    EXPECT_EQ(n.rows, 3 * 10 + 3 + 2 + 3 * (16 * 2 + 2) + 2) << tp;
    EXPECT_EQ(n.columns, 3 + 1 + 1 + 3 * (16 + 1)) << tp;
    EXPECT_EQ(n.a_log, 3);
    EXPECT_GT(n.replicated, 40);
  }
}

TEST(ShardLoad, Mxfp4CodesAndScalesAreCutAtTheSameColumns) {
  TempDir dir;
  config::K3Config cfg = config::builtin_config("k3-tiny-mxfp4");
  write_random_checkpoint(cfg, {.seed = 5, .mxfp4 = true}, dir.path());
  const Counts n = expect_rank_blocks(dir.path(), cfg, 2);  // 64 / 2 = one 32-group per rank
  EXPECT_EQ(n.columns, 3 + 1 + 1 + 3 * (2 * 16 + 1));       // w2 codes and scales both by columns
  // w2's rank-1 block decodes to the columns [32, 64) of the full w2.
  const auto full = flatten(load_weights(dir.path(), cfg), cfg);
  const auto rank1 = flatten(load_weights(dir.path(), cfg, config::TpShard{1, 2}), config::shard_config(cfg, 2));
  const std::string w2 = "model.layers.1.block_sparse_moe.experts.5.w2.weight_";
  EXPECT_EQ(rank1.at(w2 + "packed").shape(), Shape({128, 16}));
  EXPECT_EQ(rank1.at(w2 + "scale").shape(), Shape({128, 1}));
  for (int64_t row = 0; row < 128; ++row) {
    EXPECT_EQ(rank1.at(w2 + "scale").data<uint8_t>()[row], full.at(w2 + "scale").data<uint8_t>()[row * 2 + 1]);
    EXPECT_EQ(std::memcmp(rank1.at(w2 + "packed").data<uint8_t>() + row * 16,
                          full.at(w2 + "packed").data<uint8_t>() + row * 32 + 16, 16),
              0);
  }
}

TEST(ShardLoad, ALogStoredPerHeadGivesEachRankItsHeads) {
  TempDir dir;
  const config::K3Config cfg = a_log_by_heads_config();
  write_random_checkpoint(cfg, {.seed = 9}, dir.path());
  ASSERT_EQ(flatten(load_weights(dir.path(), cfg), cfg).at("model.layers.0.self_attn.A_log").shape(), Shape({8}));
  for (int tp : {2, 4}) EXPECT_EQ(expect_rank_blocks(dir.path(), cfg, tp).a_log, 3);
}

TEST(ShardLoad, TiedEmbeddingsShareTheVocabularySlice) {
  TempDir dir;
  nlohmann::json j = config::to_json(config::builtin_config("k3-tiny"));
  j["tie_word_embeddings"] = true;
  const config::K3Config cfg = config::parse_config(j, "test:tied");
  write_random_checkpoint(cfg, {.seed = 2}, dir.path());
  const model::Weights w = load_weights(dir.path(), cfg, config::TpShard{3, 4});
  EXPECT_EQ(w.embed.shape(), Shape({256, 256}));
  EXPECT_EQ(w.lm_head.weight.data<void>(), w.embed.data<void>());
}

TEST(ShardBlock, RowBlocksAreViewsAndColumnBlocksCopyOnlyTheBlock) {
  Tensor full = Tensor::zeros(DType::f32, {8, 6});
  for (int64_t i = 0; i < 48; ++i) full.data<float>()[i] = static_cast<float>(i);
  const Tensor rows = shard_block(full, {2, 6}, {1, 4}, "w");
  EXPECT_EQ(rows.data<float>(), full.data<float>() + 12);  // a view into the full tensor's storage
  const Tensor cols = shard_block(full, {8, 2}, {2, 3}, "w");
  EXPECT_EQ(cols.numel(), 16);  // a copy of the block alone
  for (int64_t r = 0; r < 8; ++r) {
    EXPECT_EQ(cols.data<float>()[2 * r], static_cast<float>(6 * r + 4));
    EXPECT_EQ(cols.data<float>()[2 * r + 1], static_cast<float>(6 * r + 5));
  }
  EXPECT_EQ(shard_block(full, {8, 6}, {1, 2}, "w").data<float>(), full.data<float>());  // replicated
  // A [P, 1, K] conv weight is cut by rows; a [1, H] query would be cut by columns.
  Tensor conv = Tensor::zeros(DType::f32, {8, 1, 4});
  EXPECT_EQ(shard_block(conv, {2, 1, 4}, {3, 4}, "conv").data<float>(), conv.data<float>() + 24);
  // A misaligned row block (a file that does not align its tensors) is copied.
  Tensor bytes = Tensor::zeros(DType::u8, {4 * 8 * 2 + 4});
  core::TensorView odd = core::TensorView::contiguous(bytes.data<uint8_t>() + 2, DType::f32, {8, 2});
  const Tensor misaligned(odd, std::make_shared<Tensor>(bytes));
  const Tensor copied = shard_block(misaligned, {4, 2}, {1, 2}, "odd");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(copied.data<void>()) % 4, 0u);
  EXPECT_EQ(std::memcmp(copied.data<void>(), bytes.data<uint8_t>() + 2 + 32, 32), 0);
  const Tensor whole = shard_block(misaligned, {8, 2}, {1, 2}, "odd");  // replicated, copied too
  EXPECT_EQ(reinterpret_cast<uintptr_t>(whole.data<void>()) % 4, 0u);
  EXPECT_EQ(std::memcmp(whole.data<void>(), bytes.data<uint8_t>() + 2, 64), 0);
}

TEST(ShardBlock, ShapesThatAreNoBlockFailNamingTheTensor) {
  Tensor full = Tensor::zeros(DType::f32, {8, 6});
  expect_error_naming(
      [&] {
        shard_block(full, {3, 6}, {0, 4}, "model.x.weight");
      },
      {"model.x.weight", "[8, 6]", "[3, 6]", "4 ways"});
  expect_error_naming([&] { shard_block(full, {4, 3}, {0, 2}, "model.y.weight"); }, {"model.y.weight"});
  expect_error_naming([&] { shard_block(full, {4, 6}, {2, 2}, "w"); }, {"rank 2"});
  Tensor a_log = Tensor::zeros(DType::f32, {4});
  expect_error_naming([&] { shard_a_log(a_log, 6, {0, 2}, "A_log"); }, {"A_log", "6"});
}

TEST(ShardLoad, ProgressReadsAndCountsOnlyTheRanksBytes) {
  TempDir dir;
  const config::K3Config cfg = config::builtin_config("k3-tiny");
  write_random_checkpoint(cfg, {.seed = 4}, dir.path());
  std::vector<LoadProgress> reports;
  const model::Weights w = load_weights(dir.path(), cfg, config::TpShard{1, 4},
                                        [&](const LoadProgress& p) { reports.push_back(p); });
  int64_t rank_bytes = 0, full_bytes = 0;
  for (const auto& [name, t] : flatten(w, config::shard_config(cfg, 4))) rank_bytes += t.nbytes();
  for (const auto& [name, t] : flatten(load_weights(dir.path(), cfg), cfg)) full_bytes += t.nbytes();
  ASSERT_GE(reports.size(), 2u);
  EXPECT_EQ(reports.front().bytes_done, 0);
  EXPECT_TRUE(reports.back().finished());
  EXPECT_EQ(reports.back().bytes_total, rank_bytes);
  EXPECT_LT(rank_bytes, full_bytes / 2);  // most bytes are sharded 4 ways
}

TEST(ShardLoad, ErrorsNameTheProblem) {
  TempDir dir;
  const config::K3Config cfg = config::builtin_config("k3-tiny");
  write_random_checkpoint(cfg, {.seed = 6}, dir.path());
  expect_error_naming(
      [&] {
        load_weights(dir.path(), cfg, config::TpShard{0, 8});
      },
      {"tp=8", "linear_attn_config.num_heads"});
  expect_error_naming([&] { load_weights(dir.path(), cfg, config::TpShard{2, 2}); }, {"rank 2", "2 ranks"});
  // The whole checkpoint is still checked against the full config.
  rewrite_tensors(dir.path(),
                  [](std::map<std::string, Tensor>& t) { t.erase("model.layers.2.self_attn.o_proj.weight"); });
  expect_error_naming(
      [&] {
        load_weights(dir.path(), cfg, config::TpShard{1, 2});
      },
      {"missing tensor 'model.layers.2.self_attn.o_proj.weight'"});
}

}  // namespace
}  // namespace k3::checkpoint
