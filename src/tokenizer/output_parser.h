// tokenizer/output_parser.h: parses what a K3 model generates after the chat generation prompt
// (reasoning in <think>, the answer in <response>, tool calls in <tools>) into reasoning text,
// content text and tool calls {name, arguments JSON}, all at once or incrementally as text
// streams in. The input is decoded text with the special tokens' text kept (do not decode
// with skip_special). Output grammar after the prompt (which opened the first channel):
//   [think text <|close|>think<|sep|>] [<|open|>response<|sep|>] response text <|close|>response<|sep|>
//   [<|open|>tools<|sep|> call* <|close|>tools<|sep|>] <|close|>message<|sep|> <|end_of_msg|>
//   call     := <|open|>call tool="NAME" index="N"<|sep|> (argument* | json) <|close|>call<|sep|>
//   argument := <|open|>argument key="K" type="string|number|boolean|null|object|array"<|sep|>
//               VALUE <|close|>argument<|sep|>
//   json     := <|open|>json type="object"<|sep|>{...}<|close|>json<|sep|>
#pragma once
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/chat_format.h"

namespace k3::tokenizer {

struct ParsedToolCall {
  int index = 0;          // 0-based order of the call in this output (OpenAI tool_calls index)
  std::string name;       // the call's tool="..." attribute, entities (&amp; &quot;) decoded
  std::string arguments;  // a JSON object, validated; string values JSON-escaped, other values
                          // kept as the model wrote them (after checking them against their type)
};

struct OutputEvent {
  enum class Kind : uint8_t {
    reasoning,            // text: a piece of the think channel
    content,              // text: a piece of the response channel
    tool_call_begin,      // call.index and call.name known (arguments still streaming)
    tool_call_arguments,  // text: the next piece of call.index's arguments JSON, as generated:
                          // the pieces of a call that completes concatenate to its arguments
    tool_call,            // a complete, valid call
    error,                // text: what was malformed; a call that fails is reported here instead
                          // of as tool_call (call.index says which)
  };
  Kind kind;
  std::string text;
  ParsedToolCall call;
  std::string raw;  // tool_call, and error for a call: the call's text as generated, markers included
};

class OutputParser {
 public:
  explicit OutputParser(Channel start = Channel::think);
  // Appends the events `text` completes. Text that might be the start of a marker split
  // across chunks is held until the next feed() or finish().
  void feed(std::string_view text, std::vector<OutputEvent>& events);
  // End of generation: flushes held text; a tool call still open is reported as an error.
  void finish(std::vector<OutputEvent>& events);
  // The message was closed (<|close|>message<|sep|> or <|end_of_msg|> seen).
  bool done() const { return state_ == State::done || state_ == State::after_message; }

 private:
  enum class State : uint8_t { think, response, between, tools, call, argument, json, after_message, done };
  bool step(std::vector<OutputEvent>& events, bool final);  // false: needs more input
  bool take_marker(std::string& tag, std::string& attrs, bool& is_open, bool final);
  void end_call(std::vector<OutputEvent>& events);
  void fail_call(const std::string& why);
  // Streams a piece of the open call's arguments (nothing once the call has failed).
  void emit_arguments(std::string piece, std::vector<OutputEvent>& events);
  // Streams the open string value's new bytes: up to its last whole UTF-8 character, or all
  // of them when `final` (the argument closed).
  void stream_string_value(std::vector<OutputEvent>& events, bool final);
  bool in_call() const { return state_ == State::call || state_ == State::argument || state_ == State::json; }

  State state_;
  std::string buf_;
  int next_index_ = 0;
  bool call_failed_ = false;
  ParsedToolCall call_;
  std::vector<std::pair<std::string, std::string>> args_;  // (key, JSON value) of the open call
  std::string arg_key_, arg_type_, value_;
  std::string call_raw_;         // the open call's text so far
  size_t value_streamed_ = 0;    // bytes of value_ already streamed (string values)
  bool arguments_open_ = false;  // "{" of the open call's arguments has been streamed
  bool has_json_block_ = false;
  std::string error_;
};

struct ParsedOutput {
  std::string reasoning, content;
  std::vector<ParsedToolCall> tool_calls;
  std::vector<std::string> errors;
  bool complete = false;  // the message was closed
};

ParsedOutput parse_output(std::string_view text, Channel start = Channel::think);

}  // namespace k3::tokenizer
