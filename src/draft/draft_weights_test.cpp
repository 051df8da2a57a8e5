// draft/draft_weights_test.cpp: the draft checkpoint: random write -> load gives the same tensors,
// the embedding (and a shared lm_head) alias the target's, and every checkpoint fault is named.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "draft/test_util.h"

namespace k3::draft {
namespace {

namespace fs = std::filesystem;
using testing::read_all;
using testing::same_bytes;
using testing::write_all;

struct FakeTarget {
  config::K3Config config = config::builtin_config("k3-tiny");
  model::Weights weights;
  FakeTarget() {
    weights.embed = testing::random_bf16(config.vocab_size, config.hidden_size, 1);
    weights.lm_head = {testing::random_bf16(config.vocab_size, config.hidden_size, 2), {}};
  }
};

void expect_load_error(const fs::path& dir, const FakeTarget& t, const std::vector<std::string>& needles) {
  try {
    load_draft(dir, t.config, t.weights);
    FAIL() << "no error";
  } catch (const core::Error& e) {
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what() << " lacks " << n;
  }
}

TEST(DraftCheckpoint, RandomWriteLoadRoundTrip) {
  FakeTarget t;
  testing::TempDir dir;
  const DraftConfig c = builtin_draft_config("k3-tiny-dspark");
  write_random_draft(c, 7, dir.path());
  const LoadedDraft loaded = load_draft(dir.path(), t.config, t.weights);
  EXPECT_EQ(to_json(loaded.config), to_json(c));
  const DraftWeights mem = random_draft_weights(c, 7, t.weights.embed);
  const DraftWeights& w = loaded.weights;
  EXPECT_EQ(w.embed.data<void>(), t.weights.embed.data<void>());  // aliased, not copied
  EXPECT_TRUE(same_bytes(w.context_proj.weight, mem.context_proj.weight));
  EXPECT_TRUE(same_bytes(w.context_norm, mem.context_norm));
  ASSERT_EQ(w.layers.size(), 2u);
  for (size_t l = 0; l < 2; ++l) {
    EXPECT_TRUE(same_bytes(w.layers[l].q_b_proj.weight, mem.layers[l].q_b_proj.weight));
    EXPECT_TRUE(same_bytes(w.layers[l].kv_a_norm, mem.layers[l].kv_a_norm));
    EXPECT_TRUE(same_bytes(w.layers[l].down_proj.weight, mem.layers[l].down_proj.weight));
  }
  EXPECT_TRUE(same_bytes(w.lm_head.weight, mem.lm_head.weight));
  EXPECT_TRUE(same_bytes(w.markov_w1, mem.markov_w1));
  EXPECT_TRUE(same_bytes(w.markov_w2.weight, mem.markov_w2.weight));
  EXPECT_TRUE(same_bytes(w.confidence_head.weight, mem.confidence_head.weight));
  EXPECT_FALSE(w.d2t.defined());
  // Every tensor of the file is one of draft_params, and the same seed writes the same bytes.
  const auto all = read_all(dir.path());
  EXPECT_EQ(all.size(), draft_params(c).size());
  testing::TempDir again;
  write_random_draft(c, 7, again.path());
  for (const auto& [n, v] : read_all(again.path())) EXPECT_TRUE(same_bytes(v, all.at(n))) << n;
  testing::TempDir other;
  write_random_draft(c, 8, other.path());
  EXPECT_FALSE(same_bytes(read_all(other.path()).at("lm_head.weight"), all.at("lm_head.weight")));
  // The loaded draft runs.
  const DraftModel m(loaded.config, loaded.weights, testing::reference_ops());
  DraftCache cache = m.new_cache();
  m.append_context(cache, testing::random_act(2, c.num_taps() * c.hidden_size, 3).view());
  EXPECT_EQ(m.draft(cache, 5, 4).tokens.size(), 4u);
}

TEST(DraftCheckpoint, SharedLmHeadAndD2t) {
  FakeTarget t;
  testing::TempDir dir;
  DraftConfig c = builtin_draft_config("k3-tiny-dspark");
  c.share_target_lm_head = true;
  write_random_draft(c, 1, dir.path());
  EXPECT_FALSE(read_all(dir.path()).count("lm_head.weight"));
  const LoadedDraft shared = load_draft(dir.path(), t.config, t.weights);
  EXPECT_EQ(shared.weights.lm_head.weight.data<void>(), t.weights.lm_head.weight.data<void>());

  testing::TempDir dir2;
  c = builtin_draft_config("k3-tiny-dspark");
  c.draft_vocab_size = 600;
  write_random_draft(c, 1, dir2.path());
  const LoadedDraft small = load_draft(dir2.path(), t.config, t.weights);
  EXPECT_EQ(small.weights.d2t.shape(), (core::Shape{600}));
  EXPECT_EQ(small.weights.lm_head.out_features(), 600);
  // A d2t entry that leaves the target vocabulary is named.
  auto tensors = read_all(dir2.path());
  tensors.at("d2t").data<int64_t>()[599] = 1000;
  write_all(dir2.path(), tensors);
  expect_load_error(dir2.path(), t, {"d2t[599]", "outside the target vocabulary"});
}

TEST(DraftCheckpoint, FaultsAreNamed) {
  FakeTarget t;
  testing::TempDir dir;
  const DraftConfig c = builtin_draft_config("k3-tiny-dspark");
  write_random_draft(c, 3, dir.path());
  const auto good = read_all(dir.path());

  auto edited = good;
  edited.erase("layers.1.mlp.up_proj.weight");
  write_all(dir.path(), edited);
  expect_load_error(dir.path(), t, {"lacks tensor layers.1.mlp.up_proj.weight"});

  edited = good;
  edited["layers.2.mlp.up_proj.weight"] = good.at("layers.1.mlp.up_proj.weight");
  write_all(dir.path(), edited);
  expect_load_error(dir.path(), t, {"model.safetensors", "unexpected tensor layers.2.mlp.up_proj.weight"});

  edited = good;
  edited["markov_w1.weight"] = testing::random_bf16(1024, 31, 1);
  write_all(dir.path(), edited);
  expect_load_error(dir.path(), t, {"markov_w1.weight", "[1024, 31]", "expected [1024, 32]"});

  edited = good;
  edited["norm.weight"] = core::Tensor::zeros(core::DType::i32, {256});
  write_all(dir.path(), edited);
  expect_load_error(dir.path(), t, {"norm.weight", "dtype I32", "BF16 or F32"});

  // An F32 tensor is accepted, and the "model." prefix too.
  edited = good;
  const core::Tensor norm = edited.at("norm.weight");
  core::Tensor f32 = core::Tensor::zeros(core::DType::f32, {256});
  for (int i = 0; i < 256; ++i) f32.data<float>()[i] = kernels::load_f32(norm.view(), i);
  edited.erase("norm.weight");
  edited["model.norm.weight"] = f32;
  write_all(dir.path(), edited);
  EXPECT_NO_THROW(load_draft(dir.path(), t.config, t.weights));

  // A draft for another target is named by the config check.
  write_all(dir.path(), good);
  FakeTarget wrong;
  wrong.config.hidden_size = 128;
  expect_load_error(dir.path(), wrong, {"config.json", "hidden_size"});
  // No weights at all.
  fs::remove(dir.path() / checkpoint::kSingleFileName);
  EXPECT_THROW(load_draft(dir.path(), t.config, t.weights), core::Error);
}

}  // namespace
}  // namespace k3::draft
