// tokenizer/chat_format.h: K3's chat format ("XTML": <|open|>tag attrs<|sep|> ... <|close|>tag
// <|sep|>, each turn ending in <|end_of_msg|>), rendered natively from OpenAI-style messages.
// It follows Moonshot's reference renderer encoding_k3.py and the published Kimi-K3 Jinja
// template; docs/validation/chat_template.md says where they came from, where the two differ,
// and which sample conversations the tests check.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace k3::tokenizer {

// One piece of the rendered prompt. Control segments are K3 markers and are encoded with
// special tokens allowed; text segments (message content, tag names, attributes) are encoded
// with specials denied, so a "<|open|>" typed by a user stays ordinary text. Segment
// boundaries are also BPE boundaries (each segment is encoded on its own).
struct ChatSegment {
  std::string text;
  bool control = false;
};

enum class Channel : uint8_t { think, response };

struct ChatOptions {
  bool add_generation_prompt = true;
  bool thinking = true;  // render think channels; the generation prompt opens <think>
  // "low" | "medium" | "high" | "max": adds the thinking-effort system message (thinking only).
  // nullopt: no such message (encoding_k3.py's default; the Jinja template defaults to "max").
  std::optional<std::string> thinking_effort;
  std::optional<std::string> tool_choice;  // "required" / "none" add a system message; others nothing
  std::string forced_tool;                 // a named tool_choice: a system message names the tool
  bool parallel_tool_calls = true;         // false: a system message asks for one call at most
  nlohmann::ordered_json response_format;  // null, or {"type": "text" | "json_object" | "json_schema", ...}
};

// `messages`: a JSON array of {"role": "system"|"developer"|"user"|"assistant"|"tool" (developer
// renders as system: OpenAI's newer name for it), "content": string |
// [{"type": "text", "text": ...}] | null, "name"?, "reasoning_content"?/"reasoning"?,
// "tool_calls"?: [{"id"?, "type"?, "function": {"name", "arguments": JSON-object string |
// object}}], "tool_call_id"?, "tools"? (system: tools added mid-conversation)}.
// `tools`: null or the OpenAI tools array. Throws core::Error naming the offending field
// (e.g. "messages[2].tool_calls[0].function.name must be a string").
std::vector<ChatSegment> render_chat_segments(const nlohmann::ordered_json& messages,
                                              const nlohmann::ordered_json& tools, const ChatOptions& options);
std::string render_chat(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                        const ChatOptions& options);
std::vector<int32_t> encode_chat(const Tokenizer& tokenizer, const nlohmann::ordered_json& messages,
                                 const nlohmann::ordered_json& tools, const ChatOptions& options);
std::vector<int32_t> encode_segments(const Tokenizer& tokenizer, const std::vector<ChatSegment>& segments);

// The channel the model's output starts in after the generation prompt.
inline Channel generation_channel(const ChatOptions& options) {
  return options.thinking ? Channel::think : Channel::response;
}

}  // namespace k3::tokenizer
