// checkpoint/loader_errors_test.cpp: what the loader accepts besides the writer's own form
// (language_model. prefix, vision/projector tensors, A_log [num_heads]) and every way a
// checkpoint can be wrong; each error message must name the file and the tensor.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_test_util.h"
#include "checkpoint/safetensors.h"

namespace k3::checkpoint {
namespace {

using namespace k3::checkpoint::testing;
using core::DType;
using core::Tensor;

// A k3-tiny BF16 checkpoint (seed 3) written once, copied into each test's folder.
const fs::path& tiny_source() {
  struct Source {
    TempDir dir;  // removed at exit
    Source() { write_random_checkpoint(config::builtin_config("k3-tiny"), WriteOptions{.seed = 3}, dir.path()); }
  };
  static const Source source;
  return source.dir.path();
}
struct TinyCopy {
  TempDir dir;
  TinyCopy() {
    for (const auto& e : fs::directory_iterator(tiny_source())) fs::copy(e.path(), dir.path() / e.path().filename());
  }
  fs::path file() const { return dir / kSingleFileName; }
};

const char* kQProj = "model.layers.2.self_attn.q_proj.weight";

TEST(LoaderAccepts, LanguageModelPrefixAndSkipsVisionTensors) {
  TinyCopy c;
  rewrite_tensors(c.dir.path(), [](std::map<std::string, Tensor>& t) {
    std::map<std::string, Tensor> out;
    int i = 0;
    for (auto& [name, tensor] : t)  // every other tensor prefixed: the convention is per tensor
      out[(i++ % 2 == 0 ? std::string(kLanguageModelPrefix) : std::string()) + name] = tensor;
    out["vision_tower.encoder.blocks.0.attn.qkv.weight"] = Tensor::zeros(DType::bf16, {6, 4});
    out["language_model.vision_tower.extra"] = Tensor::zeros(DType::f32, {3});
    out["mm_projector.proj.0.weight"] = Tensor::zeros(DType::bf16, {4, 4});
    out["language_model.mm_projector.proj.2.bias"] = Tensor::zeros(DType::bf16, {4});
    t = std::move(out);
  });
  EXPECT_TRUE(SafetensorsSet::open_dir(c.dir.path()).find("language_model.model.embed_tokens.weight") ||
              SafetensorsSet::open_dir(c.dir.path()).find("language_model.lm_head.weight"));
  expect_round_trip(c.dir.path(), config::builtin_config("k3-tiny"), WriteOptions{.seed = 3});
}

TEST(LoaderAccepts, ALogOfNumHeadsLength) {
  TinyCopy c;
  const std::string a_log = "model.layers.1.self_attn.A_log";
  // The writer stores [head_dim] = [32] with entries [num_heads = 4:] zero (spec §4).
  const SafetensorsFile f = SafetensorsFile::open(c.file());
  const Tensor stored = f.tensor(a_log);
  ASSERT_EQ(stored.shape(), core::Shape({32}));
  for (int i = 4; i < 32; ++i) EXPECT_EQ(stored.data<float>()[i], 0.0f);
  rewrite_tensors(c.dir.path(), [&](std::map<std::string, Tensor>& t) {
    Tensor short_a_log = Tensor::zeros(DType::f32, {4});
    std::memcpy(short_a_log.data<void>(), stored.data<void>(), 16);
    t[a_log] = short_a_log;
  });
  const LoadedModel m = load_checkpoint(c.dir.path());
  const Tensor& loaded = std::get<model::KdaWeights>(m.weights.layers[1].attn).a_log;
  ASSERT_EQ(loaded.shape(), core::Shape({4}));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(loaded.data<float>()[i], stored.data<float>()[i]);
  EXPECT_EQ(std::get<model::KdaWeights>(m.weights.layers[0].attn).a_log.shape(), core::Shape({32}));

  rewrite_tensors(c.dir.path(), [&](std::map<std::string, Tensor>& t) { t[a_log] = Tensor::zeros(DType::f32, {8}); });
  expect_error_naming([&] { load_checkpoint(c.dir.path()); },
                      {c.file().string(), a_log, "wrong shape", "[32] or [4]", "[8]"});
}

// A file from another writer may place tensors at offsets not aligned to their dtype (here a
// skipped 1-byte tensor first, then the rest by name). The loader then copies those tensors
// so kernels can read them as typed data; the values are unchanged.
TEST(LoaderAccepts, MisalignedTensorsAreCopied) {
  TinyCopy c;
  std::map<std::string, Tensor> tensors;
  {
    const SafetensorsFile f = SafetensorsFile::open(c.file());
    for (const TensorInfo& t : f.tensors()) tensors[t.name] = f.tensor(t);
  }
  nlohmann::json header;
  std::vector<char> data(1, 7);
  header["vision_tower.pad"] = {{"dtype", "U8"}, {"shape", {1}}, {"data_offsets", {0, 1}}};
  for (const auto& [name, t] : tensors) {
    nlohmann::json shape = nlohmann::json::array();
    for (int i = 0; i < t.shape().rank(); ++i) shape.push_back(t.shape()[i]);
    const int64_t begin = static_cast<int64_t>(data.size());
    header[name] = {
        {"dtype", core::dtype_name(t.dtype())}, {"shape", shape}, {"data_offsets", {begin, begin + t.nbytes()}}};
    data.insert(data.end(), t.data<char>(), t.data<char>() + t.nbytes());
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  write_raw_safetensors(c.file(), text, data);
  const model::Weights w = load_checkpoint(c.dir.path()).weights;
  EXPECT_EQ(reinterpret_cast<uintptr_t>(std::get<model::KdaWeights>(w.layers[0].attn).dt_bias.data<void>()) % 4, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w.embed.data<void>()) % 2, 0u);
  expect_round_trip(c.dir.path(), config::builtin_config("k3-tiny"), WriteOptions{.seed = 3});
}

// ---- tensor-level problems: all collected, each naming tensor and file ----

TEST(LoaderRejects, MissingTensor) {
  TinyCopy c;
  rewrite_tensors(c.dir.path(), [](std::map<std::string, Tensor>& t) { t.erase(kQProj); });
  expect_error_naming([&] { load_checkpoint(c.dir.path()); },
                      {"missing tensor", kQProj, c.file().string(), "BF16/F32 [128, 256]"});
}

TEST(LoaderRejects, UnexpectedTensor) {
  TinyCopy c;
  rewrite_tensors(c.dir.path(), [](std::map<std::string, Tensor>& t) {
    t["model.layers.0.self_attn.bogus.weight"] = Tensor::zeros(DType::bf16, {2});
    t["language_model.model.layers.9.input_layernorm.weight"] = Tensor::zeros(DType::bf16, {256});
  });
  expect_error_naming([&] { load_checkpoint(c.dir.path()); },
                      {"unexpected tensor", "'model.layers.0.self_attn.bogus.weight'",
                       "'language_model.model.layers.9.input_layernorm.weight'", c.file().string()});
}

TEST(LoaderRejects, WrongShapeAndWrongDtype) {
  TinyCopy c;
  rewrite_tensors(c.dir.path(), [](std::map<std::string, Tensor>& t) {
    t["lm_head.weight"] = Tensor::zeros(DType::bf16, {1024, 255});
    t["model.layers.0.self_attn.dt_bias"] = Tensor::zeros(DType::bf16, {128});
    t["model.layers.3.self_attn.kv_b_proj.weight"] = Tensor::zeros(DType::u8, {256, 31});
  });
  expect_error_naming([&] { load_checkpoint(c.dir.path()); },
                      {"3 problem(s)", c.file().string(), "wrong shape for tensor 'lm_head.weight'", "[1024, 256]",
                       "found BF16 [1024, 255]", "wrong dtype for tensor 'model.layers.0.self_attn.dt_bias'",
                       "expected F32 [128], found BF16 [128]",
                       "wrong dtype and shape for tensor 'model.layers.3.self_attn.kv_b_proj.weight'"});
}

TEST(LoaderRejects, NameWithAndWithoutPrefix) {
  TinyCopy c;
  rewrite_tensors(c.dir.path(), [](std::map<std::string, Tensor>& t) {
    t[std::string(kLanguageModelPrefix) + "model.norm.weight"] = t.at("model.norm.weight");
  });
  expect_error_naming([&] { load_checkpoint(c.dir.path()); },
                      {"'model.norm.weight' is present twice", "'language_model.model.norm.weight'",
                       c.file().string()});
}

TEST(LoaderRejects, ManyProblemsAreCountedAndTheFirstListed) {
  TinyCopy c;
  rewrite_tensors(c.dir.path(), [](std::map<std::string, Tensor>& t) {
    for (auto it = t.begin(); it != t.end();)
      it = it->first.find(".experts.") != std::string::npos ? t.erase(it) : std::next(it);
  });
  expect_error_naming([&] { load_checkpoint(c.dir.path()); },
                      {"144 problem(s)", "144 missing:", "missing tensor", "and 136 more missing"});
}

TEST(LoaderRejects, Bf16ExpertsUnderAnMxfp4Config) {
  TinyCopy c;
  config::K3Config q = config::builtin_config("k3-tiny");
  q.mxfp4.enabled = true;
  expect_error_naming([&] { load_weights(c.dir.path(), q); },
                      {"missing tensor 'model.layers.1.block_sparse_moe.experts.0.w1.weight_packed'",
                       "unexpected tensor 'model.layers.1.block_sparse_moe.experts.0.w1.weight'", c.file().string()});
}

// ---- file-level corruption, seen through load_checkpoint ----

// Rewrites the JSON header of PATH (data section unchanged).
void edit_header(const fs::path& path, const std::function<void(nlohmann::json&)>& edit) {
  const std::vector<char> bytes = read_bytes(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  nlohmann::json h = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<int64_t>(n));
  edit(h);
  write_raw_safetensors(path, h.dump(), std::vector<char>(bytes.begin() + 8 + static_cast<int64_t>(n), bytes.end()));
}

TEST(LoaderRejects, TruncatedFile) {
  TinyCopy c;
  const SafetensorsFile f = SafetensorsFile::open(c.file());
  const TensorInfo* last = &f.tensors()[0];
  for (const TensorInfo& t : f.tensors())
    if (t.end > last->end) last = &t;
  std::vector<char> bytes = read_bytes(c.file());
  bytes.resize(bytes.size() - 100);
  write_bytes(c.file(), bytes);
  expect_error_naming([&] { load_checkpoint(c.dir.path()); }, {c.file().string(), "'" + last->name + "'", "truncated"});
}

TEST(LoaderRejects, CorruptHeaders) {
  {
    TinyCopy c;
    std::vector<char> bytes = read_bytes(c.file());
    const uint64_t too_long = bytes.size();
    std::memcpy(bytes.data(), &too_long, 8);
    write_bytes(c.file(), bytes);
    expect_error_naming([&] { load_checkpoint(c.dir.path()); }, {c.file().string(), "header length", "past the end"});
  }
  {
    TinyCopy c;
    std::vector<char> bytes = read_bytes(c.file());
    bytes[8] = 'x';
    write_bytes(c.file(), bytes);
    expect_error_naming([&] { load_checkpoint(c.dir.path()); }, {c.file().string(), "not valid JSON"});
  }
  {
    TinyCopy c;
    edit_header(c.file(), [](nlohmann::json& h) {
      h["model.norm.weight"]["data_offsets"][1] = h["model.norm.weight"]["data_offsets"][1].get<int64_t>() + 2;
    });
    expect_error_naming([&] { load_checkpoint(c.dir.path()); },
                        {c.file().string(), "'model.norm.weight'", "data_offsets"});
  }
  {
    TinyCopy c;
    edit_header(c.file(), [](nlohmann::json& h) { h[kQProj]["dtype"] = "F16"; });
    expect_error_naming([&] { load_checkpoint(c.dir.path()); }, {c.file().string(), kQProj, "unknown dtype 'F16'"});
  }
  {
    TinyCopy c;
    std::ofstream(c.dir / "config.json") << "{not json";
    expect_error_naming([&] { load_checkpoint(c.dir.path()); }, {(c.dir / "config.json").string()});
  }
}

TEST(LoaderRejects, IndexNamingAMissingShard) {
  TempDir dir;
  WriteOptions opt;
  opt.max_shard_bytes = 256 * 1024;
  write_random_checkpoint(config::builtin_config("k3-tiny"), opt, dir.path());
  const SafetensorsSet set = SafetensorsSet::open_dir(dir.path());
  const SafetensorsSet::Entry& e = *set.find(kQProj);
  const std::string shard = e.file->path().filename().string();
  fs::remove(e.file->path());
  expect_error_naming([&] { load_checkpoint(dir.path()); },
                      {(dir / kIndexFileName).string(), shard, "does not exist", "tensor '"});
}

TEST(LoaderRejects, MissingTensorInShardedSetNamesTheIndex) {
  TempDir dir;
  WriteOptions opt;
  opt.max_shard_bytes = 256 * 1024;
  write_random_checkpoint(config::builtin_config("k3-tiny"), opt, dir.path());
  const SafetensorsSet set = SafetensorsSet::open_dir(dir.path());
  std::map<std::string, std::string> weight_map;
  for (const auto& [name, e] : set.entries())
    if (name != kQProj) weight_map[name] = e.file->path().filename().string();
  const std::string shard = set.find(kQProj)->file->path().filename().string();
  // Drop the tensor from its shard and from the index.
  const SafetensorsFile f = SafetensorsFile::open(dir / shard);
  std::map<std::string, Tensor> keep;
  for (const TensorInfo& t : f.tensors())
    if (t.name != kQProj) keep[t.name] = f.tensor(t);
  std::map<std::string, core::TensorView> views;
  for (const auto& [n, t] : keep) views[n] = t.view();
  write_safetensors(dir / shard, views);
  write_index(dir.path(), weight_map, 0);
  expect_error_naming([&] { load_checkpoint(dir.path()); },
                      {"missing tensor", kQProj, (dir / kIndexFileName).string()});
}

TEST(LoaderRejects, EmptyFolder) {
  TempDir dir;
  expect_error_naming([&] { load_weights(dir.path(), config::builtin_config("k3-tiny")); },
                      {dir.path().string(), "neither"});
}

}  // namespace
}  // namespace k3::checkpoint
