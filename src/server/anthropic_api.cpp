// server/anthropic_api.cpp: POST /v1/messages and /v1/messages/count_tokens: Anthropic's shapes
// for a Job (server/job.h).
//
// A reply is {id: "msg_...", type: "message", role, model, content: [thinking?, text?,
// tool_use*], stop_reason (end_turn | max_tokens | stop_sequence | tool_use), stop_sequence,
// usage: {input_tokens (not from the cache), cache_read_input_tokens (prefix-cache hits),
// cache_creation_input_tokens (0: the prefix cache fills itself, nothing is billed as a write),
// output_tokens}}. A stream is Anthropic's event sequence: message_start, a ping, then per block
// content_block_start / content_block_delta (thinking_delta + signature_delta, text_delta,
// input_json_delta with the tool input as it is generated) / content_block_stop, then
// message_delta (stop_reason, final usage) and message_stop; a ping every few seconds of
// silence (long prefills); an "error" event if the job fails.
#include <iomanip>
#include <sstream>

#include "core/log.h"
#include "server/anthropic_request.h"
#include "server/job.h"

namespace k3::server {

namespace {

using Clock = std::chrono::steady_clock;

// An opaque signature for a thinking block: clients hand it back with the block, and nothing
// here checks it (thinking is rendered from the text), so a hash of the text is enough.
std::string thinking_signature(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  std::ostringstream s;
  s << "k3serve-" << std::hex << std::setw(16) << std::setfill('0') << h;
  return s.str();
}

std::string stop_reason(const Job& job, const std::string& finish) {
  if (finish == "length") return "max_tokens";
  if (finish == "tool_calls") return "tool_use";
  if (finish == "stop" && !job.decoder(0).matched_stop().empty()) return "stop_sequence";
  return "end_turn";
}

Json stop_sequence(const Job& job) {
  const std::string& m = job.decoder(0).matched_stop();
  return m.empty() ? Json(nullptr) : Json(m);
}

Json usage(const Job& job) {
  const Usage u = job.usage();
  return {{"input_tokens", u.prompt_tokens - u.cached_tokens},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", u.cached_tokens},
          {"output_tokens", u.completion_tokens}};
}

Json tool_input(const std::string& arguments) {
  Json input = Json::parse(arguments, nullptr, false);
  return input.is_object() ? input : Json::object();
}

class AnthropicFormatter final : public Formatter {
 public:
  AnthropicFormatter(bool show_thinking, std::chrono::milliseconds ping_interval)
      : show_thinking_(show_thinking), ping_interval_(ping_interval) {}

  std::string begin(Job& job) override {
    last_ = Clock::now();
    Json message = {{"id", job.meta().id},       {"type", "message"},        {"role", "assistant"},
                    {"model", job.meta().model}, {"content", Json::array()}, {"stop_reason", nullptr},
                    {"stop_sequence", nullptr},  {"usage", usage(job)}};
    return sse_event("message_start", {{"type", "message_start"}, {"message", message}}) + ping();
  }

  std::string delta(Job& job, int c, const ChoiceDelta& d) override {
    if (!d.finish_reason.empty()) finish_ = d.finish_reason;  // end() reports it
    std::string out;
    if (!d.reasoning.empty()) {
      out += open(Block::thinking, {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
      thinking_ += d.reasoning;
      if (show_thinking_) out += block_delta({{"type", "thinking_delta"}, {"thinking", d.reasoning}});
    }
    for (const ToolCallPiece& piece : d.tool_call_pieces)            // before the text: that text is the call's own
      if (piece.failed && open_ == Block::tool_use) out += close();  // a block cannot be taken back: it ends here
    if (!d.text.empty()) {
      out += open(Block::text, {{"type", "text"}, {"text", ""}});
      out += block_delta({{"type", "text_delta"}, {"text", d.text}});
    }
    for (const ToolCallPiece& piece : d.tool_call_pieces) {
      if (piece.failed) continue;  // ended above
      if (piece.begin) {
        out += close();
        out += open(Block::tool_use, {{"type", "tool_use"},
                                      {"id", job.call_id(c, piece.index)},
                                      {"name", piece.name},
                                      {"input", Json::object()}});
      }
      if (!piece.arguments.empty())
        out += block_delta({{"type", "input_json_delta"}, {"partial_json", piece.arguments}});
    }
    if (!out.empty()) last_ = Clock::now();
    return out;
  }

  std::string idle(Job&) override {
    if (Clock::now() - last_ < ping_interval_) return {};
    last_ = Clock::now();
    return ping();
  }

  std::string end(Job& job) override {
    if (const auto& f = job.failure()) return sse_event("error", anthropic_error_body(*f));
    std::string out = close();
    Json delta = {{"stop_reason", stop_reason(job, finish_)}, {"stop_sequence", stop_sequence(job)}};
    out += sse_event("message_delta", {{"type", "message_delta"}, {"delta", delta}, {"usage", usage(job)}});
    return out + sse_event("message_stop", {{"type", "message_stop"}});
  }

  Json reply(Job& job, const std::vector<ChoiceResult>& results) override {
    const ChoiceResult& r = results.at(0);
    Json content = Json::array();
    if (!r.reasoning.empty())
      content.push_back({{"type", "thinking"},
                         {"thinking", show_thinking_ ? r.reasoning : std::string()},
                         {"signature", thinking_signature(r.reasoning)}});
    if (!r.text.empty() || (r.tool_calls.empty() && r.reasoning.empty()))
      content.push_back({{"type", "text"}, {"text", r.text}});
    for (size_t k = 0; k < r.tool_calls.size(); ++k)
      content.push_back({{"type", "tool_use"},
                         {"id", r.tool_call_ids[k]},
                         {"name", r.tool_calls[k].name},
                         {"input", tool_input(r.tool_calls[k].arguments)}});
    return {{"id", job.meta().id},
            {"type", "message"},
            {"role", "assistant"},
            {"model", job.meta().model},
            {"content", content},
            {"stop_reason", stop_reason(job, r.finish_reason)},
            {"stop_sequence", stop_sequence(job)},
            {"usage", usage(job)}};
  }

 private:
  enum class Block : uint8_t { none, thinking, text, tool_use };

  static std::string ping() { return sse_event("ping", {{"type", "ping"}}); }

  std::string open(Block kind, const Json& block) {
    if (kind == open_ && kind != Block::tool_use) return {};
    std::string out = close();
    open_ = kind;
    return out + sse_event("content_block_start",
                           {{"type", "content_block_start"}, {"index", index_}, {"content_block", block}});
  }

  std::string close() {
    if (open_ == Block::none) return {};
    std::string out;
    if (open_ == Block::thinking)
      out += block_delta({{"type", "signature_delta"}, {"signature", thinking_signature(thinking_)}});
    out += sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
    open_ = Block::none;
    ++index_;
    return out;
  }

  std::string block_delta(const Json& delta) const {
    return sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_}, {"delta", delta}});
  }

  bool show_thinking_;
  std::chrono::milliseconds ping_interval_;
  Block open_ = Block::none;
  int index_ = 0;
  std::string thinking_, finish_;
  Clock::time_point last_;
};

}  // namespace

void ApiServer::Impl::handle_messages(const httplib::Request& req, httplib::Response& res) {
  MessagesRequest r = parse_request("messages", req, [](const Json& body, const ParseContext& ctx) {
    return parse_messages_request(body, ctx, false);
  });
  if (!r.skipped_tools.empty()) {
    std::string names;
    for (const std::string& n : r.skipped_tools) names += (names.empty() ? "" : ", ") + n;
    log::warn("messages: server tools left out of the prompt (this server cannot run them): " + names);
  }
  run_job(std::make_shared<Job>(*this, std::move(r.params), "msg_", "toolu_"),
          std::make_shared<AnthropicFormatter>(r.show_thinking, config.stream_ping_interval), req, res);
}

void ApiServer::Impl::handle_count_tokens(const httplib::Request& req, httplib::Response& res) {
  const MessagesRequest r = parse_request("messages_count_tokens", req, [](const Json& body, const ParseContext& ctx) {
    return parse_messages_request(body, ctx, true);
  });
  res.set_content(dump_json(Json{{"input_tokens", r.params.prompts.at(0).size()}}), "application/json");
}

}  // namespace k3::server
