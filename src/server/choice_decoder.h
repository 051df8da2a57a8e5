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

// A tool call as it is generated: the first piece of a call has begin = true and its name;
// every piece may carry the next fragment of its arguments JSON. The fragments of a call that
// completes concatenate to its arguments exactly. A call begins with its first checked
// fragment (not at its header), so a call whose first argument is malformed never shows; one
// that fails later ends with a piece with failed = true (its raw text then follows as content),
// for the front ends to take back what their protocol allows.
struct ToolCallPiece {
  int index = 0;  // the call's position in this output (chat tool_calls index)
  bool begin = false;
  std::string name;       // begin only
  std::string arguments;  // the next fragment
  bool failed = false;    // the call turned out malformed: no more pieces come for it
};

struct ChoiceDelta {
  std::string text;                                   // completions: text; chat: content
  std::string reasoning;                              // chat: the think channel
  std::vector<ToolCallPiece> tool_call_pieces;        // calls as they are generated
  std::vector<tokenizer::ParsedToolCall> tool_calls;  // complete calls, arguments valid JSON
  std::vector<TokenLogprob> logprobs;                 // the tokens this delta consumed (when asked)
  std::string finish_reason;  // set on the choice's last delta: stop, length, tool_calls, abort, error
  std::string error;          // finish_reason == "error": what failed

  bool empty() const {
    return text.empty() && reasoning.empty() && tool_call_pieces.empty() && tool_calls.empty() && logprobs.empty() &&
           finish_reason.empty();
  }
};

// What the request allows of tool calls (tool_choice, parallel_tool_calls). A call the policy
// does not allow is not returned as a call: its text reaches the client as content, and it is
// counted as a parse error, never dropped silently.
struct ToolPolicy {
  bool allowed = true;    // tool_choice none: false
  std::string only_name;  // a named tool_choice: calls to other tools are refused
  bool single = false;    // parallel_tool_calls false: the first call ends the output
};

struct DecoderOptions {
  bool chat = false;
  tokenizer::Channel start = tokenizer::Channel::response;  // chat: where the output begins
  std::vector<std::string> stop;
  bool skip_special_tokens = true;
  bool logprobs = false;
  ToolPolicy tools;
};

class ChoiceDecoder {
 public:
  ChoiceDecoder(const tokenizer::Tokenizer& tokenizer, DecoderOptions options);

  // Folds one engine event in and returns what it adds. When a stop string completes (or the
  // one call parallel_tool_calls=false allows does), the delta finishes the choice
  // (finish_reason "stop" / "tool_calls") and stopped_early() turns true: the caller aborts
  // the engine request. Events after the finish are ignored.
  ChoiceDelta push(const engine::TokenEvent& e);

  bool finished() const { return finished_; }
  bool stopped_early() const { return stopped_early_; }
  const std::string& matched_stop() const { return stop_.matched(); }  // the stop string that ended it
  int64_t tokens() const { return tokens_; }  // output tokens consumed (usage.completion_tokens)
  // Chat: output tokens whose text went to the think channel alone (reasoning token usage).
  int64_t reasoning_tokens() const { return reasoning_tokens_; }
  // Chat: what the output parser found malformed (dropped tool calls, stray markers).
  const std::vector<std::string>& parse_errors() const { return parse_errors_; }

 private:
  bool call_allowed(const tokenizer::ParsedToolCall& call) const;
  void refuse_call(const tokenizer::OutputEvent& ev, const std::string& why, ChoiceDelta& d);
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
  int64_t tokens_ = 0, reasoning_tokens_ = 0;
  bool finished_ = false, stopped_early_ = false, had_tool_calls_ = false;
  // Per call index, as its pieces go out.
  enum class CallState : uint8_t { pending, refused, streaming };
  std::vector<CallState> calls_;
  std::vector<std::string> call_names_;  // pending: the name its begin will carry
};

}  // namespace k3::server
