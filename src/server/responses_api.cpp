// server/responses_api.cpp: POST /v1/responses: OpenAI's Responses shapes for a Job.
//
// Output items in order: reasoning (rs_..., content [reasoning_text], summary [summary_text]
// when a summary was asked for, encrypted_content when include asks for it), message (msg_...,
// one output_text part), function_call (fc_..., call_id call_..., name, arguments, namespace
// when the tool came from one). A stream is the API's event sequence, every event with a
// sequence_number: response.created, response.in_progress, per item output_item.added /
// content_part.added, (output_text.delta..., output_text.done) |
// (reasoning_text.delta..., reasoning_summary_* ...), content_part.done | (function_call_arguments.delta...,
// .done) / output_item.done, then response.completed (response.incomplete when
// max_output_tokens cut it, response.failed when the engine failed). With store, the
// conversation the response ends is kept for previous_response_id.
#include <algorithm>

#include "core/log.h"
#include "server/job.h"
#include "server/responses_request.h"

namespace k3::server {

namespace {

class ResponsesFormatter final : public Formatter {
 public:
  ResponsesFormatter(ResponsesRequest r, ResponseStore& store) : r_(std::move(r)), store_(store) {}

  std::string begin(Job& job) override {
    std::string out = event("response.created", {{"response", response(job, "in_progress")}});
    return out +
           event("response.in_progress", {{"response", response(job, "in_progress")}});  // sequenced: numbers in order
  }

  std::string delta(Job& job, int c, const ChoiceDelta& d) override {
    if (!d.finish_reason.empty()) finish_ = d.finish_reason;
    std::string out;
    if (!d.reasoning.empty()) {
      if (open_ != Kind::reasoning) out += open_item(job, c, Kind::reasoning, {});
      Json& item = items_.back();
      item["content"][0]["text"] = item["content"][0]["text"].get<std::string>() + d.reasoning;
      out += event("response.reasoning_text.delta", at_part({{"delta", d.reasoning}}));
      if (r_.summary) {
        item["summary"][0]["text"] = item["summary"][0]["text"].get<std::string>() + d.reasoning;
        out += event("response.reasoning_summary_text.delta", at_item({{"summary_index", 0}, {"delta", d.reasoning}}));
      }
    }
    for (const ToolCallPiece& piece : d.tool_call_pieces)
      if (piece.failed && open_ == Kind::function_call) {  // before the text: that text is the call's own
        items_.back()["status"] = "incomplete";            // done as incomplete, left out of the output and the store
        failed_.push_back(items_.size() - 1);
        out += close_item();
      }
    if (!d.text.empty()) {
      if (open_ != Kind::message) out += open_item(job, c, Kind::message, {});
      Json& part = items_.back()["content"][0];
      part["text"] = part["text"].get<std::string>() + d.text;
      out += event("response.output_text.delta", at_part({{"delta", d.text}, {"logprobs", Json::array()}}));
    }
    for (const ToolCallPiece& piece : d.tool_call_pieces) {
      if (piece.failed) continue;  // ended above
      if (piece.begin) out += open_item(job, c, Kind::function_call, piece);
      if (piece.arguments.empty()) continue;
      Json& item = items_.back();
      item["arguments"] = item["arguments"].get<std::string>() + piece.arguments;
      out += event("response.function_call_arguments.delta", at_item({{"delta", piece.arguments}}));
    }
    return out;
  }

  std::string end(Job& job) override {
    if (const auto& f = job.failure()) {
      Json failed = response(job, "failed");
      failed["error"] = {{"code", f->status >= 500 ? "server_error" : "invalid_request"}, {"message", f->what()}};
      return event("response.failed", {{"response", failed}});
    }
    std::string out = close_item();
    const std::string status = finish_ == "length" ? "incomplete" : "completed";
    keep(job);
    return out + event(status == "completed" ? "response.completed" : "response.incomplete",
                       {{"response", response(job, status)}});
  }

  Json reply(Job& job, const std::vector<ChoiceResult>& results) override {
    const ChoiceResult& res = results.at(0);
    finish_ = res.finish_reason;
    if (!res.reasoning.empty()) {
      open_item(job, 0, Kind::reasoning, {});
      items_.back()["content"][0]["text"] = res.reasoning;
      if (r_.summary) items_.back()["summary"][0]["text"] = res.reasoning;
      close_item();
    }
    if (!res.text.empty() || (res.tool_calls.empty() && res.reasoning.empty())) {
      open_item(job, 0, Kind::message, {});
      items_.back()["content"][0]["text"] = res.text;
      close_item();
    }
    for (const tokenizer::ParsedToolCall& call : res.tool_calls) {
      open_item(job, 0, Kind::function_call, {call.index, true, call.name, {}});
      items_.back()["arguments"] = call.arguments;
      close_item();
    }
    keep(job);
    return response(job, finish_ == "length" ? "incomplete" : "completed");
  }

 private:
  enum class Kind : uint8_t { none, reasoning, message, function_call };

  std::string event(const std::string& type, Json data) {
    Json e = {{"type", type}, {"sequence_number", seq_++}};
    for (auto& [k, v] : data.items()) e[k] = v;
    return sse_event(type, e);
  }
  Json at_item(Json fields) const {
    Json j = {{"item_id", items_.back()["id"]}, {"output_index", items_.size() - 1}};
    for (auto& [k, v] : fields.items()) j[k] = v;
    return j;
  }
  Json at_part(Json fields) const {
    Json j = at_item(std::move(fields));
    j["content_index"] = 0;
    return j;
  }

  // Opens an output item (closing the one before) and returns its events.
  std::string open_item(Job& job, int c, Kind kind, const ToolCallPiece& piece) {
    std::string out = close_item();
    Json item;
    if (kind == Kind::reasoning) {
      item = {{"id", random_id("rs_")},
              {"type", "reasoning"},
              {"summary", Json::array()},
              {"content", Json::array({{{"type", "reasoning_text"}, {"text", ""}}})}};
      if (r_.summary) item["summary"].push_back({{"type", "summary_text"}, {"text", ""}});
    } else if (kind == Kind::message) {
      item = {{"id", random_id("msg_")},
              {"type", "message"},
              {"status", "in_progress"},
              {"role", "assistant"},
              {"content", Json::array({{{"type", "output_text"}, {"text", ""}, {"annotations", Json::array()}}})}};
    } else {
      item = {{"id", random_id("fc_")},  {"type", "function_call"},
              {"status", "in_progress"}, {"call_id", job.call_id(c, piece.index)},
              {"name", piece.name},      {"arguments", ""}};
      if (auto ns = r_.tool_namespace.find(piece.name); ns != r_.tool_namespace.end()) item["namespace"] = ns->second;
    }
    items_.push_back(item);
    open_ = kind;
    Json added = item;
    if (kind == Kind::message) added["content"] = Json::array();
    if (kind == Kind::reasoning) added["content"] = Json::array(), added["summary"] = Json::array();
    out += event("response.output_item.added", {{"output_index", items_.size() - 1}, {"item", added}});
    if (kind != Kind::function_call)  // the SDKs add deltas to a part they were told of
      out += event("response.content_part.added", at_part({{"part", item["content"][0]}}));
    if (kind == Kind::reasoning && r_.summary)
      out += event("response.reasoning_summary_part.added",
                   at_item({{"summary_index", 0}, {"part", item["summary"][0]}}));
    return out;
  }

  std::string close_item() {
    if (open_ == Kind::none) return {};
    Json& item = items_.back();
    std::string out;
    if (open_ == Kind::message) {
      item["status"] = "completed";
      out += event("response.output_text.done",
                   at_part({{"text", item["content"][0]["text"]}, {"logprobs", Json::array()}}));
      out += event("response.content_part.done", at_part({{"part", item["content"][0]}}));
    } else if (open_ == Kind::reasoning) {
      out += event("response.reasoning_text.done", at_part({{"text", item["content"][0]["text"]}}));
      out += event("response.content_part.done", at_part({{"part", item["content"][0]}}));
      if (r_.summary) {
        out += event("response.reasoning_summary_text.done",
                     at_item({{"summary_index", 0}, {"text", item["summary"][0]["text"]}}));
        out += event("response.reasoning_summary_part.done",
                     at_item({{"summary_index", 0}, {"part", item["summary"][0]}}));
      }
      if (r_.encrypted_reasoning)
        item["encrypted_content"] = seal_reasoning(item["content"][0]["text"].get<std::string>());
    } else {
      if (item["status"] != "incomplete") item["status"] = "completed";
      out += event("response.function_call_arguments.done",
                   at_item({{"name", item["name"]}, {"arguments", item["arguments"]}}));
    }
    out += event("response.output_item.done", {{"output_index", items_.size() - 1}, {"item", item}});
    open_ = Kind::none;
    return out;
  }

  Json response(Job& job, const std::string& status) const {
    Json j = {{"id", job.meta().id},
              {"object", "response"},
              {"created_at", job.meta().created},
              {"status", status},
              {"error", nullptr},
              {"incomplete_details", status == "incomplete" ? Json{{"reason", "max_output_tokens"}} : Json(nullptr)},
              {"model", job.meta().model},
              {"output", status == "in_progress" ? Json::array() : output()}};
    for (const auto& [k, v] : r_.echo.items()) j[k] = v;
    if (!r_.warnings.empty()) j["warnings"] = r_.warnings;
    if (status != "in_progress") {
      const Usage u = job.usage();
      j["usage"] = {{"input_tokens", u.prompt_tokens},
                    {"input_tokens_details", {{"cached_tokens", u.cached_tokens}}},
                    {"output_tokens", u.completion_tokens},
                    {"output_tokens_details", {{"reasoning_tokens", job.decoder(0).reasoning_tokens()}}},
                    {"total_tokens", u.prompt_tokens + u.completion_tokens}};
    } else {
      j["usage"] = nullptr;
    }
    return j;
  }

  // The output items, without calls that turned out malformed.
  Json output() const {
    Json out = Json::array();
    for (size_t i = 0; i < items_.size(); ++i)
      if (std::find(failed_.begin(), failed_.end(), i) == failed_.end()) out.push_back(items_[i]);
    return out;
  }

  // store: the conversation this response ends, for previous_response_id.
  void keep(Job& job) {
    if (!r_.store) return;
    Json conversation = r_.history;
    Json turn = {{"role", "assistant"}, {"content", ""}};
    for (const Json& item : output()) {
      if (item["type"] == "reasoning") turn["reasoning_content"] = item["content"][0]["text"];
      else if (item["type"] == "message")
        turn["content"] = turn["content"].get<std::string>() + item["content"][0]["text"].get<std::string>();
      else {
        if (!turn.contains("tool_calls")) turn["tool_calls"] = Json::array();
        turn["tool_calls"].push_back({{"id", item["call_id"]},
                                      {"type", "function"},
                                      {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}});
      }
    }
    conversation.push_back(std::move(turn));
    store_.put(job.meta().id, std::move(conversation));
  }

  ResponsesRequest r_;
  ResponseStore& store_;
  Json items_ = Json::array();
  std::vector<size_t> failed_;  // items_ indexes of malformed calls
  Kind open_ = Kind::none;
  int64_t seq_ = 0;
  std::string finish_;
};

}  // namespace

void ApiServer::Impl::handle_responses(const httplib::Request& req, httplib::Response& res) {
  ResponsesRequest r = parse_request("responses", req, [this](const Json& body, const ParseContext& ctx) {
    return parse_responses_request(body, ctx, responses);
  });
  for (const std::string& w : r.warnings) log::warn("responses: " + w);
  GenerationParams params = std::move(r.params);
  run_job(std::make_shared<Job>(*this, std::move(params), "resp_", "call_"),
          std::make_shared<ResponsesFormatter>(std::move(r), responses), req, res);
}

}  // namespace k3::server
