// server/job.cpp: Job and run_job.
#include "server/job.h"

#include "server/connection_probe.h"

namespace k3::server {

Job::Job(ApiServer::Impl& server, GenerationParams params, std::string id_prefix, std::string call_id_prefix)
    : server_(server),
      params_(std::move(params)),
      call_id_prefix_(std::move(call_id_prefix)),
      gen_(std::make_shared<Generation>(server.engine, server.metrics)) {
  meta_.id = random_id(id_prefix);
  meta_.created = unix_now();
  meta_.model = params_.model.empty() ? server.config.served_model_names.front() : params_.model;
  const int n = params_.num_choices();
  DecoderOptions o;
  o.chat = params_.chat;
  o.start = params_.start_channel;
  o.stop = params_.stop;
  o.skip_special_tokens = params_.skip_special_tokens;
  o.logprobs = params_.logprobs;
  o.tools = params_.tool_policy;
  decoders_.reserve(static_cast<size_t>(n));
  for (int c = 0; c < n; ++c) decoders_.emplace_back(server.tokenizer, o);
  cached_.assign(static_cast<size_t>(n), 0);
  offsets_.assign(static_cast<size_t>(n), 0);
  call_ids_.resize(static_cast<size_t>(n));
}

void Job::submit() {
  std::vector<engine::GenerateRequest> choices;
  for (int c = 0; c < params_.num_choices(); ++c) choices.push_back(params_.choice(c));
  try {
    gen_->submit(std::move(choices), params_.n);
  } catch (const core::Error& e) {
    throw bad_request(std::string("the engine refused the request: ") + e.what());
  }
  inflight_ = server_.track(gen_);
}

bool Job::fold(Generation::Event& ev, ChoiceDelta& d) {
  const auto c = static_cast<size_t>(ev.choice);
  cached_[c] = std::max(cached_[c], ev.event.stats.cached_prompt_tokens);
  ChoiceDecoder& dec = decoders_[c];
  if (dec.finished()) return false;
  d = dec.push(ev.event);
  if (dec.stopped_early()) gen_->stop_early(ev.choice);
  for (const ToolCallPiece& p : d.tool_call_pieces)
    if (p.begin) call_id(ev.choice, p.index);
  for (const tokenizer::ParsedToolCall& call : d.tool_calls) call_id(ev.choice, call.index);
  if (dec.finished()) {
    for (size_t k = 0; k < dec.parse_errors().size(); ++k) server_.metrics->count_tool_parse_error();
    if (d.finish_reason == "error" || d.finish_reason == "abort") {
      fail(d);
      d.finish_reason.clear();
    }
  }
  return !failure_ && !d.empty();
}

const std::string& Job::call_id(int c, int index) {
  std::vector<std::string>& ids = call_ids_[static_cast<size_t>(c)];
  const auto i = static_cast<size_t>(index);
  if (ids.size() <= i) ids.resize(i + 1);
  if (ids[i].empty()) ids[i] = random_id(call_id_prefix_);
  return ids[i];
}

bool Job::complete() const {
  if (!gen_->engine_done()) return false;
  if (failure_) return true;
  for (const ChoiceDecoder& d : decoders_)
    if (!d.finished()) return false;
  return true;
}

void Job::client_gone() {
  if (gone_) return;
  gone_ = true;
  server_.metrics->count_client_disconnect();
  gen_->abort_all();
}

Usage Job::usage() const {
  Usage u;
  for (const auto& p : params_.prompts) u.prompt_tokens += static_cast<int64_t>(p.size());
  for (const ChoiceDecoder& d : decoders_) u.completion_tokens += d.tokens();
  u.cached_tokens = cached_tokens();
  return u;
}

int64_t Job::cached_tokens() const {
  int64_t total = 0;
  for (size_t p = 0; p < params_.prompts.size(); ++p) {
    int64_t best = 0;
    for (int i = 0; i < params_.n; ++i) best = std::max(best, cached_[p * static_cast<size_t>(params_.n) + i]);
    total += best;
  }
  return total;
}

void Job::fail(const ChoiceDelta& d) {
  if (failure_) return;
  if (d.finish_reason == "error") {
    failure_.emplace(500, "generation failed: " + d.error, "", "generation_failed");
  } else {
    const std::string why = gen_->shutdown_reason();
    failure_.emplace(503, why.empty() ? "the request was aborted by the server" : why, "", "server_shutting_down");
  }
  gen_->abort_all();
}

std::string sse_event(const std::string& name, const Json& data) {
  std::string out;
  if (!name.empty()) out = "event: " + name + "\n";
  return out + "data: " + dump_json(data) + "\n\n";
}

namespace {

// One call of the stream's content provider: begins the stream, sends what arrived within a
// poll interval, and ends it once the job is complete. False: the client is gone.
bool stream_step(Job& job, Formatter& f, bool& started, httplib::DataSink& sink) {
  std::string out;
  if (!started) {
    started = true;
    out += f.begin(job);
  }
  const bool any = job.pump([&](int c, const ChoiceDelta& d) { out += f.delta(job, c, d); });
  const bool complete = job.complete();
  if (complete) out += f.end(job);
  else if (!any && out.empty()) out += f.idle(job);
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

void stream(std::shared_ptr<Job> job, std::shared_ptr<Formatter> f, httplib::Response& res) {
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");  // tell proxies not to buffer the stream
  auto started = std::make_shared<bool>(false);
  res.set_chunked_content_provider(
      f->content_type(),
      [job, f, started](size_t, httplib::DataSink& sink) {
        // httplib runs this outside its handler try-block: nothing may escape.
        try {
          return stream_step(*job, *f, *started, sink);
        } catch (...) {
          job->client_gone();  // abort; closing the connection is all that is left to do
          return false;
        }
      },
      [job](bool success) {
        if (!success) job->client_gone();
      });
}

void reply_when_done(Job& job, Formatter& f, const httplib::Request& req, httplib::Response& res) {
  const ConnectionProbe probe(req.local_addr, req.local_port, req.remote_addr, req.remote_port);
  std::vector<ChoiceResult> results(static_cast<size_t>(job.params().num_choices()));
  while (!job.complete()) {
    job.pump([&](int c, const ChoiceDelta& d) {
      std::vector<std::string> ids;
      for (const tokenizer::ParsedToolCall& call : d.tool_calls) ids.push_back(job.call_id(c, call.index));
      results[static_cast<size_t>(c)].add(d, std::move(ids));
    });
    if (probe.peer_closed()) {
      job.client_gone();  // nobody to answer; the Job's end frees the rest
      return;
    }
  }
  if (job.failure()) throw *job.failure();
  res.set_content(dump_json(f.reply(job, results)), "application/json");
}

}  // namespace

void run_job(std::shared_ptr<Job> job, std::shared_ptr<Formatter> formatter, const httplib::Request& req,
             httplib::Response& res) {
  job->submit();
  if (job->params().stream) stream(std::move(job), std::move(formatter), res);
  else reply_when_done(*job, *formatter, req, res);
}

}  // namespace k3::server
