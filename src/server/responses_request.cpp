// server/responses_request.cpp: OpenAI Responses bodies -> ChatPrompt + GenerationParams.
#include "server/responses_request.h"

#include "tokenizer/base64.h"

namespace k3::server {

namespace {

constexpr std::string_view kSealPrefix = "k3serve-reasoning:";

std::string at(const std::string& path, size_t i) { return path + "[" + std::to_string(i) + "]"; }

std::string required_string(const Json& obj, const char* key, const std::string& path) {
  if (!obj.contains(key) || !obj[key].is_string())
    throw bad_request("'" + path + "." + key + "' must be a string", path + "." + key, "missing");
  return obj[key].get<std::string>();
}

// Text of a message's content: a string or parts (input_text / output_text / text / refusal).
std::string content_text(const Json& content, const std::string& path) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    throw bad_request("'" + path + "' must be a string or an array of parts", path, "invalid_type");
  std::string out;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string p = at(path, i);
    if (!content[i].is_object()) throw bad_request("'" + p + "' must be an object", p, "invalid_type");
    const std::string type = string_or(content[i], "type", "", p);
    if (type == "input_text" || type == "output_text" || type == "text") {
      out += required_string(content[i], "text", p);
    } else if (type == "refusal") {
      out += required_string(content[i], "refusal", p);
    } else if (type == "input_image" || type == "input_file" || type == "input_audio") {
      throw bad_request("'" + p + "' is an " + type + " part: this model takes text only", p, "unsupported_content");
    } else {
      throw bad_request("'" + p + ".type' must be input_text or output_text, got '" + type + "'", p + ".type");
    }
  }
  return out;
}

std::string reasoning_text(const Json& item, const std::string& path) {
  std::string out;
  for (const char* key : {"content", "summary"}) {
    if (!item.contains(key) || !item[key].is_array()) continue;
    for (const Json& part : item[key])
      if (part.is_object() && part.contains("text") && part["text"].is_string()) out += part["text"].get<std::string>();
    if (!out.empty()) return out;
  }
  if (item.contains("encrypted_content") && item["encrypted_content"].is_string()) {
    const std::string sealed = item["encrypted_content"].get<std::string>();
    if (sealed.rfind(kSealPrefix, 0) == 0)
      if (auto text = tokenizer::base64_decode(std::string_view(sealed).substr(kSealPrefix.size()))) return *text;
  }
  (void)path;
  return out;  // another server's encrypted reasoning: nothing here can read it
}

// Input items -> chat messages. A reasoning item and the function calls that follow an
// assistant message belong to one assistant turn (K3 renders them in one message).
void add_items(const Json& input, Json& messages) {
  Json turn;  // the assistant turn being assembled (null: none)
  auto flush = [&] {
    if (!turn.is_null()) messages.push_back(std::move(turn));
    turn = nullptr;
  };
  auto assistant = [&]() -> Json& {
    if (turn.is_null()) turn = {{"role", "assistant"}, {"content", ""}};
    return turn;
  };
  for (size_t i = 0; i < input.size(); ++i) {
    const std::string p = at("input", i);
    const Json& item = input[i];
    if (!item.is_object()) throw bad_request("'" + p + "' must be an object", p, "invalid_type");
    const std::string type = string_or(item, "type", item.contains("role") ? "message" : "", p);
    if (type == "message") {
      const std::string role = required_string(item, "role", p);
      if (!item.contains("content")) throw bad_request("'" + p + ".content' is required", p + ".content", "missing");
      const std::string text = content_text(item["content"], p + ".content");
      if (role == "assistant") {
        Json& t = assistant();
        if (!t["content"].get<std::string>().empty() || t.contains("tool_calls")) {
          flush();
          assistant();
        }
        turn["content"] = text;
      } else if (role == "user" || role == "system" || role == "developer") {
        flush();
        messages.push_back({{"role", role}, {"content", text}});
      } else {
        throw bad_request("'" + p + ".role' must be user, assistant, system or developer", p + ".role");
      }
    } else if (type == "reasoning") {
      if (!turn.is_null() && (turn.contains("tool_calls") || !turn["content"].get<std::string>().empty())) flush();
      Json& t = assistant();
      t["reasoning_content"] = t.value("reasoning_content", "") + reasoning_text(item, p);
    } else if (type == "function_call") {
      Json& t = assistant();
      const std::string args = required_string(item, "arguments", p);
      if (!t.contains("tool_calls")) t["tool_calls"] = Json::array();
      t["tool_calls"].push_back({{"id", required_string(item, "call_id", p)},
                                 {"type", "function"},
                                 {"function", {{"name", required_string(item, "name", p)}, {"arguments", args}}}});
    } else if (type == "function_call_output") {
      flush();
      const std::string call_id = required_string(item, "call_id", p);
      if (!item.contains("output")) throw bad_request("'" + p + ".output' is required", p + ".output", "missing");
      messages.push_back(
          {{"role", "tool"}, {"tool_call_id", call_id}, {"content", content_text(item["output"], p + ".output")}});
    } else {
      throw bad_request("'" + p + ".type' '" + type +
                            "' is not supported: give message, reasoning, function_call or "
                            "function_call_output items",
                        p + ".type", "unsupported_value");
    }
  }
  flush();
}

Json function_tool(const Json& t, const std::string& path, std::vector<std::string>* ignored) {
  const JsonFields f(t, {"type", "name", "description", "parameters", "strict"}, path + ".", ignored);
  const auto name = f.string("name");
  if (!name || name->empty())
    throw bad_request("'" + path + ".name' must be a non-empty string", path + ".name", "missing");
  Json fn = {{"name", *name}};
  if (auto d = f.string("description")) fn["description"] = *d;
  if (const Json* params = f.get("parameters")) {
    if (!params->is_object())
      throw bad_request("'" + path + ".parameters' must be a JSON Schema object", path + ".parameters", "invalid_type");
    fn["parameters"] = *params;
  }
  if (auto strict = f.boolean("strict")) fn["strict"] = *strict;  // absent: strict (ChatPrompt::tools_strict)
  return {{"type", "function"}, {"function", fn}};
}

Json read_tools(const Json& tools, ResponsesRequest& r, std::vector<std::string>* ignored) {
  if (!tools.is_array()) throw bad_request("'tools' must be an array", "tools", "invalid_type");
  Json out = Json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string p = at("tools", i);
    if (!tools[i].is_object()) throw bad_request("'" + p + "' must be an object", p, "invalid_type");
    const std::string type = string_or(tools[i], "type", "", p);
    if (type == "function") {
      out.push_back(function_tool(tools[i], p, ignored));
    } else if (type == "namespace") {
      const std::string ns = string_or(tools[i], "name", "", p);
      const Json& nested = tools[i].contains("tools") ? tools[i]["tools"] : Json::array();
      if (!nested.is_array()) throw bad_request("'" + p + ".tools' must be an array", p + ".tools", "invalid_type");
      for (size_t k = 0; k < nested.size(); ++k) {
        const std::string np = at(p + ".tools", k);
        if (!nested[k].is_object() || string_or(nested[k], "type", "", np) != "function") {
          r.warnings.push_back("tool " + np + " is not a function tool and was left out");
          continue;
        }
        Json tool = function_tool(nested[k], np, ignored);
        r.tool_namespace[tool["function"]["name"].get<std::string>()] = ns;
        out.push_back(std::move(tool));
      }
    } else {
      r.warnings.push_back("the hosted tool '" + (type.empty() ? std::string("(no type)") : type) +
                           "' cannot run on this server and was left out of the prompt");
    }
  }
  return out;
}

}  // namespace

std::string seal_reasoning(const std::string& text) {
  return std::string(kSealPrefix) + tokenizer::base64_encode(text);
}

ResponsesRequest parse_responses_request(const Json& body, const ParseContext& ctx, ResponseStore& store) {
  const JsonFields f(body,
                     {"model",
                      "input",
                      "instructions",
                      "tools",
                      "tool_choice",
                      "parallel_tool_calls",
                      "reasoning",
                      "max_output_tokens",
                      "temperature",
                      "top_p",
                      "text",
                      "store",
                      "previous_response_id",
                      "include",
                      "prompt_cache_key",
                      "stream",
                      "metadata",
                      "user",
                      "service_tier",
                      "truncation",
                      "background",
                      "conversation",
                      "prompt",
                      "safety_identifier",
                      "top_logprobs",
                      "max_tool_calls",
                      "stream_options"},
                     {}, ctx.ignored_fields);
  ResponsesRequest r;
  GenerationParams& p = r.params;
  const auto model = f.string("model");
  if (!model) throw bad_request("'model' is required", "model", "missing");
  p.model = resolve_model(*model, ctx);
  if (f.boolean("background").value_or(false))
    throw bad_request("'background' = true is not supported by this server", "background", "unsupported_value");
  for (const char* key : {"conversation", "prompt"})
    if (f.has(key))
      throw bad_request(std::string("'") + key + "' is not supported by this server", key, "unsupported_value");
  for (const char* key : {"prompt_cache_key", "user", "service_tier", "safety_identifier"}) f.string(key);
  if (const Json* m = f.get("metadata"); m && !m->is_object())
    throw bad_request("'metadata' must be an object", "metadata", "invalid_type");
  if (auto t = f.string("truncation"); t && *t != "disabled" && *t != "auto")
    throw bad_request("'truncation' must be disabled or auto", "truncation");
  if (const Json* inc = f.get("include")) {
    if (!inc->is_array()) throw bad_request("'include' must be an array of strings", "include", "invalid_type");
    for (const Json& v : *inc)
      r.encrypted_reasoning |= v.is_string() && v.get<std::string>() == "reasoning.encrypted_content";
  }
  r.store = f.boolean("store").value_or(true);
  f.integer("max_tool_calls", 1, 1 << 20);

  runner::SamplingParams& s = p.base.sampling;
  s.temperature = 1.0f;  // the API's default
  if (auto v = f.number("temperature", 0, 2)) s.temperature = static_cast<float>(*v);
  if (auto v = f.number("top_p", 0, 1, true)) s.top_p = static_cast<float>(*v);
  s.seed = ctx.random_seed;
  p.max_tokens_field = "max_output_tokens";
  if (auto v = f.integer("max_output_tokens", 1, ctx.max_model_len)) p.max_tokens = *v;
  f.integer("top_logprobs", 0, 0);  // logprobs are not returned by this API here: only 0 is honoured
  p.stream = f.boolean("stream").value_or(false);
  if (const Json* so = f.get("stream_options")) JsonFields(*so, {"include_obfuscation"}, "stream_options.");
  p.max_model_len = ctx.max_model_len;

  tokenizer::ChatOptions& options = r.chat.options;
  Json reasoning_echo = {{"effort", nullptr}, {"summary", nullptr}};
  if (const Json* rs = f.get("reasoning")) {
    const JsonFields rf(*rs, {"effort", "summary", "generate_summary"}, "reasoning.", ctx.ignored_fields);
    if (auto effort = rf.string("effort")) {
      if (*effort == "none") options.thinking = false;
      else if (*effort == "minimal" || *effort == "low") options.thinking_effort = "low";
      else if (*effort == "medium" || *effort == "high") options.thinking_effort = *effort;
      else if (*effort == "xhigh") options.thinking_effort = "max";
      else
        throw bad_request("'reasoning.effort' must be none, minimal, low, medium, high or xhigh", "reasoning.effort");
      reasoning_echo["effort"] = *effort;
    }
    for (const char* key : {"summary", "generate_summary"})
      if (auto summary = rf.string(key)) {
        if (*summary != "auto" && *summary != "concise" && *summary != "detailed")
          throw bad_request(std::string("'reasoning.") + key + "' must be auto, concise or detailed",
                            std::string("reasoning.") + key);
        r.summary = true;
        reasoning_echo["summary"] = *summary;
      }
  }
  Json text_echo = {{"format", {{"type", "text"}}}};
  if (const Json* text = f.get("text")) {
    const JsonFields tf(*text, {"format", "verbosity"}, "text.", ctx.ignored_fields);
    tf.string("verbosity");
    if (const Json* format = tf.get("format")) {
      const JsonFields ff(*format, {"type", "name", "schema", "strict", "description"}, "text.format.");
      const auto type = ff.string("type");
      if (type == "json_schema") {
        if (!ff.get("schema")) throw bad_request("'text.format.schema' is required", "text.format.schema", "missing");
        options.response_format = {{"type", "json_schema"}, {"json_schema", {{"schema", *ff.get("schema")}}}};
      } else if (type == "json_object") {
        options.response_format = {{"type", "json_object"}};
      } else if (type != "text") {
        throw bad_request("'text.format.type' must be text, json_object or json_schema", "text.format.type");
      }
      text_echo["format"] = *format;
    }
  }

  Json tools_echo = Json::array();
  if (const Json* t = f.get("tools")) {
    r.chat.tools = read_tools(*t, r, ctx.ignored_fields);
    r.chat.tools_strict = true;  // Responses function tools are strict unless they say otherwise (OpenAI)
    tools_echo = *t;
  }
  std::string choice = "auto", forced;
  Json choice_echo = "auto";
  if (const Json* tc = f.get("tool_choice")) {
    choice_echo = *tc;
    if (tc->is_string()) {
      choice = tc->get<std::string>();
      if (choice != "auto" && choice != "required" && choice != "none")
        throw bad_request("'tool_choice' must be auto, required, none or {type: function, name}", "tool_choice");
    } else {
      const JsonFields c(*tc, {"type", "name"}, "tool_choice.");
      if (c.string("type") != "function")
        throw bad_request("'tool_choice.type' must be function (hosted tools cannot run here)", "tool_choice.type",
                          "unsupported_value");
      const auto name = c.string("name");
      if (!name || name->empty()) throw bad_request("'tool_choice.name' is required", "tool_choice.name", "missing");
      choice = "named", forced = *name;
    }
  }
  const bool parallel = f.boolean("parallel_tool_calls").value_or(true);
  apply_tool_choice(r.chat, choice, forced, parallel, "tool_choice");

  // The conversation: the stored one, instructions, then the new input.
  const auto previous = f.string("previous_response_id");
  if (previous) {
    auto stored = store.get(*previous);
    if (!stored)
      throw ApiError(404, "Previous response with id '" + *previous + "' not found (never stored, or evicted)",
                     "previous_response_id", "previous_response_not_found");
    r.history = std::move(*stored);
  }
  const Json* input = f.get("input");
  if (!input) throw bad_request("'input' is required", "input", "missing");
  Json fresh = Json::array();
  if (input->is_string()) fresh.push_back({{"role", "user"}, {"content", *input}});
  else if (input->is_array()) add_items(*input, fresh);
  else throw bad_request("'input' must be a string or an array of items", "input", "invalid_type");
  for (Json& m : fresh) r.history.push_back(std::move(m));
  const auto instructions = f.string("instructions");
  if (instructions && !instructions->empty())
    r.chat.messages.push_back({{"role", "system"}, {"content", *instructions}});
  for (const Json& m : r.history) r.chat.messages.push_back(m);
  if (r.chat.messages.empty()) throw bad_request("'input' is empty", "input");
  set_chat_prompt(p, r.chat, ctx, "input");

  r.echo = {{"instructions", instructions ? Json(*instructions) : Json(nullptr)},
            {"max_output_tokens", p.max_tokens > 0 ? Json(p.max_tokens) : Json(nullptr)},
            {"parallel_tool_calls", parallel},
            {"previous_response_id", previous ? Json(*previous) : Json(nullptr)},
            {"reasoning", reasoning_echo},
            {"store", r.store},
            {"temperature", s.temperature},
            {"text", text_echo},
            {"tool_choice", choice_echo},
            {"tools", tools_echo},
            {"top_p", s.top_p},
            {"truncation", f.string("truncation").value_or("disabled")},
            {"metadata", f.get("metadata") ? *f.get("metadata") : Json::object()},
            {"user", f.string("user") ? Json(*f.string("user")) : Json(nullptr)}};
  return r;
}

}  // namespace k3::server
