// server/server_structured_test.cpp: constrained outputs through the HTTP APIs on the real tiny model
// (random weights, sampled at temperature 1 over several seeds, so the grammar, not the model, is
// what makes the outputs valid):
//   - chat response_format json_schema / json_object, structured_outputs and guided_* (json, regex,
//     choice, grammar), completions with structured_outputs: every finished output meets its
//     constraint;
//   - tool_choice required and named with a strict tool: the output is tool calls whose arguments
//     meet the tool's schema; the Messages API (tool_choice any, output_config.format) and the
//     Responses API (text.format, and a namespace tool as Codex sends it under tool_choice required) likewise;
//   - what cannot be enforced is a 400 naming the field and the reason.
#include <gtest/gtest.h>

#include <regex>

#include "server/server_test_util.h"

namespace k3::server {
namespace {

using testing::post;

// The tiny model with a context that holds a schema's system message and a long answer.
testing::ModelServer& model_server() {
  static testing::ModelServer s(4096);
  return s;
}

// Short sentences only, so random weights finish well inside max_tokens.
const Json kSchema = {{"type", "object"},
                      {"properties",
                       {{"color", {{"enum", {"red", "green", "blue"}}}},
                        {"size", {{"type", "integer"}, {"minimum", 1}, {"maximum", 12}}},
                        {"flags", {{"type", "array"}, {"items", {{"type", "boolean"}}}, {"maxItems", 2}}}}},
                      {"required", {"color", "size"}},
                      {"additionalProperties", false}};

void expect_meets_schema(const Json& j) {
  ASSERT_TRUE(j.is_object()) << j.dump();
  EXPECT_TRUE(j["color"] == "red" || j["color"] == "green" || j["color"] == "blue") << j.dump();
  ASSERT_TRUE(j["size"].is_number_integer()) << j.dump();
  EXPECT_GE(j["size"].get<int>(), 1);
  EXPECT_LE(j["size"].get<int>(), 12);
  if (j.contains("flags")) EXPECT_LE(j["flags"].size(), 2u);
  for (const auto& [k, _] : j.items()) EXPECT_TRUE(k == "color" || k == "size" || k == "flags") << k;
}

Json chat(Json extra, uint64_t seed) {
  Json b = {{"model", "k3-tiny"}, {"messages", Json::array({{{"role", "user"}, {"content", "Pick."}}})},
            {"max_tokens", 300},  {"temperature", 1.0},
            {"seed", seed},       {"chat_template_kwargs", {{"thinking", false}}}};
  for (auto& [k, v] : extra.items()) b[k] = v;
  return b;
}

// The content of each choice, over `seeds` seeds. Every one must have finished unless `may_cut`
// (constraints with unbounded strings, which random weights can run past max_tokens): then the cut
// ones are left out, and at least one must have finished.
std::vector<std::string> contents(const Json& extra, int seeds = 4, bool may_cut = false) {
  std::vector<std::string> out;
  for (int s = 1; s <= seeds; ++s) {
    const testing::Reply r = post(model_server().port, "/v1/chat/completions", chat(extra, static_cast<uint64_t>(s)));
    EXPECT_EQ(r.status, 200) << r.body;
    if (r.status != 200) continue;
    const Json j = r.json();
    if (may_cut && j["choices"][0]["finish_reason"] == "length") continue;
    EXPECT_EQ(j["choices"][0]["finish_reason"], "stop") << r.body;
    out.push_back(j["choices"][0]["message"]["content"].get<std::string>());
  }
  EXPECT_FALSE(out.empty()) << "no output finished: " << extra.dump();
  return out;
}

TEST(ServerStructured, ChatJsonSchemaAndJsonObject) {
  const Json rf = {{"type", "json_schema"}, {"json_schema", {{"name", "pick"}, {"schema", kSchema}, {"strict", true}}}};
  for (const std::string& c : contents({{"response_format", rf}})) expect_meets_schema(Json::parse(c));
  for (const std::string& c : contents({{"structured_outputs", {{"json", kSchema}}}}))
    expect_meets_schema(Json::parse(c));
  for (const std::string& c : contents({{"guided_json", kSchema.dump()}})) expect_meets_schema(Json::parse(c));
  for (const std::string& c : contents({{"response_format", {{"type", "json_object"}}}, {"max_tokens", 1500}}, 4, true))
    EXPECT_TRUE(Json::parse(c).is_object()) << c;
}

TEST(ServerStructured, RegexChoiceAndGrammar) {
  for (const std::string& c : contents({{"guided_regex", "[a-c]{2,4}-[0-9]{3}"}}))
    EXPECT_TRUE(std::regex_match(c, std::regex("[a-c]{2,4}-[0-9]{3}"))) << c;
  for (const std::string& c : contents({{"structured_outputs", {{"choice", {"yes", "no", "maybe so"}}}}}))
    EXPECT_TRUE(c == "yes" || c == "no" || c == "maybe so") << c;
  const std::string g = "root ::= greeting \" \" name\ngreeting ::= \"hi\" | \"hello\"\nname ::= [A-Z] [a-z]{1,5}";
  for (const std::string& c : contents({{"guided_grammar", g}}))
    EXPECT_TRUE(std::regex_match(c, std::regex("(hi|hello) [A-Z][a-z]{1,5}"))) << c;
  // Completions: the text itself.
  for (uint64_t s = 1; s <= 3; ++s) {
    const Json body = {{"model", "k3-tiny"}, {"prompt", "Code:"}, {"max_tokens", 40},
                       {"temperature", 1.0}, {"seed", s},         {"structured_outputs", {{"regex", "[0-9]{4}"}}}};
    const testing::Reply r = post(model_server().port, "/v1/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_TRUE(std::regex_match(r.json()["choices"][0]["text"].get<std::string>(), std::regex("[0-9]{4}"))) << r.body;
  }
}

const Json kStrictTool = {{"type", "function"},
                          {"function", {{"name", "paint"}, {"parameters", kSchema}, {"strict", true}}}};
// A second strict tool (random weights write free text forever, so a loose tool's argument
// elements would rarely end inside max_tokens: the scripted tests cover those).
const Json kOtherTool = {{"type", "function"},
                         {"function",
                          {{"name", "noop"},
                           {"strict", true},
                           {"parameters",
                            {{"type", "object"},
                             {"properties", {{"x", {{"type", "boolean"}}}}},
                             {"required", {"x"}},
                             {"additionalProperties", false}}}}}};

TEST(ServerStructured, RequiredAndNamedToolCallsMeetTheirSchema) {
  for (const Json& tc : {Json("required"), Json{{"type", "function"}, {"function", {{"name", "paint"}}}}}) {
    for (uint64_t s = 1; s <= 3; ++s) {
      const Json b = chat({{"tools", Json::array({kStrictTool, kOtherTool})},
                           {"tool_choice", tc},
                           {"parallel_tool_calls", false},
                           {"max_tokens", 400}},
                          s);
      const testing::Reply r = post(model_server().port, "/v1/chat/completions", b);
      ASSERT_EQ(r.status, 200) << r.body;
      const Json reply = r.json();
      const Json& choice = reply["choices"][0];
      ASSERT_EQ(choice["finish_reason"], "tool_calls") << r.body;
      const Json& calls = choice["message"]["tool_calls"];
      ASSERT_EQ(calls.size(), 1u) << r.body;  // parallel_tool_calls false: exactly one
      const std::string name = calls[0]["function"]["name"];
      const Json args = Json::parse(calls[0]["function"]["arguments"].get<std::string>());
      if (tc.is_object()) EXPECT_EQ(name, "paint");
      if (name == "paint") expect_meets_schema(args);
      else EXPECT_TRUE(args.is_object() && args.size() == 1 && args["x"].is_boolean()) << args.dump();
    }
  }
}

TEST(ServerStructured, MessagesAndResponsesApis) {
  const Json tool = {{"name", "paint"}, {"input_schema", kSchema}, {"strict", true}};
  for (uint64_t s = 1; s <= 2; ++s) {
    const Json b = {{"model", "k3-tiny"},
                    {"max_tokens", 400},
                    {"temperature", 1.0},
                    {"messages", Json::array({{{"role", "user"}, {"content", "Paint."}}})},
                    {"tools", Json::array({tool})},
                    // One call: random weights would otherwise call on until max_tokens.
                    {"tool_choice", {{"type", "any"}, {"disable_parallel_tool_use", true}}},
                    {"thinking", {{"type", "disabled"}}},
                    {"metadata", {{"user_id", "seed-" + std::to_string(s)}}}};
    const testing::Reply r = post(model_server().port, "/v1/messages", b);
    ASSERT_EQ(r.status, 200) << r.body;
    const Json j = r.json();
    ASSERT_EQ(j["stop_reason"], "tool_use") << r.body;
    ASSERT_EQ(j["content"].size(), 1u) << r.body;  // the call alone: no text before it
    ASSERT_EQ(j["content"][0]["type"], "tool_use") << r.body;
    expect_meets_schema(j["content"][0]["input"]);
  }
  const Json m = {{"model", "k3-tiny"},
                  {"max_tokens", 300},
                  {"messages", Json::array({{{"role", "user"}, {"content", "Pick."}}})},
                  {"thinking", {{"type", "disabled"}}},
                  {"output_config", {{"format", {{"type", "json_schema"}, {"schema", kSchema}}}}}};
  const testing::Reply mr = post(model_server().port, "/v1/messages", m);
  ASSERT_EQ(mr.status, 200) << mr.body;
  const Json mj = mr.json();
  for (const Json& block : mj["content"])
    if (block["type"] == "text") expect_meets_schema(Json::parse(block["text"].get<std::string>()));
  const Json rb = {{"model", "k3-tiny"},
                   {"input", "Pick."},
                   {"max_output_tokens", 300},
                   {"reasoning", {{"effort", "none"}}},
                   {"text", {{"format", {{"type", "json_schema"}, {"name", "pick"}, {"schema", kSchema}}}}}};
  const testing::Reply rr = post(model_server().port, "/v1/responses", rb);
  ASSERT_EQ(rr.status, 200) << rr.body;
  const Json rj = rr.json();
  EXPECT_EQ(rj["status"], "completed") << rr.body;
  for (const Json& item : rj["output"])
    if (item["type"] == "message") expect_meets_schema(Json::parse(item["content"][0]["text"].get<std::string>()));
}

// Codex sends some of its tools inside a Responses "namespace" tool: they are flattened into
// function tools, so tool_choice required binds them like any other (strict by default there).
TEST(ServerStructured, ResponsesNamespaceToolsAreBoundByToolChoiceRequired) {
  const Json tools = Json::array(
      {{{"type", "namespace"},
        {"name", "painter"},
        {"tools", Json::array({{{"type", "function"}, {"name", "paint"}, {"parameters", kSchema}}})}}});
  for (int s = 1; s <= 2; ++s) {
    const Json b = {{"model", "k3-tiny"},
                    {"input", "Paint " + std::to_string(s) + "."},
                    {"max_output_tokens", 400},
                    {"temperature", 1.0},
                    {"reasoning", {{"effort", "none"}}},
                    {"tools", tools},
                    {"tool_choice", "required"},
                    {"parallel_tool_calls", false}};
    const testing::Reply r = post(model_server().port, "/v1/responses", b);
    ASSERT_EQ(r.status, 200) << r.body;
    const Json j = r.json();
    int calls = 0;
    for (const Json& item : j["output"]) {
      if (item["type"] != "function_call") continue;
      ++calls;
      EXPECT_EQ(item["name"], "paint") << r.body;
      EXPECT_EQ(item["namespace"], "painter") << r.body;
      expect_meets_schema(Json::parse(item["arguments"].get<std::string>()));
    }
    EXPECT_EQ(calls, 1) << r.body;
  }
}

TEST(ServerStructured, WhatCannotBeEnforcedIsA400NamingIt) {
  auto expect_400 = [](const Json& extra, const std::string& param, const std::string& needle) {
    const testing::Reply r = post(model_server().port, "/v1/chat/completions", chat(extra, 1));
    ASSERT_EQ(r.status, 400) << r.body;
    const Json e = r.json()["error"];
    EXPECT_EQ(e["param"], param) << r.body;
    EXPECT_NE(e["message"].get<std::string>().find(needle), std::string::npos) << r.body;
  };
  expect_400({{"response_format",
               {{"type", "json_schema"},
                {"json_schema", {{"name", "x"}, {"schema", {{"type", "array"}, {"uniqueItems", true}}}}}}}},
             "response_format.json_schema.schema", "unsupported JSON Schema keyword 'uniqueItems'");
  expect_400({{"guided_regex", "a(?=b)"}}, "guided_regex", "lookaround");
  expect_400({{"guided_grammar", "root ::= \"a"}}, "guided_grammar", "line 1 column");
  expect_400({{"guided_regex", "a"}, {"guided_choice", {"b"}}}, "guided_choice", "both constrain the output");
  expect_400({{"guided_regex", "a"}, {"response_format", {{"type", "json_object"}}}}, "guided_regex",
             "both constrain the output");
  expect_400({{"guided_choice", Json::array()}}, "guided_choice", "non-empty array");
  Json bad_tool = kStrictTool;
  bad_tool["function"]["parameters"] = {{"type", "object"}, {"patternProperties", {{"^x", {{"type", "string"}}}}}};
  expect_400({{"tools", Json::array({bad_tool})}, {"tool_choice", "required"}}, "tools[0].function.parameters",
             "'patternProperties'");
}

}  // namespace
}  // namespace k3::server
