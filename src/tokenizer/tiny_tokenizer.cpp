// tokenizer/tiny_tokenizer.cpp: deterministic BPE training on a built-in text, and the writer.
#include "tokenizer/tiny_tokenizer.h"

#include <algorithm>
#include <fstream>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/base64.h"
#include "tokenizer/bpe_trainer.h"
#include "tokenizer/k3_tokens.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/split_patterns.h"

namespace k3::tokenizer {

namespace fs = std::filesystem;

namespace {

// Training text: chat-like English, the words of K3's chat format, a little code, numbers and
// Chinese, so the merges cover what the bundled model is asked to say.
constexpr std::string_view kTrainingText = R"TXT(
Hello! How can I help you today? I am a small test model, and I answer every question with
the best words I have. The user asks, the assistant thinks, and then the assistant writes a
response. A message has a role: system, user, assistant or tool. The system message says what
the assistant should do. The tool message returns the result of a call, and the assistant reads
it before it writes the next response.
message role="user" message role="assistant" message role="system" message role="tool"
think response tools call argument json key type string number boolean null object array
index tool name content reasoning function arguments parameters description properties required
Here are the available tools, described in JSONSchema. The system is invoked with tool_choice.
What is the weather in Paris today? It is sunny and warm, with a light wind from the west.
What is the capital of France? The capital of France is Paris. What is two plus two? Four.
Please write a short story about a cat who lives in a library and reads books at night.
Once upon a time there was a cat named Tom. Every night, when the people had gone home, Tom
walked between the shelves and opened the books that were left on the tables. He read about
ships and stars, about kings and queens, about numbers and about the sea.
def add(a, b):
    return a + b

for i in range(10):
    print(i, add(i, i * 2))

int main(int argc, char** argv) {
  std::vector<int> values = {1, 2, 3, 4, 5};
  for (int v : values) std::printf("%d\n", v);
  return 0;
}
{"name": "get_weather", "arguments": {"city": "Paris", "days": 3, "unit": "celsius"}}
The numbers 0 1 2 3 4 5 6 7 8 9 10 11 12 100 1000 2024 2025 2026 3.14 2.71 42 7 99 256 512 1024.
You are a helpful assistant. Answer in the language of the question, and keep it short.
Thank you very much! You are welcome. Good morning, good evening, good night. Yes, no, maybe.
I think that the answer is correct, but let me check it again: first we read the question,
then we find the facts, then we write the answer, and then we check that every step is right.
你好，世界！今天天气很好。我是一个小模型，我会尽力回答你的问题。谢谢你！再见。
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
)TXT";

}  // namespace

K3Vocab k3_vocab(std::vector<std::string> tokens, int32_t vocab_size) {
  K3_CHECK(vocab_size >= kMinK3Vocab, "tokenizer: vocab_size " + std::to_string(vocab_size) + " is below " +
                                          std::to_string(kMinK3Vocab) + " (256 byte tokens + 256 special slots)");
  K3_CHECK(tokens.size() >= 256, "tokenizer: the learned tokens must start with the 256 single bytes");
  K3Vocab vocab;
  vocab.first_special = vocab_size - Tokenizer::kReservedSpecialSlots;
  const auto target = static_cast<size_t>(vocab.first_special);
  tokens.resize(std::min(tokens.size(), target));
  std::unordered_set<std::string> present(tokens.begin(), tokens.end());
  // Too few merges: extend tokens by one byte each, in rank order, printable first.
  for (size_t base = tokens.size() > 256 ? 256 : 0; tokens.size() < target; ++base) {
    for (int k = 0; k < 256 && tokens.size() < target; ++k) {
      const int b = (k + 32) % 256;
      std::string extended = tokens[base] + static_cast<char>(b);
      if (present.insert(extended).second) tokens.push_back(std::move(extended));
    }
  }
  for (size_t r = 0; r < tokens.size(); ++r) vocab.ranks.emplace_back(tokens[r], static_cast<int32_t>(r));
  for (const k3_tokens::Slot& slot : k3_tokens::kLayout)
    vocab.specials.push_back({std::string(slot.text), vocab.first_special + slot.offset, true});
  return vocab;
}

K3Vocab build_tiny_vocab(int32_t vocab_size) {
  K3_CHECK(vocab_size >= kMinK3Vocab, "tiny tokenizer: vocab_size " + std::to_string(vocab_size) + " is below " +
                                          std::to_string(kMinK3Vocab) + " (256 byte tokens + 256 special slots)");
  WordCounter words(patterns::kKimi);
  words.add(kTrainingText);
  return k3_vocab(learn_bpe(words.counts(), static_cast<size_t>(vocab_size - Tokenizer::kReservedSpecialSlots)),
                  vocab_size);
}

void write_k3_tokenizer(const K3Vocab& vocab, const fs::path& dir, std::string_view note) {
  const fs::path model_file = dir / "tiktoken.model", config_file = dir / "tokenizer_config.json";
  std::string model;
  for (const auto& [bytes, rank] : vocab.ranks) model += base64_encode(bytes) + " " + std::to_string(rank) + "\n";
  nlohmann::ordered_json added = nlohmann::ordered_json::object();
  for (const SpecialToken& s : vocab.specials)
    added[std::to_string(s.id)] = {{"content", s.text}, {"lstrip", false},      {"normalized", false},
                                   {"rstrip", false},   {"single_word", false}, {"special", s.special}};
  const nlohmann::ordered_json config = {
      {"added_tokens_decoder", added},          {"bos_token", k3_tokens::kBos},      {"eos_token", k3_tokens::kEos},
      {"pad_token", k3_tokens::kPad},           {"unk_token", k3_tokens::kUnk},      {"model_max_length", 1048576},
      {"tokenizer_class", "TikTokenTokenizer"}, {"k3serve_note", std::string(note)},
  };
  fs::create_directories(dir);
  for (const auto& [path, text] : {std::pair{model_file, model}, std::pair{config_file, config.dump(2) + "\n"}}) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    K3_CHECK(f.good(), "tokenizer: cannot create " + path.string());
    f << text;
    f.flush();
    K3_CHECK(f.good(), "tokenizer: writing " + path.string() + " failed");
  }
}

bool write_tiny_tokenizer(int32_t vocab_size, const fs::path& dir) {
  if (vocab_size < kMinK3Vocab) {
    fs::remove(dir / "tiktoken.model");
    fs::remove(dir / "tokenizer_config.json");
    return false;
  }
  write_k3_tokenizer(build_tiny_vocab(vocab_size), dir,
                     "tiny built-in BPE written by k3serve make-checkpoint; K3 special-token layout");
  return true;
}

}  // namespace k3::tokenizer
