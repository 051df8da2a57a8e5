// checkpoint/loader_progress_test.cpp: the load progress callback (bytes reported from 0,
// strictly increasing in load_progress_step() steps, ending at the total weight bytes of the
// files, single file and sharded; the weights loaded with it are the same bytes; nothing is
// reported for a checkpoint that fails validation) and LoadProgressLog's lines.
#include <gtest/gtest.h>

#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_test_util.h"
#include "checkpoint/safetensors.h"

namespace k3::checkpoint {
namespace {

using namespace k3::checkpoint::testing;

// Sum of the data bytes of every tensor in every safetensors file of `dir`, read from the
// headers independently of the loader.
int64_t weight_bytes_on_disk(const fs::path& dir) {
  int64_t total = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors")
      for (const TensorInfo& t : SafetensorsFile::open(e.path()).tensors()) total += t.end - t.begin;
  return total;
}

void expect_progress_well_formed(const std::vector<LoadProgress>& reports, int64_t expected_total) {
  const int64_t step = load_progress_step(expected_total);
  ASSERT_GE(reports.size(), 2u);
  EXPECT_EQ(reports.front().bytes_done, 0);
  EXPECT_EQ(reports.back().bytes_done, expected_total);
  EXPECT_TRUE(reports.back().finished());
  for (size_t i = 0; i < reports.size(); ++i) {
    EXPECT_EQ(reports[i].bytes_total, expected_total) << i;
    if (i == 0) continue;
    EXPECT_GT(reports[i].bytes_done, reports[i - 1].bytes_done) << i;
    EXPECT_GE(reports[i].seconds, reports[i - 1].seconds) << i;
    if (i + 1 < reports.size()) {
      // Intermediate reports come every step, exactly.
      EXPECT_EQ(reports[i].bytes_done, static_cast<int64_t>(i) * step) << i;
      EXPECT_FALSE(reports[i].finished()) << i;
    }
  }
  const auto expected_reports = static_cast<size_t>((expected_total + step - 1) / step) + 1;
  EXPECT_EQ(reports.size(), expected_reports);
}

class LoaderProgress : public ::testing::TestWithParam<bool> {};  // param: sharded

TEST_P(LoaderProgress, ReportsIncreasingBytesEndingAtTheTotal) {
  const bool sharded = GetParam();
  const config::K3Config cfg = config::builtin_config("k3-tiny");
  WriteOptions opt;
  opt.seed = 7;
  opt.max_shard_bytes = sharded ? 3 << 20 : 0;
  TempDir dir;
  write_random_checkpoint(cfg, opt, dir.path());
  const int64_t total = weight_bytes_on_disk(dir.path());
  // Many steps (about 100 of 64 KiB here), so intermediate reports exist.
  ASSERT_GT(total, 50 * load_progress_step(total));

  std::vector<LoadProgress> reports;
  const LoadedModel with = load_checkpoint(dir.path(), [&](const LoadProgress& p) { reports.push_back(p); });
  expect_progress_well_formed(reports, total);

  // Reading the pages in changes nothing about what is loaded.
  const LoadedModel without = load_checkpoint(dir.path());
  const auto a = flatten(with.weights, cfg), b = flatten(without.weights, cfg);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) EXPECT_TRUE(same_bytes(t, b.at(name))) << name;
}

TEST(LoadProgressStep, OnePercentBetween64KiBAnd16MiB) {
  EXPECT_EQ(load_progress_step(0), 64 << 10);
  EXPECT_EQ(load_progress_step(1000), 64 << 10);
  EXPECT_EQ(load_progress_step(6'529'920), 64 << 10);
  EXPECT_EQ(load_progress_step(1'000'000'000), 10'000'000);
  EXPECT_EQ(load_progress_step(int64_t{1} << 40), 16 << 20);
}

INSTANTIATE_TEST_SUITE_P(Files, LoaderProgress, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "sharded" : "single_file"; });

TEST(LoaderProgressErrors, NothingIsReportedForACheckpointThatFailsValidation) {
  const config::K3Config cfg = config::builtin_config("k3-tiny");
  TempDir dir;
  write_random_checkpoint(cfg, WriteOptions{}, dir.path());
  rewrite_tensors(dir.path(), [](std::map<std::string, core::Tensor>& m) { m.erase("model.norm.weight"); });
  int calls = 0;
  expect_error_naming([&] { load_checkpoint(dir.path(), [&](const LoadProgress&) { ++calls; }); },
                      {"missing tensor 'model.norm.weight'"});
  EXPECT_EQ(calls, 0);
}

LoadProgress at(int64_t done, int64_t total, double seconds) {
  LoadProgress p;
  p.bytes_done = done;
  p.bytes_total = total;
  p.seconds = seconds;
  return p;
}

TEST(LoadProgressLog, ThrottlesProgressLinesAndAlwaysPrintsTheLast) {
  LoadProgressLog log("models/k3-tiny", 0.5);
  const int64_t total = 27'000'000;
  EXPECT_EQ(log.line(at(0, total, 0.0)), "");
  EXPECT_EQ(log.line(at(5'000'000, total, 0.2)), "");  // too soon
  EXPECT_EQ(log.line(at(12'150'000, total, 0.5)), "loading models/k3-tiny: 45% 12.2/27.0 MB 24 MB/s");
  EXPECT_EQ(log.line(at(13'000'000, total, 0.9)), "");  // 0.4 s after the last line
  EXPECT_EQ(log.line(at(20'000'000, total, 1.0)), "loading models/k3-tiny: 74% 20.0/27.0 MB 20 MB/s");
  EXPECT_EQ(log.line(at(total, total, 1.1)), "loaded models/k3-tiny: 27.0 MB in 1.10 s (25 MB/s)");
}

TEST(LoadProgressLog, FinalLineEvenWhenFastAndGigabyteUnitsForLargeModels) {
  LoadProgressLog fast("m", 0.5);
  EXPECT_EQ(fast.line(at(0, 27'000'000, 0.0)), "");
  EXPECT_EQ(fast.line(at(27'000'000, 27'000'000, 0.0675)), "loaded m: 27.0 MB in 0.07 s (400 MB/s)");

  LoadProgressLog big("/ckpt/k3", 0.5);
  const int64_t total = 1'200'000'000'000;  // 1.2 TB
  EXPECT_EQ(big.line(at(300'000'000'000, total, 100.0)), "loading /ckpt/k3: 25% 300.0/1200.0 GB 3.00 GB/s");
  EXPECT_EQ(big.line(at(total, total, 400.0)), "loaded /ckpt/k3: 1200.0 GB in 400.0 s (3.00 GB/s)");

  LoadProgressLog empty("e", 0.5);
  EXPECT_EQ(empty.line(at(0, 0, 0.0)), "loaded e: 0.0 MB in 0.00 s (- MB/s)");
}

}  // namespace
}  // namespace k3::checkpoint
