// tests/cli_test.cpp: the k3serve program as users and other checks call it.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "checkpoint/safetensors.h"
#include "test_util.h"

namespace k3 {
namespace {

struct RunResult {
  int code = -1;
  std::string output;  // stdout + stderr
};

RunResult run(const std::string& args) {
  const std::string cmd = std::string(K3_BINARY) + " " + args + " 2>&1";
  RunResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  while (size_t n = std::fread(buf.data(), 1, buf.size(), p)) r.output.append(buf.data(), n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

class Cli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new testing::TempDir();
    const RunResult r = run("make-checkpoint --config k3-tiny --seed 0 --out " + model_dir());
    ASSERT_EQ(r.code, 0) << r.output;
  }
  static void TearDownTestSuite() { delete tmp_; }
  static std::string model_dir() { return (tmp_->path() / "k3-tiny").string(); }
  static std::string path(const std::string& name) { return (tmp_->path() / name).string(); }
  static testing::TempDir* tmp_;
};
testing::TempDir* Cli::tmp_ = nullptr;

const std::string kTokens = "3,14,15,92,65,35,89,79,32,38,46,26";

TEST_F(Cli, LogitsWithDecodeFromMatchesFullPrefill) {
  for (const std::string precision : {"fp32", "bf16"}) {
    ASSERT_EQ(run("logits --model " + model_dir() + " --precision " + precision + " --token-ids " + kTokens +
                  " --out " + path("full.safetensors"))
                  .code,
              0);
    const RunResult r = run("logits --model " + model_dir() + " --precision " + precision + " --token-ids " + kTokens +
                            " --decode-from 5 --out " + path("dec.safetensors"));
    ASSERT_EQ(r.code, 0) << r.output;
    const auto full = checkpoint::SafetensorsFile::open(path("full.safetensors")).tensor("logits");
    const auto dec = checkpoint::SafetensorsFile::open(path("dec.safetensors")).tensor("logits");
    ASSERT_EQ(full.shape(), (core::Shape{12, 1024}));
    ASSERT_EQ(dec.dtype(), core::DType::f32);
    const auto d = testing::compare(dec, full);
    if (precision == "fp32") {
      EXPECT_LT(d.rel(), 1e-4);
    } else {
      EXPECT_GT(d.cosine, 0.99);
    }
  }
}

TEST_F(Cli, GenerateIsDeterministicAndHonoursMaxTokens) {
  const std::string base = "generate --model " + model_dir() + " --token-ids " + kTokens + " --max-tokens 7";
  const RunResult greedy1 = run(base), greedy2 = run(base);
  ASSERT_EQ(greedy1.code, 0) << greedy1.output;
  EXPECT_EQ(greedy1.output.substr(0, greedy1.output.find('\n')), greedy2.output.substr(0, greedy2.output.find('\n')));
  const std::string first_line = greedy1.output.substr(0, greedy1.output.find('\n'));
  EXPECT_EQ(std::count(first_line.begin(), first_line.end(), ','), 6) << first_line;
  const RunResult s1 = run(base + " --temperature 1.0 --top-p 0.9 --seed 5");
  const RunResult s2 = run(base + " --temperature 1.0 --top-p 0.9 --seed 5");
  ASSERT_EQ(s1.code, 0) << s1.output;
  EXPECT_EQ(s1.output.substr(0, s1.output.find('\n')), s2.output.substr(0, s2.output.find('\n')));
}

TEST_F(Cli, BadInputGivesAClearErrorAndExitCode2) {
  struct Case {
    std::string args, expect;
  };
  const std::vector<Case> cases = {
      {"frobnicate", "unknown command"},
      {"generate --model " + model_dir() + " --token-ids 1,2 --bogus 3", "unknown option --bogus"},
      {"generate --model " + model_dir() + " --token-ids 1,5000", "token id 5000"},
      {"generate --model " + model_dir() + " --token-ids 1,x", "--token-ids"},
      {"generate --model " + model_dir() + " --token-ids 1 --temperature -2", "temperature"},
      {"generate --model " + model_dir() + " --token-ids 1 --max-tokens", "needs a value"},
      {"generate --model /nonexistent/dir --token-ids 1", "/nonexistent/dir"},
      {"logits --model " + model_dir() + " --token-ids 1,2 --decode-from 3 --out " + path("x.safetensors"),
       "--decode-from"},
      {"logits --model " + model_dir() + " --token-ids 1,2 --precision fp16 --out " + path("x.safetensors"),
       "--precision"},
      {"logits --model " + model_dir() + " --token-ids 1,2", "--out is required"},
      {"make-checkpoint --config k3-huge --out " + path("y"), "k3-huge"},
      {"train-tokenizer --corpus " + path("bad.jsonl") + " --vocab-size 600 --out " + path("y"), "bad.jsonl line 2"},
      {"train-tokenizer --corpus " + path("bad.jsonl") + " --vocab-size 300 --out " + path("y"), "--vocab-size"},
      {"encode-corpus --tokenizer " + model_dir() + " --corpus /nonexistent.jsonl --out " + path("y"),
       "/nonexistent.jsonl"},
      {"make-checkpoint --config k3-tiny --draft-kind eagle3 --out " + path("y"), "only apply with --draft-for"},
      {"make-checkpoint --draft-for k3-tiny --draft-kind medusa --out " + path("y"), "dspark or eagle3"},
      {"serve --model " + model_dir() + " --speculative-model " + path("y"),
       "--speculative-model is only used with --speculative-method dspark or eagle3"},
      {"serve --model " + model_dir() + " --speculative-method eagle3 --num-speculative-tokens 3",
       "--speculative-method eagle3 needs --speculative-model"},
      {"serve --model " + model_dir() + " --tp 2 --decode-context-parallel-size 4",
       "dcp 4 must be 1 or the tensor-parallel size 2"},
      {"serve --model " + model_dir() + " --shadow-validate-rate 0.01",
       "--shadow-validate-rate checks the fused decode path against the standard one: it needs --decode-backend "
       "latency_specialized"},
      {"serve --model " + model_dir() + " --decode-backend latency_specialized --shadow-validate-rate 2",
       "--shadow-validate-rate must be in [0, 1], got 2"},
      {"serve --model " + model_dir() + " --max-num-partial-prefills 2 --max-long-partial-prefills 3",
       "--max-long-partial-prefills (3) must be <= --max-num-partial-prefills (2)"},
      {"serve --model " + model_dir() + " --long-prefill-token-threshold 16",
       "long_prefill_token_threshold (16) must be >= the chunk alignment"},
  };
  std::ofstream(path("bad.jsonl")) << R"({"text": "fine"})"
                                   << "\n"
                                   << R"({"txt": "typo"})"
                                   << "\n";
  for (const auto& c : cases) {
    const RunResult r = run(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << c.args << "\n" << r.output;
  }
}

// `make-checkpoint --draft-for T --draft-kind eagle3` writes an EAGLE-3 draft in the Hugging Face
// layout (the config vLLM and SGLang read) that the server's loader takes.
TEST_F(Cli, MakeCheckpointWritesAnEagle3Draft) {
  const RunResult r = run("make-checkpoint --draft-for k3-tiny --draft-kind eagle3 --seed 1 --out " + path("e3"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("wrote EAGLE-3 draft"), std::string::npos) << r.output;
  std::ifstream f(path("e3") + "/config.json");
  const std::string config((std::istreambuf_iterator<char>(f)), {});
  EXPECT_NE(config.find("LlamaForCausalLMEagle3"), std::string::npos) << config;
  EXPECT_NE(config.find("eagle_aux_hidden_state_layer_ids"), std::string::npos) << config;
  EXPECT_TRUE(std::filesystem::exists(path("e3") + "/model.safetensors"));
}

// train-tokenizer + encode-corpus (train/README.md): a trained tokenizer folder the server loads,
// and the uint32 token stream train/train_k3.py reads: each document's ids, then [EOS].
TEST_F(Cli, TrainTokenizerAndEncodeCorpus) {
  {
    std::ofstream f(path("corpus.jsonl"));
    for (int i = 0; i < 40; ++i)
      f << R"({"text": "def square(x):\n    return x * x\n"})"
        << "\n";
    f << R"({"messages": [{"role": "user", "content": "square 3"}, {"role": "assistant", "content": "9"}]})"
      << "\n";
  }
  RunResult r = run("train-tokenizer --corpus " + path("corpus.jsonl") + " --vocab-size 600 --out " + path("tok"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("41 documents"), std::string::npos) << r.output;
  EXPECT_TRUE(std::filesystem::exists(path("tok") + "/tiktoken.model"));
  r = run("encode-corpus --tokenizer " + path("tok") + " --corpus " + path("corpus.jsonl") + " --threads 3 --out " +
          path("corpus.bin"));
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream bin(path("corpus.bin"), std::ios::binary);
  std::vector<uint32_t> ids;
  for (uint32_t v = 0; bin.read(reinterpret_cast<char*>(&v), 4);) ids.push_back(v);
  const uint32_t eos = 600 - 256 + 1;
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.back(), eos);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), eos), 41);
  // The repeated document is a handful of tokens ("def", " square", "(x", ...), the same each time.
  const auto first_eos = std::find(ids.begin(), ids.end(), eos) - ids.begin();
  EXPECT_LE(first_eos, 10);
  EXPECT_TRUE(std::equal(ids.begin(), ids.begin() + first_eos + 1, ids.begin() + first_eos + 1));
  EXPECT_TRUE(std::all_of(ids.begin(), ids.end(), [](uint32_t v) { return v < 600; }));
}

TEST_F(Cli, HelpListsEveryCommand) {
  const RunResult r = run("--help");
  EXPECT_EQ(r.code, 0);
  for (const char* c : {"make-checkpoint", "logits", "generate"}) EXPECT_NE(r.output.find(c), std::string::npos);
  EXPECT_EQ(run("generate --help").code, 0);
}

}  // namespace
}  // namespace k3
