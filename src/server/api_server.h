// server/api_server.h: k3serve's HTTP server over an Engine: OpenAI and Anthropic APIs.
//
//   POST /v1/completions, /v1/chat/completions   OpenAI generation, streamed (SSE) or not
//   POST /v1/responses                            OpenAI Responses API (responses_api.h)
//   POST /v1/messages, /v1/messages/count_tokens  Anthropic Messages API (anthropic_api.h)
//   GET  /v1/models, /health, /metrics           model list, liveness, Prometheus text
//   POST /tokenize, /detokenize                  vLLM's shapes
//
// Every request is validated at the edge (request_params.h) and answered: a 2xx, or an error
// body in the API's own shape with 400 (bad field, named), 401 (API key), 404 (unknown route or
// model), 405, 413 (body over the limit), 500 or 503 (draining; 529 for Anthropic clients). With
// an API key set, every route but /health and /metrics needs it (Authorization: Bearer KEY or
// x-api-key: KEY). A client that goes away mid-request has its engine
// requests aborted within one poll interval, so no cache page or state slot outlives it.
// HTTP is Debian's cpp-httplib: one pooled thread per open connection (docs/architecture.md
// says why and where that stops scaling).
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/metrics.h"
#include "tokenizer/tokenizer.h"

namespace k3::server {

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8000;                                            // 0: any free port (tests); start() returns the one bound
  std::vector<std::string> served_model_names = {"k3-tiny"};  // ids clients may use; the first is the main one
  std::string api_key;                                        // non-empty: required on every API route
  std::string model_root;                                     // shown in /v1/models
  int http_threads = 256;                                     // connections served at once: streams + idle keep-alives
  size_t max_body_bytes = 8u << 20;                           // larger bodies get 413
  int keep_alive_seconds = 5;                                 // an idle keep-alive connection holds a thread this long
  int read_timeout_seconds = 30;                              // a client stalling mid-request is dropped after this
  int write_timeout_seconds = 30;                             // a client not reading its stream is dropped after this
  int max_n = 16;
  int max_prompts = 64;
  int64_t default_chat_max_tokens = 0;  // 0: fill the context (OpenAI, vLLM)
  size_t max_stored_responses = 1024;   // /v1/responses store: the most recent kept (previous_response_id)
  // How often a handler waiting on the engine checks that its client is still there.
  std::chrono::milliseconds poll_interval{20};
  // Anthropic streams: a ping after this long without an event (long prefills), so clients and
  // proxies see the stream is alive.
  std::chrono::milliseconds stream_ping_interval{3000};
};

class ApiServer {
 public:
  ApiServer(ServerConfig config, engine::Engine& engine, const tokenizer::Tokenizer& tokenizer);
  ~ApiServer();  // stop()
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  // Binds host:port and serves on a background thread; returns the bound port. Throws
  // core::Error when the address cannot be bound. The engine must be running (Engine::start).
  int start();
  // Graceful shutdown, step one: new generation requests get 503; in-flight ones run for up to
  // `grace`, then the rest are aborted and each gets a final error (an SSE error event or a
  // 503 body). Returns once every generation handler has replied.
  void drain(std::chrono::milliseconds grace);
  // Stops listening and closes connections (after drain() for a graceful stop).
  void stop();

  int port() const;
  int64_t inflight() const;  // generation requests being served
  Metrics& metrics();
  const ServerConfig& config() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace k3::server
