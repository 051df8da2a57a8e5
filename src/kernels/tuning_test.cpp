// kernels/tuning_test.cpp: tuning tables: lookup by size, the errors of a malformed table, and the
// checked-in tables of tuning/ (each parses; one default; GPU tables by device name).
#include "kernels/tuning.h"

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace k3::kernels {
namespace {

std::string parse_error(const std::string& json) {
  try {
    TuningTable::parse(json, "t.json");
  } catch (const core::Error& e) {
    return e.what();
  }
  return "";
}

TEST(Tuning, RulesAreFoundBySize) {
  const TuningTable t = TuningTable::parse(R"({"gpu": "G", "ops": {"op": {"measure": "rows", "rules": [
      {"sizes": [1, 1], "order": ["a"]}, {"sizes": [2, 16], "order": ["b", "a"]}, {"sizes": [33, null], "order": ["c"]}]}}})",
                                           "t.json");
  EXPECT_EQ(t.gpu(), "G");
  EXPECT_EQ(t.find("op", 1)->order, std::vector<std::string>{"a"});
  EXPECT_EQ(t.find("op", 16)->order, (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(t.find("op", 17), nullptr);  // a gap: the caller falls back
  EXPECT_EQ(t.find("op", 1 << 30)->order, std::vector<std::string>{"c"});
  EXPECT_EQ(t.find("op", 0), nullptr);
  EXPECT_EQ(t.find("other", 1), nullptr);
  EXPECT_EQ(describe_sizes("rows", *t.find("op", 1)), "rows 1");
  EXPECT_EQ(describe_sizes("rows", *t.find("op", 3)), "rows 2..16");
  EXPECT_EQ(describe_sizes("rows", *t.find("op", 40)), "rows 33+");
}

TEST(Tuning, TheGpuTableComesBeforeTheDefault) {
  Tuning t;
  t.gpu = std::make_shared<const TuningTable>(TuningTable::parse(
      R"({"gpu": "G", "ops": {"op": {"measure": "rows", "rules": [{"sizes": [1, 4], "order": ["g"]}]}}})", "g.json"));
  t.fallback = std::make_shared<const TuningTable>(TuningTable::parse(
      R"({"gpu": "*", "ops": {"op": {"measure": "rows", "rules": [{"sizes": [0, null], "order": ["d"]}]}}})",
      "d.json"));
  const std::string* source = nullptr;
  EXPECT_EQ(t.find("op", 3, &source)->order[0], "g");
  EXPECT_EQ(*source, "g.json");
  EXPECT_EQ(t.find("op", 5, &source)->order[0], "d");
  EXPECT_EQ(*source, "d.json");
  EXPECT_EQ(Tuning{}.find("op", 5, &source), nullptr);
}

TEST(Tuning, MalformedTablesAreErrorsNamingTheKey) {
  EXPECT_NE(parse_error("[1]").find("t.json: not a JSON object"), std::string::npos);
  EXPECT_NE(parse_error(R"({"ops": {}})").find("\"gpu\" must be a non-empty string"), std::string::npos);
  EXPECT_NE(parse_error(R"({"gpu": "G"})").find("\"ops\" must be an object"), std::string::npos);
  EXPECT_NE(parse_error(R"({"gpu": "G", "ops": {"op": {"rules": []}}})").find("ops.op.measure must be a string"),
            std::string::npos);
  const std::string overlap = parse_error(R"({"gpu": "G", "ops": {"op": {"measure": "rows", "rules": [
      {"sizes": [1, 8], "order": ["a"]}, {"sizes": [8, 9], "order": ["a"]}]}}})");
  EXPECT_NE(overlap.find("ops.op.rules[1].sizes overlap"), std::string::npos) << overlap;
  const std::string twice = parse_error(R"({"gpu": "G", "ops": {"op": {"measure": "rows", "rules": [
      {"sizes": [1, 8], "order": ["a", "a"]}]}}})");
  EXPECT_NE(twice.find("ops.op.rules[0].order names 'a' twice"), std::string::npos) << twice;
  const std::string empty = parse_error(R"({"gpu": "G", "ops": {"op": {"measure": "rows", "rules": [
      {"sizes": [1, 8], "order": []}]}}})");
  EXPECT_NE(empty.find("ops.op.rules[0].order must be a non-empty array"), std::string::npos) << empty;
  const std::string bounds = parse_error(R"({"gpu": "G", "ops": {"op": {"measure": "rows", "rules": [
      {"sizes": [9, 8], "order": ["a"]}]}}})");
  EXPECT_NE(bounds.find("lo above hi"), std::string::npos) << bounds;
  EXPECT_NE(
      parse_error(R"({"gpu": "G", "ops": {"op": {"measure": "rows", "rules": [{"sizes": [-1, 8], "order": ["a"]}]}}})")
          .find("must be a non-negative integer"),
      std::string::npos);
}

TEST(Tuning, TheCheckedInTablesParseWithOneDefault) {
  const auto tables = builtin_tuning_tables();
  int defaults = 0;
  for (const auto& t : tables) defaults += t->gpu() == "*";
  EXPECT_EQ(defaults, 1) << "tuning/default.json (gpu \"*\") must be there, once";
  const Tuning unknown = builtin_tuning("A GPU nobody tuned for");
  EXPECT_EQ(unknown.gpu, nullptr);
  ASSERT_NE(unknown.fallback, nullptr);
  EXPECT_EQ(unknown.fallback->source(), "tuning/default.json");
  // Each GPU's table is what that GPU's selection reads (tables are parsed anew on each call).
  for (const auto& t : tables) {
    if (t->gpu() == "*") continue;
    const Tuning tuning = builtin_tuning(t->gpu());
    ASSERT_NE(tuning.gpu, nullptr) << t->source();
    EXPECT_EQ(tuning.gpu->source(), t->source());
    EXPECT_EQ(tuning.gpu->ops().size(), t->ops().size()) << t->source();
    EXPECT_EQ(tuning.fallback->source(), "tuning/default.json");
  }
  // The H200's table is checked in (written by k3bench_decode_gpu --tune, docs/perf/tuning.md).
  EXPECT_NE(builtin_tuning("NVIDIA H200").gpu, nullptr);
}

}  // namespace
}  // namespace k3::kernels
