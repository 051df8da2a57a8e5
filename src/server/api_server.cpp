// server/api_server.cpp: ApiServer: the httplib server, its routes, the plain endpoints and
// the lifecycle (start, drain, stop).
#include "server/api_server.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "core/error.h"
#include "core/log.h"
#include "server/openai_format.h"
#include "server/output_grammar.h"
#include "server/server_impl.h"
#include "tokenizer/utf8.h"

namespace k3::server {

namespace {

// Runs `body`; any exception becomes an error reply, so no input can take the server down
// and no request goes unanswered.
template <class F>
void guarded(httplib::Response& res, F&& body, ErrorShape shape = ErrorShape::openai) {
  try {
    body();
  } catch (const ApiError& e) {
    reply_error(res, e, shape);
  } catch (const core::Error& e) {
    reply_error(res, bad_request(e.what()), shape);
  } catch (const std::exception& e) {
    reply_error(res, ApiError(500, std::string("internal error: ") + e.what(), {}, "internal_error"), shape);
  } catch (...) {
    reply_error(res, ApiError(500, "internal error", {}, "internal_error"), shape);
  }
}

// Anthropic's clients read Anthropic's error shape: every /v1/messages path answers in it.
ErrorShape shape_for(const std::string& path) {
  return path.rfind("/v1/messages", 0) == 0 ? ErrorShape::anthropic : ErrorShape::openai;
}

// Compares without an early exit, so the time taken does not tell how much of a key matched.
bool same_key(const std::string& given, const std::string& key) {
  if (given.size() != key.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < key.size(); ++i) diff |= static_cast<unsigned char>(given[i] ^ key[i]);
  return diff == 0;
}

// The key a request carries: "Authorization: Bearer KEY" (OpenAI) or "x-api-key: KEY" (Anthropic).
std::string request_key(const httplib::Request& req) {
  const std::string auth = req.get_header_value("Authorization");
  if (auth.rfind("Bearer ", 0) == 0) return auth.substr(7);
  return req.get_header_value("x-api-key");
}

}  // namespace

void reply_error(httplib::Response& res, const ApiError& e, ErrorShape shape) {
  if (shape == ErrorShape::anthropic) {
    res.status = anthropic_status(e.status);
    res.set_content(dump_json(anthropic_error_body(e)), "application/json");
  } else {
    res.status = e.status;
    res.set_content(dump_json(error_body(e)), "application/json");
  }
}

// The served names, checked before anything uses the first one.
static ServerConfig checked(ServerConfig c) {
  K3_CHECK(!c.served_model_names.empty(), "server: at least one served model name is needed");
  for (const std::string& n : c.served_model_names) K3_CHECK(!n.empty(), "server: a served model name is empty");
  return c;
}

ApiServer::Impl::Impl(ServerConfig c, engine::Engine& e, const tokenizer::Tokenizer& t)
    : config(checked(std::move(c))),
      engine(e),
      tokenizer(t),
      metrics(std::make_shared<Metrics>(config.served_model_names.front(), e.config().scheduler.max_model_len,
                                        e.config().cache)),
      max_model_len(e.config().scheduler.max_model_len),
      created(unix_now()),
      responses(config.max_stored_responses),
      grammars(grammar_vocabulary(t, e.executor().vocab_size(), e.config().eos_token_id)) {}

ParseContext ApiServer::Impl::parse_context() {
  ParseContext ctx;
  ctx.tokenizer = &tokenizer;
  ctx.served_models = config.served_model_names;
  ctx.vocab_size = engine.executor().vocab_size();
  ctx.max_model_len = max_model_len;
  ctx.max_n = config.max_n;
  ctx.max_prompts = config.max_prompts;
  ctx.default_chat_max_tokens = config.default_chat_max_tokens;
  ctx.grammars = &grammars;
  std::lock_guard lock(rng_mu);
  ctx.random_seed = rng();
  return ctx;
}

void ApiServer::Impl::note_ignored_fields(const char* api, const std::vector<std::string>& fields) {
  std::string fresh;
  for (const std::string& field : fields) {
    metrics->count_ignored_field(api, field);
    std::lock_guard lock(ignored_mu);
    if (ignored_logged.size() < 4096 && ignored_logged.insert(std::string(api) + " " + field).second)
      fresh += (fresh.empty() ? "" : ", ") + field;
  }
  if (!fresh.empty()) log::warn(std::string(api) + " request fields accepted with no effect here: " + fresh);
}

std::shared_ptr<void> ApiServer::Impl::track(const std::shared_ptr<Generation>& g) {
  {
    std::lock_guard lock(inflight_mu);
    // Checked under the lock drain() sets it under, so drain() never misses a request.
    if (draining) throw ApiError(503, "the server is shutting down", {}, "server_shutting_down");
    ++inflight;
    generations.remove_if([](const std::weak_ptr<Generation>& w) { return w.expired(); });
    generations.push_back(g);
  }
  return std::shared_ptr<void>(nullptr, [this](void*) {
    {
      std::lock_guard lock(inflight_mu);
      --inflight;
    }
    inflight_cv.notify_all();
  });
}

namespace {

// One model entry in both APIs' shapes: OpenAI's (id, object, created, owned_by) and
// Anthropic's (type, display_name, created_at), so either SDK's models.list() reads it.
Json model_entry(const std::string& name, int64_t created, const std::string& root, int64_t max_model_len) {
  char when[32];
  const std::time_t t = static_cast<std::time_t>(created);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return {{"id", name},
          {"object", "model"},
          {"created", created},
          {"owned_by", "k3serve"},
          {"root", root.empty() ? name : root},
          {"parent", nullptr},
          {"max_model_len", max_model_len},
          {"type", "model"},
          {"display_name", name},
          {"created_at", when}};
}

}  // namespace

void ApiServer::Impl::handle_models(httplib::Response& res) {
  Json data = Json::array();
  for (const std::string& name : config.served_model_names)
    data.push_back(model_entry(name, created, config.model_root, max_model_len));
  res.set_content(dump_json(Json{{"object", "list"},
                                 {"data", data},
                                 {"has_more", false},
                                 {"first_id", config.served_model_names.front()},
                                 {"last_id", config.served_model_names.back()}}),
                  "application/json");
}

void ApiServer::Impl::handle_model(const std::string& id, httplib::Response& res) {
  for (const std::string& name : config.served_model_names)
    if (name == id)
      return res.set_content(dump_json(model_entry(name, created, config.model_root, max_model_len)),
                             "application/json");
  throw ApiError(404, "The model '" + id + "' does not exist", "model", "model_not_found");
}

void ApiServer::Impl::handle_tokenize(const httplib::Request& req, httplib::Response& res) {
  const TokenizeParams t = parse_tokenize_request(parse_body(req.body), parse_context());
  Json out = {{"count", t.tokens.size()}, {"max_model_len", max_model_len}, {"tokens", t.tokens}};
  if (t.return_token_strs) {
    Json strs = Json::array();
    for (int32_t id : t.tokens) {
      std::string s;
      tokenizer::utf8::append_replacing(tokenizer.token_bytes(id), true, s);
      strs.push_back(s);
    }
    out["token_strs"] = strs;
  } else {
    out["token_strs"] = nullptr;
  }
  res.set_content(dump_json(out), "application/json");
}

void ApiServer::Impl::handle_detokenize(const httplib::Request& req, httplib::Response& res) {
  const std::vector<int32_t> ids = parse_detokenize_request(parse_body(req.body), parse_context());
  std::string text;
  try {
    text = tokenizer.decode(ids);
  } catch (const core::Error& e) {
    throw bad_request(std::string("'tokens' cannot be decoded: ") + e.what(), "tokens");
  }
  res.set_content(dump_json(Json{{"prompt", text}}), "application/json");
}

void ApiServer::Impl::install_routes() {
  auto json_404_405 = [](int status, const std::string& message) {
    return [status, message](const httplib::Request& req, httplib::Response& res) {
      reply_error(res, ApiError(status, message, {}, status == 405 ? "method_not_allowed" : "not_found"),
                  shape_for(req.path));
    };
  };
  // With an API key, every route but liveness and metrics needs it.
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (config.api_key.empty() || req.path == "/health" || req.path == "/metrics")
      return httplib::Server::HandlerResponse::Unhandled;
    if (same_key(request_key(req), config.api_key)) return httplib::Server::HandlerResponse::Unhandled;
    // (counted by the error handler, which sees every reply of 400 and up, this one too)
    reply_error(res,
                ApiError(401,
                         req.has_header("Authorization") || req.has_header("x-api-key")
                             ? "invalid API key"
                             : "missing API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'",
                         {}, "invalid_api_key"),
                shape_for(req.path));
    return httplib::Server::HandlerResponse::Handled;
  });
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] { handle_generate(req, res, false); });
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] { handle_generate(req, res, true); });
  });
  http.Post("/v1/responses", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] { handle_responses(req, res); });
  });
  http.Post("/v1/messages", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(
        res, [&] { handle_messages(req, res); }, ErrorShape::anthropic);
  });
  http.Post("/v1/messages/count_tokens", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(
        res, [&] { handle_count_tokens(req, res); }, ErrorShape::anthropic);
  });
  http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] { handle_tokenize(req, res); });
  });
  http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] { handle_detokenize(req, res); });
  });
  http.Get("/v1/models",
           [this](const httplib::Request&, httplib::Response& res) { guarded(res, [&] { handle_models(res); }); });
  http.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] { handle_model(req.matches[1].str(), res); });
  });
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (draining) reply_error(res, ApiError(503, "the server is shutting down", {}, "server_shutting_down"));
    else res.status = 200;
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    guarded(res, [&] { res.set_content(metrics->render(engine.stats()), "text/plain; version=0.0.4; charset=utf-8"); });
  });
  for (const char* path : {"/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages",
                           "/v1/messages/count_tokens", "/tokenize", "/detokenize"})
    http.Get(path, json_404_405(405, std::string("use POST for ") + path));
  for (const char* path : {"/v1/models", "/health", "/metrics"})
    http.Post(path, json_404_405(405, std::string("use GET for ") + path));

  // Errors httplib produces itself (no route, body over the limit, a malformed request line)
  // have an empty body: give them OpenAI's shape. Every error reply is counted.
  http.set_error_handler(
      httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
        metrics->count_http_error(res.status);
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        std::string message;
        switch (res.status) {
          case 404: message = "no route for " + req.method + " " + req.path; break;
          case 413:
            message = "the request body is larger than " + std::to_string(config.max_body_bytes) + " bytes";
            break;
          case 400: message = "malformed HTTP request"; break;
          default: message = "HTTP error " + std::to_string(res.status); break;
        }
        reply_error(res, ApiError(res.status, message, {}, res.status == 413 ? "request_too_large" : ""),
                    shape_for(req.path));
        return httplib::Server::HandlerResponse::Handled;
      }));
  http.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr) {
    reply_error(res, ApiError(500, "internal error", {}, "internal_error"), shape_for(req.path));
  });
}

ApiServer::ApiServer(ServerConfig config, engine::Engine& engine, const tokenizer::Tokenizer& tokenizer)
    : impl_(std::make_unique<Impl>(std::move(config), engine, tokenizer)) {
  K3_CHECK(impl_->config.http_threads >= 1, "server: http_threads must be >= 1");
  K3_CHECK(tokenizer.vocab_size() <= engine.executor().vocab_size(),
           "server: the tokenizer has " + std::to_string(tokenizer.vocab_size()) + " ids but the model only " +
               std::to_string(engine.executor().vocab_size()));
  Impl& s = *impl_;
  const auto threads = static_cast<size_t>(s.config.http_threads);
  s.http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  s.http.set_tcp_nodelay(true);  // SSE chunks are small; Nagle + delayed ACK would add ~40 ms
  s.http.set_keep_alive_max_count(100000);
  s.http.set_keep_alive_timeout(s.config.keep_alive_seconds);
  s.http.set_read_timeout(s.config.read_timeout_seconds, 0);
  s.http.set_write_timeout(s.config.write_timeout_seconds, 0);
  s.http.set_payload_max_length(s.config.max_body_bytes);
  // httplib listens with a backlog of 5; a burst of clients would then see SYN retries (1 s
  // each). Remember the listening socket to raise the backlog after bind.
  s.http.set_socket_options([&s](socket_t sock) {
    httplib::default_socket_options(sock);
    s.listen_fd = sock;
  });
  s.install_routes();
}

ApiServer::~ApiServer() { stop(); }

int ApiServer::start() {
  Impl& s = *impl_;
  K3_CHECK(!s.listener.joinable(), "server: already started");
  const int port = s.config.port == 0 ? s.http.bind_to_any_port(s.config.host)
                                      : (s.http.bind_to_port(s.config.host, s.config.port) ? s.config.port : -1);
  if (port < 0)
    throw core::Error("server: cannot listen on " + s.config.host + ":" + std::to_string(s.config.port) + ": " +
                      std::strerror(errno));
  if (s.listen_fd >= 0) ::listen(s.listen_fd, SOMAXCONN);  // Linux: a second listen() resizes the backlog
  s.port = port;
  s.listener = std::thread([&s] {
    s.http.listen_after_bind();
    s.listener_done = true;
  });
  // stop() only reaches a server whose accept loop runs: wait for it.
  while (!s.http.is_running() && !s.listener_done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return port;
}

void ApiServer::drain(std::chrono::milliseconds grace) {
  Impl& s = *impl_;
  std::unique_lock lock(s.inflight_mu);
  s.draining = true;
  if (!s.inflight_cv.wait_for(lock, grace, [&] { return s.inflight == 0; })) {
    std::vector<std::shared_ptr<Generation>> live;
    for (const auto& w : s.generations)
      if (auto g = w.lock()) live.push_back(std::move(g));
    lock.unlock();
    for (const auto& g : live) g->shut_down("the server is shutting down; the request was aborted");
    live.clear();
    lock.lock();
    // Aborted handlers reply within a poll interval; one stuck writing to a client that does
    // not read gives up after the write timeout.
    s.inflight_cv.wait_for(lock, std::chrono::seconds(s.config.write_timeout_seconds + 5),
                           [&] { return s.inflight == 0; });
  }
}

void ApiServer::stop() {
  Impl& s = *impl_;
  if (s.http.is_running() || s.listener.joinable()) s.http.stop();
  if (s.listener.joinable()) s.listener.join();
}

int ApiServer::port() const { return impl_->port; }
int64_t ApiServer::inflight() const {
  std::lock_guard lock(impl_->inflight_mu);
  return impl_->inflight;
}
Metrics& ApiServer::metrics() { return *impl_->metrics; }
const ServerConfig& ApiServer::config() const { return impl_->config; }

}  // namespace k3::server
