// server/openai_format.h: OpenAI's response shapes, built from ChoiceDeltas.
//   /v1/completions        object "text_completion" (streamed chunks have the same object)
//   /v1/chat/completions   object "chat.completion" / "chat.completion.chunk"
// usage = {prompt_tokens, completion_tokens, total_tokens, prompt_tokens_details: {cached_tokens}}.
// Logprobs: completions use the legacy {tokens, token_logprobs, top_logprobs (token -> logprob
// maps), text_offset}; chat uses {content: [{token, logprob, bytes, top_logprobs: [...]}]}.
// A logprob of -inf (a token a bias or penalty ruled out) is sent as -9999.0, as vLLM does,
// since JSON has no infinity.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "server/choice_decoder.h"
#include "server/json_body.h"
#include "tokenizer/tokenizer.h"

namespace k3::server {

struct ResponseMeta {
  std::string id;  // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;
  std::string model;
};

struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};

// Everything one choice produced, for a non-streaming reply.
struct ChoiceResult {
  std::string text, reasoning;
  std::vector<tokenizer::ParsedToolCall> tool_calls;
  std::vector<std::string> tool_call_ids;
  std::vector<TokenLogprob> logprobs;
  std::string finish_reason;
  void add(const ChoiceDelta& d, std::vector<std::string> ids);
};

std::string random_id(const std::string& prefix);  // prefix + 24 random hex digits
int64_t unix_now();

Json usage_json(const Usage& u);
Json tool_call_json(const tokenizer::ParsedToolCall& call, const std::string& id, bool with_index);

// Legacy completion logprobs of `entries`; `text_offset` is the running character offset of
// the choice's text and advances by each token's text length.
Json completion_logprobs(const tokenizer::Tokenizer& tok, const std::vector<TokenLogprob>& entries,
                         int64_t& text_offset);
// Chat logprobs content entries.
Json chat_logprobs_content(const tokenizer::Tokenizer& tok, const std::vector<TokenLogprob>& entries);

Json completion_chunk(const ResponseMeta& m, int index, const std::string& text, const Json& logprobs,
                      const std::string& finish_reason);
Json chat_chunk(const ResponseMeta& m, int index, const Json& delta, const Json& logprobs,
                const std::string& finish_reason);
Json usage_chunk(const ResponseMeta& m, bool chat, const Usage& u);

Json completion_response(const tokenizer::Tokenizer& tok, const ResponseMeta& m,
                         const std::vector<ChoiceResult>& choices, bool logprobs, const Usage& u);
Json chat_response(const tokenizer::Tokenizer& tok, const ResponseMeta& m, const std::vector<ChoiceResult>& choices,
                   bool logprobs, const Usage& u);

// The finish_reason OpenAI clients know for ours ("abort" and "error" never reach a reply as
// such: aborts come from clients that left or from a draining server, errors become error
// events).
Json finish_reason_json(const std::string& reason);

}  // namespace k3::server
