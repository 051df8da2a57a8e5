// bench/structured_mask.cpp: constrained decoding's host cost per token on a K3-size vocabulary:
// the time to compute one request's token bitmask (structured/matcher.h fill_mask) at every step of
// a generation that follows the grammar, and the time to compile each grammar.
//
// The vocabulary is 163,840 ids like K3's: a tiktoken rank file's first 163,584 ranks (default:
// o200k_base, fetched by scripts/fetch_test_data.sh; K3's own ranks are not public here) and K3's
// 256 special slots. The schema set is the real one: the tool schemas Claude Code and Codex send
// (src/structured/testdata/agent_tool_schemas.json, each as a strict tool's arguments), our own
// schemas exercising every supported keyword, json_object, and Claude Code's whole tool list as one
// chat output grammar (tool_choice required, every tool strict, K3's call syntax around it).
//
// Each grammar runs --requests generations of up to --tokens tokens; each step times fill_mask,
// then draws a token uniformly among the allowed ones (seeded), so every path of the grammar the
// draws reach is measured. Request 1 is cold: it runs right after the grammar is compiled, while the
// cache's background thread warms it (GrammarCache: the masks of its reachable chains, nearest
// first), so its steps compute or wait for the chains they reach first. Then the benchmark waits
// for the warming (at most --warm-wait seconds; its time and chains are reported) and the later
// requests are warm, as for an agent that sends the same schemas every turn. Prints a table and
// writes a JSON bundle with every sample.
//
//   k3bench_structured_mask [--tiktoken FILE] [--requests 3] [--tokens 256] [--warm-wait 120] [--out FILE]
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "bench/bundle.h"
#include "cli/args.h"
#include "core/error.h"
#include "core/rng.h"
#include "evidence/environment.h"
#include "server/output_grammar.h"
#include "structured/json_schema.h"
#include "structured/matcher.h"
#include "tokenizer/k3_tokens.h"
#include "tokenizer/split_patterns.h"

using namespace k3;
using Json = nlohmann::ordered_json;
namespace fs = std::filesystem;

namespace {

constexpr int32_t kK3Vocab = 163840, kK3Ranks = 163584, kK3Eos = 163586;

double now_s() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

tokenizer::Tokenizer k3_size_tokenizer(const fs::path& file) {
  auto ranks = tokenizer::Tokenizer::read_tiktoken_file(file);
  std::erase_if(ranks, [](const auto& r) { return r.second >= kK3Ranks; });
  std::vector<tokenizer::SpecialToken> specials;
  for (int slot = 0; slot < tokenizer::Tokenizer::kReservedSpecialSlots; ++slot) {
    std::string text = "<|reserved_token_" + std::to_string(kK3Ranks + slot) + "|>";
    for (const auto& s : tokenizer::k3_tokens::kLayout)
      if (s.offset == slot) text = std::string(s.text);
    specials.push_back({text, kK3Ranks + slot, true});
  }
  return tokenizer::Tokenizer(std::move(ranks), std::move(specials), {std::string(tokenizer::patterns::kKimi), true});
}

// Our own schemas: every keyword the converter supports.
Json own_schemas() {
  return Json::parse(R"({
    "keywords_object": {"type": "object", "properties": {
        "id": {"type": "string", "format": "uuid"}, "when": {"type": "string", "format": "date-time"},
        "mail": {"type": "string", "format": "email"}, "name": {"type": "string", "minLength": 1, "maxLength": 24},
        "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}, "kind": {"enum": ["a", "b", "c"]},
        "version": {"const": 2}, "score": {"type": "number", "minimum": 0, "maximum": 100},
        "count": {"type": "integer", "exclusiveMinimum": 0, "maximum": 1000},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1, "maxItems": 4},
        "pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "boolean"}], "items": false},
        "extra": {"type": "object", "additionalProperties": {"type": "integer"}},
        "maybe": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 8}]},
        "merged": {"allOf": [{"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
                             {"properties": {"y": {"type": "boolean"}}}]}},
      "required": ["id", "kind", "score"], "additionalProperties": false},
    "recursive_tree": {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 3}}, "required": ["v"]}},
      "$ref": "#/$defs/node"}
  })");
}

struct Case {
  std::string name, group, text, root;
};

struct Result {
  double compile_ms = 0;
  double warm_s = 0;  // the background warming of this grammar
  int64_t warm_chains = 0;
  bool warmed = false;  // the warming ended within --warm-wait
  std::vector<double> cold_us, warm_us;
  int64_t tokens = 0, finished = 0;
  size_t groups = 0;
};

Result run_case(structured::GrammarCache& cache, const Case& c, int requests, int max_tokens, uint64_t seed,
                double warm_wait_s) {
  Result r;
  const double t0 = now_s();
  const auto g = cache.get(c.text, c.root);
  r.compile_ms = 1e3 * (now_s() - t0);
  const structured::Vocabulary& v = g->vocabulary();
  std::vector<uint32_t> mask(static_cast<size_t>(v.words()));
  std::vector<int32_t> allowed;
  core::Rng rng(seed);
  const structured::GrammarCache::Stats before = cache.stats();
  for (int q = 0; q < requests; ++q) {
    if (q == 1) {
      r.warmed = cache.wait_warm(warm_wait_s);
      const structured::GrammarCache::Stats after = cache.stats();
      r.warm_s = after.warm_seconds - before.warm_seconds;
      r.warm_chains = after.warmed_chains - before.warmed_chains;
    }
    structured::Matcher m(g);
    for (int t = 0; t < max_tokens; ++t) {
      const double a = now_s();
      m.fill_mask(mask);
      const double us = 1e6 * (now_s() - a);
      (q == 0 ? r.cold_us : r.warm_us).push_back(us);
      ++r.tokens;
      allowed.clear();
      for (size_t w = 0; w < mask.size(); ++w)
        for (uint32_t bits = mask[w]; bits; bits &= bits - 1)
          allowed.push_back(static_cast<int32_t>(w * 32 + static_cast<size_t>(__builtin_ctz(bits))));
      K3_CHECK(!allowed.empty(), c.name + ": a grammar state with no token allowed");
      // The end when it is allowed (half the time), else any allowed token.
      int32_t tok = allowed[rng.next_u64() % allowed.size()];
      if (m.can_end() && rng.uniform() < 0.5) tok = v.end_tokens()[0];
      K3_CHECK(m.accept(tok), c.name + ": the mask allowed a token the matcher refuses");
      if (m.terminated()) {
        ++r.finished;
        break;
      }
    }
  }
  r.groups = g->cached_groups();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    cli::Args args("k3bench_structured_mask",
                   {{"tiktoken", "FILE", "rank file for the vocabulary", ".testdata/gpt-tokenizer/o200k_base.tiktoken"},
                    {"requests", "N", "generations per grammar (the first cold, the rest warm)", "3"},
                    {"tokens", "N", "tokens per generation at most", "256"},
                    {"warm-wait", "S", "seconds to wait for a grammar's background warming after request 1", "120"},
                    {"out", "FILE", "JSON bundle path", "structured_mask.json"}},
                   {argv + 1, static_cast<size_t>(argc - 1)});
    if (args.help_requested()) {
      std::cout << args.usage();
      return 0;
    }
    const int requests = static_cast<int>(args.get_int("requests")), tokens = static_cast<int>(args.get_int("tokens"));
    K3_CHECK(requests >= 2 && tokens >= 1, "--requests must be >= 2 (one cold, one warm) and --tokens >= 1");
    fs::path rank_file = args.get("tiktoken");
    if (rank_file.is_relative()) rank_file = fs::path(K3_SOURCE_DIR) / rank_file;
    K3_CHECK(fs::exists(rank_file),
             "no rank file at " + rank_file.string() + " (scripts/fetch_test_data.sh fetches o200k_base)");
    const double v0 = now_s();
    const tokenizer::Tokenizer tok = k3_size_tokenizer(rank_file);
    auto vocab = server::grammar_vocabulary(tok, kK3Vocab, kK3Eos);
    const double vocab_ms = 1e3 * (now_s() - v0);
    structured::GrammarCache cache(vocab, 1024);

    std::vector<Case> cases;
    const Json agents = Json::parse(
        std::ifstream(fs::path(K3_SOURCE_DIR) / "src/structured/testdata/agent_tool_schemas.json"));
    auto schema_case = [&](const std::string& group, const std::string& name, const Json& schema) {
      structured::EbnfRules rules;
      structured::JsonSchemaConverter conv(rules, "s");
      rules.add("root", conv.convert(schema));
      cases.push_back({name, group, rules.text(), "root"});
    };
    for (const char* group : {"claude_code", "codex"})
      for (const auto& [name, schema] : agents[group].items()) schema_case(group, name, schema);
    const Json own = own_schemas();
    for (const auto& [name, schema] : own.items()) schema_case("own", name, schema);
    {
      structured::EbnfRules rules;
      rules.add("root", structured::json_object(rules));
      cases.push_back({"json_object", "own", rules.text(), "root"});
    }
    {  // Claude Code's tools as one chat output: tool_choice required, all strict
      server::ChatPrompt chat;
      chat.tools = Json::array();
      for (const auto& [name, schema] : agents["claude_code"].items())
        chat.tools.push_back(
            {{"type", "function"}, {"function", {{"name", name}, {"parameters", schema}, {"strict", true}}}});
      chat.options.tool_choice = "required";
      chat.options.thinking = false;
      cases.push_back({"claude_code_all_tools_required", "chat",
                       server::chat_output_grammar(chat, tokenizer::Channel::response), "k3-output"});
    }

    std::printf("vocabulary: %d ids (%s, first %d ranks + 256 K3 specials), built in %.0f ms\n\n", kK3Vocab,
                rank_file.filename().c_str(), kK3Ranks, vocab_ms);
    const double warm_wait_s = args.get_double("warm-wait");
    K3_CHECK(warm_wait_s >= 0, "--warm-wait must be >= 0 seconds");
    std::printf("%-34s %9s %7s %8s %9s %9s %9s %9s %9s %6s\n", "grammar", "compile", "groups", "warming", "cold p50",
                "cold p99", "warm p50", "warm p99", "warm max", "done");
    std::vector<double> all_cold, all_warm, compile;
    Json rows = Json::array();
    uint64_t seed = 1;
    for (const Case& c : cases) {
      const Result r = run_case(cache, c, requests, tokens, seed++, warm_wait_s);
      all_cold.insert(all_cold.end(), r.cold_us.begin(), r.cold_us.end());
      all_warm.insert(all_warm.end(), r.warm_us.begin(), r.warm_us.end());
      compile.push_back(r.compile_ms);
      std::printf("%-34s %7.2fms %7zu %6.2fs%s %7.1fus %7.1fus %7.1fus %7.1fus %7.1fus %3lld/%d\n",
                  c.name.substr(0, 34).c_str(), r.compile_ms, r.groups, r.warm_s, r.warmed ? " " : "+",
                  percentile(r.cold_us, 0.5), percentile(r.cold_us, 0.99), percentile(r.warm_us, 0.5),
                  percentile(r.warm_us, 0.99), percentile(r.warm_us, 1.0), static_cast<long long>(r.finished),
                  requests);
      rows.push_back({{"grammar", c.name},
                      {"group", c.group},
                      {"grammar_bytes", c.text.size()},
                      {"compile_ms", r.compile_ms},
                      {"cached_groups", r.groups},
                      {"warming_seconds", r.warm_s},
                      {"warming_chains", r.warm_chains},
                      {"warming_finished", r.warmed},
                      {"tokens", r.tokens},
                      {"finished", r.finished},
                      {"cold_us", r.cold_us},
                      {"warm_us", r.warm_us}});
    }
    std::printf(
        "\nall %zu grammars, per token: warm p50 %.1f us, p99 %.1f us (goal p99 < 25 us); cold p50 %.1f us, p99 %.1f us;"
        " compile p50 %.2f ms, max %.2f ms\n",
        cases.size(), percentile(all_warm, 0.5), percentile(all_warm, 0.99), percentile(all_cold, 0.5),
        percentile(all_cold, 0.99), percentile(compile, 0.5), percentile(compile, 1.0));
    const Json bundle = {{"benchmark", "structured_mask"},
                         {"environment", evidence::environment()},
                         {"config",
                          {{"vocabulary", rank_file.filename().string() + " first 163584 ranks + 256 K3 specials"},
                           {"vocab_size", kK3Vocab},
                           {"requests", requests},
                           {"tokens", tokens},
                           {"warm_wait_seconds", warm_wait_s},
                           {"threads", "1 for the masks, plus the cache's warming thread"}}},
                         {"summary",
                          {{"warm_p50_us", percentile(all_warm, 0.5)},
                           {"warm_p99_us", percentile(all_warm, 0.99)},
                           {"cold_p50_us", percentile(all_cold, 0.5)},
                           {"cold_p99_us", percentile(all_cold, 0.99)},
                           {"compile_p50_ms", percentile(compile, 0.5)},
                           {"compile_max_ms", percentile(compile, 1.0)}}},
                         {"results", rows}};
    std::ofstream(args.get("out")) << bundle.dump(1) << "\n";
    std::cout << "wrote " << args.get("out") << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
}
