// server/job.h: one HTTP generation request in flight, whatever its API: its engine requests
// (a Generation), one ChoiceDecoder per choice, the ids given to its tool calls, its usage,
// and how it ends. The three front ends (OpenAI completions/chat, Anthropic messages, OpenAI
// responses) differ only in how they parse a body into GenerationParams and how they print
// ChoiceDeltas (a Formatter); waiting, decoding, stop handling, tool parsing, client-gone
// detection and cleanup live here once.
//
// The handler (or, streaming, httplib's content provider, on the same connection thread)
// waits on the Generation's queue for at most one poll interval at a time; between waits it
// checks the client (DataSink::is_writable / ConnectionProbe) and aborts every choice when the
// client is gone. The Job owns the Generation, whose destructor aborts whatever is left, so
// every way out of a request - reply, disconnect, write failure, exception - frees its engine
// requests.
#pragma once
#include <httplib.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/choice_decoder.h"
#include "server/generation.h"
#include "server/openai_format.h"
#include "server/request_params.h"
#include "server/server_impl.h"

namespace k3::server {

class Job {
 public:
  // call_id_prefix: "call_" (OpenAI), "toolu_" (Anthropic).
  Job(ApiServer::Impl& server, GenerationParams params, std::string id_prefix, std::string call_id_prefix);

  // Submits every choice; a refusal by the engine is a 400.
  void submit();

  // Waits up to one poll interval for events and folds them in; emit(choice, delta) gets every
  // delta with something to show. False when nothing arrived.
  template <class Emit>
  bool pump(Emit&& emit) {
    events_.clear();
    gen_->wait(server_.config.poll_interval, events_);
    for (Generation::Event& ev : events_) {
      ChoiceDelta d;
      if (fold(ev, d)) emit(ev.choice, d);
    }
    return !events_.empty();
  }

  bool complete() const;
  void client_gone();
  const std::optional<ApiError>& failure() const { return failure_; }
  Usage usage() const;
  // Prompt tokens reused from the prefix cache so far (known from a choice's first token on).
  int64_t cached_tokens() const;

  const GenerationParams& params() const { return params_; }
  const ResponseMeta& meta() const { return meta_; }
  const ChoiceDecoder& decoder(int c) const { return decoders_[static_cast<size_t>(c)]; }
  // The id of choice c's tool call number `index` (made when the call began).
  const std::string& call_id(int c, int index);
  int64_t& text_offset(int c) { return offsets_[static_cast<size_t>(c)]; }

 private:
  bool fold(Generation::Event& ev, ChoiceDelta& d);
  void fail(const ChoiceDelta& d);

  ApiServer::Impl& server_;
  GenerationParams params_;
  std::string call_id_prefix_;
  std::shared_ptr<Generation> gen_;
  std::vector<ChoiceDecoder> decoders_;
  std::vector<int64_t> cached_, offsets_;
  std::vector<std::vector<std::string>> call_ids_;  // [choice][call index]
  std::vector<Generation::Event> events_;
  ResponseMeta meta_;
  std::optional<ApiError> failure_;
  std::shared_ptr<void> inflight_;
  bool gone_ = false;
};

// How one API prints a Job. Streaming: begin() once, delta() per delta, idle() when a poll
// interval passed with nothing new (keep-alive pings), end() once every choice is done (or
// the job failed). Not streaming: reply() once at the end.
class Formatter {
 public:
  virtual ~Formatter() = default;
  virtual std::string begin(Job& job) = 0;
  virtual std::string delta(Job& job, int choice, const ChoiceDelta& d) = 0;
  virtual std::string idle(Job&) { return {}; }
  virtual std::string end(Job& job) = 0;
  // Every choice's accumulated result; throws the job's failure as an ApiError.
  virtual Json reply(Job& job, const std::vector<ChoiceResult>& results) = 0;
  // The stream's content type ("text/event-stream").
  virtual const char* content_type() const { return "text/event-stream"; }
};

// Submits the job and answers: streams through the formatter when params().stream, else
// waits for the end and replies once.
void run_job(std::shared_ptr<Job> job, std::shared_ptr<Formatter> formatter, const httplib::Request& req,
             httplib::Response& res);

// "event: NAME\ndata: JSON\n\n" (NAME empty: the data line only).
std::string sse_event(const std::string& name, const Json& data);

}  // namespace k3::server
