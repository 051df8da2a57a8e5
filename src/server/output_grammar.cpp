#include "server/output_grammar.h"

#include "core/error.h"
#include "server/api_error.h"
#include "structured/ebnf.h"
#include "structured/json_schema.h"
#include "structured/regex.h"

namespace k3::server {

namespace {

using structured::ebnf_literal;
using structured::EbnfRules;
using structured::JsonSchemaConverter;

// A K3 marker: <|open|>tag<|sep|>, <|close|>tag<|sep|>.
std::string open_tag(const std::string& tag) { return "<|open|> " + ebnf_literal(tag) + " <|sep|>"; }
std::string close_tag(const std::string& tag) { return "<|close|> " + ebnf_literal(tag) + " <|sep|>"; }

// K3's attribute escaping (tokenizer/chat_format.cpp escape_attr).
std::string escape_attr(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

// A call's arguments as K3 writes them for a tool that is not strict: a JSON block with any
// object, or argument elements, each with its key, its type and a value of that type (a string
// value raw, up to the marker; others as JSON).
std::string generic_arguments(EbnfRules& rules) {
  if (rules.has("k3-arguments")) return "k3-arguments";
  const std::string object = structured::json_object(rules);
  rules.add("k3-attr-char", R"([^"&] | "&amp;" | "&quot;")");
  rules.add(
      "k3-argument",
      "<|open|> \"argument key=\\\"\" k3-attr-char* \"\\\" type=\\\"\" (\"string\\\"\" <|sep|> k3-char* | "
      "\"number\\\"\" <|sep|> json-number | \"boolean\\\"\" <|sep|> (\"true\" | \"false\") | \"null\\\"\" <|sep|> "
      "\"null\" | \"object\\\"\" <|sep|> json-object | \"array\\\"\" <|sep|> json-array) " +
          close_tag("argument"));
  rules.add("k3-arguments",
            open_tag("json type=\"object\"") + " " + object + " " + close_tag("json") + " | k3-argument*");
  return "k3-arguments";
}

// Runs a conversion, turning its core::Error into a 400 naming `field`.
template <class F>
std::string converting(const std::string& field, F&& f) {
  try {
    return f();
  } catch (const core::Error& e) {
    throw bad_request("'" + field + "' cannot be enforced: " + e.what(), field);
  }
}

// The rule for an answer the structured outputs ask for ("" when they ask for nothing).
std::string answer_rule(EbnfRules& rules, const StructuredOutputs& so) {
  if (!so.any()) return "";
  return converting(so.field, [&]() -> std::string {
    const std::string ws = structured::json_ws(rules);
    if (so.json) {
      JsonSchemaConverter c(rules, "answer");
      return ws + " " + c.convert(*so.json) + " " + ws;
    }
    if (so.json_object) return ws + " " + structured::json_object(rules) + " " + ws;
    if (so.regex) return structured::regex_to_ebnf(*so.regex);
    if (so.choice) {
      std::string body;
      for (const std::string& c : *so.choice) body += (body.empty() ? "" : " | ") + ebnf_literal(c);
      return "(" + body + ")";
    }
    // A user grammar: its rules join ours, its root is the answer (checked when compiled).
    rules.add("k3-user-grammar", "root");
    return "k3-user-grammar";
  });
}

// response_format / text.format / output_config.format as structured outputs.
StructuredOutputs from_response_format(const Json& rf) {
  StructuredOutputs so;
  if (!rf.is_object() || !rf.contains("type")) return so;
  const std::string type = rf["type"].get<std::string>();
  if (type == "json_object") {
    so.json_object = true;
    so.field = "response_format";
  } else if (type == "json_schema") {
    const Json& js = rf.contains("json_schema") ? rf["json_schema"] : Json::object();
    so.json = js.is_object() && js.contains("schema") ? js["schema"] : Json::object();
    so.field = "response_format.json_schema.schema";
  }
  return so;
}

}  // namespace

std::string completion_output_grammar(const StructuredOutputs& so) {
  if (!so.any()) return "";
  EbnfRules rules;
  const std::string answer = answer_rule(rules, so);
  if (so.grammar) return *so.grammar + "\n" + rules.text() + "k3-output ::= " + answer + "\n";
  rules.add("k3-output", answer);
  return rules.text();
}

std::string chat_output_grammar(const ChatPrompt& chat, tokenizer::Channel start) {
  StructuredOutputs so = chat.structured;
  const StructuredOutputs rf = from_response_format(chat.options.response_format);
  if (rf.any()) {
    if (so.any())
      throw bad_request("'" + so.field + "' and '" + rf.field + "' both constrain the output; give one of them",
                        so.field);
    so = rf;
  }
  const bool tools_allowed = chat.tool_policy.allowed && chat.tools.is_array() && !chat.tools.empty();
  const bool tools_required = tools_allowed &&
                              (chat.options.tool_choice == "required" || !chat.tool_policy.only_name.empty());
  bool any_strict = false;
  if (tools_allowed)
    for (const Json& t : chat.tools) any_strict |= t["function"].value("strict", chat.tools_strict);
  if (!so.any() && !tools_required && !any_strict) return "";

  EbnfRules rules;
  rules.add("k3-char", ".");
  std::string answer = answer_rule(rules, so);
  // A required or named call comes with no text before it (as vLLM's required mode and Anthropic's
  // any / tool make it); otherwise the text is free.
  if (answer.empty()) answer = tools_required ? "\"\"" : "k3-char*";
  std::string output;
  if (start == tokenizer::Channel::think) output = "k3-char* " + close_tag("think") + " ";
  output += open_tag("response") + " " + answer + " " + close_tag("response");

  if (tools_allowed && (tools_required || any_strict)) {
    std::vector<std::pair<std::string, std::string>> tools;  // (attribute text, args rule)
    for (size_t i = 0; i < chat.tools.size(); ++i) {
      const Json& fn = chat.tools[i]["function"];
      const std::string name = fn.value("name", "");
      if (!chat.tool_policy.only_name.empty() && name != chat.tool_policy.only_name) continue;
      std::string args;                             // what follows the call's <|sep|>, up to <|close|>call
      if (fn.value("strict", chat.tools_strict)) {  // the JSON block only: its object must match the schema
        const Json params = fn.contains("parameters") ? fn["parameters"] : Json{{"type", "object"}};
        args = open_tag("json type=\"object\"") + " " +
               converting("tools[" + std::to_string(i) + "].function.parameters",
                          [&] {
                            JsonSchemaConverter c(rules, "tool-" + name);
                            return c.convert(params);
                          }) +
               " " + close_tag("json");
      } else {
        args = generic_arguments(rules);
      }
      tools.push_back({escape_attr(name), args});
    }
    // One call rule for every position (index="1", "2", ...: any number, as the parser reads it), so
    // the calls share their grammar positions and token masks.
    std::string body;
    for (const auto& [attr, args] : tools)
      body += (body.empty() ? "" : " | ") + ebnf_literal(attr + "\" index=\"") + " [1-9] [0-9]? \"\\\"\" <|sep|> " +
              args;
    rules.add("k3-call", "<|open|> " + ebnf_literal("call tool=\"") + " (" + body + ") " + close_tag("call"));
    rules.add("k3-tools",
              open_tag("tools") + (chat.tool_policy.single ? " k3-call " : " k3-call+ ") + close_tag("tools"));
    output += tools_required ? " k3-tools" : " k3-tools?";
  }
  output += " " + close_tag("message");
  rules.add("k3-output", output);
  return (so.grammar ? *so.grammar + "\n" : "") + rules.text();
}

std::shared_ptr<const structured::CompiledGrammar> compile_output_grammar(const std::string& text,
                                                                          const ParseContext& ctx,
                                                                          const std::string& field) {
  if (!ctx.grammars)
    throw bad_request("'" + field + "' needs constrained decoding, which this server was started without", field);
  try {
    return ctx.grammars->get(text, "k3-output");
  } catch (const core::Error& e) {
    throw bad_request("'" + field + "' cannot be enforced: " + e.what(), field);
  }
}

std::shared_ptr<const structured::Vocabulary> grammar_vocabulary(const tokenizer::Tokenizer& tokenizer,
                                                                 int32_t model_vocab, int32_t eos) {
  std::vector<std::string> names;
  std::vector<std::pair<int32_t, structured::Vocabulary::Token>> tokens;
  for (const tokenizer::SpecialToken& s : tokenizer.specials()) {
    if (s.id >= model_vocab) continue;
    tokens.push_back({s.id, {"", static_cast<int>(names.size())}});
    names.push_back(s.text);
  }
  const int32_t n = std::min(model_vocab, tokenizer.vocab_size());
  for (int32_t id = 0; id < n; ++id) {
    if (tokenizer.is_special(id)) continue;
    try {
      tokens.push_back({id, {std::string(tokenizer.token_bytes(id)), -1}});
    } catch (const core::Error&) {
      // an id with no token (a hole in the ranks): never allowed under a grammar
    }
  }
  if (eos < 0)
    if (auto e = tokenizer.special_id("<|end_of_msg|>")) eos = *e;
  std::vector<int32_t> ends;
  if (eos >= 0 && eos < model_vocab) ends.push_back(eos);
  return std::make_shared<const structured::Vocabulary>(model_vocab, tokens, std::move(names), std::move(ends));
}

}  // namespace k3::server
