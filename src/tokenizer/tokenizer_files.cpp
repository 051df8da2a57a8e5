// tokenizer/tokenizer_files.cpp: reading tiktoken rank files and K3's tokenizer folder
// (tiktoken.model + tokenizer_config.json), with errors that name the file and line or key.
#include <fstream>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/base64.h"
#include "tokenizer/split_patterns.h"
#include "tokenizer/tokenizer.h"

namespace k3::tokenizer {

namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  K3_CHECK(f.good(), std::string("tokenizer: cannot open ") + what + " " + path.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// "content" of a token given as a string or as an AddedToken object {"content": ...}; empty
// when absent or null.
std::string token_content(const nlohmann::json& config, const char* key, const fs::path& file) {
  if (!config.contains(key) || config[key].is_null()) return {};
  const nlohmann::json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  throw core::Error("tokenizer: " + file.string() + ": \"" + key +
                    "\" must be a string or an object with a string \"content\"");
}

}  // namespace

std::vector<std::pair<std::string, int32_t>> Tokenizer::read_tiktoken_file(const fs::path& file) {
  const std::string text = read_file(file, "rank file");
  std::vector<std::pair<std::string, int32_t>> ranks;
  std::unordered_map<int32_t, size_t> line_of_rank;
  std::unordered_map<std::string, size_t> line_of_bytes;
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const std::string where = file.string() + " line " + std::to_string(line_no) + ": ";
    const size_t space = line.find(' ');
    K3_CHECK(space != std::string_view::npos && line.find(' ', space + 1) == std::string_view::npos,
             "tokenizer: " + where + "expected 'base64 rank', got '" + std::string(line.substr(0, 80)) + "'");
    const std::string_view b64 = line.substr(0, space), rank_text = line.substr(space + 1);
    auto bytes = base64_decode(b64);
    K3_CHECK(bytes.has_value() && !bytes->empty(),
             "tokenizer: " + where + "'" + std::string(b64.substr(0, 80)) + "' is not valid base64 token bytes");
    K3_CHECK(!rank_text.empty() && rank_text.size() <= 10 &&
                 rank_text.find_first_not_of("0123456789") == std::string_view::npos,
             "tokenizer: " + where + "rank '" + std::string(rank_text.substr(0, 20)) +
                 "' is not a non-negative integer");
    const long long rank = std::stoll(std::string(rank_text));
    K3_CHECK(rank < INT32_MAX / 2, "tokenizer: " + where + "rank " + std::string(rank_text) + " is too large");
    const auto r = static_cast<int32_t>(rank);
    const auto [rank_it, rank_new] = line_of_rank.emplace(r, line_no);
    K3_CHECK(rank_new, "tokenizer: " + where + "duplicate rank " + std::to_string(r) + " (first on line " +
                           std::to_string(rank_it->second) + ")");
    const auto [bytes_it, bytes_new] = line_of_bytes.emplace(*bytes, line_no);
    K3_CHECK(bytes_new,
             "tokenizer: " + where + "token bytes duplicate those of line " + std::to_string(bytes_it->second));
    ranks.emplace_back(std::move(*bytes), r);
  }
  K3_CHECK(!ranks.empty(), "tokenizer: " + file.string() + " has no ranks");
  return ranks;
}

Tokenizer Tokenizer::load_k3(const fs::path& dir) {
  const fs::path model_file = dir / "tiktoken.model", config_file = dir / "tokenizer_config.json";
  auto ranks = read_tiktoken_file(model_file);
  const auto num_base = static_cast<int32_t>(ranks.size());
  for (const auto& [bytes, rank] : ranks)
    K3_CHECK(rank < num_base, "tokenizer: " + model_file.string() + ": rank " + std::to_string(rank) +
                                  " is outside 0.." + std::to_string(num_base - 1) +
                                  " (ranks must be dense: special tokens follow them)");
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(read_file(config_file, "tokenizer config"));
  } catch (const nlohmann::json::exception& e) {
    throw core::Error("tokenizer: " + config_file.string() + " is not valid JSON: " + e.what());
  }
  K3_CHECK(config.is_object(), "tokenizer: " + config_file.string() + " must hold a JSON object");

  std::vector<SpecialToken> specials;
  std::vector<bool> named(kReservedSpecialSlots, false);
  if (config.contains("added_tokens_decoder")) {
    const nlohmann::json& added = config["added_tokens_decoder"];
    K3_CHECK(added.is_object(), "tokenizer: " + config_file.string() + ": \"added_tokens_decoder\" must be an object");
    for (const auto& [key, value] : added.items()) {
      const std::string where = config_file.string() + ": added_tokens_decoder[\"" + key + "\"]";
      K3_CHECK(!key.empty() && key.size() <= 10 && key.find_first_not_of("0123456789") == std::string::npos,
               "tokenizer: " + where + ": the key must be a token id");
      const long long id = std::stoll(key);
      K3_CHECK(id >= num_base && id < num_base + kReservedSpecialSlots,
               "tokenizer: " + where + ": id is outside the special range " + std::to_string(num_base) + ".." +
                   std::to_string(num_base + kReservedSpecialSlots - 1));
      K3_CHECK(value.is_object() && value.contains("content") && value["content"].is_string() &&
                   !value["content"].get<std::string>().empty(),
               "tokenizer: " + where + " must be an object with a non-empty string \"content\"");
      bool special = true;
      if (value.contains("special")) {
        K3_CHECK(value["special"].is_boolean(), "tokenizer: " + where + ".special must be true or false");
        special = value["special"].get<bool>();
      }
      specials.push_back({value["content"].get<std::string>(), static_cast<int32_t>(id), special});
      named[static_cast<size_t>(id - num_base)] = true;
    }
  }
  for (int32_t k = 0; k < kReservedSpecialSlots; ++k)
    if (!named[static_cast<size_t>(k)])
      specials.push_back({"<|reserved_token_" + std::to_string(num_base + k) + "|>", num_base + k, true});

  Tokenizer tok(std::move(ranks), std::move(specials), {std::string(patterns::kKimi), true});
  auto resolve = [&](const char* key) -> std::optional<int32_t> {
    const std::string content = token_content(config, key, config_file);
    if (content.empty()) return std::nullopt;
    const auto id = tok.special_id(content);
    K3_CHECK(id.has_value(),
             "tokenizer: " + config_file.string() + ": " + key + " '" + content + "' is not one of the added tokens");
    return id;
  };
  tok.bos_id = resolve("bos_token");
  tok.eos_id = resolve("eos_token");
  tok.pad_id = resolve("pad_token");
  tok.unk_id = resolve("unk_token");
  return tok;
}

}  // namespace k3::tokenizer
