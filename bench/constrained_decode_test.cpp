// bench/constrained_decode_test.cpp: k3bench_constrained_decode as CI runs it (CPU reference ops,
// k3-tiny): the bundle holds a row per (batch, grammar) with decode steps timed at full batch, every
// constrained output is a sentence of its grammar, and bad options are refused by name.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

namespace k3::bench {
namespace {

namespace fs = std::filesystem;

const fs::path kRanks = fs::path(K3_SOURCE_DIR) / ".testdata/gpt-tokenizer/o200k_base.tiktoken";

struct Scratch {
  fs::path path = fs::temp_directory_path() / ("k3_constrained_decode_test_" + std::to_string(::getpid()));
  Scratch() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~Scratch() { fs::remove_all(path); }
};

// Runs the program with `args`; returns its exit status, stderr in *err.
int run(const Scratch& dir, const std::string& args, std::string* err) {
  const fs::path e = dir.path / "stderr.txt";
  const std::string cmd = std::string("'") + K3BENCH_CONSTRAINED_DECODE + "' " + args + " > '" +
                          (dir.path / "stdout.txt").string() + "' 2> '" + e.string() + "'";
  const int status = std::system(cmd.c_str());
  std::stringstream s;
  s << std::ifstream(e).rdbuf();
  *err = s.str();
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(ConstrainedDecodeBench, TimesFreeAndConstrainedRowsAndEveryOutputFollowsItsGrammar) {
  if (!fs::exists(kRanks)) GTEST_SKIP() << "no " << kRanks << " (scripts/fetch_test_data.sh fetches it)";
  const Scratch dir;
  const fs::path model = dir.path / "tiny", out = dir.path / "bundle.json";
  std::string err;
  ASSERT_EQ(run(dir,
                "--model '" + model.string() + "' --make --config k3-tiny --device cpu --batches 1,3 --grammars " +
                    "free,bash,agent_tools --prompt 9 --tokens 12 --rounds 2 --kv-gb 0.05 --out '" + out.string() + "'",
                &err),
            0)
      << err;
  const nlohmann::json b = nlohmann::json::parse(std::ifstream(out));
  EXPECT_EQ(b["benchmark"], "constrained_decode");
  EXPECT_EQ(b["config"]["vocab_size"], 1024);
  ASSERT_EQ(b["rows"].size(), 6u);
  for (const auto& row : b["rows"]) {
    SCOPED_TRACE(row.dump().substr(0, 200));
    const int batch = row["batch"];
    EXPECT_EQ(row["outputs"], batch * 2);  // two rounds
    EXPECT_GE(row["tokens"].get<int>(), batch);
    if (row["grammar"] == "free") {
      // Free rows of a random model run to --tokens: every step after the prefill has all rows.
      EXPECT_GE(row["full_batch_steps"].get<int>(), 5);
      EXPECT_GT(row["tpot_full_batch_ms"]["median"].get<double>(), 0);
      EXPECT_TRUE(row["valid_outputs"].is_null());
    } else {
      EXPECT_EQ(row["valid_outputs"], row["outputs"]) << "every constrained output must follow its grammar";
      EXPECT_GT(row["step_ms_by_rows"].size(), 0u);
      // Each constrained round's free twin has its prompts and output lengths: the same rows at
      // every step. At batch 1 every step has 1 row, warm from the warm-up round, so all pair.
      const auto& paired = row["paired_with_free_twins"];
      EXPECT_EQ(paired["mismatched_steps"], 0);
      if (batch == 1) {
        EXPECT_GT(paired["steps"].get<int>(), 0);
        EXPECT_GT(paired["ratio_of_sums"].get<double>(), 0);
        EXPECT_EQ(paired["step_ratio"]["n"], paired["steps"]);
      }
    }
  }
  EXPECT_EQ(b["rows"][5]["grammars"], 33) << "agent_tools: the 21 Claude Code and 12 Codex tool schemas";
  EXPECT_EQ(b["config"]["prefix_cache"], false);
  // The timed rounds come after the cache warmed the grammars (bash and the 33 agent tools).
  EXPECT_GE(b["grammar_warming"]["grammars"].get<int>(), 31) << b["grammar_warming"].dump();
  EXPECT_GT(b["grammar_warming"]["chains"].get<int>(), 0);
  for (const auto& row : b["rows"]) EXPECT_EQ(row["warmed"], true) << row["grammar"];
}

// --vocab writes the checkpoint with that vocabulary (K3's is 163840) and is held to it afterwards.
TEST(ConstrainedDecodeBench, VocabWritesTheCheckpointWithThatVocabulary) {
  if (!fs::exists(kRanks)) GTEST_SKIP() << "no " << kRanks << " (scripts/fetch_test_data.sh fetches it)";
  const Scratch dir;
  const fs::path model = dir.path / "tiny", out = dir.path / "bundle.json";
  const std::string common = "--model '" + model.string() + "' --make --config k3-tiny --device cpu --batches 1 " +
                             "--grammars free,bash --prompt 5 --tokens 4 --rounds 1 --kv-gb 0.05 --out '" +
                             out.string() + "' ";
  std::string err;
  ASSERT_EQ(run(dir, common + "--vocab 3000", &err), 0) << err;
  const nlohmann::json b = nlohmann::json::parse(std::ifstream(out));
  EXPECT_EQ(b["config"]["vocab_size"], 3000);
  EXPECT_EQ(b["rows"][1]["valid_outputs"], 1);
  EXPECT_EQ(run(dir, common + "--vocab 4000", &err), 1);
  EXPECT_NE(err.find("has vocab_size 3000, not the 4000 asked for"), std::string::npos) << err;
}

TEST(ConstrainedDecodeBench, RefusesBadOptionsNamingThem) {
  const Scratch dir;
  const std::string m = "--model '" + (dir.path / "none").string() + "' --device cpu ";
  for (const auto& [args, needle] :
       std::vector<std::pair<std::string, std::string>>{{"--batches 0", "--batches"},
                                                        {"--tokens 1", "--tokens"},
                                                        {"--device tpu", "--device"},
                                                        {"--decode-backend fast", "--decode-backend"},
                                                        {"--grammars free,xml", "'xml'"},
                                                        {"--vocab -5", "--vocab"},
                                                        {"--warm-wait -1", "--warm-wait"},
                                                        {"", "no checkpoint in"}}) {
    std::string err;
    EXPECT_EQ(run(dir, m + args, &err), 1) << args;
    EXPECT_NE(err.find(needle), std::string::npos) << args << ": " << err;
  }
}

}  // namespace
}  // namespace k3::bench
