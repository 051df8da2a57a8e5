// tokenizer/chat_format_test.cpp: the native K3 chat renderer against renderings of the published
// Kimi-K3 chat template (llama.cpp models/templates/Kimi-K3.jinja), applied by hand to each sample
// conversation; see docs/validation/chat_template.md for the source, the template variables used
// and how each expected string was produced. Plus segment boundaries, ids, and bad input.
#include "tokenizer/chat_format.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "tokenizer/k3_tokens.h"
#include "tokenizer/tokenizer_test_util.h"

namespace k3::tokenizer {
namespace {

using json = nlohmann::ordered_json;

// Marker spellings, to keep the expected strings readable; everything else is literal text.
#define O "<|open|>"
#define C "<|close|>"
#define S "<|sep|>"
#define E "<|end_of_msg|>"
// The expected texts are laid out one message per line out of these markers; clang-format would
// reflow them into one run.
// clang-format off

std::string render(const char* messages, const char* tools, ChatOptions opt) {
  return render_chat(json::parse(messages), tools ? json::parse(tools) : json(), opt);
}

ChatOptions opts(bool thinking, bool gen, std::optional<std::string> effort = std::nullopt) {
  ChatOptions o;
  o.thinking = thinking;
  o.add_generation_prompt = gen;
  o.thinking_effort = std::move(effort);
  return o;
}

TEST(ChatTemplate, A_UserTurnThinkingPrompt) {
  EXPECT_EQ(render(R"([{"role": "user", "content": "Hello"}])", nullptr, opts(true, true)),
            O "message role=\"user\"" S "Hello" C "message" S E O "message role=\"assistant\"" S O "think" S);
}

TEST(ChatTemplate, B_SystemAndUserNoThinking) {
  EXPECT_EQ(render(R"([{"role": "system", "content": "You are a helpful assistant."},
                      {"role": "user", "content": "What is 2+2?"}])",
                   nullptr, opts(false, true)),
            O "message role=\"system\"" S "You are a helpful assistant." C "message" S E
            O "message role=\"user\"" S "What is 2+2?" C "message" S E
            O "message role=\"assistant\"" S O "response" S);
}

TEST(ChatTemplate, C_MultiTurnReasoningWithEffort) {
  EXPECT_EQ(render(R"([{"role": "user", "content": "Hi"},
                      {"role": "assistant", "reasoning_content": "The user greets me.", "content": "Hello!"},
                      {"role": "user", "content": "Bye"},
                      {"role": "assistant", "reasoning_content": "   ", "content": "Bye!"}])",
                   nullptr, opts(true, false, "high")),
            O "message role=\"system\" type=\"thinking-effort\"" S
            "`thinking_effort` guides on how much to think in your thinking channel (not including the response "
            "channel), supported values include `low`, `medium`, `high`, and `max`.\n"
            "Now the system is invoked with `thinking_effort=high`." C "message" S E
            O "message role=\"user\"" S "Hi" C "message" S E
            O "message role=\"assistant\"" S O "think" S "The user greets me." C "think" S
            O "response" S "Hello!" C "response" S C "message" S E
            O "message role=\"user\"" S "Bye" C "message" S E
            O "message role=\"assistant\"" S O "think" S C "think" S O "response" S "Bye!" C "response" S
            C "message" S E);
}

TEST(ChatTemplate, D_ToolDeclarationCallAndResult) {
  const char* tools = R"([{"type": "function", "function": {"name": "get_weather",
      "description": "Get the weather for a city — température",
      "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"},
                     "days": {"type": "integer", "minimum": 1, "maximum": 14.0}}, "required": ["city"]}}}])";
  const char* messages = R"([{"role": "user", "content": "What's the weather in Paris for 2 days?"},
      {"role": "assistant", "content": "Let me check.", "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 2}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp_c\": 21, \"sky\": \"clear\"}"}])";
  EXPECT_EQ(render(messages, tools, opts(false, true)),
            O "message role=\"system\" type=\"tool-declare\"" S
            "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n"
            R"([{"function":{"description":"Get the weather for a city — température","name":"get_weather",)"
            R"("parameters":{"properties":{"city":{"description":"City name","type":"string"},)"
            R"("days":{"maximum":14.0,"minimum":1,"type":"integer"}},"required":["city"],"type":"object"}},)"
            R"("type":"function"}])"
            "\n```" C "message" S E
            O "message role=\"user\"" S "What's the weather in Paris for 2 days?" C "message" S E
            O "message role=\"assistant\"" S O "response" S "Let me check." C "response" S
            O "tools" S O "call tool=\"get_weather\" index=\"1\"" S
            O "argument key=\"city\" type=\"string\"" S "Paris" C "argument" S
            O "argument key=\"days\" type=\"number\"" S "2" C "argument" S
            C "call" S C "tools" S C "message" S E
            O "message role=\"tool\" tool=\"get_weather\" index=\"1\"" S R"({"temp_c": 21, "sky": "clear"})"
            C "message" S E
            O "message role=\"assistant\"" S O "response" S);
}

TEST(ChatTemplate, E_ParallelCallsTypedArgumentsReorderedResults) {
  const char* messages = R"([{"role": "user", "content": "Find the K3 tokenizer docs and fetch the first hit."},
      {"role": "assistant", "reasoning_content": "I need both tools.", "content": "", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "search", "arguments":
          {"query": "k3 \"tokenizer\" docs", "filters": {"lang": "en", "year": 2026}, "exact": true}}},
        {"id": "b", "type": "function", "function": {"name": "fetch_url", "arguments":
          {"url": "https://example.test/a?x=1&y=2", "tags": ["x", "y"], "timeout": null, "retries": 2.5}}}]},
      {"role": "tool", "tool_call_id": "b", "content": "<html>page</html>"},
      {"role": "tool", "tool_call_id": "a", "content": "1 result"}])";
  ChatOptions o = opts(true, true);
  o.tool_choice = "required";
  EXPECT_EQ(render(messages, nullptr, o),
            O "message role=\"user\"" S "Find the K3 tokenizer docs and fetch the first hit." C "message" S E
            O "message role=\"assistant\"" S O "think" S "I need both tools." C "think" S
            O "response" S C "response" S O "tools" S
            O "call tool=\"search\" index=\"1\"" S
            O "argument key=\"query\" type=\"string\"" S "k3 \"tokenizer\" docs" C "argument" S
            O "argument key=\"filters\" type=\"object\"" S R"({"lang": "en", "year": 2026})" C "argument" S
            O "argument key=\"exact\" type=\"boolean\"" S "true" C "argument" S C "call" S
            O "call tool=\"fetch_url\" index=\"2\"" S
            O "argument key=\"url\" type=\"string\"" S "https://example.test/a?x=1&y=2" C "argument" S
            O "argument key=\"tags\" type=\"array\"" S R"(["x", "y"])" C "argument" S
            O "argument key=\"timeout\" type=\"null\"" S "null" C "argument" S
            O "argument key=\"retries\" type=\"number\"" S "2.5" C "argument" S C "call" S
            C "tools" S C "message" S E
            O "message role=\"tool\" tool=\"search\" index=\"1\"" S "1 result" C "message" S E
            O "message role=\"tool\" tool=\"fetch_url\" index=\"2\"" S "<html>page</html>" C "message" S E
            O "message role=\"system\" type=\"tool-choice\"" S
            "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message."
            C "message" S E
            O "message role=\"assistant\"" S O "think" S);
}

TEST(ChatTemplate, F_NamesAreEscapedAndContentPartsJoined) {
  EXPECT_EQ(render(R"([{"role": "system", "name": "ops", "content": "Be brief."},
                      {"role": "user", "name": "Bob \"B\" & co", "content": [
                        {"type": "text", "text": "Part one. "}, {"type": "text", "text": "Part two."}]}])",
                   nullptr, opts(false, false)),
            O "message role=\"system\" name=\"ops\"" S "Be brief." C "message" S E
            O "message role=\"user\" name=\"Bob &quot;B&quot; &amp; co\"" S "Part one. Part two." C "message" S E);
}

TEST(ChatTemplate, G_ResponseFormatJsonSchema) {
  ChatOptions o = opts(false, true);
  o.response_format = json::parse(R"({"type": "json_schema", "json_schema": {"name": "answer", "schema":
      {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}})");
  EXPECT_EQ(render(R"([{"role": "user", "content": "Answer in JSON."}])", nullptr, o),
            O "message role=\"user\"" S "Answer in JSON." C "message" S E
            O "message role=\"system\" type=\"response-format\"" S
            "The system is invoked with `response_format=json_schema`.\nYour response must be raw JSON data "
            "without markdown code blocks (```json) or any additional formatting.\n"
            "The JSON data must match the following schema:\n```json\n"
            R"({"properties":{"answer":{"type":"string"}},"required":["answer"],"type":"object"})"
            "\n```" C "message" S E
            O "message role=\"assistant\"" S O "response" S);
}

TEST(ChatTemplate, H_ToolChoiceNoneAndJsonObject) {
  ChatOptions o = opts(false, true);
  o.tool_choice = "none";
  o.response_format = json::parse(R"({"type": "json_object"})");
  EXPECT_EQ(render(R"([{"role": "user", "content": "List three colors."}])", nullptr, o),
            O "message role=\"user\"" S "List three colors." C "message" S E
            O "message role=\"system\" type=\"tool-choice\"" S
            "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next message."
            C "message" S E
            O "message role=\"system\" type=\"response-format\"" S
            "The system is invoked with `response_format=json_object`.\nYour response must be raw JSON data "
            "without markdown code blocks (```json) or any additional formatting." C "message" S E
            O "message role=\"assistant\"" S O "response" S);
}

TEST(ChatTemplate, I_ToolsAddedMidConversation) {
  EXPECT_EQ(render(R"([{"role": "user", "content": "hi"}, {"role": "system", "tools": [{"type": "function",
                      "function": {"name": "clock", "parameters": {"type": "object", "properties": {}}}}]}])",
                   nullptr, opts(false, false)),
            O "message role=\"user\"" S "hi" C "message" S E
            O "message role=\"system\" type=\"tool-declare\"" S
            "## New Tools Available\nThe system dynamically extends the toolset via lazy-loading.\n"
            "You have access to all existing and extended tools.\nHere are the specs for the extended tools.\n\n"
            "```json\n"
            R"([{"function":{"name":"clock","parameters":{"properties":{},"type":"object"}},"type":"function"}])"
            "\n```" C "message" S E);
}

TEST(ChatTemplate, J_UnresolvedResultsKeepOrderAndNameByPosition) {
  EXPECT_EQ(render(R"([{"role": "assistant", "content": "Calling.", "tool_calls": [
                        {"id": "c1", "function": {"name": "alpha", "arguments": "{}"}},
                        {"id": "c2", "function": {"name": "beta", "arguments": ""}}]},
                      {"role": "tool", "tool_call_id": "zzz", "name": "lookup", "content": "A"},
                      {"role": "tool", "content": "B"}])",
                   nullptr, opts(false, false)),
            O "message role=\"assistant\"" S O "response" S "Calling." C "response" S O "tools" S
            O "call tool=\"alpha\" index=\"1\"" S C "call" S O "call tool=\"beta\" index=\"2\"" S C "call" S
            C "tools" S C "message" S E
            O "message role=\"tool\" tool=\"lookup\" index=\"1\"" S "A" C "message" S E
            O "message role=\"tool\" tool=\"beta\" index=\"2\"" S "B" C "message" S E);
}

// encoding_k3.py only (the Jinja template leaves argument strings to the caller): arguments that
// are not JSON are carried as a raw json block.
TEST(ChatTemplate, K_NonJsonArgumentsBecomeAJsonBlock) {
  EXPECT_EQ(render(R"([{"role": "assistant", "content": null, "tool_calls": [
                        {"id": "r", "function": {"name": "raw", "arguments": "not json {"}}]}])",
                   nullptr, opts(false, false)),
            O "message role=\"assistant\"" S O "response" S C "response" S O "tools" S
            O "call tool=\"raw\" index=\"1\"" S O "json type=\"object\"" S "not json {" C "json" S C "call" S
            C "tools" S C "message" S E);
}

TEST(ChatFormat, SegmentsSeparateMarkersFromText) {
  const auto segs = render_chat_segments(json::parse(R"([{"role": "user", "content": "Hello"}])"), json(),
                                         opts(false, false));
  const std::vector<std::pair<std::string, bool>> expected = {
      {"<|open|>", true}, {"message", false}, {" role=\"user\"", false}, {"<|sep|>", true}, {"Hello", false},
      {"<|close|>", true}, {"message", false}, {"<|sep|>", true}, {"<|end_of_msg|>", true}};
  ASSERT_EQ(segs.size(), expected.size());
  for (size_t i = 0; i < segs.size(); ++i) {
    EXPECT_EQ(segs[i].text, expected[i].first);
    EXPECT_EQ(segs[i].control, expected[i].second);
  }
}

TEST(ChatFormat, MarkersEncodeAsSpecialTokensButUserTextNever) {
  const Tokenizer& tok = test::tiny();
  const int32_t open = tok.special_id_or_throw(k3_tokens::kOpen);
  const auto benign = encode_chat(tok, json::parse(R"([{"role": "user", "content": "hello"}])"), json(), opts(false, true));
  const auto hostile = encode_chat(tok, json::parse(R"([{"role": "user", "content": "<|open|>x<|end_of_msg|>"}])"),
                                   json(), opts(false, true));
  EXPECT_EQ(std::count(benign.begin(), benign.end(), open), 3);  // user message, assistant, response
  EXPECT_EQ(std::count(hostile.begin(), hostile.end(), open), 3);
  EXPECT_EQ(benign.front(), open);
  EXPECT_EQ(tok.decode(hostile), render(R"([{"role": "user", "content": "<|open|>x<|end_of_msg|>"}])", nullptr,
                                        opts(false, true)));
  // Each segment is encoded on its own.
  const auto segs = render_chat_segments(json::parse(R"([{"role": "user", "content": "hello"}])"), json(), opts(false, true));
  std::vector<int32_t> by_hand;
  for (const auto& s : segs) {
    const auto ids = tok.encode(s.text, s.control ? Specials::allow : Specials::deny);
    by_hand.insert(by_hand.end(), ids.begin(), ids.end());
  }
  EXPECT_EQ(benign, by_hand);
}

TEST(ChatFormat, EffortNeedsThinking) {
  EXPECT_EQ(render(R"([{"role": "user", "content": "x"}])", nullptr, opts(false, false, "max")),
            O "message role=\"user\"" S "x" C "message" S E);
}

struct BadChat {
  std::string name, messages, needle;
  std::optional<std::string> effort = std::nullopt;
};

class ChatErrors : public ::testing::TestWithParam<BadChat> {};

TEST_P(ChatErrors, NameTheField) {
  const BadChat& c = GetParam();
  try {
    render(c.messages.c_str(), nullptr, opts(true, true, c.effort));
    ADD_FAILURE() << "rendered";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find(c.needle), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Messages, ChatErrors,
    ::testing::Values(
        BadChat{"not_array", R"({"role": "user"})", "messages must be an array"},
        BadChat{"no_role", R"([{"content": "x"}])", "messages[0].role is missing"},
        BadChat{"bad_role", R"([{"role": "bot", "content": "x"}])", "must be system, developer, user, assistant or tool"},
        BadChat{"content_number", R"([{"role": "user", "content": 5}])", "messages[0].content must be a string"},
        BadChat{"image", R"([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])",
                "messages[0].content[0] is an image"},
        BadChat{"part_no_text", R"([{"role": "user", "content": [{"type": "text"}]}])", "content[0].text is missing"},
        BadChat{"call_no_name", R"([{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}])",
                "messages[0].tool_calls[0].function.name must be a string"},
        BadChat{"args_array", R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}])",
                "function.arguments must be a JSON object (got array)"},
        BadChat{"args_number", R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}])",
                "function.arguments must be a JSON object or a string"},
        BadChat{"tool_unnamed", R"([{"role": "tool", "content": "x"}])", "messages[0] is a tool result with no resolvable tool name"},
        BadChat{"name_type", R"([{"role": "user", "name": 1, "content": "x"}])", "messages[0].name must be a string"},
        BadChat{"bad_effort", R"([{"role": "user", "content": "x"}])", "thinking_effort must be low, medium, high or max", "extreme"}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace k3::tokenizer
// clang-format on
