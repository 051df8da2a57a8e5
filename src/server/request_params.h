// server/request_params.h: the bodies of POST /v1/completions and /v1/chat/completions,
// checked field by field and resolved into what the engine runs: prompts (token ids), n
// choices each, one engine::GenerateRequest per choice, plus what the server does around the
// engine (stop strings, streaming, logprobs shape, chat channels).
//
// Every OpenAI field the server honours is read and range-checked; vLLM's extra sampling fields
// (top_k, min_p, repetition_penalty, stop_token_ids, ignore_eos, skip_special_tokens) and K3's
// chat switches (chat_template_kwargs.thinking / thinking_effort) too. A value this server
// cannot honour (echo, best_of != n, suffix) is a 400 naming the field. Fields with no effect on
// a self-hosted model (user, metadata, store, service_tier, prompt_cache_key,
// safety_identifier) are type-checked and unused; any other unknown field is collected into
// ParseContext::ignored_fields for the handler to log and count.
//
// Every chat-shaped API (chat completions, Anthropic messages, OpenAI responses) resolves its
// body to a ChatPrompt and calls set_chat_prompt: one renderer, one tool policy, one context
// check.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/choice_decoder.h"
#include "server/json_body.h"
#include "server/structured_outputs.h"
#include "structured/grammar_cache.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/tokenizer.h"

namespace k3::server {

struct ParseContext {
  const tokenizer::Tokenizer* tokenizer = nullptr;
  std::vector<std::string> served_models;              // the model ids this server answers to (first: the main one)
  int32_t vocab_size = 0;                              // the model's
  int64_t max_model_len = 0;                           // prompt + completion tokens of one request
  int max_n = 16;                                      // choices per prompt
  int max_prompts = 64;                                // prompts per completions request
  int max_stop = 16;                                   // stop strings per request
  int64_t default_completion_max_tokens = 16;          // OpenAI's documented default for /v1/completions
  int64_t default_chat_max_tokens = 0;                 // 0: whatever the context has left (OpenAI, vLLM)
  uint64_t random_seed = 0;                            // the base seed when the request names none
  std::vector<std::string>* ignored_fields = nullptr;  // unknown fields go here (null: they are a 400)
  structured::GrammarCache* grammars = nullptr;        // constrained outputs (null: refused with a 400)
};

// The served model `name` asks for (404 naming the served ones when it is not one of them).
std::string resolve_model(const std::string& name, const ParseContext& ctx);

struct GenerationParams {
  bool chat = false;
  std::string model;                          // the served name the request asked for (echoed in replies)
  std::vector<std::vector<int32_t>> prompts;  // completions: one per prompt; chat: exactly one
  int n = 1;
  // The template every choice starts from: sampling (seed = the base seed), stop ids,
  // ignore_eos. max_tokens is resolved per prompt (max_tokens_for).
  engine::GenerateRequest base;
  int64_t max_tokens = 0;                       // as requested; 0: the endpoint's default
  std::string max_tokens_field = "max_tokens";  // its name in the API (Responses: max_output_tokens)
  int64_t default_max_tokens = 0;               // 0: all the context has left after the prompt
  int64_t max_model_len = 0;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;       // return logprobs (completions: logprobs >= 0; chat: logprobs true)
  bool skip_special_tokens = true;
  // chat only
  tokenizer::Channel start_channel = tokenizer::Channel::response;
  bool has_tools = false;
  ToolPolicy tool_policy;

  int num_choices() const { return static_cast<int>(prompts.size()) * n; }
  // Choice c = prompt (c / n), sample (c % n); seed = base seed + c.
  engine::GenerateRequest choice(int c) const;
};

// A chat request as every front end resolves it.
struct ChatPrompt {
  Json messages = Json::array();  // OpenAI chat messages: system / developer / user / assistant / tool
  Json tools = nullptr;           // null or OpenAI function tools [{type: function, function: {...}}]
  tokenizer::ChatOptions options;
  ToolPolicy tool_policy;
  StructuredOutputs structured;  // vLLM's structured_outputs / guided_* (chat completions)
  bool tools_strict = false;     // a tool without "strict" is strict (the Responses API's default)
};

// tool_choice as the three APIs spell it, resolved: "auto" | "required" | "none" | a tool name
// (named), with parallel calls allowed or not. Checks that a named tool is declared and that
// "required" / a name come with tools; `field` names the request field in errors.
void apply_tool_choice(ChatPrompt& chat, const std::string& choice, const std::string& name, bool parallel,
                       const std::string& field);

// Renders and encodes the prompt (400 naming `messages_field` paths on a malformed conversation)
// and fills p.prompts, start_channel, has_tools, tool_policy and the context check.
void set_chat_prompt(GenerationParams& p, const ChatPrompt& chat, const ParseContext& ctx,
                     const std::string& messages_field);
// The prompt's token ids alone (count_tokens).
std::vector<int32_t> encode_chat_prompt(const ChatPrompt& chat, const ParseContext& ctx,
                                        const std::string& messages_field);

// Throw ApiError (400 naming the field; 404 for another model's name) on any problem.
GenerationParams parse_completion_request(const Json& body, const ParseContext& ctx);
GenerationParams parse_chat_request(const Json& body, const ParseContext& ctx);

// POST /tokenize and /detokenize bodies (vLLM's shapes).
struct TokenizeParams {
  std::vector<int32_t> tokens;
  bool return_token_strs = false;
};
TokenizeParams parse_tokenize_request(const Json& body, const ParseContext& ctx);
std::vector<int32_t> parse_detokenize_request(const Json& body, const ParseContext& ctx);

}  // namespace k3::server
