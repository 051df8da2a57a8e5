// tokenizer/output_parser_stream_test.cpp: the parser's streaming events for tool calls
// (tool_call_begin, tool_call_arguments, then tool_call or error), fed whole and one byte at a
// time: the argument fragments of a call that completes concatenate to exactly its final
// arguments (so a client that appends them, as OpenAI and Anthropic clients do, ends with the
// same JSON as a non-streaming reply), string values stream inside the string, and a malformed
// call reports the call's exact text (which the server shows as content instead of dropping it).
#include <gtest/gtest.h>

#include <map>

#include "tokenizer/k3_tokens.h"
#include "tokenizer/output_parser.h"

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

static_assert(k3_tokens::kOpen == O && k3_tokens::kClose == C && k3_tokens::kSep == S && k3_tokens::kEndOfMsg == E);

// One call as its events told it.
struct CallLog {
  bool begun = false, completed = false, failed = false;
  std::string name;                    // from tool_call_begin
  std::vector<std::string> fragments;  // tool_call_arguments, in order
  std::string arguments;               // tool_call's final arguments
  std::string raw, error;              // tool_call / error: the call's text; error: what failed
  std::string streamed() const {
    std::string s;
    for (const std::string& f : fragments) s += f;
    return s;
  }
};

struct Events {
  std::string reasoning, content;
  std::map<int, CallLog> calls;
  std::vector<std::string> other_errors;  // errors that are not a call's
};

// Feeds `text` whole (chunk 0) or `chunk` bytes at a time, checking the order of each call's
// events: begin, then fragments, then exactly one tool_call or error, nothing after it.
Events run(std::string_view text, Channel start, size_t chunk) {
  OutputParser p(start);
  std::vector<OutputEvent> events;
  if (chunk == 0) {
    p.feed(text, events);
  } else {
    for (size_t pos = 0; pos < text.size(); pos += chunk) p.feed(text.substr(pos, chunk), events);
  }
  p.finish(events);
  Events r;
  for (const OutputEvent& e : events) {
    CallLog* c = nullptr;
    if (e.kind != OutputEvent::Kind::reasoning && e.kind != OutputEvent::Kind::content &&
        !(e.kind == OutputEvent::Kind::error && e.raw.empty())) {
      c = &r.calls[e.call.index];
      EXPECT_FALSE(c->completed || c->failed) << "an event after call " << e.call.index << " ended";
    }
    switch (e.kind) {
      case OutputEvent::Kind::reasoning: r.reasoning += e.text; break;
      case OutputEvent::Kind::content: r.content += e.text; break;
      case OutputEvent::Kind::tool_call_begin:
        EXPECT_FALSE(c->begun) << "call " << e.call.index << " began twice";
        c->begun = true;
        c->name = e.call.name;
        break;
      case OutputEvent::Kind::tool_call_arguments:
        EXPECT_TRUE(c->begun) << "arguments before the call began";
        EXPECT_FALSE(e.text.empty()) << "an empty fragment";
        c->fragments.push_back(e.text);
        break;
      case OutputEvent::Kind::tool_call:
        EXPECT_TRUE(c->begun);
        EXPECT_EQ(e.call.name, c->name);
        c->completed = true;
        c->arguments = e.call.arguments;
        c->raw = e.raw;
        break;
      case OutputEvent::Kind::error:
        if (e.raw.empty()) {
          r.other_errors.push_back(e.text);
        } else {
          c->failed = true;
          c->raw = e.raw;
          c->error = e.text;
        }
        break;
    }
  }
  return r;
}

// A tools block after an empty response, as a chat with tools ends.
std::string tools_block(const std::string& calls) {
  return C "response" S O "tools" S + calls + C "tools" S C "message" S E;
}
std::string call(const std::string& name, int index, const std::string& body) {
  return O "call tool=\"" + name + "\" index=\"" + std::to_string(index) + "\"" S + body + C "call" S;
}
std::string arg(const std::string& key, const std::string& type, const std::string& value) {
  return O "argument key=\"" + key + "\" type=\"" + type + "\"" S + value + C "argument" S;
}

// Every completed call: streamed fragments == final arguments, which parse as JSON.
void expect_streams_match(const Events& r) {
  for (const auto& [index, c] : r.calls) {
    if (!c.completed) continue;
    EXPECT_EQ(c.streamed(), c.arguments) << "call " << index;
    EXPECT_TRUE(json::accept(c.arguments)) << c.arguments;
  }
}

// Whole and byte by byte agree on everything but how the fragments are cut.
void expect_same_result(const Events& a, const Events& b) {
  EXPECT_EQ(a.reasoning, b.reasoning);
  EXPECT_EQ(a.content, b.content);
  EXPECT_EQ(a.other_errors, b.other_errors);
  ASSERT_EQ(a.calls.size(), b.calls.size());
  for (const auto& [index, c] : a.calls) {
    const CallLog& d = b.calls.at(index);
    EXPECT_EQ(c.begun, d.begun);
    EXPECT_EQ(c.completed, d.completed);
    EXPECT_EQ(c.failed, d.failed);
    EXPECT_EQ(c.name, d.name);
    EXPECT_EQ(c.arguments, d.arguments);
    EXPECT_EQ(c.raw, d.raw);
    EXPECT_EQ(c.error, d.error);
    if (c.completed) {
      EXPECT_EQ(c.streamed(), d.streamed());
    }
  }
}

// Both ways, checked against each other; returns the byte-by-byte run.
Events run_both(const std::string& text, Channel start = Channel::response) {
  const Events whole = run(text, start, 0);
  const Events bytes = run(text, start, 1);
  expect_streams_match(whole);
  expect_streams_match(bytes);
  expect_same_result(whole, bytes);
  return bytes;
}

TEST(OutputParserStream, TypedArgumentsStreamToTheirFinalArguments) {
  const std::string c = call("f", 1,
                             arg("s", "string", "Paris \"quoted\" back\\slash\ttab\nline a<b <|x") +
                                 arg("n", "number", " -3.5e1 ") + arg("o", "object", "{\"a\": [1, {\"b\": null}]}") +
                                 arg("a", "array", "[1, \"x\", []]") + arg("t", "boolean", "true") +
                                 arg("z", "null", "null") + arg("last", "string", ""));
  const Events r = run_both(tools_block(c));
  ASSERT_EQ(r.calls.size(), 1u);
  const CallLog& log = r.calls.at(0);
  ASSERT_TRUE(log.completed) << log.error;
  EXPECT_EQ(log.name, "f");
  EXPECT_EQ(json::parse(log.arguments), json::parse(R"({"s": "Paris \"quoted\" back\\slash\ttab\nline a<b <|x",
      "n": -3.5e1, "o": {"a": [1, {"b": null}]}, "a": [1, "x", []], "t": true, "z": null, "last": ""})"));
  EXPECT_TRUE(r.other_errors.empty());
}

// Non-ASCII string values fed one whole character at a time, as the server's incremental
// detokenizer feeds the parser.
TEST(OutputParserStream, NonAsciiStringValuesFedCharacterByCharacter) {
  const std::string value = "São Paulo — 東京 🚀";
  const std::string text = tools_block(call("f", 1, arg("city", "string", value)));
  OutputParser p(Channel::response);
  std::vector<OutputEvent> events;
  for (size_t pos = 0; pos < text.size();) {
    size_t n = 1;
    while (pos + n < text.size() && (static_cast<unsigned char>(text[pos + n]) & 0xC0) == 0x80) ++n;
    p.feed(std::string_view(text).substr(pos, n), events);
    pos += n;
  }
  p.finish(events);
  std::string streamed, final_arguments;
  for (const OutputEvent& e : events) {
    if (e.kind == OutputEvent::Kind::tool_call_arguments) streamed += e.text;
    if (e.kind == OutputEvent::Kind::tool_call) final_arguments = e.call.arguments;
  }
  EXPECT_EQ(streamed, final_arguments);
  EXPECT_EQ(json::parse(final_arguments)["city"], value);
}

// BUG (disabled until fixed): a feed that cuts a character in two streams each half of it as
// U+FFFD (json_string of a partial UTF-8 sequence), while the final arguments, built from the
// whole value, have the character: the fragments no longer concatenate to the arguments. The
// server never cuts characters (its detokenizer emits whole ones), but OutputParser::feed does
// not ask for whole characters. Fix: hold a trailing incomplete UTF-8 sequence of a string
// value back until the next feed (or the argument's close), as the detokenizer does.
TEST(OutputParserStream, NonAsciiStringValuesFedByteByByte) {
  const Events r = run_both(tools_block(call("f", 1, arg("city", "string", "São Paulo — 東京 🚀"))));
  const CallLog& log = r.calls.at(0);
  ASSERT_TRUE(log.completed) << log.error;
  EXPECT_EQ(json::parse(log.arguments)["city"], "São Paulo — 東京 🚀");
}

TEST(OutputParserStream, StringValuesArriveInPiecesWhileGenerated) {
  const std::string text = tools_block(call("get_weather", 1, arg("city", "string", "Paris") + arg("days", "number", "3")));
  const Events whole = run(text, Channel::response, 0);
  const Events bytes = run(text, Channel::response, 1);
  // Whole: the opening, the value, the closing quote, the number, the brace.
  EXPECT_EQ(whole.calls.at(0).fragments,
            (std::vector<std::string>{"{\"city\":\"", "Paris", "\"", ",\"days\":3", "}"}));
  // Byte by byte: the value streams one character at a time, inside its string.
  const std::vector<std::string>& f = bytes.calls.at(0).fragments;
  ASSERT_EQ(f.size(), 9u) << ::testing::PrintToString(f);
  EXPECT_EQ(f[0], "{\"city\":\"");
  EXPECT_EQ((std::vector<std::string>(f.begin() + 1, f.begin() + 6)), (std::vector<std::string>{"P", "a", "r", "i", "s"}));
  EXPECT_EQ(bytes.calls.at(0).arguments, "{\"city\":\"Paris\",\"days\":3}");
  EXPECT_EQ(bytes.calls.at(0).streamed(), bytes.calls.at(0).arguments);
}

TEST(OutputParserStream, JsonBlockStreamsWholeAtItsEnd) {
  const Events r = run_both(tools_block(call("get_time", 1, O "json type=\"object\"" S "  {\"tz\": \"CET\", \"n\": [1]}\n" C "json" S)));
  const CallLog& log = r.calls.at(0);
  ASSERT_TRUE(log.completed) << log.error;
  EXPECT_EQ(log.fragments, (std::vector<std::string>{"{\"tz\": \"CET\", \"n\": [1]}"}));  // checked whole first
  EXPECT_EQ(log.arguments, "{\"tz\": \"CET\", \"n\": [1]}");
}

TEST(OutputParserStream, ZeroArgumentsStreamAnEmptyObject) {
  const Events r = run_both(tools_block(call("ping", 1, "")));
  const CallLog& log = r.calls.at(0);
  ASSERT_TRUE(log.completed);
  EXPECT_EQ(log.fragments, (std::vector<std::string>{"{}"}));
  EXPECT_EQ(log.arguments, "{}");
}

TEST(OutputParserStream, TwoCallsStreamSeparately) {
  const std::string first = call("get_weather", 1, arg("city", "string", "Paris") + arg("days", "number", "3"));
  const std::string second = call("get_time", 2, O "json type=\"object\"" S "{\"tz\": \"CET\"}" C "json" S);
  const Events r = run_both("I need the weather." C "think" S O "response" S C "response" S O "tools" S + first + second +
                             C "tools" S C "message" S E,
                         Channel::think);
  EXPECT_EQ(r.reasoning, "I need the weather.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls.at(0).name, "get_weather");
  EXPECT_EQ(json::parse(r.calls.at(0).arguments), json::parse(R"({"city": "Paris", "days": 3})"));
  EXPECT_EQ(r.calls.at(0).raw, first);  // a good call keeps its text too
  EXPECT_EQ(r.calls.at(1).name, "get_time");
  EXPECT_EQ(r.calls.at(1).arguments, "{\"tz\": \"CET\"}");
  EXPECT_EQ(r.calls.at(1).raw, second);
}

struct Malformed {
  std::string name;
  std::string call_text;  // the call as generated (what `raw` must be)
  std::string after;      // what follows it in the output
  std::string needle;     // in the error
  bool begins = true;     // tool_call_begin is sent (the header was good)
};

class OutputParserStreamMalformed : public ::testing::TestWithParam<Malformed> {};

TEST_P(OutputParserStreamMalformed, ErrorCarriesTheCallsExactText) {
  const Malformed& m = GetParam();
  const std::string text = C "response" S O "tools" S + m.call_text + m.after;
  for (size_t chunk : {size_t{0}, size_t{1}}) {
    const Events r = run(text, Channel::response, chunk);
    ASSERT_TRUE(r.calls.count(0)) << "chunk " << chunk;
    const CallLog& log = r.calls.at(0);
    EXPECT_TRUE(log.failed) << "chunk " << chunk;
    EXPECT_FALSE(log.completed);
    EXPECT_EQ(log.begun, m.begins);
    EXPECT_EQ(log.raw, m.call_text) << "chunk " << chunk;
    EXPECT_NE(log.error.find(m.needle), std::string::npos) << log.error;
    EXPECT_NE(log.error.find("tool call 0"), std::string::npos) << log.error;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Calls, OutputParserStreamMalformed,
    ::testing::Values(
        Malformed{"bad_number", call("f", 1, arg("n", "number", "12abc")), C "tools" S C "message" S E,
                  "is not a valid JSON number"},
        Malformed{"unclosed_argument",
                  O "call tool=\"f\" index=\"1\"" S O "argument key=\"s\" type=\"string\"" S "abc" C "call" S,
                  C "tools" S C "message" S E, "was not closed"},
        Malformed{"missing_name", O "call index=\"1\"" S + arg("s", "string", "x") + C "call" S,
                  C "tools" S C "message" S E, "no tool=", false},
        Malformed{"ends_inside_the_call",
                  O "call tool=\"f\" index=\"1\"" S O "argument key=\"s\" type=\"string\"" S "Par", "",
                  "ended inside the call"},
        Malformed{"end_of_msg_inside_the_call",
                  O "call tool=\"f\" index=\"1\"" S O "argument key=\"s\" type=\"string\"" S "Par", E,
                  "ended inside the call"},
        Malformed{"ends_inside_a_marker",
                  O "call tool=\"f\" index=\"1\"" S O "argument key=\"s\" type=\"string\"" S "Par<|clo", "",
                  "ended inside the call"}),
    [](const auto& info) { return info.param.name; });

// A good call after a bad one still comes through, with the next index.
TEST(OutputParserStream, GoodCallAfterAMalformedOne) {
  const Events r = run_both(tools_block(call("f", 1, arg("n", "number", "12abc")) + call("g", 2, arg("x", "boolean", "false"))));
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_TRUE(r.calls.at(0).failed);
  EXPECT_TRUE(r.calls.at(0).fragments.empty());  // a typed value is checked before it is streamed
  ASSERT_TRUE(r.calls.at(1).completed);
  EXPECT_EQ(r.calls.at(1).arguments, "{\"x\":false}");
}

// The model may skip <|close|>think: the <|open|> of the tools block closes the channel.
TEST(OutputParserStream, CallAfterAnUnclosedThinkChannel) {
  const Events r = run_both("I must call it." O "tools" S + call("get_time", 1, arg("tz", "string", "CET")) +
                             C "tools" S C "message" S E,
                         Channel::think);
  EXPECT_EQ(r.reasoning, "I must call it.");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  ASSERT_TRUE(r.calls.at(0).completed) << r.calls.at(0).error;
  EXPECT_EQ(r.calls.at(0).arguments, "{\"tz\":\"CET\"}");
  EXPECT_TRUE(r.other_errors.empty()) << r.other_errors.front();
}

}  // namespace
}  // namespace k3::tokenizer
// clang-format on
