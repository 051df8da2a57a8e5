// server/anthropic_request.cpp: Anthropic Messages bodies -> ChatPrompt + GenerationParams.
#include "server/anthropic_request.h"

#include <limits>
#include <map>

namespace k3::server {

namespace {

std::string at(const std::string& path, size_t i) { return path + "[" + std::to_string(i) + "]"; }

std::string block_type(const Json& block, const std::string& path) {
  if (!block.is_object()) throw bad_request("'" + path + "' must be a content block object", path, "invalid_type");
  if (!block.contains("type") || !block["type"].is_string())
    throw bad_request("'" + path + ".type' must be a string", path + ".type", "missing");
  return block["type"].get<std::string>();
}

[[noreturn]] void text_only(const std::string& path, const std::string& type) {
  throw bad_request("'" + path + "' is a " + type + " block: this model takes text only (no images or documents)", path,
                    "unsupported_content");
}

std::string text_of(const Json& block, const std::string& path) {
  if (!block.contains("text") || !block["text"].is_string())
    throw bad_request("'" + path + ".text' must be a string", path + ".text", "missing");
  return block["text"].get<std::string>();
}

// A string, or text blocks joined (system prompts and tool results).
std::string joined_text(const Json& v, const std::string& path, std::vector<std::string>* tool_refs) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array())
    throw bad_request("'" + path + "' must be a string or an array of text blocks", path, "invalid_type");
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string type = block_type(v[i], at(path, i));
    if (type == "text") {
      out += text_of(v[i], at(path, i));
    } else if (type == "tool_reference" && tool_refs) {
      const Json& name = v[i].contains("tool_name") ? v[i]["tool_name"] : Json();
      if (!name.is_string())
        throw bad_request("'" + at(path, i) + ".tool_name' must be a string", at(path, i) + ".tool_name", "missing");
      tool_refs->push_back(name.get<std::string>());
    } else if (type == "image" || type == "document") {
      text_only(at(path, i), type);
    } else {
      throw bad_request("'" + at(path, i) + ".type' must be text, got '" + type + "'", at(path, i) + ".type");
    }
  }
  return out;
}

// Claude Code's tool search loads deferred tools by name; a loaded tool is declared to the model
// the way K3 declares tools added mid-conversation (a system message with "tools").
struct ToolTable {
  std::map<std::string, Json> deferred;  // name -> OpenAI function tool, until a tool_reference loads it
};

void add_user_content(const Json& content, const std::string& path, ToolTable& tools, Json& out) {
  if (content.is_string()) {
    out.push_back({{"role", "user"}, {"content", content}});
    return;
  }
  if (!content.is_array())
    throw bad_request("'" + path + "' must be a string or an array of blocks", path, "invalid_type");
  Json text = Json::array();
  auto flush = [&] {
    if (!text.empty()) out.push_back({{"role", "user"}, {"content", text}});
    text = Json::array();
  };
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string p = at(path, i), type = block_type(content[i], p);
    const Json& b = content[i];
    if (type == "text") {
      text.push_back({{"type", "text"}, {"text", text_of(b, p)}});
    } else if (type == "tool_result") {
      flush();
      if (!b.contains("tool_use_id") || !b["tool_use_id"].is_string())
        throw bad_request("'" + p + ".tool_use_id' must be a string", p + ".tool_use_id", "missing");
      std::vector<std::string> refs;
      std::string result = b.contains("content") && !b["content"].is_null()
                               ? joined_text(b["content"], p + ".content", &refs)
                               : std::string();
      if (b.contains("is_error") && !b["is_error"].is_null() && !b["is_error"].is_boolean())
        throw bad_request("'" + p + ".is_error' must be a boolean", p + ".is_error", "invalid_type");
      if (b.contains("is_error") && b["is_error"].is_boolean() && b["is_error"].get<bool>())
        result = "Error: " + result;
      out.push_back({{"role", "tool"}, {"tool_call_id", b["tool_use_id"]}, {"content", result}});
      Json newly = Json::array();
      for (const std::string& name : refs) {
        const auto it = tools.deferred.find(name);
        if (it == tools.deferred.end()) continue;  // already loaded, or not a deferred tool
        newly.push_back(it->second);
        tools.deferred.erase(it);
      }
      if (!newly.empty()) out.push_back({{"role", "system"}, {"content", ""}, {"tools", newly}});
    } else if (type == "image" || type == "document") {
      text_only(p, type);
    } else {
      throw bad_request("'" + p + ".type' must be text, tool_result, image or document in a user message, got '" +
                            type + "'",
                        p + ".type");
    }
  }
  flush();
}

void add_assistant_content(const Json& content, const std::string& path, Json& out) {
  Json m = {{"role", "assistant"}};
  if (content.is_string()) {
    m["content"] = content;
    out.push_back(std::move(m));
    return;
  }
  if (!content.is_array())
    throw bad_request("'" + path + "' must be a string or an array of blocks", path, "invalid_type");
  std::string text, thinking;
  Json calls = Json::array();
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string p = at(path, i), type = block_type(content[i], p);
    const Json& b = content[i];
    if (type == "text") {
      text += text_of(b, p);
    } else if (type == "thinking") {
      if (!b.contains("thinking") || !b["thinking"].is_string())
        throw bad_request("'" + p + ".thinking' must be a string", p + ".thinking", "missing");
      thinking += b["thinking"].get<std::string>();
    } else if (type == "redacted_thinking") {
      // Encrypted by whoever made it: nothing here can read it, and nothing of ours made it.
    } else if (type == "tool_use") {
      if (!b.contains("id") || !b["id"].is_string())
        throw bad_request("'" + p + ".id' must be a string", p + ".id", "missing");
      if (!b.contains("name") || !b["name"].is_string())
        throw bad_request("'" + p + ".name' must be a string", p + ".name", "missing");
      const Json input = b.contains("input") && !b["input"].is_null() ? b["input"] : Json::object();
      if (!input.is_object()) throw bad_request("'" + p + ".input' must be an object", p + ".input", "invalid_type");
      calls.push_back(
          {{"id", b["id"]}, {"type", "function"}, {"function", {{"name", b["name"]}, {"arguments", input}}}});
    } else if (type == "image" || type == "document") {
      text_only(p, type);
    } else {
      throw bad_request("'" + p +
                            ".type' must be text, thinking, redacted_thinking or tool_use in an assistant "
                            "message, got '" +
                            type + "'",
                        p + ".type");
    }
  }
  m["content"] = text;
  if (!thinking.empty()) m["reasoning_content"] = thinking;
  if (!calls.empty()) m["tool_calls"] = calls;
  out.push_back(std::move(m));
}

// Tools: custom tools become function tools; defer_loading ones wait for a tool_reference;
// server tools (a "type" other than custom) are left out.
Json read_tools(const Json& tools, ToolTable& table, std::vector<std::string>& skipped,
                std::vector<std::string>* ignored) {
  if (!tools.is_array())
    throw bad_request("'tools' must be an array, got " + json_type_name(tools), "tools", "invalid_type");
  Json out = Json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string p = at("tools", i);
    if (!tools[i].is_object()) throw bad_request("'" + p + "' must be an object", p, "invalid_type");
    const std::string type = string_or(tools[i], "type", "custom", p);
    const std::string name = tools[i].contains("name") && tools[i]["name"].is_string()
                                 ? tools[i]["name"].get<std::string>()
                                 : "";
    if (type != "custom") {
      skipped.push_back(name.empty() ? type : name + " (" + type + ")");
      continue;
    }
    const JsonFields t(tools[i],
                       {"type", "name", "description", "input_schema", "cache_control", "defer_loading", "strict",
                        "input_examples", "eager_input_streaming"},
                       p + ".", ignored);
    if (name.empty()) throw bad_request("'" + p + ".name' must be a non-empty string", p + ".name", "missing");
    const Json* schema = t.get("input_schema");
    if (!schema || !schema->is_object())
      throw bad_request("'" + p + ".input_schema' must be a JSON Schema object", p + ".input_schema", "missing");
    Json fn = {{"name", name}};
    if (auto d = t.string("description")) fn["description"] = *d;
    fn["parameters"] = *schema;
    if (auto strict = t.boolean("strict")) fn["strict"] = *strict;  // true: its input must match input_schema
    Json tool = {{"type", "function"}, {"function", fn}};
    if (t.boolean("defer_loading").value_or(false)) table.deferred.emplace(name, std::move(tool));
    else out.push_back(std::move(tool));
  }
  return out;
}

// clear_thinking_20251015: drops the reasoning of all but the last `keep` assistant turns that
// have some (keep < 0: all kept).
void clear_thinking(Json& messages, int64_t keep) {
  if (keep < 0) return;
  int64_t seen = 0;
  for (auto it = messages.rbegin(); it != messages.rend(); ++it)
    if ((*it)["role"] == "assistant" && it->contains("reasoning_content") && ++seen > keep)
      it->erase("reasoning_content");
}

int64_t thinking_turns_kept(const Json& cm, std::vector<std::string>* ignored) {
  const JsonFields f(cm, {"edits"}, "context_management.", ignored);
  const Json* edits = f.get("edits");
  if (!edits) return -1;
  if (!edits->is_array()) throw bad_request("'context_management.edits' must be an array", "context_management.edits");
  int64_t keep = -1;
  for (size_t i = 0; i < edits->size(); ++i) {
    const std::string p = at("context_management.edits", i);
    const JsonFields e((*edits)[i], {"type", "keep"}, p + ".");
    const auto type = e.string("type");
    if (type != "clear_thinking_20251015")
      throw bad_request("'" + p + ".type' " + (type ? "'" + *type + "'" : std::string("(missing)")) +
                            " is not supported: this server can clear thinking (clear_thinking_20251015) only",
                        p + ".type", "unsupported_value");
    const Json* k = e.get("keep");
    if (!k) {
      keep = 1;  // Anthropic's default: the last thinking turn
    } else if (k->is_string() && k->get<std::string>() == "all") {
      keep = -1;
    } else {
      const JsonFields kf(*k, {"type", "value"}, p + ".keep.");
      if (kf.string("type") != "thinking_turns")
        throw bad_request("'" + p + ".keep' must be \"all\" or {type: thinking_turns, value: N}", p + ".keep");
      keep = kf.integer("value", 0, 1 << 30).value_or(1);
    }
  }
  return keep;
}

std::string effort_for_budget(int64_t budget) {
  if (budget <= 4096) return "low";
  if (budget <= 16384) return "medium";
  if (budget <= 32768) return "high";
  return "max";
}

}  // namespace

MessagesRequest parse_messages_request(const Json& body, const ParseContext& ctx, bool count_tokens) {
  const JsonFields f(body,
                     {"model", "messages", "system", "max_tokens", "temperature", "top_p", "top_k", "stop_sequences",
                      "stream", "metadata", "tools", "tool_choice", "thinking", "output_config", "context_management",
                      "service_tier", "mcp_servers", "container"},
                     {}, ctx.ignored_fields);
  MessagesRequest r;
  GenerationParams& p = r.params;
  const auto model = f.string("model");
  if (!model) throw bad_request("'model' is required", "model", "missing");
  p.model = resolve_model(*model, ctx);
  if (f.has("mcp_servers") && !f.get("mcp_servers")->empty())
    throw bad_request("'mcp_servers' is not supported: this server cannot reach MCP servers", "mcp_servers",
                      "unsupported_value");
  if (f.has("container"))
    throw bad_request("'container' is not supported: no code execution here", "container", "unsupported_value");
  f.string("service_tier");
  if (const Json* m = f.get("metadata"); m && !m->is_object())
    throw bad_request("'metadata' must be an object", "metadata", "invalid_type");

  runner::SamplingParams& s = p.base.sampling;
  s.temperature = 1.0f;  // the API's default
  if (auto v = f.number("temperature", 0, 1)) s.temperature = static_cast<float>(*v);
  if (auto v = f.number("top_p", 0, 1, true)) s.top_p = static_cast<float>(*v);
  if (auto v = f.integer("top_k", 0, std::numeric_limits<int32_t>::max()); v && *v > 0) s.top_k = static_cast<int>(*v);
  s.seed = ctx.random_seed;
  const auto max_tokens = f.integer("max_tokens", 1, ctx.max_model_len);
  if (!max_tokens && !count_tokens) throw bad_request("'max_tokens' is required", "max_tokens", "missing");
  p.max_tokens = max_tokens.value_or(0);
  if (const Json* stops = f.get("stop_sequences")) {
    if (!stops->is_array() || stops->size() > static_cast<size_t>(ctx.max_stop))
      throw bad_request("'stop_sequences' must be an array of at most " + std::to_string(ctx.max_stop) + " strings",
                        "stop_sequences", "invalid_type");
    for (size_t i = 0; i < stops->size(); ++i) {
      const Json& v = (*stops)[i];
      if (!v.is_string() || v.get<std::string>().empty())
        throw bad_request("'stop_sequences[" + std::to_string(i) + "]' must be a non-empty string", "stop_sequences");
      p.stop.push_back(v.get<std::string>());
    }
  }
  p.stream = f.boolean("stream").value_or(false);
  p.max_model_len = ctx.max_model_len;

  // Thinking: off unless asked for, as in Anthropic's API.
  tokenizer::ChatOptions& options = r.chat.options;
  options.thinking = false;
  if (const Json* t = f.get("thinking")) {
    const JsonFields tf(*t, {"type", "budget_tokens", "display"}, "thinking.", ctx.ignored_fields);
    const auto type = tf.string("type");
    if (type == "enabled") {
      const auto budget = tf.integer("budget_tokens", 1024, ctx.max_model_len);
      if (!budget)
        throw bad_request("'thinking.budget_tokens' is required (at least 1024)", "thinking.budget_tokens", "missing");
      if (max_tokens && *budget >= *max_tokens)
        throw bad_request("'max_tokens' must be greater than 'thinking.budget_tokens'", "max_tokens");
      options.thinking = true;
      options.thinking_effort = effort_for_budget(*budget);
    } else if (type == "adaptive") {
      options.thinking = true;
    } else if (type != "disabled") {
      throw bad_request("'thinking.type' must be enabled, adaptive or disabled", "thinking.type");
    }
    if (auto display = tf.string("display")) {
      if (*display != "summarized" && *display != "omitted")
        throw bad_request("'thinking.display' must be summarized or omitted", "thinking.display");
      r.show_thinking = *display != "omitted";
    }
  }
  if (const Json* oc = f.get("output_config")) {
    const JsonFields of(*oc, {"effort", "format"}, "output_config.", ctx.ignored_fields);
    if (auto effort = of.string("effort")) {
      if (*effort != "low" && *effort != "medium" && *effort != "high" && *effort != "xhigh" && *effort != "max")
        throw bad_request("'output_config.effort' must be low, medium, high, xhigh or max", "output_config.effort");
      if (options.thinking) options.thinking_effort = *effort == "xhigh" ? "max" : *effort;
    }
    if (const Json* format = of.get("format")) {  // {type: json_schema, schema}: rendered as K3's response format
      const JsonFields ff(*format, {"type", "schema"}, "output_config.format.");
      if (ff.string("type") != "json_schema")
        throw bad_request("'output_config.format.type' must be json_schema", "output_config.format.type");
      options.response_format = {{"type", "json_schema"},
                                 {"json_schema", {{"schema", ff.get("schema") ? *ff.get("schema") : Json::object()}}}};
    }
  }

  ToolTable table;
  if (const Json* t = f.get("tools")) r.chat.tools = read_tools(*t, table, r.skipped_tools, ctx.ignored_fields);

  // system, then the conversation.
  Json& messages = r.chat.messages;
  if (const Json* sys = f.get("system")) {
    const std::string text = joined_text(*sys, "system", nullptr);
    if (!text.empty()) messages.push_back({{"role", "system"}, {"content", text}});
  }
  const Json* list = f.get("messages");
  if (!list) throw bad_request("'messages' is required", "messages", "missing");
  if (!list->is_array() || list->empty())
    throw bad_request("'messages' must be a non-empty array of messages", "messages", "invalid_type");
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string path = at("messages", i);
    const JsonFields m((*list)[i], {"role", "content"}, path + ".", ctx.ignored_fields);
    const auto role = m.string("role");
    const Json* content = m.get("content");
    if (!content) throw bad_request("'" + path + ".content' is required", path + ".content", "missing");
    if (role == "user") {
      add_user_content(*content, path + ".content", table, messages);
    } else if (role == "assistant") {
      add_assistant_content(*content, path + ".content", messages);
    } else if (role == "system") {  // Claude Code sends mid-conversation system messages
      messages.push_back({{"role", "system"}, {"content", joined_text(*content, path + ".content", nullptr)}});
    } else {
      throw bad_request("'" + path + ".role' must be user or assistant", path + ".role");
    }
  }
  if (const Json* cm = f.get("context_management"))
    clear_thinking(messages, thinking_turns_kept(*cm, ctx.ignored_fields));

  std::string choice = "auto", forced;
  bool parallel = true;
  if (const Json* tc = f.get("tool_choice")) {
    const JsonFields c(*tc, {"type", "name", "disable_parallel_tool_use"}, "tool_choice.");
    const auto type = c.string("type");
    if (type == "auto") choice = "auto";
    else if (type == "any") choice = "required";
    else if (type == "none") choice = "none";
    else if (type == "tool") {
      const auto name = c.string("name");
      if (!name || name->empty())
        throw bad_request("'tool_choice.name' is required for type tool", "tool_choice.name", "missing");
      choice = "named", forced = *name;
    } else {
      throw bad_request("'tool_choice.type' must be auto, any, tool or none", "tool_choice.type");
    }
    parallel = !c.boolean("disable_parallel_tool_use").value_or(false);
  }
  apply_tool_choice(r.chat, choice, forced, parallel, "tool_choice");
  if (count_tokens) {
    p.chat = true;
    p.prompts.assign(1, encode_chat_prompt(r.chat, ctx, "messages"));
  } else {
    set_chat_prompt(p, r.chat, ctx, "messages");
  }
  return r;
}

}  // namespace k3::server
