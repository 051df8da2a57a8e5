// server/generate_handler.cpp: POST /v1/completions and /v1/chat/completions: parse, submit
// the choices, then either stream SSE chunks as events arrive or wait and reply once.
//
// The handler (or, streaming, httplib's content provider, on the same connection thread)
// waits on the Generation's queue for at most one poll interval at a time; between waits it
// checks the client (DataSink::is_writable / ConnectionProbe) and aborts every choice when the
// client is gone. The Job owns the Generation, whose destructor aborts whatever is left, so
// every way out of a request - reply, disconnect, write failure, exception - frees its engine
// requests.
#include <optional>

#include "server/connection_probe.h"
#include "server/openai_format.h"
#include "server/server_impl.h"

namespace k3::server {

namespace {

std::string sse(const Json& j) { return "data: " + dump_json(j) + "\n\n"; }
constexpr std::string_view kSseDone = "data: [DONE]\n\n";

class Job {
 public:
  Job(ApiServer::Impl& server, GenerationParams params)
      : server_(server), params_(std::move(params)), gen_(std::make_shared<Generation>(server.engine, server.metrics)) {
    meta_.id = random_id(params_.chat ? "chatcmpl-" : "cmpl-");
    meta_.created = unix_now();
    meta_.model = server.config.served_model_name;
    const int n = params_.num_choices();
    DecoderOptions o;
    o.chat = params_.chat;
    o.start = params_.start_channel;
    o.stop = params_.stop;
    o.skip_special_tokens = params_.skip_special_tokens;
    o.logprobs = params_.logprobs;
    decoders_.reserve(static_cast<size_t>(n));
    for (int c = 0; c < n; ++c) decoders_.emplace_back(server.tokenizer, o);
    cached_.assign(static_cast<size_t>(n), 0);
    offsets_.assign(static_cast<size_t>(n), 0);
  }

  void submit() {
    std::vector<engine::GenerateRequest> choices;
    for (int c = 0; c < params_.num_choices(); ++c) choices.push_back(params_.choice(c));
    try {
      gen_->submit(std::move(choices));
    } catch (const core::Error& e) {
      throw bad_request(std::string("the engine refused the request: ") + e.what());
    }
    inflight_ = server_.track(gen_);
  }

  // Waits up to one poll interval for events and folds them in; emit(choice, delta, ids) gets
  // every delta with something to show (ids: one new id per tool call in it).
  template <class Emit>
  void pump(Emit&& emit) {
    events_.clear();
    gen_->wait(server_.config.poll_interval, events_);
    for (Generation::Event& ev : events_) {
      const auto c = static_cast<size_t>(ev.choice);
      if (ev.event.finished) cached_[c] = ev.event.stats.cached_prompt_tokens;
      ChoiceDecoder& dec = decoders_[c];
      if (dec.finished()) continue;
      ChoiceDelta d = dec.push(ev.event);
      if (dec.stopped_by_string()) gen_->stop_early(ev.choice);
      if (dec.finished()) {
        for (size_t k = 0; k < dec.parse_errors().size(); ++k) server_.metrics->count_tool_parse_error();
        if (d.finish_reason == "error" || d.finish_reason == "abort") {
          fail(d);
          d.finish_reason.clear();
        }
      }
      if (failure_ || d.empty()) continue;
      std::vector<std::string> ids;
      for (size_t k = 0; k < d.tool_calls.size(); ++k) ids.push_back(random_id("call_"));
      emit(ev.choice, d, ids);
    }
  }

  bool complete() const {
    if (!gen_->engine_done()) return false;
    if (failure_) return true;
    for (const ChoiceDecoder& d : decoders_)
      if (!d.finished()) return false;
    return true;
  }

  void client_gone() {
    if (gone_) return;
    gone_ = true;
    server_.metrics->count_client_disconnect();
    gen_->abort_all();
  }

  const std::optional<ApiError>& failure() const { return failure_; }

  Usage usage() const {
    Usage u;
    for (const auto& p : params_.prompts) u.prompt_tokens += static_cast<int64_t>(p.size());
    for (const ChoiceDecoder& d : decoders_) u.completion_tokens += d.tokens();
    for (size_t p = 0; p < params_.prompts.size(); ++p) {
      int64_t best = 0;
      for (int i = 0; i < params_.n; ++i) best = std::max(best, cached_[p * static_cast<size_t>(params_.n) + i]);
      u.cached_tokens += best;
    }
    return u;
  }

  const GenerationParams& params() const { return params_; }
  const ResponseMeta& meta() const { return meta_; }
  int64_t& text_offset(int c) { return offsets_[static_cast<size_t>(c)]; }

 private:
  void fail(const ChoiceDelta& d) {
    if (failure_) return;
    if (d.finish_reason == "error") {
      failure_.emplace(500, "generation failed: " + d.error, "", "generation_failed");
    } else {
      const std::string why = gen_->shutdown_reason();
      failure_.emplace(503, why.empty() ? "the request was aborted by the server" : why, "", "server_shutting_down");
    }
    gen_->abort_all();
  }

  ApiServer::Impl& server_;
  GenerationParams params_;
  std::shared_ptr<Generation> gen_;
  std::vector<ChoiceDecoder> decoders_;
  std::vector<int64_t> cached_, offsets_;
  std::vector<Generation::Event> events_;
  ResponseMeta meta_;
  std::optional<ApiError> failure_;
  std::shared_ptr<void> inflight_;
  bool gone_ = false;
};

// The SSE chunk for one delta.
std::string stream_chunk(Job& job, const tokenizer::Tokenizer& tok, int c, const ChoiceDelta& d,
                         const std::vector<std::string>& ids) {
  const GenerationParams& p = job.params();
  if (!p.chat) {
    const Json lp = p.logprobs ? completion_logprobs(tok, d.logprobs, job.text_offset(c)) : Json(nullptr);
    return sse(completion_chunk(job.meta(), c, d.text, lp, d.finish_reason));
  }
  Json delta = Json::object();
  if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
  if (!d.text.empty()) delta["content"] = d.text;
  if (!d.tool_calls.empty()) {
    Json calls = Json::array();
    for (size_t k = 0; k < d.tool_calls.size(); ++k) calls.push_back(tool_call_json(d.tool_calls[k], ids[k], true));
    delta["tool_calls"] = calls;
  }
  const Json lp = p.logprobs && !d.logprobs.empty() ? Json{{"content", chat_logprobs_content(tok, d.logprobs)}}
                                                    : Json(nullptr);
  return sse(chat_chunk(job.meta(), c, delta, lp, d.finish_reason));
}

// One call of the stream's content provider: opens the choices (chat), sends what arrived
// within a poll interval, and finishes the stream once every choice is done. False: the
// client is gone.
bool stream_step(ApiServer::Impl& server, Job& job, bool& started, httplib::DataSink& sink) {
  std::string out;
  if (!started) {
    started = true;
    if (job.params().chat)  // OpenAI opens each choice with the role
      for (int c = 0; c < job.params().num_choices(); ++c)
        out += sse(chat_chunk(job.meta(), c, Json{{"role", "assistant"}, {"content", ""}}, nullptr, ""));
  }
  job.pump([&](int c, const ChoiceDelta& d, const std::vector<std::string>& ids) {
    out += stream_chunk(job, server.tokenizer, c, d, ids);
  });
  const bool complete = job.complete();
  if (complete) {
    if (const auto& f = job.failure()) out += sse(error_body(*f));
    else if (job.params().include_usage) out += sse(usage_chunk(job.meta(), job.params().chat, job.usage()));
    out += kSseDone;
  }
  if (!out.empty()) {
    if (!sink.write(out.data(), out.size())) {
      job.client_gone();
      return false;
    }
  } else if (!sink.is_writable()) {  // peeks at the socket: a closed peer shows here
    job.client_gone();
    return false;
  }
  if (complete) sink.done();
  return true;
}

void stream(ApiServer::Impl& server, std::shared_ptr<Job> job, httplib::Response& res) {
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");  // tell proxies not to buffer the stream
  auto started = std::make_shared<bool>(false);
  res.set_chunked_content_provider(
      "text/event-stream",
      [&server, job, started](size_t, httplib::DataSink& sink) {
        // httplib runs this outside its handler try-block: nothing may escape.
        try {
          return stream_step(server, *job, *started, sink);
        } catch (...) {
          job->client_gone();  // abort; closing the connection is all that is left to do
          return false;
        }
      },
      [job](bool success) {
        if (!success) job->client_gone();
      });
}

void reply_when_done(ApiServer::Impl& server, Job& job, const httplib::Request& req, httplib::Response& res) {
  const ConnectionProbe probe(req.local_addr, req.local_port, req.remote_addr, req.remote_port);
  std::vector<ChoiceResult> results(static_cast<size_t>(job.params().num_choices()));
  while (!job.complete()) {
    job.pump([&](int c, const ChoiceDelta& d, const std::vector<std::string>& ids) {
      results[static_cast<size_t>(c)].add(d, ids);
    });
    if (probe.peer_closed()) {
      job.client_gone();  // nobody to answer; the Job's end frees the rest
      return;
    }
  }
  if (job.failure()) throw *job.failure();
  const Usage u = job.usage();
  const Json body = job.params().chat
                        ? chat_response(server.tokenizer, job.meta(), results, job.params().logprobs, u)
                        : completion_response(server.tokenizer, job.meta(), results, job.params().logprobs, u);
  res.set_content(dump_json(body), "application/json");
}

}  // namespace

void ApiServer::Impl::handle_generate(const httplib::Request& req, httplib::Response& res, bool chat) {
  if (draining) throw ApiError(503, "the server is shutting down", {}, "server_shutting_down");
  const Json body = parse_body(req.body);
  const ParseContext ctx = parse_context();
  GenerationParams params = chat ? parse_chat_request(body, ctx) : parse_completion_request(body, ctx);
  auto job = std::make_shared<Job>(*this, std::move(params));
  job->submit();
  if (job->params().stream) stream(*this, std::move(job), res);
  else reply_when_done(*this, *job, req, res);
}

}  // namespace k3::server
