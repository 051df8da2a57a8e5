// server/responses_request.h: the body of POST /v1/responses (OpenAI's Responses API as Codex
// sends it), resolved onto the one chat request model (ChatPrompt + GenerationParams):
//   instructions                        -> a system message first (not carried over by
//                                          previous_response_id, as in OpenAI's API)
//   previous_response_id                -> the stored conversation it ended, then `input`
//   input (string | items):
//     message (user / assistant / system / developer; input_text / output_text parts)
//     reasoning (content reasoning_text, else summary_text, else our own encrypted_content)
//       -> the next assistant message's reasoning
//     function_call (call_id, name, arguments) -> that assistant message's tool_calls
//     function_call_output (call_id, output)   -> a tool message
//     input_image / input_file parts -> 400 (the model takes text only)
//   tools: function tools, and the function tools of a namespace; hosted tools the server
//     cannot run (web_search, file_search, ...) are left out and named in `warnings`
//   tool_choice (auto | required | none | {type: function, name}), parallel_tool_calls
//   reasoning.effort (none: thinking off; minimal/low/medium/high/xhigh -> K3's effort),
//   reasoning.summary; max_output_tokens, temperature, top_p; text.format -> response format;
//   store, include, prompt_cache_key, metadata, user, service_tier, truncation, stream
// Unknown fields go to ParseContext::ignored_fields; background, conversation and prompt
// (which would change what runs) are a 400 naming them.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "server/request_params.h"
#include "server/response_store.h"

namespace k3::server {

struct ResponsesRequest {
  GenerationParams params;
  ChatPrompt chat;
  Json history = Json::array();  // the conversation before this response (stored with its output)
  Json echo = Json::object();    // request fields a response object repeats (instructions, tools, ...)
  std::vector<std::string> warnings;
  std::map<std::string, std::string> tool_namespace;  // function name -> its namespace
  bool store = true;
  bool summary = false;              // reasoning.summary asked for
  bool encrypted_reasoning = false;  // include has reasoning.encrypted_content
};

// Throws ApiError naming the field; an unknown previous_response_id is a 404 naming it.
ResponsesRequest parse_responses_request(const Json& body, const ParseContext& ctx, ResponseStore& store);

// Reasoning handed to a client that asked for "encrypted" reasoning (store: false): opaque to
// it, readable here when it comes back in `input`.
std::string seal_reasoning(const std::string& text);

}  // namespace k3::server
