// server/anthropic_request.h: the body of POST /v1/messages (and /v1/messages/count_tokens),
// Anthropic's Messages API as Claude Code sends it, resolved onto the one chat request model
// (ChatPrompt + GenerationParams, request_params.h):
//   system (string | text blocks)          -> a system message first
//   messages[].content (string | blocks)   -> user / assistant / tool messages:
//     text -> content; thinking -> the assistant's reasoning (K3's think channel);
//     redacted_thinking -> nothing (its data is another model's, encrypted); tool_use ->
//     tool_calls; tool_result (string | text blocks, is_error) -> a tool message, and the
//     deferred tools its tool_reference blocks load -> a tool-declare system message after it;
//     image / document -> 400 (the model takes text only)
//   tools (input_schema)                   -> function tools; defer_loading tools wait for a
//     tool_reference; server tools (typed, e.g. web_search_20250305) are left out and logged
//   tool_choice auto / any / tool / none, disable_parallel_tool_use
//   thinking enabled (budget_tokens -> effort) / adaptive / disabled (the default, as in
//     Anthropic's API), display omitted; output_config.effort; output_config.format
//   context_management.edits clear_thinking_20251015 (keep all | thinking_turns N)
//   max_tokens (required), temperature, top_p, top_k, stop_sequences, metadata, stream
// Anything that would change the output and cannot be honoured (mcp_servers, other context
// edits) is a 400 naming it; other unknown fields go to ParseContext::ignored_fields.
#pragma once
#include <string>
#include <vector>

#include "server/request_params.h"

namespace k3::server {

struct MessagesRequest {
  GenerationParams params;
  ChatPrompt chat;
  bool show_thinking = true;               // thinking.display != "omitted"
  std::vector<std::string> skipped_tools;  // server tools left out of the prompt
};

// Throws ApiError naming the field. count_tokens: max_tokens is not required and nothing is
// submitted (params.prompts holds the rendered prompt).
MessagesRequest parse_messages_request(const Json& body, const ParseContext& ctx, bool count_tokens);

}  // namespace k3::server
