// server/choice_decoder.h: one choice's engine events -> what the client sees. Token ids go
// through the incremental detokenizer (whole UTF-8 characters only), then, for chat, through
// K3's output parser (reasoning / content / tool calls), then the content through the stop
// strings. Completions see the detokenized text directly through the stop strings.
//
// Stop strings apply to the visible answer: the completion text, or the chat content channel
// (not to reasoning, not to tool-call arguments). The token that ends a request as eos or as
// one of stop_token_ids is counted and has logprobs, but its text is not part of the output.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/token_stream.h"
#include "server/stop_matcher.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/output_parser.h"

namespace k3::server {

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // most likely first
};

struct ChoiceDelta {
  std::string text;       // completions: text; chat: content
  std::string reasoning;  // chat: the think channel
  std::vector<tokenizer::ParsedToolCall> tool_calls;  // complete calls, arguments valid JSON
  std::vector<TokenLogprob> logprobs;                 // the tokens this delta consumed (when asked)
  std::string finish_reason;  // set on the choice's last delta: stop, length, tool_calls, abort, error
  std::string error;          // finish_reason == "error": what failed

  bool empty() const {
    return text.empty() && reasoning.empty() && tool_calls.empty() && logprobs.empty() && finish_reason.empty();
  }
};

struct DecoderOptions {
  bool chat = false;
  tokenizer::Channel start = tokenizer::Channel::response;  // chat: where the output begins
  std::vector<std::string> stop;
  bool skip_special_tokens = true;
  bool logprobs = false;
};

class ChoiceDecoder {
 public:
  ChoiceDecoder(const tokenizer::Tokenizer& tokenizer, DecoderOptions options);

  // Folds one engine event in and returns what it adds. When a stop string completes, the
  // delta finishes the choice (finish_reason "stop") and stopped_by_string() turns true: the
  // caller aborts the engine request. Events after the finish are ignored.
  ChoiceDelta push(const engine::TokenEvent& e);

  bool finished() const { return finished_; }
  bool stopped_by_string() const { return stopped_by_string_; }
  int64_t tokens() const { return tokens_; }  // output tokens consumed (usage.completion_tokens)
  // Chat: what the output parser found malformed (dropped tool calls, stray markers).
  const std::vector<std::string>& parse_errors() const { return parse_errors_; }

 private:
  void feed_token(int32_t id, ChoiceDelta& d);
  void feed_parser(std::string_view text, ChoiceDelta& d, bool final);
  void feed_visible(std::string_view text, ChoiceDelta& d);
  void finish(const engine::TokenEvent& e, ChoiceDelta& d);

  const tokenizer::Tokenizer& tokenizer_;
  DecoderOptions options_;
  tokenizer::IncrementalDetokenizer detok_;
  tokenizer::OutputParser parser_;
  StopMatcher stop_;
  std::vector<tokenizer::OutputEvent> events_;
  std::vector<std::string> parse_errors_;
  int64_t tokens_ = 0;
  bool finished_ = false, stopped_by_string_ = false, had_tool_calls_ = false;
};

}  // namespace k3::server
