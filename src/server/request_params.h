// server/request_params.h: the bodies of POST /v1/completions and /v1/chat/completions,
// checked field by field and resolved into what the engine runs: prompts (token ids), n
// choices each, one engine::GenerateRequest per choice, plus what the server does around the
// engine (stop strings, streaming, logprobs shape, chat channels).
//
// Every OpenAI field the server honours is read and range-checked; vLLM's extra sampling fields
// (top_k, min_p, repetition_penalty, stop_token_ids, ignore_eos, skip_special_tokens) and K3's
// chat switches (chat_template_kwargs.thinking / thinking_effort) too. Anything else, and any
// value this server cannot honour (echo, best_of != n, suffix, a named tool_choice,
// parallel_tool_calls = false), is a 400 naming the field. "user" is accepted and unused, as
// OpenAI documents it (an end-user id for abuse monitoring).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/json_body.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/tokenizer.h"

namespace k3::server {

struct ParseContext {
  const tokenizer::Tokenizer* tokenizer = nullptr;
  std::string served_model;       // the one model id this server answers to
  int32_t vocab_size = 0;         // the model's
  int64_t max_model_len = 0;      // prompt + completion tokens of one request
  int max_n = 16;                 // choices per prompt
  int max_prompts = 64;           // prompts per completions request
  int max_stop = 16;              // stop strings per request
  int64_t default_completion_max_tokens = 16;  // OpenAI's documented default for /v1/completions
  int64_t default_chat_max_tokens = 0;         // 0: whatever the context has left (OpenAI, vLLM)
  uint64_t random_seed = 0;       // the base seed when the request names none
};

struct GenerationParams {
  bool chat = false;
  std::vector<std::vector<int32_t>> prompts;  // completions: one per prompt; chat: exactly one
  int n = 1;
  // The template every choice starts from: sampling (seed = the base seed), stop ids,
  // ignore_eos. max_tokens is resolved per prompt (max_tokens_for).
  engine::GenerateRequest base;
  int64_t max_tokens = 0;          // as requested; 0: the endpoint's default
  int64_t default_max_tokens = 0;  // 0: all the context has left after the prompt
  int64_t max_model_len = 0;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;   // stream_options.include_usage
  bool logprobs = false;        // return logprobs (completions: logprobs >= 0; chat: logprobs true)
  bool skip_special_tokens = true;
  // chat only
  tokenizer::Channel start_channel = tokenizer::Channel::response;
  bool has_tools = false;

  int num_choices() const { return static_cast<int>(prompts.size()) * n; }
  // Choice c = prompt (c / n), sample (c % n); seed = base seed + c.
  engine::GenerateRequest choice(int c) const;
};

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
