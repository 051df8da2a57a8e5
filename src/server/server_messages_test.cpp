// server/server_messages_test.cpp: POST /v1/messages (Anthropic's Messages API) over the
// scripted server: reply content blocks (thinking + signature, text, tool_use with parsed input),
// stop reasons, usage; golden event sequences of streams, whose folded content equals the reply;
// tool_choice and disable_parallel_tool_use. Requests as Claude Code sends them and errors:
// server_messages_requests_test.cpp.
#include "server/messages_test_util.h"

namespace k3::server {
namespace {

using namespace messages_test;

// ---- replies ----

TEST(ServerMessages, ThinkingAndTextReply) {
  const Reply r = call("/v1/messages", body("SCRIPT_CHAT hello", {{"thinking", kThinking}}));
  ASSERT_EQ(r.status, 200) << r.body;
  const Json j = r.json();
  EXPECT_TRUE(j["id"].get<std::string>().starts_with("msg_"));
  EXPECT_EQ(j["type"], "message");
  EXPECT_EQ(j["role"], "assistant");
  EXPECT_EQ(j["model"], "k3-tiny");
  ASSERT_EQ(j["content"].size(), 2u) << j.dump();
  EXPECT_EQ(j["content"][0]["type"], "thinking");
  EXPECT_EQ(j["content"][0]["thinking"], "The user greets me; I greet back.");
  EXPECT_TRUE(j["content"][0]["signature"].get<std::string>().starts_with("k3serve-"));
  EXPECT_EQ(j["content"][1], (Json{{"type", "text"}, {"text", "Hello! How can I help you today?"}}));
  EXPECT_EQ(j["stop_reason"], "end_turn");
  EXPECT_TRUE(j["stop_sequence"].is_null());
  const Json& u = j["usage"];
  EXPECT_GT(u["input_tokens"].get<int>(), 5);
  EXPECT_EQ(u["cache_read_input_tokens"], 0);  // the scripted server has no prefix cache
  EXPECT_EQ(u["cache_creation_input_tokens"], 0);
  EXPECT_EQ(u["output_tokens"], script_tokens("SCRIPT_CHAT"));
}

TEST(ServerMessages, ThinkingIsOffByDefault) {
  const Json j = call("/v1/messages", body("SCRIPT_CHAT hello")).json();
  ASSERT_EQ(j["content"].size(), 1u) << j.dump();
  EXPECT_EQ(j["content"][0]["type"], "text");  // (the script thinks anyway: its thoughts come as text)
  EXPECT_TRUE(j["content"][0]["text"].get<std::string>().ends_with("Hello! How can I help you today?"));
}

TEST(ServerMessages, ToolUseReply) {
  const Json j =
      call("/v1/messages", body("SCRIPT_TOOLS weather?", {{"tools", kTools}, {"thinking", kThinking}})).json();
  ASSERT_EQ(j["content"].size(), 3u) << j.dump();
  EXPECT_EQ(j["content"][0]["type"], "thinking");
  EXPECT_EQ(j["content"][0]["thinking"], "I need the weather.");
  const Json& a = j["content"][1];
  const Json& b = j["content"][2];
  EXPECT_EQ(a["type"], "tool_use");
  EXPECT_TRUE(a["id"].get<std::string>().starts_with("toolu_"));
  EXPECT_EQ(a["name"], "get_weather");
  EXPECT_EQ(a["input"], (Json{{"city", "Paris"}, {"days", 3}}));
  EXPECT_EQ(b["type"], "tool_use");
  EXPECT_EQ(b["name"], "get_time");
  EXPECT_EQ(b["input"], (Json{{"tz", "CET"}}));
  EXPECT_NE(a["id"], b["id"]);
  EXPECT_EQ(j["stop_reason"], "tool_use");

  // The calls round-trip: tool_use blocks and tool_result blocks render a valid next prompt.
  Json next = body("SCRIPT_CHAT thanks", {{"tools", kTools}, {"thinking", kThinking}, {"max_tokens", 50}});
  next["messages"].push_back({{"role", "assistant"}, {"content", j["content"]}});
  next["messages"].push_back(
      {{"role", "user"},
       {"content", Json::array({{{"type", "tool_result"}, {"tool_use_id", a["id"]}, {"content", "sunny"}},
                                {{"type", "tool_result"},
                                 {"tool_use_id", b["id"]},
                                 {"is_error", true},
                                 {"content", Json::array({{{"type", "text"}, {"text", "no clock"}}})}}})}});
  const Reply again = call("/v1/messages", next);
  EXPECT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(again.json()["stop_reason"], "end_turn");
}

TEST(ServerMessages, MaxTokensAndStopSequence) {
  const Json cut = call("/v1/messages", body("SCRIPT_STORY", {{"max_tokens", 5}})).json();
  EXPECT_EQ(cut["stop_reason"], "max_tokens");
  EXPECT_EQ(cut["usage"]["output_tokens"], 5);
  const Json stop = call("/v1/messages",
                         body("SCRIPT_CHAT hello",
                              {{"thinking", kThinking}, {"stop_sequences", Json::array({"nope", "help you"})}}))
                        .json();
  EXPECT_EQ(stop["content"][1]["text"], "Hello! How can I ");
  EXPECT_EQ(stop["stop_reason"], "stop_sequence");
  EXPECT_EQ(stop["stop_sequence"], "help you");
  const auto evs = events(
      call("/v1/messages",
           body("SCRIPT_CHAT hello",
                {{"thinking", kThinking}, {"stream", true}, {"stop_sequences", Json::array({"help you"})}})));
  const Json folded = fold(evs);
  EXPECT_EQ(folded["stop_reason"], "stop_sequence");
  EXPECT_EQ(folded["stop_sequence"], "help you");
  EXPECT_EQ(folded["content"][1]["text"], "Hello! How can I ");
}

// A malformed call is shown as text, never dropped.
Json bad_tool_body(bool stream) {
  return body("SCRIPT_BADTOOL", {{"tools", kTools}, {"thinking", kThinking}, {"stream", stream}});
}
const std::string kBadCallText =
    "<|open|>call tool=\"f\" index=\"1\"<|sep|><|open|>argument key=\"n\" type=\"number\"<|sep|>"
    "12abc<|close|>argument<|sep|><|close|>call<|sep|>";

TEST(ServerMessages, MalformedCallIsText) {
  const Json j = call("/v1/messages", bad_tool_body(false)).json();
  EXPECT_EQ(block_types(j), (std::vector<std::string>{"thinking", "text"})) << j.dump();
  EXPECT_EQ(j["content"][1]["text"], "Calling." + kBadCallText);
  EXPECT_EQ(j["stop_reason"], "end_turn");
}

// A call begins to stream with its first checked argument: one whose first argument is
// malformed never shows as a tool_use block, so the stream says what the reply says.
TEST(ServerMessages, MalformedCallStreamsAsTheReplyDoes) {
  const auto evs = events(call("/v1/messages", bad_tool_body(true)));
  EXPECT_EQ(without_ids(fold(evs)), without_ids(call("/v1/messages", bad_tool_body(false)).json()));
}

// A call that fails after it began streaming: its tool_use block ends where it failed (a stream
// cannot take it back), its text follows as text, and stop_reason is not tool_use.
TEST(ServerMessages, CallFailingAfterItBeganEndsItsBlockAndFollowsAsText) {
  const Json b = body("SCRIPT_LATEBADTOOL", {{"tools", kTools}, {"thinking", kThinking}});
  const Json reply = call("/v1/messages", b).json();
  EXPECT_EQ(block_types(reply), (std::vector<std::string>{"thinking", "text"})) << reply.dump();
  const std::string raw =
      "<|open|>call tool=\"f\" index=\"1\"<|sep|><|open|>argument key=\"path\" type=\"string\"<|sep|>a.txt"
      "<|close|>argument<|sep|><|open|>argument key=\"n\" type=\"number\"<|sep|>12abc<|close|>argument<|sep|>"
      "<|close|>call<|sep|>";
  EXPECT_EQ(reply["content"][1]["text"], "Writing." + raw);
  EXPECT_EQ(reply["stop_reason"], "end_turn");
  Json sb = b;
  sb["stream"] = true;
  std::vector<std::string> blocks;
  std::string last_text, stop_reason;
  for (const auto& e : events(call("/v1/messages", sb))) {
    if (e.data["type"] == "content_block_start") blocks.push_back(e.data["content_block"]["type"]);
    if (e.data["type"] == "content_block_start" && e.data["content_block"]["type"] == "text") last_text.clear();
    if (e.data["type"] == "content_block_delta" && e.data["delta"]["type"] == "text_delta")
      last_text += e.data["delta"]["text"].get<std::string>();
    if (e.data["type"] == "message_delta") stop_reason = e.data["delta"]["stop_reason"];
  }
  EXPECT_EQ(blocks, (std::vector<std::string>{"thinking", "text", "tool_use", "text"}));
  EXPECT_EQ(last_text, raw);
  EXPECT_EQ(stop_reason, "end_turn");
}

// Cut while thinking: the reply, like the stream, is the thinking block alone.
TEST(ServerMessages, MaxTokensWhileThinking) {
  const Json b = body("SCRIPT_CHAT hello", {{"thinking", kThinking}, {"max_tokens", 5}});
  const Json j = call("/v1/messages", b).json();
  EXPECT_EQ(j["stop_reason"], "max_tokens");
  Json sb = b;
  sb["stream"] = true;
  const Json folded = fold(events(call("/v1/messages", sb)));
  EXPECT_EQ(block_types(folded), (std::vector<std::string>{"thinking"}));
  EXPECT_EQ(without_ids(folded), without_ids(j));
}

// ---- streams ----

TEST(ServerMessages, GoldenStreamWithThinking) {
  const Json b = body("SCRIPT_CHAT hello", {{"thinking", kThinking}});
  Json sb = b;
  sb["stream"] = true;
  const auto evs = events(call("/v1/messages", sb));
  EXPECT_EQ(shape(evs), (std::vector<std::string>{"message_start", "ping", "content_block_start@0 thinking",
                                                  "content_block_delta@0 thinking_delta +",
                                                  "content_block_delta@0 signature_delta", "content_block_stop@0",
                                                  "content_block_start@1 text", "content_block_delta@1 text_delta +",
                                                  "content_block_stop@1", "message_delta", "message_stop"}));
  const Json& start = evs[0].data["message"];
  EXPECT_TRUE(start["content"].empty());
  EXPECT_TRUE(start["stop_reason"].is_null());
  EXPECT_GT(start["usage"]["input_tokens"].get<int>(), 5);  // known before the first token
  const Json reply = call("/v1/messages", b).json();
  EXPECT_EQ(without_ids(fold(evs)), without_ids(reply));
}

TEST(ServerMessages, GoldenStreamWithoutThinking) {
  const auto evs = events(call("/v1/messages", body("SCRIPT_CHAT hello", {{"stream", true}})));
  EXPECT_EQ(shape(evs), (std::vector<std::string>{"message_start", "ping", "content_block_start@0 text",
                                                  "content_block_delta@0 text_delta +", "content_block_stop@0",
                                                  "message_delta", "message_stop"}));
  EXPECT_EQ(without_ids(fold(evs)), without_ids(call("/v1/messages", body("SCRIPT_CHAT hello")).json()));
}

TEST(ServerMessages, GoldenStreamWithToolUse) {
  const Json b = body("SCRIPT_TOOLS weather?", {{"tools", kTools}, {"thinking", kThinking}});
  Json sb = b;
  sb["stream"] = true;
  const auto evs = events(call("/v1/messages", sb));
  EXPECT_EQ(shape(evs),
            (std::vector<std::string>{
                "message_start", "ping", "content_block_start@0 thinking", "content_block_delta@0 thinking_delta +",
                "content_block_delta@0 signature_delta", "content_block_stop@0", "content_block_start@1 tool_use",
                "content_block_delta@1 input_json_delta +", "content_block_stop@1", "content_block_start@2 tool_use",
                "content_block_delta@2 input_json_delta", "content_block_stop@2", "message_delta", "message_stop"}));
  for (const Event& e : evs)
    if (e.name == "content_block_start" && e.data["content_block"]["type"] == "tool_use") {
      EXPECT_TRUE(e.data["content_block"]["id"].get<std::string>().starts_with("toolu_"));
      EXPECT_EQ(e.data["content_block"]["input"], Json::object());  // the input comes as deltas
    }
  const Json folded = fold(evs);
  EXPECT_EQ(folded["stop_reason"], "tool_use");
  EXPECT_EQ(folded["content"][1]["input"], (Json{{"city", "Paris"}, {"days", 3}}));
  EXPECT_EQ(without_ids(folded), without_ids(call("/v1/messages", b).json()));
}

// ---- tool_choice ----

Json tools_body(Json tool_choice, bool stream = false) {
  return body("SCRIPT_TOOLS weather?",
              {{"tools", kTools}, {"thinking", kThinking}, {"tool_choice", tool_choice}, {"stream", stream}});
}

TEST(ServerMessages, ToolChoiceAnyAndAuto) {
  for (const Json& tc : {Json{{"type", "any"}}, Json{{"type", "auto"}}}) {
    const Json j = call("/v1/messages", tools_body(tc)).json();
    EXPECT_EQ(block_types(j), (std::vector<std::string>{"thinking", "tool_use", "tool_use"})) << tc.dump();
    EXPECT_EQ(j["stop_reason"], "tool_use");
  }
  EXPECT_GT(count_tokens(tools_body({{"type", "any"}})),
            count_tokens(tools_body({{"type", "auto"}})));  // "MUST call tools"
}

// A named tool constrains the output to one or more calls of that tool (server/output_grammar.h):
// a script that makes exactly such a call passes through unchanged.
TEST(ServerMessages, ToolChoiceNamedPassesItsCall) {
  auto time_body = [](bool stream) {
    return body("SCRIPT_TIME now?", {{"tools", kTools},
                                     {"thinking", kThinking},
                                     {"tool_choice", {{"type", "tool"}, {"name", "get_time"}}},
                                     {"stream", stream}});
  };
  const Json j = call("/v1/messages", time_body(false)).json();
  EXPECT_EQ(block_types(j), (std::vector<std::string>{"thinking", "tool_use"})) << j.dump();
  EXPECT_EQ(j["content"][1]["name"], "get_time");
  EXPECT_EQ(j["content"][1]["input"], (Json{{"tz", "CET"}}));
  EXPECT_EQ(j["stop_reason"], "tool_use");
  EXPECT_EQ(without_ids(fold(events(call("/v1/messages", time_body(true))))), without_ids(j));
  EXPECT_EQ(call("/v1/messages", tools_body({{"type", "tool"}, {"name", "nope"}})).status, 400);
}

TEST(ServerMessages, ToolChoiceNoneGivesNoToolUse) {
  const Json j = call("/v1/messages", tools_body({{"type", "none"}})).json();
  EXPECT_EQ(block_types(j), (std::vector<std::string>{"thinking", "text"})) << j.dump();
  EXPECT_EQ(j["content"][1]["text"], call_text("get_weather") + call_text("get_time"));
  EXPECT_EQ(j["stop_reason"], "end_turn");
  EXPECT_EQ(without_ids(fold(events(call("/v1/messages", tools_body({{"type", "none"}}, true))))), without_ids(j));
}

TEST(ServerMessages, DisableParallelToolUseGivesOneCall) {
  const Json tc = {{"type", "auto"}, {"disable_parallel_tool_use", true}};
  const Json j = call("/v1/messages", tools_body(tc)).json();
  EXPECT_EQ(block_types(j), (std::vector<std::string>{"thinking", "tool_use"})) << j.dump();
  EXPECT_EQ(j["content"][1]["name"], "get_weather");
  EXPECT_EQ(j["stop_reason"], "tool_use");
  EXPECT_LT(j["usage"]["output_tokens"].get<int64_t>(), script_tokens("SCRIPT_TOOLS"));  // stopped at the call
  const auto evs = events(call("/v1/messages", tools_body(tc, true)));
  EXPECT_EQ(shape(evs).back(), "message_stop");
  EXPECT_EQ(without_ids(fold(evs)), without_ids(j));
  EXPECT_TRUE(testing::engine_idle(*scripted_server().engine));  // the aborted rest is freed
}

}  // namespace
}  // namespace k3::server
