// tokenizer/tiny_tokenizer.cpp: deterministic BPE training on a built-in text, and the writer.
#include "tokenizer/tiny_tokenizer.h"

#include <fstream>
#include <map>
#include <set>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/base64.h"
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

// Counts of each pre-token of the training text (Kimi pattern), as sequences of token ids.
std::vector<std::pair<std::vector<int32_t>, int64_t>> training_words() {
  const Pretokenizer split(patterns::kKimi);
  std::map<std::string, int64_t> counts;
  for (const std::string& piece : split.split(kTrainingText)) ++counts[piece];
  std::vector<std::pair<std::vector<int32_t>, int64_t>> words;
  for (const auto& [piece, count] : counts) {
    std::vector<int32_t> ids;
    for (unsigned char b : piece) ids.push_back(b);
    words.emplace_back(std::move(ids), count);
  }
  return words;
}

}  // namespace

TinyVocab build_tiny_vocab(int32_t vocab_size) {
  K3_CHECK(vocab_size >= kMinTinyVocab, "tiny tokenizer: vocab_size " + std::to_string(vocab_size) + " is below " +
                                            std::to_string(kMinTinyVocab) + " (256 byte tokens + 256 special slots)");
  TinyVocab vocab;
  vocab.first_special = vocab_size - Tokenizer::kReservedSpecialSlots;
  std::vector<std::string> tokens;  // bytes by rank
  std::unordered_set<std::string> present;
  for (int b = 0; b < 256; ++b) {
    tokens.emplace_back(1, static_cast<char>(b));
    present.insert(tokens.back());
  }
  const auto target = static_cast<size_t>(vocab.first_special);

  // Byte-pair counting: merge the most frequent adjacent pair (ties: lowest (left, right)
  // ranks); a pair whose bytes already form a token is skipped for good.
  auto words = training_words();
  std::set<std::pair<int32_t, int32_t>> banned;
  while (tokens.size() < target) {
    std::map<std::pair<int32_t, int32_t>, int64_t> pairs;
    for (const auto& [ids, count] : words)
      for (size_t i = 0; i + 1 < ids.size(); ++i) pairs[{ids[i], ids[i + 1]}] += count;
    std::pair<int32_t, int32_t> best{-1, -1};
    int64_t best_count = 0;
    for (const auto& [pair, count] : pairs)
      if (count > best_count && !banned.count(pair)) best = pair, best_count = count;
    if (best_count == 0) break;
    std::string merged = tokens[static_cast<size_t>(best.first)] + tokens[static_cast<size_t>(best.second)];
    if (!present.insert(merged).second) {
      banned.insert(best);
      continue;
    }
    const auto id = static_cast<int32_t>(tokens.size());
    tokens.push_back(std::move(merged));
    for (auto& [ids, count] : words) {
      std::vector<int32_t> next;
      for (size_t i = 0; i < ids.size(); ++i) {
        if (i + 1 < ids.size() && ids[i] == best.first && ids[i + 1] == best.second) {
          next.push_back(id);
          ++i;
        } else {
          next.push_back(ids[i]);
        }
      }
      ids = std::move(next);
    }
  }
  // The text ran out of pairs: extend tokens by one byte each, in rank order, printable first.
  for (size_t base = 256; tokens.size() < target; ++base) {
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

bool write_tiny_tokenizer(int32_t vocab_size, const fs::path& dir) {
  const fs::path model_file = dir / "tiktoken.model", config_file = dir / "tokenizer_config.json";
  if (vocab_size < kMinTinyVocab) {
    fs::remove(model_file);
    fs::remove(config_file);
    return false;
  }
  const TinyVocab vocab = build_tiny_vocab(vocab_size);
  std::string model;
  for (const auto& [bytes, rank] : vocab.ranks) model += base64_encode(bytes) + " " + std::to_string(rank) + "\n";
  nlohmann::ordered_json added = nlohmann::ordered_json::object();
  for (const SpecialToken& s : vocab.specials)
    added[std::to_string(s.id)] = {{"content", s.text}, {"lstrip", false},      {"normalized", false},
                                   {"rstrip", false},   {"single_word", false}, {"special", s.special}};
  const nlohmann::ordered_json config = {
      {"added_tokens_decoder", added},
      {"bos_token", k3_tokens::kBos},
      {"eos_token", k3_tokens::kEos},
      {"pad_token", k3_tokens::kPad},
      {"unk_token", k3_tokens::kUnk},
      {"model_max_length", 1048576},
      {"tokenizer_class", "TikTokenTokenizer"},
      {"k3serve_note", "tiny built-in BPE written by k3serve make-checkpoint; K3 special-token layout"},
  };
  fs::create_directories(dir);
  for (const auto& [path, text] : {std::pair{model_file, model}, std::pair{config_file, config.dump(2) + "\n"}}) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    K3_CHECK(f.good(), "tiny tokenizer: cannot create " + path.string());
    f << text;
    f.flush();
    K3_CHECK(f.good(), "tiny tokenizer: writing " + path.string() + " failed");
  }
  return true;
}

}  // namespace k3::tokenizer
