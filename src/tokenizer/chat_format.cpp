// tokenizer/chat_format.cpp: the K3 chat renderer (messages -> XTML segments -> ids).
#include "tokenizer/chat_format.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "tokenizer/k3_tokens.h"
#include "tokenizer/py_json.h"
#include "tokenizer/utf8.h"

namespace k3::tokenizer {

namespace {

using json = nlohmann::ordered_json;
using Attrs = std::vector<std::pair<std::string, std::string>>;

std::string escape_attr(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '&') {
      out += "&amp;";
    } else if (c == '"') {
      out += "&quot;";
    } else {
      out += c;
    }
  }
  return out;
}

// Python str.strip(): drops leading and trailing Unicode whitespace.
std::string py_strip(std::string_view s) {
  size_t begin = 0, end = s.size();
  while (begin < end) {
    int len = 1;
    if (!utf8::is_python_space(utf8::decode(s, begin, len))) break;
    begin += static_cast<size_t>(len);
  }
  while (end > begin) {
    size_t start = end - 1;
    while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    int len = 1;
    if (!utf8::is_python_space(utf8::decode(s, start, len))) break;
    end = start;
  }
  return std::string(s.substr(begin, end - begin));
}

class Builder {
 public:
  void control(std::string_view t) {
    if (!t.empty()) segments.push_back({std::string(t), true});
  }
  void text(std::string_view t) {
    if (!t.empty()) segments.push_back({std::string(t), false});
  }
  void open(std::string_view tag, const Attrs& attrs = {}) {
    control(k3_tokens::kOpen);
    text(tag);
    for (const auto& [key, value] : attrs) text(" " + key + "=\"" + escape_attr(value) + "\"");
    control(k3_tokens::kSep);
  }
  void close(std::string_view tag) {
    control(k3_tokens::kClose);
    text(tag);
    control(k3_tokens::kSep);
  }
  void end_of_msg() { control(k3_tokens::kEndOfMsg); }
  void system_message(std::string_view kind, std::string_view body) {
    open("message", {{"role", "system"}, {"type", std::string(kind)}});
    text(py_strip(body));
    close("message");
    end_of_msg();
  }
  std::vector<ChatSegment> segments;
};

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw core::Error("chat: " + path + " " + what);
}

// Optional string field: absent or null -> nullopt.
std::optional<std::string> opt_string(const json& obj, const char* key, const std::string& path) {
  if (!obj.contains(key) || obj[key].is_null()) return std::nullopt;
  if (!obj[key].is_string()) bad(path + "." + key, "must be a string");
  return obj[key].get<std::string>();
}

// An id compared as Python's str(): strings as they are, integers in decimal.
std::optional<std::string> opt_id(const json& obj, const char* key, const std::string& path) {
  if (!obj.contains(key) || obj[key].is_null()) return std::nullopt;
  if (obj[key].is_string()) return obj[key].get<std::string>();
  if (obj[key].is_number_integer()) return obj[key].dump();
  bad(path + "." + key, "must be a string");
}

void render_content(Builder& b, const json& message, const std::string& path) {
  if (!message.contains("content") || message["content"].is_null()) return;
  const json& content = message["content"];
  if (content.is_string()) return b.text(content.get<std::string>());
  if (!content.is_array()) bad(path + ".content", "must be a string, an array of content parts, or null");
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string at = path + ".content[" + std::to_string(i) + "]";
    const json& part = content[i];
    if (!part.is_object()) bad(at, "must be an object");
    const std::string type = opt_string(part, "type", at).value_or("");
    if (type == "image" || type == "image_url") bad(at, "is an image: this model takes text only");
    if (type != "text") bad(at + ".type", "must be \"text\"");
    const auto text = opt_string(part, "text", at);
    if (!text) bad(at + ".text", "is missing");
    b.text(*text);
  }
}

struct ToolCall {
  std::optional<std::string> id;
  std::string name;
  json arguments = json::object();        // typed arguments, rendered one <argument> each
  std::optional<std::string> json_block;  // arguments text that is not JSON, rendered as is
};

// encoding_k3.py _normalize_arguments: a JSON-object string is parsed (key order kept); a
// string that is not JSON is kept as a raw json block; other JSON is refused.
std::vector<ToolCall> read_tool_calls(const json& message, const std::string& path) {
  std::vector<ToolCall> calls;
  if (!message.contains("tool_calls") || message["tool_calls"].is_null()) return calls;
  const json& list = message["tool_calls"];
  if (!list.is_array()) bad(path + ".tool_calls", "must be an array");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = path + ".tool_calls[" + std::to_string(i) + "]";
    if (!list[i].is_object()) bad(at, "must be an object");
    ToolCall call;
    call.id = opt_id(list[i], "id", at);
    const bool nested = list[i].contains("function");
    const json& fn = nested ? list[i]["function"] : list[i];
    const std::string fn_path = nested ? at + ".function" : at;
    if (!fn.is_object()) bad(fn_path, "must be an object");
    const auto name = opt_string(fn, "name", fn_path);
    if (!name) bad(fn_path + ".name", "must be a string");
    call.name = *name;
    if (fn.contains("arguments") && !fn["arguments"].is_null()) {
      const json& args = fn["arguments"];
      if (args.is_object()) {
        call.arguments = args;
      } else if (args.is_string()) {
        const std::string text = args.get<std::string>();
        if (!py_strip(text).empty()) {
          json parsed = json::parse(text, nullptr, false);
          if (parsed.is_discarded()) {
            call.json_block = text;
          } else if (!parsed.is_object()) {
            bad(fn_path + ".arguments", "must be a JSON object (got " + std::string(parsed.type_name()) + ")");
          } else {
            call.arguments = std::move(parsed);
          }
        }
      } else {
        bad(fn_path + ".arguments", "must be a JSON object or a string holding one");
      }
    }
    calls.push_back(std::move(call));
  }
  return calls;
}

std::string xtml_type(const json& v) {
  if (v.is_boolean()) return "boolean";
  if (v.is_null()) return "null";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_object()) return "object";
  return "array";
}

void render_tool_declare(Builder& b, const json& tools, bool dynamic) {
  const std::string schema = py_json_dumps(deep_sorted(tools), true);
  if (dynamic) {
    b.system_message("tool-declare",
                     "## New Tools Available\nThe system dynamically extends the toolset via lazy-loading.\n"
                     "You have access to all existing and extended tools.\n"
                     "Here are the specs for the extended tools.\n\n```json\n" +
                         schema + "\n```");
  } else {
    b.system_message("tool-declare",
                     "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n" + schema + "\n```");
  }
}

void render_assistant(Builder& b, const json& m, const std::vector<ToolCall>& calls, bool thinking,
                      const std::string& path) {
  if (thinking) {
    b.open("think");
    auto reasoning = opt_string(m, "reasoning_content", path);
    if (!reasoning || reasoning->empty()) reasoning = opt_string(m, "reasoning", path);
    if (reasoning && !py_strip(*reasoning).empty()) b.text(*reasoning);
    b.close("think");
  }
  b.open("response");
  render_content(b, m, path);
  b.close("response");
  if (calls.empty()) return;
  b.open("tools");
  for (size_t i = 0; i < calls.size(); ++i) {
    b.open("call", {{"tool", calls[i].name}, {"index", std::to_string(i + 1)}});
    if (calls[i].json_block) {
      b.open("json", {{"type", "object"}});
      b.text(*calls[i].json_block);
      b.close("json");
    } else {
      for (const auto& [key, value] : calls[i].arguments.items()) {
        b.open("argument", {{"key", key}, {"type", xtml_type(value)}});
        b.text(value.is_string() ? value.get<std::string>() : py_json_dumps(value, false));
        b.close("argument");
      }
    }
    b.close("call");
  }
  b.close("tools");
}

// One message after validation, with the tool name resolved for tool results.
struct Message {
  const json* src;
  std::string path, role;
  std::vector<ToolCall> calls;      // assistant
  std::optional<std::string> tool;  // tool: name from "tool" / "name" or the matched call
  bool has_tool_key = false;        // tool: "tool" present (it wins over "name", even if null)
};

// encoding_k3.py normalize_xtml_tool_result_messages: a run of tool results whose ids all match
// calls of the latest assistant message is put in call order and named after the calls.
std::vector<Message> order_tool_results(std::vector<Message> in) {
  std::vector<Message> out;
  std::map<std::string, std::pair<size_t, std::string>> call_index;  // id -> (position, name)
  for (size_t i = 0; i < in.size();) {
    if (in[i].role == "assistant") {
      call_index.clear();
      for (size_t k = 0; k < in[i].calls.size(); ++k)
        if (in[i].calls[k].id) call_index.emplace(*in[i].calls[k].id, std::pair{k + 1, in[i].calls[k].name});
    }
    if (in[i].role != "tool") {
      out.push_back(std::move(in[i++]));
      continue;
    }
    std::vector<std::pair<size_t, Message>> run;
    bool unresolved = false;
    for (; i < in.size() && in[i].role == "tool"; ++i) {
      auto id = opt_id(*in[i].src, "tool_call_id", in[i].path);
      if (!id) id = opt_id(*in[i].src, "id", in[i].path);
      const auto hit = id ? call_index.find(*id) : call_index.end();
      if (hit == call_index.end()) {
        unresolved = true;
        run.emplace_back(0, std::move(in[i]));
      } else {
        Message m = std::move(in[i]);
        m.tool = hit->second.second;
        m.has_tool_key = true;
        run.emplace_back(hit->second.first, std::move(m));
      }
    }
    if (unresolved) {  // left as sent, names unresolved (as the reference does)
      for (auto& [pos, m] : run) {
        m.has_tool_key = m.src->contains("tool");
        m.tool = m.has_tool_key ? opt_string(*m.src, "tool", m.path) : opt_string(*m.src, "name", m.path);
      }
    } else {
      std::stable_sort(run.begin(), run.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    }
    for (auto& [pos, m] : run) out.push_back(std::move(m));
  }
  return out;
}

}  // namespace

std::vector<ChatSegment> render_chat_segments(const json& messages, const json& tools, const ChatOptions& options) {
  if (!messages.is_array()) bad("messages", "must be an array");
  if (!tools.is_null() && !tools.is_array()) bad("tools", "must be an array or null");
  std::vector<Message> list;
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string path = "messages[" + std::to_string(i) + "]";
    const json& m = messages[i];
    if (!m.is_object()) bad(path, "must be an object");
    auto role = opt_string(m, "role", path);
    if (!role) bad(path + ".role", "is missing");
    if (*role == "developer") role = "system";
    if (*role != "system" && *role != "user" && *role != "assistant" && *role != "tool")
      bad(path + ".role", "must be system, developer, user, assistant or tool (got '" + *role + "')");
    opt_string(m, "name", path);  // type check
    Message msg{&m, path, *role, {}, std::nullopt, false};
    if (*role == "assistant") msg.calls = read_tool_calls(m, path);
    if (*role == "tool") {
      msg.has_tool_key = m.contains("tool");
      msg.tool = msg.has_tool_key ? opt_string(m, "tool", path) : opt_string(m, "name", path);
    }
    if (*role == "system" && m.contains("tools") && !m["tools"].is_null() && !m["tools"].is_array())
      bad(path + ".tools", "must be an array");
    list.push_back(std::move(msg));
  }
  list = order_tool_results(std::move(list));

  const std::string effort = options.thinking_effort.value_or("");
  if (options.thinking && !effort.empty() && effort != "low" && effort != "medium" && effort != "high" &&
      effort != "max")
    bad("thinking_effort", "must be low, medium, high or max (got '" + effort + "')");

  Builder b;
  if (tools.is_array() && !tools.empty()) render_tool_declare(b, tools, false);
  if (options.thinking && !effort.empty())
    b.system_message("thinking-effort",
                     "`thinking_effort` guides on how much to think in your thinking channel (not including the "
                     "response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
                     "Now the system is invoked with `thinking_effort=" +
                         effort + "`.");

  const std::vector<ToolCall>* prior_calls = nullptr;
  size_t tool_index = 0;
  for (const Message& msg : list) {
    const json& m = *msg.src;
    if (msg.role == "system" && m.contains("tools") && m["tools"].is_array() && !m["tools"].empty()) {
      render_tool_declare(b, m["tools"], true);
    } else if (msg.role == "user" || msg.role == "system") {
      Attrs attrs = {{"role", msg.role}};
      if (const auto name = opt_string(m, "name", msg.path); name && !name->empty()) attrs.emplace_back("name", *name);
      b.open("message", attrs);
      render_content(b, m, msg.path);
      b.close("message");
      b.end_of_msg();
    } else if (msg.role == "assistant") {
      prior_calls = &msg.calls;
      tool_index = 0;
      b.open("message", {{"role", "assistant"}});
      render_assistant(b, m, msg.calls, options.thinking, msg.path);
      b.close("message");
      b.end_of_msg();
    } else {  // tool
      ++tool_index;
      std::optional<std::string> name = msg.tool;
      if (!name && prior_calls && tool_index <= prior_calls->size()) name = (*prior_calls)[tool_index - 1].name;
      if (!name)
        bad(msg.path,
            "is a tool result with no resolvable tool name: give \"tool_call_id\" of an earlier call, "
            "or \"name\"");
      b.open("message", {{"role", "tool"}, {"tool", *name}, {"index", std::to_string(tool_index)}});
      render_content(b, m, msg.path);
      b.close("message");
      b.end_of_msg();
    }
  }

  if (options.tool_choice == "required" || options.tool_choice == "none")
    b.system_message("tool-choice", "The system is invoked with `tool_choice=" + *options.tool_choice +
                                        "`.\nYou MUST " +
                                        (*options.tool_choice == "required" ? "call tools" : "NOT call any tools") +
                                        " in the next message.");
  if (!options.forced_tool.empty() || !options.parallel_tool_calls) {
    std::string body = "The system is invoked with ";
    if (!options.forced_tool.empty())
      body += "`tool_choice=" + options.forced_tool + "`.\nYou MUST call the tool `" + options.forced_tool + "`";
    else body += "`parallel_tool_calls=false`.\nYou MUST NOT call more than one tool";
    if (!options.forced_tool.empty() && !options.parallel_tool_calls) body += ", exactly once,";
    b.system_message("tool-choice", body + " in the next message.");
  }
  const json& rf = options.response_format;
  std::string rf_type;
  if (rf.is_object() && rf.contains("type") && rf["type"].is_string()) rf_type = rf["type"].get<std::string>();
  if (rf.is_string()) rf_type = rf.get<std::string>();
  static constexpr std::string_view kRawJson =
      "Your response must be raw JSON data without markdown code blocks (```json) or any additional formatting.";
  if (rf_type == "json_object") {
    b.system_message("response-format",
                     "The system is invoked with `response_format=json_object`.\n" + std::string(kRawJson));
  } else if (rf_type == "json_schema") {
    json schema;  // encoding_k3.py _response_schema: json_schema.schema, else .json_schema, else itself
    if (rf.contains("json_schema") && !rf["json_schema"].is_null()) {
      const json& js = rf["json_schema"];
      schema = js.is_object() && js.contains("schema")        ? js["schema"]
               : js.is_object() && js.contains("json_schema") ? js["json_schema"]
                                                              : js;
    }
    b.system_message("response-format", "The system is invoked with `response_format=json_schema`.\n" +
                                            std::string(kRawJson) +
                                            "\nThe JSON data must match the following schema:\n```json\n" +
                                            py_json_dumps(deep_sorted(schema), true) + "\n```");
  }
  if (options.add_generation_prompt) {
    b.open("message", {{"role", "assistant"}});
    b.open(options.thinking ? "think" : "response");
  }
  return std::move(b.segments);
}

std::string render_chat(const json& messages, const json& tools, const ChatOptions& options) {
  std::string out;
  for (const ChatSegment& s : render_chat_segments(messages, tools, options)) out += s.text;
  return out;
}

std::vector<int32_t> encode_segments(const Tokenizer& tokenizer, const std::vector<ChatSegment>& segments) {
  std::vector<int32_t> ids;
  for (const ChatSegment& s : segments)
    tokenizer.encode_append(s.text, s.control ? Specials::allow : Specials::deny, ids);
  return ids;
}

std::vector<int32_t> encode_chat(const Tokenizer& tokenizer, const json& messages, const json& tools,
                                 const ChatOptions& options) {
  return encode_segments(tokenizer, render_chat_segments(messages, tools, options));
}

}  // namespace k3::tokenizer
