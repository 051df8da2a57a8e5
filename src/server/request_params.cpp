// server/request_params.cpp: field-by-field parsing of the generation, tokenize and detokenize
// bodies.
#include "server/request_params.h"

#include <cmath>
#include <initializer_list>
#include <limits>

#include "core/error.h"
#include "runner/sampler.h"
#include "server/output_grammar.h"

namespace k3::server {

namespace {

constexpr size_t kMaxStopBytes = 1024;
constexpr size_t kMaxStopTokenIds = 64;
constexpr size_t kMaxLogitBias = 1024;

// Fields both endpoints read (read_common), plus the endpoint's own.
std::vector<std::string_view> with_common_fields(std::initializer_list<std::string_view> own) {
  std::vector<std::string_view> known = {"model",
                                         "max_tokens",
                                         "temperature",
                                         "top_p",
                                         "n",
                                         "stream",
                                         "stream_options",
                                         "stop",
                                         "presence_penalty",
                                         "frequency_penalty",
                                         "logit_bias",
                                         "seed",
                                         "user",
                                         "top_k",
                                         "min_p",
                                         "repetition_penalty",
                                         "stop_token_ids",
                                         "ignore_eos",
                                         "skip_special_tokens",
                                         "metadata",
                                         "store",
                                         "service_tier",
                                         "prompt_cache_key",
                                         "safety_identifier"};
  known.insert(known.end(), std::begin(kStructuredOutputFields), std::end(kStructuredOutputFields));
  known.insert(known.end(), own.begin(), own.end());
  return known;
}

std::string check_model(const JsonFields& f, const ParseContext& ctx) {
  const auto model = f.string("model");
  return model ? resolve_model(*model, ctx) : ctx.served_models.front();
}

// Fields with no effect on a self-hosted model: type-checked, otherwise unused.
void check_no_effect_fields(const JsonFields& f) {
  f.string("user");  // OpenAI: an end-user id for abuse monitoring
  f.string("service_tier");
  f.string("prompt_cache_key");  // the prefix cache finds shared prefixes by itself
  f.string("safety_identifier");
  f.boolean("store");
  if (const Json* m = f.get("metadata"); m && !m->is_object())
    throw bad_request("'metadata' must be an object, got " + json_type_name(*m), "metadata", "invalid_type");
}

int32_t token_id(const Json& v, const std::string& field, const ParseContext& ctx) {
  if (!v.is_number_integer() && !v.is_number_unsigned())
    throw bad_request("'" + field + "' must be a token id (an integer), got " + json_excerpt(v), field, "invalid_type");
  const bool neg = v.is_number_integer() && v.get<int64_t>() < 0;
  const uint64_t u = neg ? 0 : v.get<uint64_t>();
  if (neg || u >= static_cast<uint64_t>(ctx.vocab_size))
    throw bad_request("'" + field + "' has token id " + json_excerpt(v) + " outside the vocabulary [0, " +
                          std::to_string(ctx.vocab_size) + ")",
                      field);
  return static_cast<int32_t>(u);
}

std::vector<int32_t> token_ids(const Json& arr, const std::string& field, const ParseContext& ctx) {
  std::vector<int32_t> ids;
  ids.reserve(arr.size());
  for (size_t i = 0; i < arr.size(); ++i) ids.push_back(token_id(arr[i], field, ctx));
  return ids;
}

uint64_t read_seed(const Json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) return static_cast<uint64_t>(v.get<int64_t>());  // negative: two's complement
  throw bad_request("'seed' must be an integer, got " + json_excerpt(v), "seed", "invalid_type");
}

std::vector<std::string> read_stop(const Json& v, const ParseContext& ctx) {
  std::vector<std::string> stop;
  auto add = [&](const Json& s, const std::string& field) {
    if (!s.is_string())
      throw bad_request("'" + field + "' must be a string, got " + json_excerpt(s), field, "invalid_type");
    std::string text = s.get<std::string>();
    if (text.empty()) throw bad_request("'" + field + "' is an empty stop string", field);
    if (text.size() > kMaxStopBytes)
      throw bad_request("'" + field + "' is longer than " + std::to_string(kMaxStopBytes) + " bytes", field);
    stop.push_back(std::move(text));
  };
  if (v.is_string()) {
    add(v, "stop");
  } else if (v.is_array()) {
    if (v.size() > static_cast<size_t>(ctx.max_stop))
      throw bad_request("'stop' has " + std::to_string(v.size()) + " strings; at most " + std::to_string(ctx.max_stop) +
                            " are allowed",
                        "stop");
    for (size_t i = 0; i < v.size(); ++i) add(v[i], "stop[" + std::to_string(i) + "]");
  } else {
    throw bad_request("'stop' must be a string or an array of strings, got " + json_type_name(v), "stop",
                      "invalid_type");
  }
  return stop;
}

std::vector<std::pair<int32_t, float>> read_logit_bias(const Json& v, const ParseContext& ctx) {
  if (!v.is_object())
    throw bad_request("'logit_bias' must be an object mapping token ids to biases, got " + json_type_name(v),
                      "logit_bias", "invalid_type");
  if (v.size() > kMaxLogitBias)
    throw bad_request("'logit_bias' has " + std::to_string(v.size()) + " entries; at most " +
                          std::to_string(kMaxLogitBias) + " are allowed",
                      "logit_bias");
  std::vector<std::pair<int32_t, float>> out;
  std::vector<bool> seen(static_cast<size_t>(ctx.vocab_size), false);
  for (const auto& [key, bias] : v.items()) {
    bool digits = !key.empty() && key.size() <= 10;
    for (char c : key) digits &= c >= '0' && c <= '9';
    const int64_t id = digits ? std::stoll(key) : -1;
    if (id < 0 || id >= ctx.vocab_size)
      throw bad_request("'logit_bias' key '" + key + "' is not a token id in [0, " + std::to_string(ctx.vocab_size) +
                            ")",
                        "logit_bias");
    if (!bias.is_number() || !std::isfinite(bias.get<double>()) ||
        std::fabs(bias.get<double>()) > static_cast<double>(runner::kMaxLogitBias))
      throw bad_request("'logit_bias' value for token " + key + " must be a number in [-100, 100], got " +
                            json_excerpt(bias),
                        "logit_bias");
    if (seen[static_cast<size_t>(id)])
      throw bad_request("'logit_bias' names token " + std::to_string(id) + " twice", "logit_bias");
    seen[static_cast<size_t>(id)] = true;
    const double b = bias.get<double>();
    out.emplace_back(static_cast<int32_t>(id), static_cast<float>(b));
  }
  return out;
}

void read_common(const JsonFields& f, const ParseContext& ctx, GenerationParams& p) {
  p.model = check_model(f, ctx);
  check_no_effect_fields(f);
  runner::SamplingParams& s = p.base.sampling;
  if (auto v = f.number("temperature", 0, 2)) s.temperature = static_cast<float>(*v);
  if (auto v = f.number("top_p", 0, 1, true)) s.top_p = static_cast<float>(*v);
  if (auto v = f.integer("top_k", -1, std::numeric_limits<int32_t>::max())) s.top_k = static_cast<int>(*v);
  if (auto v = f.number("min_p", 0, 1)) s.min_p = static_cast<float>(*v);
  if (auto v = f.number("repetition_penalty", 0, 100, true)) s.repetition_penalty = static_cast<float>(*v);
  if (auto v = f.number("presence_penalty", -runner::kMaxOpenAIPenalty, runner::kMaxOpenAIPenalty))
    s.presence_penalty = static_cast<float>(*v);
  if (auto v = f.number("frequency_penalty", -runner::kMaxOpenAIPenalty, runner::kMaxOpenAIPenalty))
    s.frequency_penalty = static_cast<float>(*v);
  if (const Json* v = f.get("logit_bias")) s.logit_bias = read_logit_bias(*v, ctx);
  s.seed = f.has("seed") ? read_seed(*f.get("seed")) : ctx.random_seed;
  if (auto v = f.integer("n", 1, ctx.max_n)) p.n = static_cast<int>(*v);
  if (auto v = f.integer("max_tokens", 1, ctx.max_model_len)) p.max_tokens = *v;
  if (const Json* v = f.get("stop")) p.stop = read_stop(*v, ctx);
  if (const Json* v = f.get("stop_token_ids")) {
    if (!v->is_array())
      throw bad_request("'stop_token_ids' must be an array of token ids, got " + json_type_name(*v), "stop_token_ids",
                        "invalid_type");
    if (v->size() > kMaxStopTokenIds)
      throw bad_request("'stop_token_ids' has more than " + std::to_string(kMaxStopTokenIds) + " ids",
                        "stop_token_ids");
    p.base.stop_token_ids = token_ids(*v, "stop_token_ids", ctx);
  }
  p.base.ignore_eos = f.boolean("ignore_eos").value_or(false);
  p.skip_special_tokens = f.boolean("skip_special_tokens").value_or(true);
  p.stream = f.boolean("stream").value_or(false);
  if (const Json* v = f.get("stream_options")) {
    if (!p.stream) throw bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options");
    const JsonFields so(*v, {"include_usage"}, "stream_options.");
    p.include_usage = so.boolean("include_usage").value_or(false);
  }
  p.max_model_len = ctx.max_model_len;
}

// The prompt must fit the context, and so must the completion when max_tokens is given.
void check_context(const GenerationParams& p, const char* prompt_field) {
  for (const auto& prompt : p.prompts) {
    const auto len = static_cast<int64_t>(prompt.size());
    if (len == 0) throw bad_request(std::string("'") + prompt_field + "' is empty (0 tokens)", prompt_field);
    if (len >= p.max_model_len)
      throw bad_request("This model's maximum context length is " + std::to_string(p.max_model_len) +
                            " tokens, but the " + prompt_field + " have " + std::to_string(len) +
                            " tokens (at least one token must be left for the completion)",
                        prompt_field, "context_length_exceeded");
    if (p.max_tokens > 0 && len + p.max_tokens > p.max_model_len)
      throw bad_request("This model's maximum context length is " + std::to_string(p.max_model_len) + " tokens, but " +
                            std::to_string(len + p.max_tokens) + " were requested (" + std::to_string(len) +
                            " in the " + prompt_field + ", " + std::to_string(p.max_tokens) +
                            " in the completion); reduce the " + prompt_field + " or '" + p.max_tokens_field + "'",
                        p.max_tokens_field, "context_length_exceeded");
  }
}

std::vector<int32_t> encode_text(const ParseContext& ctx, const std::string& text, const std::string& field) {
  try {
    // Special-token text in a raw prompt becomes the special token, as with Hugging Face
    // tokenizers under vLLM: /v1/completions is raw access to the model.
    return ctx.tokenizer->encode(text, tokenizer::Specials::allow);
  } catch (const core::Error& e) {
    throw bad_request("'" + field + "' cannot be tokenized: " + e.what(), field);
  }
}

std::vector<std::vector<int32_t>> read_prompts(const Json& v, const ParseContext& ctx) {
  std::vector<std::vector<int32_t>> prompts;
  if (v.is_string()) {
    prompts.push_back(encode_text(ctx, v.get<std::string>(), "prompt"));
    return prompts;
  }
  if (!v.is_array() || v.empty())
    throw bad_request(
        "'prompt' must be a string, an array of token ids, an array of strings or an array of token-id "
        "arrays, got " +
            (v.is_array() ? std::string("an empty array") : json_type_name(v)),
        "prompt", "invalid_type");
  if (v[0].is_number()) return {token_ids(v, "prompt", ctx)};
  if (v.size() > static_cast<size_t>(ctx.max_prompts))
    throw bad_request("'prompt' has " + std::to_string(v.size()) + " prompts; at most " +
                          std::to_string(ctx.max_prompts) + " are allowed",
                      "prompt");
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string field = "prompt[" + std::to_string(i) + "]";
    if (v[i].is_string()) prompts.push_back(encode_text(ctx, v[i].get<std::string>(), field));
    else if (v[i].is_array()) prompts.push_back(token_ids(v[i], field, ctx));
    else
      throw bad_request("'" + field + "' must be a string or an array of token ids, got " + json_type_name(v[i]), field,
                        "invalid_type");
  }
  return prompts;
}

void check_unsupported_completion_fields(const JsonFields& f, const GenerationParams& p) {
  if (f.boolean("echo").value_or(false))
    throw bad_request("'echo' = true is not supported by this server", "echo", "unsupported_value");
  if (auto best_of = f.integer("best_of", 1, 1 << 20); best_of && *best_of != p.n)
    throw bad_request("'best_of' must equal 'n' (" + std::to_string(p.n) +
                          "): choosing the best of several samples "
                          "is not supported",
                      "best_of", "unsupported_value");
  if (auto suffix = f.string("suffix"); suffix && !suffix->empty())
    throw bad_request("'suffix' (insertion) is not supported by this server", "suffix", "unsupported_value");
}

// Where a chat renderer error ("chat: messages[2].role must be ...") points.
std::string chat_error_param(const std::string& what) {
  std::string s = what.rfind("chat: ", 0) == 0 ? what.substr(6) : what;
  const size_t end = s.find_first_of(" ");
  s = s.substr(0, end);
  if (s.rfind("tools", 0) == 0) return s;
  if (s.rfind("messages", 0) == 0) return s;
  return "messages";
}

void read_tools(const Json& tools, std::vector<std::string>* ignored) {
  if (!tools.is_array())
    throw bad_request("'tools' must be an array, got " + json_type_name(tools), "tools", "invalid_type");
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string path = "tools[" + std::to_string(i) + "].";
    const JsonFields t(tools[i], {"type", "function"}, path, ignored);
    const auto type = t.string("type");
    if (type != "function")
      throw bad_request("'" + path + "type' must be \"function\"", path + "type", type ? "invalid_value" : "missing");
    const Json* fn = t.get("function");
    if (!fn) throw bad_request("'" + path + "function' is missing", path + "function", "missing");
    const JsonFields ff(*fn, {"name", "description", "parameters", "strict"}, path + "function.", ignored);
    const auto name = ff.string("name");
    if (!name || name->empty())
      throw bad_request("'" + path + "function.name' must be a non-empty string", path + "function.name", "missing");
    ff.string("description");
    ff.boolean("strict");
    if (const Json* params = ff.get("parameters"); params && !params->is_object())
      throw bad_request("'" + path + "function.parameters' must be a JSON Schema object", path + "function.parameters",
                        "invalid_type");
  }
}

}  // namespace

engine::GenerateRequest GenerationParams::choice(int c) const {
  engine::GenerateRequest r;
  r.sampling = base.sampling;
  r.sampling.seed = base.sampling.seed + static_cast<uint64_t>(c);
  r.sampling.logprobs = base.sampling.logprobs;
  r.stop_token_ids = base.stop_token_ids;
  r.ignore_eos = base.ignore_eos;
  r.grammar = base.grammar;
  r.prompt = prompts[static_cast<size_t>(c / n)];
  const int64_t left = max_model_len - static_cast<int64_t>(r.prompt.size());
  r.max_tokens = max_tokens > 0 ? max_tokens : default_max_tokens > 0 ? std::min(default_max_tokens, left) : left;
  return r;
}

GenerationParams parse_completion_request(const Json& body, const ParseContext& ctx) {
  const JsonFields f(body, with_common_fields({"prompt", "logprobs", "echo", "best_of", "suffix"}), {},
                     ctx.ignored_fields);
  GenerationParams p;
  read_common(f, ctx, p);
  check_unsupported_completion_fields(f, p);
  if (auto lp = f.integer("logprobs", 0, runner::kMaxLogprobs)) {
    p.logprobs = true;
    p.base.sampling.logprob = true;  // the sampled token's own logprob, even with 0 top entries
    p.base.sampling.logprobs = static_cast<int>(*lp);
  }
  const Json* prompt = f.get("prompt");
  if (!prompt) throw bad_request("'prompt' is required", "prompt", "missing");
  p.prompts = read_prompts(*prompt, ctx);
  const StructuredOutputs so = read_structured_outputs(f);
  if (const std::string g = completion_output_grammar(so); !g.empty())
    p.base.grammar = compile_output_grammar(g, ctx, so.field);
  if (static_cast<int64_t>(p.prompts.size()) * p.n > static_cast<int64_t>(ctx.max_prompts) * 4)
    throw bad_request("'prompt' x 'n' asks for " + std::to_string(p.prompts.size() * p.n) + " choices; at most " +
                          std::to_string(ctx.max_prompts * 4) + " are allowed",
                      "n");
  p.default_max_tokens = ctx.default_completion_max_tokens;
  check_context(p, "prompt");
  return p;
}

GenerationParams parse_chat_request(const Json& body, const ParseContext& ctx) {
  const JsonFields f(body,
                     with_common_fields({"messages", "max_completion_tokens", "logprobs", "top_logprobs", "tools",
                                         "tool_choice", "parallel_tool_calls", "response_format", "reasoning_effort",
                                         "chat_template_kwargs"}),
                     {}, ctx.ignored_fields);
  GenerationParams p;
  p.chat = true;
  read_common(f, ctx, p);
  if (auto mct = f.integer("max_completion_tokens", 1, ctx.max_model_len)) {
    if (p.max_tokens > 0 && p.max_tokens != *mct)
      throw bad_request("'max_tokens' and 'max_completion_tokens' disagree; give one of them", "max_completion_tokens");
    p.max_tokens = *mct;
  }
  p.logprobs = f.boolean("logprobs").value_or(false);
  p.base.sampling.logprob = p.logprobs;  // the sampled token's own logprob, with or without top_logprobs
  if (auto top = f.integer("top_logprobs", 0, runner::kMaxLogprobs)) {
    if (!p.logprobs) throw bad_request("'top_logprobs' requires 'logprobs' to be true", "top_logprobs");
    p.base.sampling.logprobs = static_cast<int>(*top);
  }

  tokenizer::ChatOptions options;
  if (const Json* kw = f.get("chat_template_kwargs")) {
    const JsonFields k(*kw, {"thinking", "thinking_effort"}, "chat_template_kwargs.");
    options.thinking = k.boolean("thinking").value_or(true);
    if (auto effort = k.string("thinking_effort")) options.thinking_effort = *effort;
  }
  if (auto effort = f.string("reasoning_effort")) {
    if (*effort != "low" && *effort != "medium" && *effort != "high")
      throw bad_request("'reasoning_effort' must be low, medium or high, got '" + *effort + "'", "reasoning_effort");
    if (options.thinking_effort && *options.thinking_effort != *effort)
      throw bad_request("'reasoning_effort' and 'chat_template_kwargs.thinking_effort' disagree", "reasoning_effort");
    options.thinking_effort = *effort;
  }
  if (options.thinking_effort && *options.thinking_effort != "low" && *options.thinking_effort != "medium" &&
      *options.thinking_effort != "high" && *options.thinking_effort != "max")
    throw bad_request("'chat_template_kwargs.thinking_effort' must be low, medium, high or max, got '" +
                          *options.thinking_effort + "'",
                      "chat_template_kwargs.thinking_effort");
  if (options.thinking_effort && !options.thinking)
    throw bad_request("a thinking effort was given with thinking switched off", "chat_template_kwargs.thinking_effort");

  Json tools = nullptr;
  if (const Json* t = f.get("tools")) {
    read_tools(*t, ctx.ignored_fields);
    tools = *t;
    p.has_tools = !t->empty();
  }
  std::string choice = "auto", forced;
  if (const Json* tc = f.get("tool_choice")) {
    if (tc->is_object()) {  // {"type": "function", "function": {"name": ...}}
      const JsonFields t(*tc, {"type", "function"}, "tool_choice.");
      if (t.string("type") != "function")
        throw bad_request("'tool_choice.type' must be \"function\"", "tool_choice.type");
      const Json* fn = t.get("function");
      if (!fn) throw bad_request("'tool_choice.function' is missing", "tool_choice.function", "missing");
      const JsonFields ff(*fn, {"name"}, "tool_choice.function.");
      const auto name = ff.string("name");
      if (!name || name->empty())
        throw bad_request("'tool_choice.function.name' must be a non-empty string", "tool_choice.function.name",
                          "missing");
      forced = *name;
    } else if (!tc->is_string()) {
      throw bad_request("'tool_choice' must be \"auto\", \"required\", \"none\" or a named function, got " +
                            json_type_name(*tc),
                        "tool_choice", "invalid_type");
    } else {
      choice = tc->get<std::string>();
      if (choice != "auto" && choice != "required" && choice != "none")
        throw bad_request("'tool_choice' must be \"auto\", \"required\", \"none\" or a named function, got '" + choice +
                              "'",
                          "tool_choice");
    }
  }
  const bool parallel = f.boolean("parallel_tool_calls").value_or(true);
  if (const Json* rf = f.get("response_format")) {
    const JsonFields r(*rf, {"type", "json_schema"}, "response_format.");
    const auto type = r.string("type");
    if (type != "text" && type != "json_object" && type != "json_schema")
      throw bad_request("'response_format.type' must be text, json_object or json_schema", "response_format.type");
    if (*type == "json_schema" && !r.get("json_schema"))
      throw bad_request("'response_format.json_schema' is required for type json_schema", "response_format.json_schema",
                        "missing");
    options.response_format = *rf;
  }

  const Json* messages = f.get("messages");
  if (!messages) throw bad_request("'messages' is required", "messages", "missing");
  if (!messages->is_array() || messages->empty())
    throw bad_request("'messages' must be a non-empty array of messages", "messages", "invalid_type");
  ChatPrompt chat;
  chat.messages = *messages;
  chat.tools = tools;
  chat.options = options;
  chat.structured = read_structured_outputs(f);
  apply_tool_choice(chat, forced.empty() ? choice : "named", forced, parallel, "tool_choice");
  p.default_max_tokens = ctx.default_chat_max_tokens;
  set_chat_prompt(p, chat, ctx, "messages");
  return p;
}

std::string resolve_model(const std::string& name, const ParseContext& ctx) {
  for (const std::string& m : ctx.served_models)
    if (m == name) return m;
  std::string list;
  for (const std::string& m : ctx.served_models) list += (list.empty() ? "'" : ", '") + m + "'";
  throw ApiError(404, "The model '" + name + "' does not exist; this server serves " + list, "model",
                 "model_not_found");
}

void apply_tool_choice(ChatPrompt& chat, const std::string& choice, const std::string& name, bool parallel,
                       const std::string& field) {
  const bool has_tools = chat.tools.is_array() && !chat.tools.empty();
  if ((choice == "required" || choice == "named") && !has_tools)
    throw bad_request("'" + field + "' asks for a tool call but no tools were given", field);
  if (choice == "named") {
    bool declared = false;
    for (const Json& t : chat.tools)
      declared |= t.contains("function") && t["function"].is_object() && t["function"].value("name", "") == name;
    if (!declared) throw bad_request("'" + field + "' names the tool '" + name + "', which is not in 'tools'", field);
    chat.options.forced_tool = name;
    chat.tool_policy.only_name = name;
  }
  if (choice == "required" || choice == "none") chat.options.tool_choice = choice;
  chat.tool_policy.allowed = choice != "none";
  chat.options.parallel_tool_calls = parallel || choice == "none";  // "none" already says no call at all
  chat.tool_policy.single = !parallel;
}

std::vector<int32_t> encode_chat_prompt(const ChatPrompt& chat, const ParseContext& ctx,
                                        const std::string& messages_field) {
  try {
    return tokenizer::encode_chat(*ctx.tokenizer, chat.messages, chat.tools, chat.options);
  } catch (const core::Error& e) {
    const std::string what = e.what();
    std::string message = what.rfind("chat: ", 0) == 0 ? what.substr(6) : what;
    std::string param = chat_error_param(what);
    if (messages_field != "messages" && param.rfind("messages", 0) == 0) {
      param = messages_field + param.substr(8);
      if (message.rfind("messages", 0) == 0) message = messages_field + message.substr(8);
    }
    throw bad_request(message, param);
  }
}

void set_chat_prompt(GenerationParams& p, const ChatPrompt& chat, const ParseContext& ctx,
                     const std::string& messages_field) {
  p.chat = true;
  p.prompts.assign(1, encode_chat_prompt(chat, ctx, messages_field));
  p.start_channel = tokenizer::generation_channel(chat.options);
  if (const std::string g = chat_output_grammar(chat, p.start_channel); !g.empty())
    p.base.grammar = compile_output_grammar(g, ctx, chat.structured.any() ? chat.structured.field : "tools");
  p.has_tools = chat.tools.is_array() && !chat.tools.empty();
  p.tool_policy = chat.tool_policy;
  check_context(p, messages_field.c_str());
}

TokenizeParams parse_tokenize_request(const Json& body, const ParseContext& ctx) {
  const JsonFields f(body, {"model", "prompt", "messages", "tools", "add_special_tokens", "add_generation_prompt",
                            "return_token_strs", "chat_template_kwargs"});
  check_model(f, ctx);
  TokenizeParams t;
  t.return_token_strs = f.boolean("return_token_strs").value_or(false);
  const bool has_prompt = f.has("prompt"), has_messages = f.has("messages");
  if (has_prompt == has_messages)
    throw bad_request("give exactly one of 'prompt' and 'messages'", has_prompt ? "messages" : "prompt");
  if (has_prompt) {
    if (f.has("tools") || f.has("add_generation_prompt") || f.has("chat_template_kwargs"))
      throw bad_request("'tools', 'add_generation_prompt' and 'chat_template_kwargs' apply to 'messages' only",
                        "prompt");
    // K3's tokenizer adds no BOS/EOS of its own, so add_special_tokens changes nothing; it is
    // type-checked and accepted for vLLM clients.
    f.boolean("add_special_tokens");
    const auto prompt = f.string("prompt");
    t.tokens = encode_text(ctx, *prompt, "prompt");
    return t;
  }
  if (f.has("add_special_tokens"))
    throw bad_request("'add_special_tokens' applies to 'prompt' only", "add_special_tokens");
  tokenizer::ChatOptions options;
  options.add_generation_prompt = f.boolean("add_generation_prompt").value_or(true);
  if (const Json* kw = f.get("chat_template_kwargs")) {
    const JsonFields k(*kw, {"thinking", "thinking_effort"}, "chat_template_kwargs.");
    options.thinking = k.boolean("thinking").value_or(true);
    if (auto effort = k.string("thinking_effort")) options.thinking_effort = *effort;
  }
  Json tools = nullptr;
  if (const Json* tl = f.get("tools")) {
    read_tools(*tl, nullptr);
    tools = *tl;
  }
  const Json& messages = *f.get("messages");
  if (!messages.is_array() || messages.empty())
    throw bad_request("'messages' must be a non-empty array of messages", "messages", "invalid_type");
  try {
    t.tokens = tokenizer::encode_chat(*ctx.tokenizer, messages, tools, options);
  } catch (const core::Error& e) {
    const std::string what = e.what();
    throw bad_request(what.rfind("chat: ", 0) == 0 ? what.substr(6) : what, chat_error_param(what));
  }
  return t;
}

std::vector<int32_t> parse_detokenize_request(const Json& body, const ParseContext& ctx) {
  const JsonFields f(body, {"model", "tokens"});
  check_model(f, ctx);
  const Json* tokens = f.get("tokens");
  if (!tokens) throw bad_request("'tokens' is required", "tokens", "missing");
  if (!tokens->is_array()) throw bad_request("'tokens' must be an array of token ids", "tokens", "invalid_type");
  ParseContext tok_ctx = ctx;
  tok_ctx.vocab_size = ctx.tokenizer->vocab_size();  // ids the tokenizer can spell
  return token_ids(*tokens, "tokens", tok_ctx);
}

}  // namespace k3::server
