// tokenizer/output_parser_test.cpp: parsing K3 assistant output (think / response channels,
// typed tool calls, json blocks) at once and streamed in any chunking, round trips through the
// chat renderer, and malformed calls reported as errors instead of calls.
#include "tokenizer/output_parser.h"

#include <gtest/gtest.h>

#include "core/rng.h"
#include "tokenizer/chat_format.h"

namespace k3::tokenizer {
namespace {

using json = nlohmann::ordered_json;

#define O "<|open|>"
#define C "<|close|>"
#define S "<|sep|>"
#define E "<|end_of_msg|>"
// The expected texts are laid out one message per line out of these markers; clang-format would
// reflow them into one run.
// clang-format off

// Streams `text` in chunks of the given sizes (cycled) and folds the events like parse_output.
ParsedOutput parse_streamed(std::string_view text, Channel start, const std::vector<size_t>& sizes) {
  OutputParser p(start);
  std::vector<OutputEvent> events;
  for (size_t pos = 0, k = 0; pos < text.size(); ++k) {
    const size_t n = std::min(sizes[k % sizes.size()], text.size() - pos);
    p.feed(text.substr(pos, n), events);
    pos += n;
  }
  p.finish(events);
  ParsedOutput out;
  std::vector<int> begun;
  for (const OutputEvent& e : events) {
    if (e.kind == OutputEvent::Kind::reasoning || e.kind == OutputEvent::Kind::content) {
      for (const char* marker : {O, C, S, E}) {
        EXPECT_EQ(e.text.find(marker), std::string::npos) << "a marker leaked into text: [" << e.text << "] of [" << text << "]";
      }
    }
    switch (e.kind) {
      case OutputEvent::Kind::reasoning: out.reasoning += e.text; break;
      case OutputEvent::Kind::content: out.content += e.text; break;
      case OutputEvent::Kind::tool_call_begin: begun.push_back(e.call.index); break;
      case OutputEvent::Kind::tool_call:
        EXPECT_TRUE(std::find(begun.begin(), begun.end(), e.call.index) != begun.end());
        out.tool_calls.push_back(e.call);
        break;
      case OutputEvent::Kind::error: out.errors.push_back(e.text); break;
    }
  }
  out.complete = p.done();
  return out;
}

void expect_same(const ParsedOutput& a, const ParsedOutput& b) {
  EXPECT_EQ(a.reasoning, b.reasoning);
  EXPECT_EQ(a.content, b.content);
  ASSERT_EQ(a.tool_calls.size(), b.tool_calls.size());
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    EXPECT_EQ(a.tool_calls[i].index, b.tool_calls[i].index);
    EXPECT_EQ(a.tool_calls[i].name, b.tool_calls[i].name);
    EXPECT_EQ(a.tool_calls[i].arguments, b.tool_calls[i].arguments);
  }
  EXPECT_EQ(a.errors, b.errors);
  EXPECT_EQ(a.complete, b.complete);
}

// Every chunking gives what the one-shot parse gives.
ParsedOutput parse_all_ways(std::string_view text, Channel start) {
  const ParsedOutput whole = parse_output(text, start);
  for (const auto& sizes : std::vector<std::vector<size_t>>{{1}, {2}, {3, 1, 7}, {17}, {54}, {97}, {5, 11, 2}})
    expect_same(parse_streamed(text, start, sizes), whole);
  return whole;
}

TEST(OutputParser, ThinkThenResponse) {
  const auto out = parse_all_ways("I should greet.\n" C "think" S O "response" S "Hello there!" C "response" S
                                  C "message" S E "ignored after the end",
                                  Channel::think);
  EXPECT_EQ(out.reasoning, "I should greet.\n");
  EXPECT_EQ(out.content, "Hello there!");
  EXPECT_TRUE(out.tool_calls.empty());
  EXPECT_TRUE(out.errors.empty());
  EXPECT_TRUE(out.complete);
}

TEST(OutputParser, ResponseOnlyAndTextThatLooksLikeAMarker) {
  const auto out = parse_all_ways("a <| b |> c <|op <|close c" C "response" S C "message" S, Channel::response);
  EXPECT_EQ(out.content, "a <| b |> c <|op <|close c");
  EXPECT_TRUE(out.errors.empty());
  EXPECT_TRUE(out.complete);
}

TEST(OutputParser, StopsWithoutClosingIsStillText) {
  const auto out = parse_all_ways("thinking...", Channel::think);
  EXPECT_EQ(out.reasoning, "thinking...");
  EXPECT_FALSE(out.complete);
  const auto held = parse_all_ways("partial <|clo", Channel::response);  // flushed as text at the end
  EXPECT_EQ(held.content, "partial <|clo");
  // Cut off inside a marker (max_tokens ran out after its control token): the marker's beginning
  // is not content, in either channel or inside the tools block.
  const auto cut = parse_all_ways("right" C "messa", Channel::response);
  EXPECT_EQ(cut.content, "right");
  EXPECT_TRUE(cut.errors.empty());
  EXPECT_FALSE(cut.complete);
  EXPECT_EQ(parse_all_ways("hmm" C "thi", Channel::think).reasoning, "hmm");
  EXPECT_TRUE(parse_all_ways("hmm" C "thi", Channel::think).content.empty());
  const auto in_tools = parse_all_ways("a" C "response" S O "tools" S O "call tool=\"f", Channel::response);
  EXPECT_EQ(in_tools.content, "a");
  EXPECT_TRUE(in_tools.tool_calls.empty());
  ASSERT_EQ(in_tools.errors.size(), 1u);
  EXPECT_NE(in_tools.errors[0].find("ended inside the tools block"), std::string::npos) << in_tools.errors[0];
}

TEST(OutputParser, TypedArgumentsBecomeAJsonObject) {
  const std::string text = C "response" S O "tools" S O "call tool=\"get_weather\" index=\"1\"" S
                           O "argument key=\"city\" type=\"string\"" S "São \"Paulo\"\n" C "argument" S
                           O "argument key=\"days\" type=\"number\"" S "1e2" C "argument" S
                           O "argument key=\"metric\" type=\"boolean\"" S "true" C "argument" S
                           O "argument key=\"extra\" type=\"object\"" S "{\"a\": [1, null]}" C "argument" S
                           O "argument key=\"tags\" type=\"array\"" S "[\"x\"]" C "argument" S
                           O "argument key=\"none\" type=\"null\"" S "null" C "argument" S
                           C "call" S O "call tool=\"clock\" index=\"2\"" S C "call" S C "tools" S C "message" S E;
  const auto out = parse_all_ways(text, Channel::response);
  ASSERT_EQ(out.tool_calls.size(), 2u) << (out.errors.empty() ? "" : out.errors[0]);
  EXPECT_EQ(out.tool_calls[0].index, 0);
  EXPECT_EQ(out.tool_calls[0].name, "get_weather");
  // Strings are JSON-escaped; other values are kept exactly as written (1e2 stays 1e2).
  EXPECT_EQ(out.tool_calls[0].arguments,
            R"({"city":"São \"Paulo\"\n","days":1e2,"metric":true,"extra":{"a": [1, null]},"tags":["x"],"none":null})");
  EXPECT_TRUE(json::accept(out.tool_calls[0].arguments));
  EXPECT_EQ(out.tool_calls[1].index, 1);
  EXPECT_EQ(out.tool_calls[1].arguments, "{}");
  EXPECT_TRUE(out.errors.empty());
}

TEST(OutputParser, JsonBlockAndEscapedAttributes) {
  const auto out = parse_all_ways(C "response" S O "tools" S O "call tool=\"a&amp;b&quot;c\" index=\"1\"" S
                                  O "json type=\"object\"" S " {\"q\": [1, 2]} " C "json" S C "call" S C "tools" S
                                  C "message" S,
                                  Channel::response);
  ASSERT_EQ(out.tool_calls.size(), 1u);
  EXPECT_EQ(out.tool_calls[0].name, "a&b\"c");
  EXPECT_EQ(out.tool_calls[0].arguments, "{\"q\": [1, 2]}");
}

TEST(OutputParser, RoundTripsTheRendererOutput) {
  const json messages = json::parse(R"([{"role": "assistant", "reasoning_content": "I need both tools.",
      "content": "On it.", "tool_calls": [
        {"id": "a", "function": {"name": "search", "arguments":
          {"query": "k3 \"tokenizer\" docs", "filters": {"lang": "en", "year": 2026}, "exact": true}}},
        {"id": "b", "function": {"name": "fetch_url", "arguments": "{\"url\": \"https://x.test/?a=1&b=2\", \"n\": 2.5}"}}]}])");
  ChatOptions o;
  o.add_generation_prompt = false;
  const std::string rendered = render_chat(messages, json(), o);
  const std::string prompt = O "message role=\"assistant\"" S O "think" S;  // what the generation prompt ends with
  ASSERT_EQ(rendered.substr(0, prompt.size()), prompt);
  const auto out = parse_all_ways(rendered.substr(prompt.size()), Channel::think);
  EXPECT_EQ(out.reasoning, "I need both tools.");
  EXPECT_EQ(out.content, "On it.");
  ASSERT_EQ(out.tool_calls.size(), 2u);
  EXPECT_EQ(out.tool_calls[0].name, "search");
  EXPECT_EQ(json::parse(out.tool_calls[0].arguments), messages[0]["tool_calls"][0]["function"]["arguments"]);
  EXPECT_EQ(out.tool_calls[1].name, "fetch_url");
  EXPECT_EQ(json::parse(out.tool_calls[1].arguments),
            json::parse(messages[0]["tool_calls"][1]["function"]["arguments"].get<std::string>()));
  EXPECT_TRUE(out.errors.empty());
  EXPECT_TRUE(out.complete);
}

struct BadCall {
  std::string name, call_body, needle;
};

class OutputParserErrors : public ::testing::TestWithParam<BadCall> {};

TEST_P(OutputParserErrors, ReportTheCallInsteadOfReturningIt) {
  const BadCall& c = GetParam();
  const std::string text = C "response" S O "tools" S + c.call_body +
                           O "call tool=\"ok\" index=\"2\"" S C "call" S C "tools" S C "message" S E;
  const auto out = parse_all_ways(text, Channel::response);
  ASSERT_EQ(out.errors.size(), 1u);
  EXPECT_NE(out.errors[0].find(c.needle), std::string::npos) << out.errors[0];
  ASSERT_EQ(out.tool_calls.size(), 1u);  // the good call after it still comes through
  EXPECT_EQ(out.tool_calls[0].name, "ok");
  EXPECT_EQ(out.tool_calls[0].index, 1);
}

INSTANTIATE_TEST_SUITE_P(
    Calls, OutputParserErrors,
    ::testing::Values(
        BadCall{"bad_number", O "call tool=\"f\" index=\"1\"" S O "argument key=\"n\" type=\"number\"" S "12abc" C "argument" S C "call" S,
                "tool call 0 ('f'): argument 'n': value '12abc' is not a valid JSON number"},
        BadCall{"bool_mismatch", O "call tool=\"f\" index=\"1\"" S O "argument key=\"b\" type=\"boolean\"" S "1" C "argument" S C "call" S,
                "is not a valid JSON boolean"},
        BadCall{"unknown_type", O "call tool=\"f\" index=\"1\"" S O "argument key=\"d\" type=\"date\"" S "x" C "argument" S C "call" S,
                "unknown argument type 'date'"},
        BadCall{"duplicate_key", O "call tool=\"f\" index=\"1\"" S O "argument key=\"k\" type=\"string\"" S "a" C "argument" S
                                 O "argument key=\"k\" type=\"string\"" S "b" C "argument" S C "call" S,
                "argument 'k' is given twice"},
        BadCall{"no_name", O "call index=\"1\"" S C "call" S, "the call has no tool=\"...\" name"},
        BadCall{"json_not_object", O "call tool=\"f\" index=\"1\"" S O "json type=\"object\"" S "[1]" C "json" S C "call" S,
                "the json block is not a JSON object"},
        BadCall{"stray_text", O "call tool=\"f\" index=\"1\"" S "oops" C "call" S, "unexpected text 'oops' inside the call"},
        BadCall{"bad_attrs", O "call tool=f" S C "call" S, "malformed attributes"}),
    [](const auto& info) { return info.param.name; });

TEST(OutputParser, TruncatedCallIsAnError) {
  const auto out = parse_all_ways(C "response" S O "tools" S O "call tool=\"f\" index=\"1\"" S
                                  O "argument key=\"x\" type=\"string\"" S "abc",
                                  Channel::response);
  EXPECT_TRUE(out.tool_calls.empty());
  ASSERT_EQ(out.errors.size(), 1u);
  EXPECT_NE(out.errors[0].find("ended inside the call"), std::string::npos) << out.errors[0];
  EXPECT_FALSE(out.complete);
}

TEST(OutputParser, RandomGarbageNeverCrashesAndNeverLeaksMarkers) {
  core::Rng rng(13);
  const char* atoms[] = {O, C, S, E, "think", "response", "tools", "call", " tool=\"f\"", " key=\"k\"",
                         " type=\"string\"", "argument", "json", "message", "x", "<|", "{", "}", "\"", " "};
  for (int trial = 0; trial < 300; ++trial) {
    std::string text;
    const size_t n = rng.next_u64() % 60;
    for (size_t i = 0; i < n; ++i) text += atoms[rng.next_u64() % (sizeof atoms / sizeof atoms[0])];
    const auto out = parse_all_ways(text, trial % 2 ? Channel::think : Channel::response);
    for (const auto& call : out.tool_calls) EXPECT_TRUE(json::accept(call.arguments)) << call.arguments;
  }
}

}  // namespace
}  // namespace k3::tokenizer
// clang-format on
