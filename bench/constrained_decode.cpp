// bench/constrained_decode.cpp: k3bench_constrained_decode, what constrained decoding costs a served
// decode step end to end. One checkpoint is served by the engine as the server serves it (scheduler,
// cache, ModelExecutor with CUDA graphs, the device sampler); batches of requests decode with no
// grammar and with JSON Schema grammars, and the decode steps are timed at equal batch. A
// constrained row's mask is computed on the host (structured/matcher.h) while the GPU runs the
// step's forward, then applied on the device (the token_mask op): this measures whether that hides it.
//
//   k3bench_constrained_decode --model DIR [--make] [--config NAME|PATH] [--batches 1,64]
//       [--grammars free,bash,agent_tools] [--prompt 512] [--tokens 128] [--rounds 3]
//       [--decode-backend auto|latency_specialized] [--device cuda|cpu] [--kv-gb 16] [--seed S]
//       [--vocab N] [--tiktoken FILE] [--out FILE]
//
// Grammars (--grammars, each a row per batch): free (none); bash (the arguments of Claude Code's Bash
// tool as a strict tool: src/structured/testdata/agent_tool_schemas.json); agent_tools (row i takes
// the i-th of the 33 tool schemas Claude Code and Codex send, cycled: a batch of different tool
// calls); json_object. The vocabulary is the model's size V: a tiktoken rank file's first V - 256
// ranks (default o200k_base, fetched by scripts/fetch_test_data.sh; K3's own ranks are not public)
// and the 256 special slots at the top, as K3 lays them out (the model's eos is the end token).
//
// Each (batch B, grammar) row runs one warm-up round (not timed: it compiles the grammars, fills their
// mask caches as an agent's repeated turns do, and captures the graphs), waits for the grammar
// cache's background warming (structured/grammar_cache.h; at most --warm-wait seconds, the wait
// reported), and runs --rounds timed rounds. A
// round submits B requests with distinct random prompts of --prompt tokens (no prefix hits), sampled
// at temperature 1 (seeded per request), up to --tokens output tokens, and steps the engine until
// they finish. A step is a decode step when every request of the round already had its first
// token (no prefill left); its rows are the requests it gave a token. Constrained requests end where
// their grammar does, so their batches shrink sooner: rows are compared at equal row counts, and
// the row's TPOT is the median time of its decode steps with all B rows ("full batch" steps).
// Every constrained output is checked against its grammar (every token accepted; an output that
// stopped must be a complete sentence).
//
// Each timed constrained round is followed by its free twin: the same prompts and seeds, no grammar,
// ignore_eos and each request's output length the constrained one's, so every decode step of the
// twin has the rows of the constrained step at the same index. The pairs (row counts seen in an
// earlier round, so neither side pays a first graph capture) give the cost of the grammar at equal
// batch composition, also where the batch shrinks: constrained ms over the twins' (sum and per step).
// The prefix cache is off (the twin repeats its round's prompts). --vocab writes the checkpoint with
// another vocabulary (K3's 163840; the proxy's config has 20480).
//
// Prints a table last and writes a JSON bundle (bench/bundle.h): config, environment, and rows[] of
// batch, grammar, full_batch_steps, tpot_full_batch_ms (median, p10, p90), step_ms_by_rows (median
// per row count), mean per-request TPOT, tokens, valid outputs, raw step samples, and for each
// constrained row its full-batch TPOT over the free row's of the same batch and its
// paired_with_free_twins comparison.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bundle.h"
#include "bench/decode_sweep.h"
#include "cli/args.h"
#include "core/error.h"
#include "core/rng.h"
#include "engine/engine.h"
#include "engine/model_executor.h"
#include "evidence/environment.h"
#include "model/kv_storage.h"
#include "runner/model_runner.h"
#include "structured/grammar_cache.h"
#include "structured/json_schema.h"
#include "structured/matcher.h"
#include "tokenizer/base64.h"
#include "tokenizer/k3_tokens.h"
#ifdef K3_HAVE_CUDA
#include "backends/cuda/device.h"
#endif

using namespace k3;
using Json = nlohmann::ordered_json;
namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

namespace {

double ms_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

// The model-size vocabulary: the rank file's first V - 256 ranks, then K3's 256 special slots.
std::shared_ptr<const structured::Vocabulary> model_vocabulary(const fs::path& rank_file, int32_t vocab, int32_t eos) {
  constexpr int32_t kSpecials = 256;
  K3_CHECK(vocab > kSpecials, "the model's vocabulary (" + std::to_string(vocab) + ") has no room for 256 specials");
  const int32_t ranks = vocab - kSpecials;
  std::vector<std::pair<int32_t, structured::Vocabulary::Token>> tokens;
  std::vector<std::string> names;
  std::ifstream in(rank_file);
  K3_CHECK(in.good(), "cannot read " + rank_file.string() + " (scripts/fetch_test_data.sh fetches o200k_base)");
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    const size_t space = line.find(' ');
    K3_CHECK(space != std::string::npos, rank_file.string() + ":" + std::to_string(n) + ": not 'base64 rank'");
    const int64_t rank = std::stoll(line.substr(space + 1));
    if (rank < 0 || rank >= ranks) continue;
    auto bytes = tokenizer::base64_decode(std::string_view(line).substr(0, space));
    K3_CHECK(bytes.has_value(), rank_file.string() + ":" + std::to_string(n) + ": bad base64");
    tokens.push_back({static_cast<int32_t>(rank), {std::move(*bytes), -1}});
  }
  for (int slot = 0; slot < kSpecials; ++slot) {
    std::string text = "<|reserved_token_" + std::to_string(ranks + slot) + "|>";
    for (const auto& s : tokenizer::k3_tokens::kLayout)
      if (s.offset == slot) text = std::string(s.text);
    tokens.push_back({ranks + slot, {"", static_cast<int>(names.size())}});
    names.push_back(text);
  }
  std::vector<int32_t> ends;
  if (eos >= 0 && eos < vocab) ends.push_back(eos);
  return std::make_shared<const structured::Vocabulary>(vocab, tokens, std::move(names), std::move(ends));
}

// One grammar set: the grammar of each row of a batch (empty: free decoding).
struct GrammarSet {
  std::string name;
  std::vector<std::shared_ptr<const structured::CompiledGrammar>> grammars;  // row i takes [i % size]
};

std::shared_ptr<const structured::CompiledGrammar> schema_grammar(structured::GrammarCache& cache, const Json& schema) {
  structured::EbnfRules rules;
  structured::JsonSchemaConverter conv(rules, "s");
  rules.add("root", conv.convert(schema));
  return cache.get(rules.text(), "root");
}

GrammarSet grammar_set(const std::string& name, structured::GrammarCache& cache, const Json& agents) {
  GrammarSet set{name, {}};
  if (name == "free") return set;
  if (name == "bash") {
    set.grammars.push_back(schema_grammar(cache, agents.at("claude_code").at("Bash")));
  } else if (name == "agent_tools") {
    for (const char* group : {"claude_code", "codex"}) {
      const Json tools = agents.at(group);
      for (const auto& [tool, schema] : tools.items()) set.grammars.push_back(schema_grammar(cache, schema));
    }
  } else if (name == "json_object") {
    structured::EbnfRules rules;
    rules.add("root", structured::json_object(rules));
    set.grammars.push_back(cache.get(rules.text(), "root"));
  } else {
    throw core::Error("--grammars: unknown grammar set '" + name + "' (free, bash, agent_tools, json_object)");
  }
  return set;
}

struct DecodeStep {
  int rows;
  double ms;
};

struct RowResult {
  std::vector<double> full_batch_ms;                   // decode steps with every row of the batch
  std::map<int, std::vector<double>> step_ms_by_rows;  // every decode step, by its rows
  std::vector<double> request_tpot_ms;                 // per request: (last token - first) / (tokens - 1)
  int64_t tokens = 0, outputs = 0, valid = 0, stopped = 0;
};

// A constrained round and its free twin, step for step (pairs whose row counts are equal and were
// seen in an earlier round of the row, so neither side pays a first graph capture).
struct PairedResult {
  std::vector<double> step_ratio;  // constrained step ms / the twin's
  double constrained_ms = 0, free_ms = 0;
  int64_t mismatched = 0;  // steps whose row counts differ (none expected)
};

// One round: B requests, stepped to the end; its decode steps and outputs go into `r`, its decode
// steps in order into `steps` and each request's output length into `lengths`. With `twin_lengths`
// it is a constrained round's free twin: the same prompts and seeds, no grammar, ignore_eos and
// request i's max_tokens = twin_lengths[i], so every step has the rows the constrained one had.
void run_round(engine::Engine& e, const GrammarSet& set, int batch, int prompt, int max_tokens, int32_t vocab,
               uint64_t seed, RowResult* r, std::vector<DecodeStep>* steps = nullptr,
               std::vector<int>* lengths = nullptr, const std::vector<int>* twin_lengths = nullptr) {
  const bool constrained = !set.grammars.empty() && !twin_lengths;
  std::vector<std::shared_ptr<engine::TokenStream>> streams;
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(batch));
  std::vector<double> first_ms(static_cast<size_t>(batch), -1), last_ms(static_cast<size_t>(batch), -1);
  std::vector<bool> done(static_cast<size_t>(batch), false), stopped(static_cast<size_t>(batch), false);
  for (int i = 0; i < batch; ++i) {
    engine::GenerateRequest q;
    core::Rng rng(seed * 1000003 + static_cast<uint64_t>(i));
    for (int t = 0; t < prompt; ++t) q.prompt.push_back(static_cast<int32_t>(rng.next_u64() % (vocab - 256)));
    q.max_tokens = twin_lengths ? (*twin_lengths)[static_cast<size_t>(i)] : max_tokens;
    q.ignore_eos = twin_lengths != nullptr;
    q.sampling.temperature = 1.0f;
    q.sampling.seed = seed * 7919 + static_cast<uint64_t>(i);
    if (constrained) q.grammar = set.grammars[static_cast<size_t>(i) % set.grammars.size()];
    streams.push_back(e.submit(std::move(q)).stream);
  }
  const auto t0 = clock_type::now();
  for (;;) {
    const bool all_started = std::all_of(first_ms.begin(), first_ms.end(), [](double t) { return t >= 0; });
    const auto s0 = clock_type::now();
    if (!e.step()) break;
    const double step_ms = ms_since(s0), at_ms = ms_since(t0);
    int rows = 0;
    for (int i = 0; i < batch; ++i) {
      const size_t k = static_cast<size_t>(i);
      while (auto ev = streams[k]->try_next()) {
        if (ev->token >= 0) {
          out[k].push_back(ev->token);
          ++rows;
          if (first_ms[k] < 0) first_ms[k] = at_ms;
          last_ms[k] = at_ms;
        }
        if (ev->finished) {
          K3_CHECK(ev->reason == scheduler::FinishReason::stop || ev->reason == scheduler::FinishReason::length,
                   "a request failed: " + ev->error);
          done[k] = true;
          stopped[k] = ev->reason == scheduler::FinishReason::stop;
        }
      }
    }
    if (all_started && rows > 0) {
      r->step_ms_by_rows[rows].push_back(step_ms);
      if (rows == batch) r->full_batch_ms.push_back(step_ms);
      if (steps) steps->push_back({rows, step_ms});
    }
  }
  K3_CHECK(std::all_of(done.begin(), done.end(), [](bool d) { return d; }), "the engine went idle with requests left");
  for (int i = 0; i < batch; ++i) {
    const size_t k = static_cast<size_t>(i);
    r->tokens += static_cast<int64_t>(out[k].size());
    ++r->outputs;
    r->stopped += stopped[k] ? 1 : 0;
    if (out[k].size() >= 2)
      r->request_tpot_ms.push_back((last_ms[k] - first_ms[k]) / static_cast<double>(out[k].size() - 1));
    if (lengths) lengths->push_back(static_cast<int>(out[k].size()));
    if (twin_lengths)
      K3_CHECK(static_cast<int>(out[k].size()) == (*twin_lengths)[k], "a free twin request ended early");
    if (!constrained) continue;
    structured::Matcher m(set.grammars[k % set.grammars.size()]);
    bool ok = true;
    for (int32_t t : out[k]) ok = ok && m.accept(t);
    if (ok && (!stopped[k] || m.terminated() || m.can_end())) ++r->valid;
  }
}

// Pairs a constrained round's decode steps with its free twin's, in order.
void pair_steps(const std::vector<DecodeStep>& constrained, const std::vector<DecodeStep>& twin,
                const std::set<int>& warm_rows, PairedResult* p) {
  const size_t n = std::min(constrained.size(), twin.size());
  p->mismatched += static_cast<int64_t>(std::max(constrained.size(), twin.size()) - n);
  for (size_t j = 0; j < n; ++j) {
    if (constrained[j].rows != twin[j].rows) {
      ++p->mismatched;
      continue;
    }
    if (!warm_rows.count(constrained[j].rows)) continue;
    p->step_ratio.push_back(constrained[j].ms / twin[j].ms);
    p->constrained_ms += constrained[j].ms;
    p->free_ms += twin[j].ms;
  }
}

Json samples_json(const std::vector<double>& v) {
  return {{"n", v.size()},
          {"median", percentile(v, 0.5)},
          {"p10", percentile(v, 0.1)},
          {"p90", percentile(v, 0.9)},
          {"samples", v}};
}

}  // namespace

int main(int argc, char** argv) {
  try {
    cli::Args args("k3bench_constrained_decode",
                   {{"model", "DIR", "checkpoint folder (config.json + safetensors)", "", true},
                    {"make", "", "write a random checkpoint of --config into DIR when it has none", ""},
                    {"config", "NAME|PATH", "config --make writes (a built-in name or a config.json)", "k3-proxy-tp8"},
                    {"batches", "LIST", "batch sizes, e.g. 1,64", "1,64"},
                    {"grammars", "LIST", "grammar sets: free, bash, agent_tools, json_object", "free,bash,agent_tools"},
                    {"prompt", "N", "prompt tokens per request", "512"},
                    {"tokens", "N", "output tokens per request at most", "128"},
                    {"rounds", "N", "timed rounds per row (after one warm-up round)", "3"},
                    {"decode-backend", "NAME", "auto or latency_specialized", "auto"},
                    {"device", "NAME", "cuda or cpu", "cuda"},
                    {"kv-gb", "GB", "bytes for the KV pages and KDA states", "16"},
                    {"seed", "S", "checkpoint and request seed", "1"},
                    {"warm-wait", "S", "seconds to wait after a row's warm-up round for the grammar warming", "120"},
                    {"vocab", "N", "the vocabulary --make writes (0: the config's; K3's is 163840)", "0"},
                    {"tiktoken", "FILE", "rank file for the vocabulary", ".testdata/gpt-tokenizer/o200k_base.tiktoken"},
                    {"out", "FILE", "JSON bundle path", "constrained_decode.json"}},
                   {argv + 1, static_cast<size_t>(argc - 1)});
    if (args.help_requested()) {
      std::cout << args.usage();
      return 0;
    }
    const std::vector<int32_t> batches = args.get_ids("batches");
    const int prompt = static_cast<int>(args.get_int("prompt")), tokens = static_cast<int>(args.get_int("tokens"));
    const int rounds = static_cast<int>(args.get_int("rounds"));
    const uint64_t seed = args.get_u64("seed");
    K3_CHECK(!batches.empty() && *std::min_element(batches.begin(), batches.end()) >= 1,
             "--batches: every batch must be >= 1");
    K3_CHECK(prompt >= 1 && tokens >= 2 && rounds >= 1, "--prompt >= 1, --tokens >= 2 and --rounds >= 1");
    std::vector<std::string> set_names;
    for (size_t pos = 0, end = 0; pos <= args.get("grammars").size(); pos = end + 1) {
      const std::string list = args.get("grammars");
      end = std::min(list.find(',', pos), list.size());
      set_names.push_back(list.substr(pos, end - pos));
    }
    const std::string device = args.get("device"), backend = args.get("decode-backend");
    K3_CHECK(device == "cuda" || device == "cpu", "--device must be cuda or cpu, got '" + device + "'");
    K3_CHECK(backend == "auto" || backend == "latency_specialized",
             "--decode-backend must be auto or latency_specialized, got '" + backend + "'");
    for (const std::string& name : set_names)
      K3_CHECK(name == "free" || name == "bash" || name == "agent_tools" || name == "json_object",
               "--grammars: unknown grammar set '" + name + "' (free, bash, agent_tools, json_object)");
    fs::path rank_file = args.get("tiktoken");
    if (rank_file.is_relative()) rank_file = fs::path(K3_SOURCE_DIR) / rank_file;

    Json env = evidence::environment();
    std::string gpu = "CPU (reference ops)";
#ifdef K3_HAVE_CUDA
    if (device == "cuda") {
      std::string why;
      if (backends::cuda::device_count(&why) == 0) {
        std::fprintf(stderr, "k3bench_constrained_decode: no usable CUDA device: %s\n", why.c_str());
        return 2;
      }
      const backends::cuda::DeviceInfo info = backends::cuda::device_info(0);
      gpu = info.name;
      env["gpu"] = {{"name", info.name}, {"sm_count", info.sm_count}, {"global_bytes", info.global_bytes}};
    }
#else
    K3_CHECK(device == "cpu", "this build has no CUDA backend: use --device cpu");
#endif
    const fs::path dir = args.get("model");
    const double warm_wait_s = args.get_double("warm-wait");
    K3_CHECK(warm_wait_s >= 0, "--warm-wait must be >= 0 seconds");
    const int64_t vocab_arg = args.get_int("vocab");
    K3_CHECK(vocab_arg >= 0 && vocab_arg <= (int64_t{1} << 24),
             "--vocab must be 0 (the config's) or a vocabulary size");
    const double make_seconds = bench::make_checkpoint_if_needed(dir, args.get("config"), seed, args.flag("make"),
                                                                 static_cast<int32_t>(vocab_arg));

    model::ModelOptions mo;
    mo.device = device == "cuda" ? core::Device::cuda : core::Device::cpu;
    mo.decode_backend = backend == "auto" ? model::DecodeBackend::standard : model::DecodeBackend::latency_specialized;
    const auto l0 = clock_type::now();
    const auto runner = runner::ModelRunner::open(dir, mo, model::KvCacheDtype::fp8_e4m3);
    const double load_ms = ms_since(l0);
    const config::K3Config& cfg = runner->config();
    std::printf("opened %s on %s in %.1f s (vocabulary %d)\n", dir.string().c_str(), gpu.c_str(), load_ms / 1e3,
                cfg.vocab_size);

    // The engine as the server builds it, sized for the largest batch.
    const int max_batch = *std::max_element(batches.begin(), batches.end());
    engine::EngineConfig ec;
    ec.scheduler.max_num_seqs = max_batch;
    ec.scheduler.max_model_len = prompt + tokens + 16;
    ec.cache.num_slots = max_batch;
    ec.cache.enable_prefix_cache = false;  // a free twin repeats its constrained round's prompts
    ec.cache = engine::size_model_cache(cfg, model::KvCacheDtype::fp8_e4m3, ec.cache,
                                        static_cast<int64_t>(args.get_double("kv-gb") * 1e9), 0.2,
                                        ec.scheduler.max_model_len);
    engine::apply_model_defaults(cfg, ec.scheduler, ec.cache, &ec.eos_token_id);
    const int64_t graph_len = mo.device == core::Device::cuda ? ec.scheduler.max_model_len : 0;
    engine::Engine e(ec, std::make_unique<engine::ModelExecutor>(runner->model(), ec.cache,
                                                                 model::KvCacheDtype::fp8_e4m3, graph_len));

    const auto v0 = clock_type::now();
    auto vocab = model_vocabulary(rank_file, cfg.vocab_size, ec.eos_token_id);
    std::printf("vocabulary: %d ids (%s, first %d ranks + 256 K3 specials), built in %.0f ms\n", cfg.vocab_size,
                rank_file.filename().c_str(), cfg.vocab_size - 256, ms_since(v0));
    structured::GrammarCache cache(vocab, 1024);
    const Json agents = Json::parse(
        std::ifstream(fs::path(K3_SOURCE_DIR) / "src/structured/testdata/agent_tool_schemas.json"));
    std::vector<GrammarSet> sets;
    for (const std::string& name : set_names) sets.push_back(grammar_set(name, cache, agents));

    Json rows = Json::array();
    std::map<int, double> free_tpot;  // batch -> the free row's full-batch median
    struct Line {
      int batch;
      std::string grammar;
      size_t steps;
      double tpot, p90, mean_tpot;
      int64_t valid, outputs, tokens;
      double paired = 0;  // constrained decode-step time over its free twins' (sums), 0: none
    };
    std::vector<Line> lines;
    uint64_t round_seed = seed * 100;
    for (const int batch : batches)
      for (const GrammarSet& set : sets) {
        std::printf("batch %d, %s: warm-up round ...\n", batch, set.name.c_str());
        std::fflush(stdout);
        RowResult warm, r, twins;
        PairedResult pair;
        std::set<int> warm_rows;  // row counts an earlier round of this row stepped (their graphs exist)
        std::vector<DecodeStep> steps, twin_steps;
        std::vector<int> lengths;
        run_round(e, set, batch, prompt, tokens, cfg.vocab_size, ++round_seed, &warm, &steps);
        // An agent's next turn comes after the cache has warmed the grammars it compiled for this one.
        const auto w0 = clock_type::now();
        const bool warmed = cache.wait_warm(warm_wait_s);
        const double waited_s = ms_since(w0) / 1e3;
        for (int k = 0; k < rounds; ++k) {
          for (const DecodeStep& st : steps) warm_rows.insert(st.rows);
          steps.clear(), twin_steps.clear(), lengths.clear();
          const uint64_t rs = ++round_seed;
          run_round(e, set, batch, prompt, tokens, cfg.vocab_size, rs, &r, &steps, &lengths);
          if (set.grammars.empty()) continue;
          run_round(e, set, batch, prompt, tokens, cfg.vocab_size, rs, &twins, &twin_steps, nullptr, &lengths);
          pair_steps(steps, twin_steps, warm_rows, &pair);
        }
        const double tpot = percentile(r.full_batch_ms, 0.5);
        if (set.grammars.empty()) free_tpot[batch] = tpot;
        Json by_rows = Json::object();
        for (const auto& [n, v] : r.step_ms_by_rows)
          by_rows[std::to_string(n)] = {{"n", v.size()}, {"median", percentile(v, 0.5)}};
        Json row = {{"batch", batch},
                    {"grammar", set.name},
                    {"grammars", set.grammars.size()},
                    {"full_batch_steps", r.full_batch_ms.size()},
                    {"tpot_full_batch_ms", samples_json(r.full_batch_ms)},
                    {"request_tpot_ms", samples_json(r.request_tpot_ms)},
                    {"step_ms_by_rows", by_rows},
                    {"tokens", r.tokens},
                    {"outputs", r.outputs},
                    {"stopped", r.stopped},
                    {"valid_outputs", set.grammars.empty() ? Json(nullptr) : Json(r.valid)}};
        if (!set.grammars.empty() && !r.full_batch_ms.empty() && free_tpot.count(batch) && free_tpot[batch] > 0)
          row["tpot_over_free"] = tpot / free_tpot[batch];
        const double paired = pair.free_ms > 0 ? pair.constrained_ms / pair.free_ms : 0;
        if (!set.grammars.empty())
          row["paired_with_free_twins"] = {{"steps", pair.step_ratio.size()},
                                           {"mismatched_steps", pair.mismatched},
                                           {"constrained_ms", pair.constrained_ms},
                                           {"free_ms", pair.free_ms},
                                           {"ratio_of_sums", paired},
                                           {"step_ratio", samples_json(pair.step_ratio)}};
        row["warm_wait_seconds"] = waited_s;
        row["warmed"] = warmed;
        rows.push_back(row);
        lines.push_back({batch, set.name, r.full_batch_ms.size(), tpot, percentile(r.full_batch_ms, 0.9),
                         percentile(r.request_tpot_ms, 0.5), set.grammars.empty() ? -1 : r.valid, r.outputs, r.tokens,
                         paired});
      }
    const structured::GrammarCache::Stats cs = cache.stats();
    std::printf("grammar warming: %lld grammars, %lld chains, %.1f s on the cache's thread\n",
                static_cast<long long>(cs.warmed_grammars), static_cast<long long>(cs.warmed_chains), cs.warm_seconds);
    std::printf("\n%-6s %-12s %8s %10s %10s %9s %9s %13s %8s %8s\n", "batch", "grammar", "steps", "tpot ms", "p90 ms",
                "vs free", "vs twins", "req tpot p50", "valid", "tokens");
    for (const Line& l : lines) {
      const double base = free_tpot.count(l.batch) ? free_tpot[l.batch] : 0;
      char vs[16] = "-", twins[16] = "-", valid[24] = "-";
      if (l.grammar != "free" && base > 0 && l.steps > 0)
        std::snprintf(vs, sizeof vs, "%+.1f%%", 100 * (l.tpot / base - 1));
      if (l.paired > 0) std::snprintf(twins, sizeof twins, "%+.1f%%", 100 * (l.paired - 1));
      if (l.valid >= 0)
        std::snprintf(valid, sizeof valid, "%lld/%lld", static_cast<long long>(l.valid),
                      static_cast<long long>(l.outputs));
      std::printf("%-6d %-12s %8zu %10.3f %10.3f %9s %9s %10.3f ms %8s %8lld\n", l.batch, l.grammar.c_str(), l.steps,
                  l.tpot, l.p90, vs, twins, l.mean_tpot, valid, static_cast<long long>(l.tokens));
    }
    std::printf("grammars compiled: %lld in %.1f ms\n", static_cast<long long>(cs.misses), 1e3 * cs.compile_seconds);
    const Json bundle = {
        {"benchmark", "constrained_decode"},
        {"environment", env},
        {"config",
         {{"model", dir.string()},
          {"config", args.get("config")},
          {"vocab_size", cfg.vocab_size},
          {"vocabulary", rank_file.filename().string() + " first V-256 ranks + 256 K3 specials"},
          {"device", device},
          {"decode_backend", backend},
          {"kv_cache", "fp8_e4m3"},
          {"cuda_graphs", graph_len > 0},
          {"prompt_tokens", prompt},
          {"max_tokens", tokens},
          {"rounds", rounds},
          {"temperature", 1.0},
          {"prefix_cache", false},
          {"paired_twins",
           "each constrained round is followed by a free round with its prompts, "
           "seeds and output lengths (ignore_eos), compared step for step"},
          {"seed", seed}}},
        {"checkpoint_write_seconds", make_seconds},
        {"load_seconds", load_ms / 1e3},
        {"grammar_compile_seconds", cs.compile_seconds},
        {"grammar_warming",
         {{"grammars", cs.warmed_grammars}, {"chains", cs.warmed_chains}, {"seconds", cs.warm_seconds}}},
        {"rows", rows}};
    std::ofstream(args.get("out")) << bundle.dump(1) << "\n";
    std::printf("wrote %s\n", args.get("out").c_str());
    return 0;
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "k3bench_constrained_decode: error: %s\n", ex.what());
    return 1;
  }
}
