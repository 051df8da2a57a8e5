// checkpoint/safetensors_test.cpp: safetensors reader/writer round trips, deterministic bytes,
// every header/data validation error, and sharded sets with their index errors.
#include "checkpoint/safetensors.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "checkpoint/test_util.h"
#include "core/rng.h"

namespace k3::checkpoint {
namespace {

using core::DType;
using core::Shape;
using core::Tensor;
using namespace k3::checkpoint::testing;

// A tensor of random bytes (any dtype: the file stores bytes, the test compares bytes).
Tensor random_tensor(DType dtype, Shape shape, uint64_t seed) {
  Tensor t = Tensor::zeros(dtype, shape);
  core::Rng rng(seed);
  auto* p = t.data<uint8_t>();
  for (int64_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(rng.next_u64());
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.data<void>(), b.data<void>(), static_cast<size_t>(a.nbytes())) == 0;
}

// Every dtype, ranks 0..4, odd sizes, an empty tensor, and metadata survive a round trip;
// views are aligned to their element size and stay valid after the file object is gone.
TEST(Safetensors, RoundTripEveryDtypeAndRank) {
  TempDir dir;
  std::map<std::string, Tensor> src = {
      {"a.f32", random_tensor(DType::f32, {17, 3}, 1)},      {"b.bf16", random_tensor(DType::bf16, {97}, 2)},
      {"c.u8", random_tensor(DType::u8, {5, 1, 3}, 3)},  // odd byte count before wider types in name order
      {"d.i64", random_tensor(DType::i64, {2, 3, 1, 2}, 4)}, {"e.f8", random_tensor(DType::f8_e4m3, {54}, 5)},
      {"f.i32", random_tensor(DType::i32, {1}, 6)},          {"g.scalar", random_tensor(DType::f32, {}, 7)},
      {"h.empty", random_tensor(DType::bf16, {0, 4}, 8)},
  };
  std::map<std::string, core::TensorView> views;
  for (const auto& [n, t] : src) views[n] = t.view();
  write_safetensors(dir / "x.safetensors", views, {{"format", "pt"}, {"note", "k3"}});

  std::map<std::string, Tensor> loaded;
  {
    const SafetensorsFile f = SafetensorsFile::open(dir / "x.safetensors");
    ASSERT_EQ(f.tensors().size(), src.size());
    EXPECT_EQ(f.metadata().at("format"), "pt");
    EXPECT_EQ(f.metadata().at("note"), "k3");
    for (const auto& [n, t] : src) loaded[n] = f.tensor(n);
  }  // the views keep the mapping alive
  for (const auto& [n, t] : src) {
    SCOPED_TRACE(n);
    EXPECT_TRUE(same_bytes(loaded[n], t));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(loaded[n].data<void>()) % core::dtype_size(t.dtype()), 0u);
  }
  // The header length is a multiple of 8, so the data section is 8-aligned.
  const std::vector<char> bytes = read_bytes(dir / "x.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
}

TEST(Safetensors, WriterIsDeterministicAndOrderIndependent) {
  TempDir dir;
  const Tensor a = random_tensor(DType::f32, {3, 5}, 11), b = random_tensor(DType::bf16, {7}, 12),
               c = random_tensor(DType::u8, {9}, 13);
  write_safetensors(dir / "1.safetensors", {{"b", b.view()}, {"a", a.view()}, {"c", c.view()}});
  // Entries in another order through the streaming API.
  std::vector<TensorEntry> entries = {{"c", DType::u8, {9}}, {"b", DType::bf16, {7}}, {"a", DType::f32, {3, 5}}};
  const std::map<std::string, Tensor> by_name = {{"a", a}, {"b", b}, {"c", c}};
  write_safetensors(dir / "2.safetensors", entries, [&](const TensorEntry& e, std::span<std::byte> out) {
    std::memcpy(out.data(), by_name.at(e.name).data<void>(), out.size());
  });
  EXPECT_EQ(read_bytes(dir / "1.safetensors"), read_bytes(dir / "2.safetensors"));
  // Header keys sorted, compact; data widest dtype first.
  const SafetensorsFile f = SafetensorsFile::open(dir / "1.safetensors");
  EXPECT_EQ(f.find("a")->begin, 0);   // f32 first
  EXPECT_EQ(f.find("b")->begin, 60);  // then bf16
  EXPECT_EQ(f.find("c")->begin, 74);  // then u8
  EXPECT_FALSE(fs::exists(dir / "1.safetensors.tmp"));
}

TEST(Safetensors, WriterRejectsDuplicateAndReservedNames) {
  TempDir dir;
  std::vector<TensorEntry> dup = {{"x", DType::f32, {1}}, {"x", DType::f32, {1}}};
  expect_error_naming([&] { write_safetensors(dir / "d.safetensors", dup, [](auto&, auto) {}); }, {"'x'", "twice"});
  std::vector<TensorEntry> reserved = {{"__metadata__", DType::f32, {1}}};
  expect_error_naming([&] { write_safetensors(dir / "r.safetensors", reserved, [](auto&, auto) {}); },
                      {"__metadata__"});
}

// ---- corrupt files: every message names the file, and the tensor where there is one ----

struct Corrupt {
  const char* what;
  std::string header;
  std::vector<char> data;
  int64_t header_len = -1;
  std::vector<std::string> needles;
};

class SafetensorsCorrupt : public ::testing::TestWithParam<int> {};

std::vector<Corrupt> corrupt_cases() {
  const std::vector<char> d16(16, 0);
  return {
      {"header length past EOF",
       R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
       d16,
       1 << 20,
       {"header length 1048576", "runs past the end"}},
      {"bad JSON", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]})", d16, -1, {"not valid JSON"}},
      {"non-object header", R"([1,2,3])", {}, -1, {"not a JSON object"}},
      {"duplicate key",
       R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
       d16,
       -1,
       {"'w' twice"}},
      {"unknown dtype",
       R"({"w":{"dtype":"F16","shape":[8],"data_offsets":[0,16]}})",
       d16,
       -1,
       {"tensor 'w'", "unknown dtype 'F16'"}},
      {"entry not object", R"({"w":5})", {}, -1, {"tensor 'w'", "not an object"}},
      {"missing field", R"({"w":{"dtype":"F32","shape":[4]}})", d16, -1, {"tensor 'w'", "data_offsets"}},
      {"unknown field",
       R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16],"x":1}})",
       d16,
       -1,
       {"tensor 'w'", "unknown key 'x'"}},
      {"rank 5",
       R"({"w":{"dtype":"U8","shape":[1,1,1,1,16],"data_offsets":[0,16]}})",
       d16,
       -1,
       {"tensor 'w'", "rank 5"}},
      {"negative dim",
       R"({"w":{"dtype":"U8","shape":[-16],"data_offsets":[0,16]}})",
       d16,
       -1,
       {"tensor 'w'", "negative"}},
      {"float dim",
       R"({"w":{"dtype":"U8","shape":[16.0],"data_offsets":[0,16]}})",
       d16,
       -1,
       {"tensor 'w'", "non-integer"}},
      {"offsets not a pair",
       R"({"w":{"dtype":"U8","shape":[16],"data_offsets":[0]}})",
       d16,
       -1,
       {"tensor 'w'", "[begin, end]"}},
      {"begin > end",
       R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[16,0]}})",
       d16,
       -1,
       {"tensor 'w'", "begin > end"}},
      {"size mismatch",
       R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})",
       d16,
       -1,
       {"tensor 'w'", "needs 12"}},
      {"overlap",
       R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
       d16,
       -1,
       {"tensor 'b'", "overlap tensor 'a'"}},
      {"hole",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})",
       d16,
       -1,
       {"tensor 'b'", "hole"}},
      {"truncated data",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
       d16,
       -1,
       {"tensor 'b'", "truncated"}},
      {"trailing bytes",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
       d16,
       -1,
       {"8 data bytes", "'a'", "not indexed"}},
      {"metadata not strings", R"({"__metadata__":{"k":1}})", {}, -1, {"__metadata__", "'k'"}},
  };
}

TEST_P(SafetensorsCorrupt, FailsNamingFileAndTensor) {
  const Corrupt c = corrupt_cases()[static_cast<size_t>(GetParam())];
  SCOPED_TRACE(c.what);
  TempDir dir;
  const fs::path p = dir / "bad.safetensors";
  write_raw_safetensors(p, c.header, c.data, c.header_len);
  std::vector<std::string> needles = c.needles;
  needles.push_back(p.string());
  expect_error_naming([&] { SafetensorsFile::open(p); }, needles);
}
INSTANTIATE_TEST_SUITE_P(AllCases, SafetensorsCorrupt, ::testing::Range(0, static_cast<int>(corrupt_cases().size())));

TEST(Safetensors, ShortAndEmptyFiles) {
  TempDir dir;
  write_bytes(dir / "empty.safetensors", {});
  expect_error_naming([&] { SafetensorsFile::open(dir / "empty.safetensors"); },
                      {(dir / "empty.safetensors").string(), "0 bytes"});
  write_bytes(dir / "short.safetensors", {1, 2, 3});
  expect_error_naming([&] { SafetensorsFile::open(dir / "short.safetensors"); }, {"short.safetensors", "3 bytes"});
  expect_error_naming([&] { SafetensorsFile::open(dir / "absent.safetensors"); },
                      {"absent.safetensors", "cannot open"});
}

TEST(Safetensors, AbsentTensorNamesFileAndTensor) {
  TempDir dir;
  const Tensor a = random_tensor(DType::f32, {2}, 1);
  write_safetensors(dir / "a.safetensors", {{"a", a.view()}});
  const SafetensorsFile f = SafetensorsFile::open(dir / "a.safetensors");
  EXPECT_EQ(f.find("b"), nullptr);
  expect_error_naming([&] { f.tensor("b"); }, {"a.safetensors", "'b'"});
}

// ---- sets ----

void write_two_shards(const TempDir& dir, const Tensor& a, const Tensor& b, const Tensor& c) {
  write_safetensors(dir / shard_file_name(1, 2), {{"a", a.view()}, {"b", b.view()}});
  write_safetensors(dir / shard_file_name(2, 2), {{"c", c.view()}});
  write_index(dir.path(), {{"a", shard_file_name(1, 2)}, {"b", shard_file_name(1, 2)}, {"c", shard_file_name(2, 2)}},
              a.nbytes() + b.nbytes() + c.nbytes());
}

TEST(SafetensorsSet, SingleFileAndShards) {
  const Tensor a = random_tensor(DType::f32, {4}, 1), b = random_tensor(DType::bf16, {3, 3}, 2),
               c = random_tensor(DType::u8, {17}, 3);
  {
    TempDir dir;
    write_safetensors(dir / kSingleFileName, {{"a", a.view()}, {"b", b.view()}, {"c", c.view()}});
    const SafetensorsSet set = SafetensorsSet::open_dir(dir.path());
    EXPECT_FALSE(set.sharded());
    ASSERT_EQ(set.entries().size(), 3u);
    EXPECT_TRUE(same_bytes(set.tensor(*set.find("c")), c));
  }
  TempDir dir;
  write_two_shards(dir, a, b, c);
  EXPECT_EQ(shard_file_name(1, 2), "model-00001-of-00002.safetensors");
  const SafetensorsSet set = SafetensorsSet::open_dir(dir.path());
  EXPECT_TRUE(set.sharded());
  ASSERT_EQ(set.entries().size(), 3u);
  EXPECT_EQ(set.find("c")->file->path(), dir / shard_file_name(2, 2));
  EXPECT_TRUE(same_bytes(set.tensor(*set.find("a")), a));
  EXPECT_TRUE(same_bytes(set.tensor(*set.find("b")), b));
  EXPECT_TRUE(same_bytes(set.tensor(*set.find("c")), c));
  EXPECT_EQ(set.find("d"), nullptr);
  const auto index = nlohmann::json::parse(read_bytes(dir / kIndexFileName));
  EXPECT_EQ(index["metadata"]["total_size"], a.nbytes() + b.nbytes() + c.nbytes());
}

TEST(SafetensorsSet, IndexErrors) {
  const Tensor a = random_tensor(DType::f32, {4}, 1), b = random_tensor(DType::bf16, {3, 3}, 2),
               c = random_tensor(DType::u8, {17}, 3);
  const std::string shard2 = shard_file_name(2, 2);
  {  // the index names a shard that does not exist
    TempDir dir;
    write_two_shards(dir, a, b, c);
    fs::remove(dir / shard2);
    expect_error_naming([&] { SafetensorsSet::open_dir(dir.path()); },
                        {kIndexFileName, shard2, "'c'", "does not exist"});
  }
  {  // the index places a tensor in a file that does not hold it
    TempDir dir;
    write_two_shards(dir, a, b, c);
    write_index(dir.path(), {{"a", shard_file_name(1, 2)}, {"b", shard2}, {"c", shard2}}, 0);
    expect_error_naming([&] { SafetensorsSet::open_dir(dir.path()); },
                        {kIndexFileName, "'b'", shard2, "does not hold"});
  }
  {  // a shard holds a tensor the index does not list
    TempDir dir;
    write_two_shards(dir, a, b, c);
    write_index(dir.path(), {{"a", shard_file_name(1, 2)}, {"c", shard2}}, 0);
    expect_error_naming([&] { SafetensorsSet::open_dir(dir.path()); },
                        {kIndexFileName, shard_file_name(1, 2), "'b'", "does not list"});
  }
  {  // malformed index, a path escaping the folder, both forms present, neither present
    TempDir dir;
    write_bytes(dir / kIndexFileName, {'{', '}'});
    expect_error_naming([&] { SafetensorsSet::open_dir(dir.path()); }, {kIndexFileName, "weight_map"});
    write_index(dir.path(), {{"a", "../x.safetensors"}}, 0);
    expect_error_naming([&] { SafetensorsSet::open_dir(dir.path()); }, {kIndexFileName, "'a'", "not a file inside"});
    write_safetensors(dir / kSingleFileName, {{"a", a.view()}});
    expect_error_naming([&] { SafetensorsSet::open_dir(dir.path()); }, {dir.path().string(), "both"});
    fs::remove(dir / kSingleFileName);
    fs::remove(dir / kIndexFileName);
    expect_error_naming([&] { SafetensorsSet::open_dir(dir.path()); }, {dir.path().string(), "neither"});
  }
  {  // a corrupt shard fails naming the shard
    TempDir dir;
    write_two_shards(dir, a, b, c);
    write_bytes(dir / shard2, {1, 0, 0, 0, 0, 0, 0, 0, '{'});
    expect_error_naming([&] { SafetensorsSet::open_dir(dir.path()); }, {shard2, "not valid JSON"});
  }
}

}  // namespace
}  // namespace k3::checkpoint
