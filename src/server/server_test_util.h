// server/server_test_util.h: what the server tests share: two servers started once per test
// program on ephemeral loopback ports, and small HTTP helpers (cpp-httplib's client).
//
//   model_server()     the real tiny model (make-checkpoint k3-tiny, seed 0, with its
//                      tokenizer) behind ServingModel + ApiServer: end to end, metrics, prefix
//                      cache, concurrency, disconnects.
//   scripted_server()  the same tokenizer over an Engine whose executor emits scripted token
//                      sequences (ScriptedExecutor), chosen by a trigger text in the prompt:
//                      exact outputs for stop strings across token boundaries, tool calls,
//                      reasoning, finish reasons.
#pragma once
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "config/k3_config.h"
#include "core/rng.h"
#include "engine/engine.h"
#include "server/api_server.h"
#include "server/json_body.h"
#include "server/serving_model.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/k3_tokens.h"
#include "tokenizer/tiny_tokenizer.h"

namespace k3::server::testing {

// ---- an executor that plays scripts ----

// Each request plays the script whose trigger text appears in its prompt (decoded), else the
// default script; the script cycles when max_tokens outlasts it. Logits peak (8.0) at the
// script's next token over a smooth background, so greedy replays the script exactly and
// logprobs are real numbers. Needs the prefix cache off (it reads every prompt token).
class ScriptedExecutor final : public engine::Executor {
 public:
  struct Script {
    std::string trigger;
    std::vector<int32_t> output;
  };
  ScriptedExecutor(const tokenizer::Tokenizer& tok, int32_t vocab, std::vector<Script> scripts,
                   std::vector<int32_t> fallback, std::chrono::microseconds step_delay = {})
      : tok_(tok), vocab_(vocab), scripts_(std::move(scripts)), fallback_(std::move(fallback)), delay_(step_delay) {}

  int32_t vocab_size() const override { return vocab_; }
  void release(scheduler::RequestId id) override { state_.erase(id); }
  core::Tensor execute(const scheduler::StepPlan& plan, core::LogitsAt) override {
    if (delay_.count() > 0) std::this_thread::sleep_for(delay_);  // a slow model, for drain tests
    core::Tensor logits = core::Tensor::zeros(core::DType::f32, {plan.num_logit_rows, vocab_});
    int64_t row_end = 0;  // past this sequence's rows; its last is the sampled one
    for (const scheduler::ScheduledSequence& q : plan.seqs) {
      row_end += q.logit_rows();
      State& st = state_[q.id];
      const std::span<const int32_t> tokens = plan.tokens_of(q);
      if (!st.script) st.prompt.insert(st.prompt.end(), tokens.begin(), tokens.end());
      if (!q.sample) continue;
      if (!st.script) st.script = &pick(st.prompt);
      const std::vector<int32_t>& s = *st.script;
      const int32_t target = s[static_cast<size_t>(st.sampled++ % static_cast<int64_t>(s.size()))];
      float* row = logits.data<float>() + (row_end - 1) * vocab_;
      for (int32_t v = 0; v < vocab_; ++v) row[v] = -0.01f * static_cast<float>((v * 7 + target) % vocab_);
      row[target] = 8.0f;
    }
    return logits;
  }

 private:
  struct State {
    std::vector<int32_t> prompt;
    const std::vector<int32_t>* script = nullptr;
    int64_t sampled = 0;
  };
  const std::vector<int32_t>& pick(const std::vector<int32_t>& prompt) const {
    const std::string text = tok_.decode(prompt);
    for (const Script& s : scripts_)
      if (text.find(s.trigger) != std::string::npos) return s.output;
    return fallback_;
  }
  const tokenizer::Tokenizer& tok_;
  int32_t vocab_;
  std::vector<Script> scripts_;
  std::vector<int32_t> fallback_;
  std::chrono::microseconds delay_;
  std::unordered_map<scheduler::RequestId, State> state_;
};

// ---- the shared model folder and servers ----

inline const std::filesystem::path& tiny_model_dir() {
  static const std::filesystem::path dir = [] {
    const auto d = std::filesystem::temp_directory_path() / ("k3-server-test-" + std::to_string(::getpid()));
    checkpoint::write_random_checkpoint(config::builtin_config("k3-tiny"), checkpoint::WriteOptions{}, d);
    tokenizer::write_tiny_tokenizer(config::builtin_config("k3-tiny").vocab_size, d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(
          std::filesystem::temp_directory_path() / ("k3-server-test-" + std::to_string(::getpid())), ec);
    });
    return d;
  }();
  return dir;
}

inline ServerConfig test_server_config() {
  ServerConfig c;
  c.host = "127.0.0.1";
  c.port = 0;
  c.served_model_names = {"k3-tiny"};
  c.http_threads = 256;
  c.keep_alive_seconds = 1;  // so stopping at exit does not wait on idle connections
  c.poll_interval = std::chrono::milliseconds(10);
  return c;
}

struct ModelServer {
  std::unique_ptr<ServingModel> model;
  std::unique_ptr<ApiServer> http;
  int port = 0;
  explicit ModelServer(int64_t max_model_len = 512) {
    ServingOptions o;
    o.model_dir = tiny_model_dir();
    o.max_model_len = max_model_len;
    o.max_num_seqs = 64;
    o.max_num_batched_tokens = 1024;
    o.kv_cache_bytes = 64ll << 20;
    model = ServingModel::load(o);
    model->engine().start();
    http = std::make_unique<ApiServer>(test_server_config(), model->engine(), model->tokenizer());
    port = http->start();
  }
  ~ModelServer() {
    http->stop();
    model->engine().stop();
  }
  engine::Engine& engine() { return model->engine(); }
  const tokenizer::Tokenizer& tokenizer() const { return model->tokenizer(); }
};

inline ModelServer& model_server() {
  static ModelServer s;
  return s;
}

// Script texts (the scripted server's outputs), by trigger.
#define K3_O "<|open|>"
#define K3_C "<|close|>"
#define K3_S "<|sep|>"
#define K3_E "<|end_of_msg|>"
inline const std::vector<std::pair<std::string, std::string>>& script_texts() {
  static const std::vector<std::pair<std::string, std::string>> texts = {
      // A completion that ends in eos; "the end" spans several tokens.
      {"SCRIPT_STORY", "Once upon a time there was a tiny model. It served text until the end of the story." K3_E},
      // Chat: reasoning, then an answer.
      {"SCRIPT_CHAT", "The user greets me; I greet back." K3_C "think" K3_S K3_O "response" K3_S
                      "Hello! How can I help you today?" K3_C "response" K3_S K3_C "message" K3_S K3_E},
      // Chat: reasoning, then two tool calls.
      {"SCRIPT_TOOLS",
       "I need the weather." K3_C "think" K3_S K3_O "response" K3_S K3_C "response" K3_S K3_O "tools" K3_S K3_O
       "call tool=\"get_weather\" index=\"1\"" K3_S K3_O "argument key=\"city\" type=\"string\"" K3_S "Paris" K3_C
       "argument" K3_S K3_O "argument key=\"days\" type=\"number\"" K3_S "3" K3_C "argument" K3_S K3_C "call" K3_S K3_O
       "call tool=\"get_time\" index=\"2\"" K3_S K3_O "json type=\"object\"" K3_S "{\"tz\": \"CET\"}" K3_C
       "json" K3_S K3_C "call" K3_S K3_C "tools" K3_S K3_C "message" K3_S K3_E},
      // Chat: reasoning, then one call as a JSON block (what a strict or named tool must write).
      {"SCRIPT_TIME", "I need the time." K3_C "think" K3_S K3_O "response" K3_S K3_C "response" K3_S K3_O
                      "tools" K3_S K3_O "call tool=\"get_time\" index=\"1\"" K3_S K3_O "json type=\"object\"" K3_S
                      "{\"tz\": \"CET\"}" K3_C "json" K3_S K3_C "call" K3_S K3_C "tools" K3_S K3_C "message" K3_S K3_E},
      // Chat: a malformed call (a number that is not one) among good text.
      {"SCRIPT_BADTOOL",
       "Hmm." K3_C "think" K3_S K3_O "response" K3_S "Calling." K3_C "response" K3_S K3_O "tools" K3_S K3_O
       "call tool=\"f\" index=\"1\"" K3_S K3_O "argument key=\"n\" type=\"number\"" K3_S "12abc" K3_C
       "argument" K3_S K3_C "call" K3_S K3_C "tools" K3_S K3_C "message" K3_S K3_E},
      // Chat: a call whose first argument is fine and whose second is malformed (it began to stream).
      {"SCRIPT_LATEBADTOOL",
       "Hmm." K3_C "think" K3_S K3_O "response" K3_S "Writing." K3_C "response" K3_S K3_O "tools" K3_S K3_O
       "call tool=\"f\" index=\"1\"" K3_S K3_O "argument key=\"path\" type=\"string\"" K3_S "a.txt" K3_C
       "argument" K3_S K3_O "argument key=\"n\" type=\"number\"" K3_S "12abc" K3_C "argument" K3_S K3_C "call" K3_S K3_C
       "tools" K3_S K3_C "message" K3_S K3_E},
      // UTF-8 that the tiny vocabulary must split inside characters.
      {"SCRIPT_UTF8", "naïve café — 東京 🚀 done." K3_E},
  };
  return texts;
}
#undef K3_O
#undef K3_C
#undef K3_S
#undef K3_E

inline std::vector<int32_t> encode_script(const tokenizer::Tokenizer& tok, const std::string& text) {
  return tok.encode(text, tokenizer::Specials::allow);
}

struct ScriptedServer {
  std::unique_ptr<tokenizer::Tokenizer> tok;
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<ApiServer> http;
  int port = 0;
  explicit ScriptedServer(std::chrono::microseconds step_delay = {}, ServerConfig config = test_server_config()) {
    tok = std::make_unique<tokenizer::Tokenizer>(tokenizer::Tokenizer::load_k3(tiny_model_dir()));
    std::vector<ScriptedExecutor::Script> scripts;
    for (const auto& [trigger, text] : script_texts()) scripts.push_back({trigger, encode_script(*tok, text)});
    // Default: endless filler text (no eos), for length and concurrency tests.
    auto fallback = encode_script(*tok, "lorem ipsum dolor sit amet ");
    engine::EngineConfig c;
    c.cache.block_size = 16;
    c.cache.num_blocks = 1024;
    c.cache.num_slots = 32;
    c.cache.num_checkpoints = 0;
    c.cache.enable_prefix_cache = false;
    c.scheduler.max_num_seqs = 32;
    c.scheduler.max_num_batched_tokens = 2048;
    c.scheduler.max_model_len = 512;
    c.eos_token_id = *tok->special_id(tokenizer::k3_tokens::kEndOfMsg);
    engine = std::make_unique<engine::Engine>(c, std::make_unique<ScriptedExecutor>(*tok, 1024, std::move(scripts),
                                                                                    std::move(fallback), step_delay));
    engine->start();
    http = std::make_unique<ApiServer>(std::move(config), *engine, *tok);
    port = http->start();
  }
  ~ScriptedServer() {
    http->stop();
    engine->stop();
  }
};

inline ScriptedServer& scripted_server() {
  static ScriptedServer s;
  return s;
}

// ---- HTTP helpers ----

struct Reply {
  int status = 0;  // 0: no HTTP response (connection failed or cancelled)
  std::string body;
  std::string content_type;
  Json json() const { return Json::parse(body); }
};

inline Reply send(int port, const std::string& method, const std::string& path, const std::string& body = {},
                  const std::function<bool(const std::string&)>& on_data = nullptr) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(60, 0);
  httplib::Request req;
  req.method = method;
  req.path = path;
  req.body = body;
  if (!body.empty()) req.set_header("Content-Type", "application/json");
  Reply r;
  std::string received;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    received.append(data, n);
    return on_data ? on_data(received) : true;
  };
  auto res = cli.send(req);
  r.body = received;
  if (res) {
    r.status = res->status;
    r.content_type = res->get_header_value("Content-Type");
  }
  return r;
}

inline Reply post(int port, const std::string& path, const Json& body) {
  return send(port, "POST", path, dump_json(body));
}
inline Reply get(int port, const std::string& path) { return send(port, "GET", path); }

// The "data:" payloads of an SSE body, in order ("[DONE]" included).
inline std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t end = body.find("\n\n", pos);
    const std::string block = body.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    if (block.rfind("data: ", 0) == 0) out.push_back(block.substr(6));
    if (end == std::string::npos) break;
    pos = end + 2;
  }
  return out;
}

// A named SSE event ("event: NAME\ndata: JSON"), as Anthropic's and the Responses API's
// streams send them.
struct NamedEvent {
  std::string name;
  Json data;
};
// The events of such a stream, each checked to have both lines and a data.type equal to its name.
inline std::vector<NamedEvent> named_events(const std::string& body) {
  std::vector<NamedEvent> out;
  for (size_t pos = 0; pos < body.size();) {
    const size_t end = body.find("\n\n", pos);
    const std::string block = body.substr(pos, end - pos);
    pos = end == std::string::npos ? body.size() : end + 2;
    const size_t nl = block.find('\n');
    EXPECT_TRUE(block.rfind("event: ", 0) == 0 && nl != std::string::npos) << block;
    if (nl == std::string::npos) continue;
    EXPECT_EQ(block.compare(nl + 1, 6, "data: "), 0) << block;
    NamedEvent e{block.substr(7, nl - 7), Json::parse(block.substr(nl + 7))};
    EXPECT_EQ(e.data["type"], e.name) << "event: line and data.type disagree";
    out.push_back(std::move(e));
  }
  return out;
}

// The chunks of a finished stream as JSON (the final "[DONE]" checked and dropped).
inline std::vector<Json> stream_chunks(const Reply& r) {
  std::vector<std::string> data = sse_data(r.body);
  EXPECT_FALSE(data.empty());
  if (data.empty()) return {};
  EXPECT_EQ(data.back(), "[DONE]") << r.body.substr(0, 2000);
  std::vector<Json> chunks;
  for (size_t i = 0; i + 1 < data.size(); ++i) chunks.push_back(Json::parse(data[i]));
  return chunks;
}

// `body` after 1-3 random edits: flipped bytes, truncations, spliced odd values, values
// replaced after a colon (fuzzing the request parsers).
inline std::string mutated_body(std::string body, core::Rng& rng) {
  static const std::vector<std::string> splices = {"null",        "-1",       "1e309", "\"\"",
                                                   "[]",          "{}",       "true",  "99999999999999999999",
                                                   "\"\\u0000\"", "[[[[]]]]", "0.5",   "\"\\ud800\""};
  const int edits = 1 + static_cast<int>(rng.next_u64() % 3);
  for (int e = 0; e < edits && !body.empty(); ++e) {
    const size_t at = rng.next_u64() % body.size();
    switch (rng.next_u64() % 5) {
      case 0: body[at] = static_cast<char>(rng.next_u64() % 256); break;
      case 1: body.resize(at); break;
      case 2: body.insert(at, splices[rng.next_u64() % splices.size()]); break;
      case 3: body.erase(at, 1 + rng.next_u64() % 8); break;
      case 4: {  // replace a value after a colon
        const size_t colon = body.find(':', at);
        if (colon != std::string::npos) {
          const size_t end = body.find_first_of(",}", colon);
          body.replace(colon + 1, end == std::string::npos ? 0 : end - colon - 1,
                       " " + splices[rng.next_u64() % splices.size()]);
        }
        break;
      }
    }
  }
  return body;
}

// Waits until the engine holds nothing: no request, no page in use, no slot.
inline bool engine_idle(engine::Engine& e, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    const engine::EngineStats s = e.stats();
    if (s.running == 0 && s.waiting == 0 && s.cache.blocks_in_use == 0 && s.cache.slots_in_use == 0 &&
        s.submitted == s.finished)
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

}  // namespace k3::server::testing
