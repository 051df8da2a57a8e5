// server/generate_handler.cpp: POST /v1/completions and /v1/chat/completions: OpenAI's
// shapes for a Job (server/job.h), streamed as "data: {chunk}" lines ending in "data: [DONE]",
// or one JSON body.
#include <algorithm>

#include "server/job.h"

namespace k3::server {

namespace {

std::string sse(const Json& j) { return sse_event("", j); }
constexpr std::string_view kSseDone = "data: [DONE]\n\n";

class OpenAIFormatter final : public Formatter {
 public:
  explicit OpenAIFormatter(const tokenizer::Tokenizer& tok) : tok_(tok) {}

  std::string begin(Job& job) override {
    std::string out;
    if (job.params().chat)  // OpenAI opens each choice with the role
      for (int c = 0; c < job.params().num_choices(); ++c)
        out += sse(chat_chunk(job.meta(), c, Json{{"role", "assistant"}, {"content", ""}}, nullptr, ""));
    return out;
  }

  std::string delta(Job& job, int c, const ChoiceDelta& d) override {
    const GenerationParams& p = job.params();
    if (!p.chat) {
      const Json lp = p.logprobs ? completion_logprobs(tok_, d.logprobs, job.text_offset(c)) : Json(nullptr);
      return sse(completion_chunk(job.meta(), c, d.text, lp, d.finish_reason));
    }
    Json delta = Json::object();
    if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
    if (!d.text.empty()) delta["content"] = d.text;
    if (std::any_of(d.tool_call_pieces.begin(), d.tool_call_pieces.end(),
                    [](const ToolCallPiece& p) { return !p.failed; })) {
      // OpenAI's streamed tool calls: the first piece of a call has its id, type and name,
      // later pieces only the next fragment of function.arguments.
      Json calls = Json::array();
      for (const ToolCallPiece& piece : d.tool_call_pieces) {
        if (piece.failed) continue;  // chat has no way to take a call back: its text follows as content
        Json call = {{"index", piece.index}};
        if (piece.begin) {
          call["id"] = job.call_id(c, piece.index);
          call["type"] = "function";
          call["function"] = {{"name", piece.name}, {"arguments", piece.arguments}};
        } else {
          call["function"] = {{"arguments", piece.arguments}};
        }
        calls.push_back(std::move(call));
      }
      delta["tool_calls"] = calls;
    }
    const Json lp = p.logprobs && !d.logprobs.empty() ? Json{{"content", chat_logprobs_content(tok_, d.logprobs)}}
                                                      : Json(nullptr);
    if (delta.empty() && lp.is_null() && d.finish_reason.empty()) return {};  // a complete call, already streamed
    return sse(chat_chunk(job.meta(), c, delta, lp, d.finish_reason));
  }

  std::string end(Job& job) override {
    std::string out;
    if (const auto& f = job.failure()) out += sse(error_body(*f));
    else if (job.params().include_usage) out += sse(usage_chunk(job.meta(), job.params().chat, job.usage()));
    return out + std::string(kSseDone);
  }

  Json reply(Job& job, const std::vector<ChoiceResult>& results) override {
    const Usage u = job.usage();
    return job.params().chat ? chat_response(tok_, job.meta(), results, job.params().logprobs, u)
                             : completion_response(tok_, job.meta(), results, job.params().logprobs, u);
  }

 private:
  const tokenizer::Tokenizer& tok_;
};

}  // namespace

void ApiServer::Impl::handle_generate(const httplib::Request& req, httplib::Response& res, bool chat) {
  const char* api = chat ? "chat_completions" : "completions";
  GenerationParams params = parse_request(api, req, [chat](const Json& body, const ParseContext& ctx) {
    return chat ? parse_chat_request(body, ctx) : parse_completion_request(body, ctx);
  });
  run_job(std::make_shared<Job>(*this, std::move(params), chat ? "chatcmpl-" : "cmpl-", "call_"),
          std::make_shared<OpenAIFormatter>(tokenizer), req, res);
}

}  // namespace k3::server
