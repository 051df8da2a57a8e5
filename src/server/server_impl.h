// server/server_impl.h: ApiServer's insides, shared by api_server.cpp (routes, plain
// endpoints, lifecycle) and generate_handler.cpp (completions and chat). Not for other users.
#pragma once
#include <httplib.h>

#include <atomic>
#include <condition_variable>
#include <list>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "server/api_server.h"
#include "server/generation.h"
#include "server/request_params.h"
#include "server/response_store.h"

namespace k3::server {

struct ApiServer::Impl {
  Impl(ServerConfig c, engine::Engine& e, const tokenizer::Tokenizer& t);

  ServerConfig config;
  engine::Engine& engine;
  const tokenizer::Tokenizer& tokenizer;
  std::shared_ptr<Metrics> metrics;  // shared with the engine callbacks, which may outlive the server
  int64_t max_model_len = 0;
  int64_t created = 0;  // /v1/models "created": the start time

  httplib::Server http;
  std::thread listener;
  int port = -1;
  int listen_fd = -1;
  std::atomic<bool> listener_done{false};

  // Draining and in-flight generation requests.
  std::atomic<bool> draining{false};
  mutable std::mutex inflight_mu;
  std::condition_variable inflight_cv;
  int64_t inflight = 0;
  std::list<std::weak_ptr<Generation>> generations;  // live ones, for drain() to abort

  std::mutex rng_mu;
  std::mt19937_64 rng{std::random_device{}()};

  ResponseStore responses;            // /v1/responses with store: true
  structured::GrammarCache grammars;  // constrained outputs, compiled once per grammar text

  std::mutex ignored_mu;
  std::set<std::string> ignored_logged;  // "api field" pairs already named in the log

  ParseContext parse_context();
  // Counts the fields a request sent that change nothing here, and names each new one in the log.
  void note_ignored_fields(const char* api, const std::vector<std::string>& fields);
  // The front ends' common start: 503 while draining, the body parsed by `parse(json, ctx)` with
  // unknown fields collected, the request counted for `api` and what it ignored noted.
  template <class Parse>
  auto parse_request(const char* api, const httplib::Request& req, Parse&& parse) {
    if (draining) throw ApiError(503, "the server is shutting down", {}, "server_shutting_down");
    ParseContext ctx = parse_context();
    std::vector<std::string> ignored;
    ctx.ignored_fields = &ignored;
    auto parsed = parse(parse_body(req.body), ctx);
    metrics->count_request(api);
    note_ignored_fields(api, ignored);
    return parsed;
  }
  // Counts a generation request in (until the returned token dies) and lets drain() reach it.
  std::shared_ptr<void> track(const std::shared_ptr<Generation>& g);

  void install_routes();
  void handle_generate(const httplib::Request& req, httplib::Response& res, bool chat);
  void handle_messages(const httplib::Request& req, httplib::Response& res);      // anthropic_api.cpp
  void handle_count_tokens(const httplib::Request& req, httplib::Response& res);  // anthropic_api.cpp
  void handle_responses(const httplib::Request& req, httplib::Response& res);     // responses_api.cpp
  void handle_models(httplib::Response& res);
  void handle_model(const std::string& id, httplib::Response& res);  // GET /v1/models/{id}
  void handle_tokenize(const httplib::Request& req, httplib::Response& res);
  void handle_detokenize(const httplib::Request& req, httplib::Response& res);
};

enum class ErrorShape : uint8_t { openai, anthropic };
// Sets the reply to the error in the API's shape.
void reply_error(httplib::Response& res, const ApiError& e, ErrorShape shape = ErrorShape::openai);

}  // namespace k3::server
