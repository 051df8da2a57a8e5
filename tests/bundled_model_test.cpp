// tests/bundled_model_test.cpp: the bundled trained model (models/k3-code-15m, train/README.md)
// answers a newcomer's first question like a model, through the engine's chat path on the CPU
// oracle: tokenizer folder, chat template, greedy decoding, detokenizer.
#include <gtest/gtest.h>

#include <filesystem>

#include "engine/one_shot.h"
#include "runner/model_runner.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/tokenizer.h"

namespace k3 {
namespace {

const std::filesystem::path kBundled = std::filesystem::path(K3_SOURCE_DIR) / "models" / "k3-code-15m";

TEST(BundledModel, WritesTheFunctionItIsAskedFor) {
  const tokenizer::Tokenizer tok = tokenizer::Tokenizer::load_k3(kBundled);
  auto runner = runner::ModelRunner::open(kBundled, {});
  EXPECT_EQ(runner->config().vocab_size, tok.vocab_size());
  for (const auto& [name, ask] :
       {std::pair{"is_prime", "Write a Python function `is_prime(n)`: Return True if n is a prime number."},
        std::pair{"read_json",
                  "Write a Python function `read_json(path)`: Load a JSON file and return its contents."}}) {
    const nlohmann::ordered_json messages = {{{"role", "user"}, {"content", ask}}};
    const std::vector<int32_t> prompt = tokenizer::encode_chat(tok, messages, nullptr, {});
    const std::vector<int32_t> out = engine::generate(*runner, prompt, 24, {});
    const std::string text = tok.decode(out);
    // The think channel closes at once (training's chats have empty reasoning), then a code block.
    EXPECT_NE(text.find("```python\ndef " + std::string(name) + "("), std::string::npos) << text;
  }
}

}  // namespace
}  // namespace k3
