// server/server_messages_test.cpp: POST /v1/messages (Anthropic's Messages API) over the
// scripted server: reply content blocks (thinking + signature, text, tool_use with parsed input),
// stop reasons, usage; golden event sequences of streams, whose folded content equals the reply;
// bodies as Claude Code sends them (cache_control, mid-conversation system messages, deferred
// tools loaded by tool_reference, context_management, effort, omitted thinking, ?beta=true);
// tool_choice and disable_parallel_tool_use; errors in Anthropic's shape; count_tokens.
#include "server/anthropic_request.h"
#include "server/server_test_util.h"

namespace k3::server {
namespace {

using testing::scripted_server;

// ---- helpers ----

struct Reply {
  int status = 0;
  std::string body;
  Json json() const { return Json::parse(body); }
};

Reply call(const std::string& path, const Json& body, const httplib::Headers& headers = {}) {
  httplib::Client cli("127.0.0.1", scripted_server().port);
  cli.set_read_timeout(60, 0);
  auto res = cli.Post(path, headers, dump_json(body), "application/json");
  return res ? Reply{res->status, res->body} : Reply{};
}

// max_tokens: SCRIPT_TOOLS is 129 tokens; with the tools declared (~200) that fits 512.
// Greedy: the scripted model replays its script exactly only then (the API's default is 1).
Json body(const std::string& user, Json extra = Json::object()) {
  Json b = {{"model", "k3-tiny"},
            {"max_tokens", 140},
            {"temperature", 0},
            {"messages", Json::array({{{"role", "user"}, {"content", user}}})}};
  for (auto& [k, v] : extra.items()) b[k] = v;
  return b;
}

const Json kThinking = {{"type", "adaptive"}};  // (enabled needs budget_tokens >= 1024 > this max_model_len)

const Json kTools = Json::array(
    {{{"name", "get_weather"},
      {"description", "Weather for a city"},
      {"input_schema",
       {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}, {"days", {{"type", "number"}}}}}}}},
     {{"name", "get_time"}, {"input_schema", {{"type", "object"}}}, {"cache_control", {{"type", "ephemeral"}}}}});

std::string script(const std::string& trigger) {
  for (const auto& [t, text] : testing::script_texts())
    if (t == trigger) return text;
  return {};
}
int64_t script_tokens(const std::string& trigger) {
  return static_cast<int64_t>(testing::encode_script(*scripted_server().tok, script(trigger)).size());
}
// The text of the SCRIPT_TOOLS call to `name`, markers included (what a refused call shows).
std::string call_text(const std::string& name) {
  const std::string s = script("SCRIPT_TOOLS"), end = "<|close|>call<|sep|>";
  const size_t begin = s.find("<|open|>call tool=\"" + name + "\"");
  return s.substr(begin, s.find(end, begin) + end.size() - begin);
}

int64_t count_tokens(const Json& b) {
  const Reply r = call("/v1/messages/count_tokens", b);
  EXPECT_EQ(r.status, 200) << r.body;
  return r.status == 200 ? r.json()["input_tokens"].get<int64_t>() : -1;
}

struct Event {
  std::string name;
  Json data;
};
// The events of an Anthropic stream: "event: NAME\ndata: JSON" blocks, each name its data's type.
std::vector<Event> events(const Reply& r) {
  std::vector<Event> out;
  for (size_t pos = 0; pos < r.body.size();) {
    const size_t end = r.body.find("\n\n", pos);
    const std::string block = r.body.substr(pos, end - pos);
    pos = end == std::string::npos ? r.body.size() : end + 2;
    const size_t nl = block.find('\n');
    EXPECT_TRUE(block.rfind("event: ", 0) == 0 && nl != std::string::npos) << block;
    if (nl == std::string::npos) continue;
    EXPECT_EQ(block.compare(nl + 1, 6, "data: "), 0) << block;
    Event e{block.substr(7, nl - 7), Json::parse(block.substr(nl + 7))};
    EXPECT_EQ(e.data["type"], e.name) << "event: line and data.type disagree";
    out.push_back(std::move(e));
  }
  return out;
}

// One line per event, "name@index block-or-delta type", runs of the same line folded into "... +".
std::vector<std::string> shape(const std::vector<Event>& evs) {
  std::vector<std::string> lines;
  std::string last;
  for (const Event& e : evs) {
    std::string line = e.name;
    if (e.data.contains("index")) line += "@" + std::to_string(e.data["index"].get<int>());
    if (e.data.contains("content_block")) line += " " + e.data["content_block"]["type"].get<std::string>();
    if (e.name == "content_block_delta") line += " " + e.data["delta"]["type"].get<std::string>();
    if (line == last) {
      if (lines.back().back() != '+') lines.back() += " +";
      continue;
    }
    lines.push_back(line);
    last = line;
  }
  return lines;
}

// The stream folded into the reply it stands for: content blocks (tool inputs parsed from their
// partial_json), stop reason and sequence, final usage.
Json fold(const std::vector<Event>& evs) {
  Json msg = evs.at(0).data["message"];
  std::vector<std::string> partial;
  for (const Event& e : evs) {
    if (e.name == "content_block_start") {
      EXPECT_EQ(e.data["index"], msg["content"].size()) << "blocks are numbered in order";
      msg["content"].push_back(e.data["content_block"]);
      partial.emplace_back();
    } else if (e.name == "content_block_delta") {
      EXPECT_EQ(e.data["index"].get<size_t>() + 1, msg["content"].size()) << "a delta for a block not open";
      Json& b = msg["content"].back();
      const Json& d = e.data["delta"];
      if (d["type"] == "thinking_delta") b["thinking"] = b["thinking"].get<std::string>() + d["thinking"].get<std::string>();
      if (d["type"] == "signature_delta") b["signature"] = b["signature"].get<std::string>() + d["signature"].get<std::string>();
      if (d["type"] == "text_delta") b["text"] = b["text"].get<std::string>() + d["text"].get<std::string>();
      if (d["type"] == "input_json_delta") partial.back() += d["partial_json"].get<std::string>();
    } else if (e.name == "content_block_stop") {
      Json& b = msg["content"].back();
      if (b["type"] == "tool_use") b["input"] = Json::parse(partial.back().empty() ? "{}" : partial.back());
    } else if (e.name == "message_delta") {
      for (auto& [k, v] : e.data["delta"].items()) msg[k] = v;
      msg["usage"] = e.data["usage"];
    }
  }
  return msg;
}

// A reply without its ids (message and tool_use ids are random), keys in any order.
nlohmann::json without_ids(Json msg) {
  msg.erase("id");
  for (Json& b : msg["content"]) b.erase("id");
  return nlohmann::json::parse(msg.dump());
}

// The types of a reply's content blocks, in order.
std::vector<std::string> block_types(const Json& msg) {
  std::vector<std::string> t;
  for (const Json& b : msg["content"]) t.push_back(b["type"]);
  return t;
}

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
  const Json j = call("/v1/messages", body("SCRIPT_TOOLS weather?", {{"tools", kTools}, {"thinking", kThinking}})).json();
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
                                {{"type", "tool_result"}, {"tool_use_id", b["id"]}, {"is_error", true},
                                 {"content", Json::array({{{"type", "text"}, {"text", "no clock"}}})}}})}});
  const Reply again = call("/v1/messages", next);
  EXPECT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(again.json()["stop_reason"], "end_turn");
}

TEST(ServerMessages, MaxTokensAndStopSequence) {
  const Json cut = call("/v1/messages", body("SCRIPT_STORY", {{"max_tokens", 5}})).json();
  EXPECT_EQ(cut["stop_reason"], "max_tokens");
  EXPECT_EQ(cut["usage"]["output_tokens"], 5);
  const Json stop = call("/v1/messages", body("SCRIPT_CHAT hello", {{"thinking", kThinking},
                                                                    {"stop_sequences", Json::array({"nope", "help you"})}}))
                        .json();
  EXPECT_EQ(stop["content"][1]["text"], "Hello! How can I ");
  EXPECT_EQ(stop["stop_reason"], "stop_sequence");
  EXPECT_EQ(stop["stop_sequence"], "help you");
  const auto evs = events(call("/v1/messages", body("SCRIPT_CHAT hello", {{"thinking", kThinking}, {"stream", true},
                                                                          {"stop_sequences", Json::array({"help you"})}})));
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
  EXPECT_EQ(shape(evs), (std::vector<std::string>{
                            "message_start", "ping",
                            "content_block_start@0 thinking", "content_block_delta@0 thinking_delta +",
                            "content_block_delta@0 signature_delta", "content_block_stop@0",
                            "content_block_start@1 text", "content_block_delta@1 text_delta +", "content_block_stop@1",
                            "message_delta", "message_stop"}));
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
  EXPECT_EQ(shape(evs), (std::vector<std::string>{
                            "message_start", "ping",
                            "content_block_start@0 thinking", "content_block_delta@0 thinking_delta +",
                            "content_block_delta@0 signature_delta", "content_block_stop@0",
                            "content_block_start@1 tool_use", "content_block_delta@1 input_json_delta +",
                            "content_block_stop@1",
                            "content_block_start@2 tool_use", "content_block_delta@2 input_json_delta",
                            "content_block_stop@2",
                            "message_delta", "message_stop"}));
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

// ---- requests as Claude Code sends them ----

Json claude_code_body(bool stream) {
  Json b = body("SCRIPT_CHAT hello", {{"thinking", kThinking}, {"tools", kTools}, {"stream", stream}, {"max_tokens", 50}});
  b["system"] = Json::array({{{"type", "text"}, {"text", "You are Claude Code."}, {"cache_control", {{"type", "ephemeral"}}}},
                             {{"type", "text"}, {"text", " Be brief."}}});
  b["messages"] = Json::array(
      {{{"role", "user"}, {"content", Json::array({{{"type", "text"}, {"text", "first"}, {"cache_control", {{"type", "ephemeral"}}}}})}},
       {{"role", "assistant"}, {"content", Json::array({{{"type", "thinking"}, {"thinking", "hmm"}, {"signature", "x"}},
                                                        {{"type", "text"}, {"text", "ok"}}})}},
       {{"role", "system"}, {"content", "The user switched directories."}},
       {{"role", "user"}, {"content", Json::array({{{"type", "text"}, {"text", "SCRIPT_CHAT hello"}}})}}});
  b["metadata"] = {{"user_id", "user_abc_account_123_session_456"}};
  b["output_config"] = {{"effort", "high"}};
  b["context_management"] = {{"edits", Json::array({{{"type", "clear_thinking_20251015"}, {"keep", "all"}}})}};
  return b;
}

TEST(ServerMessages, ClaudeCodeRequest) {
  const httplib::Headers headers = {{"anthropic-version", "2023-06-01"},
                                    {"anthropic-beta", "claude-code-20250219,interleaved-thinking-2025-05-14"},
                                    {"x-api-key", "anything"}};
  const Reply r = call("/v1/messages?beta=true", claude_code_body(true), headers);
  ASSERT_EQ(r.status, 200) << r.body;
  const Json folded = fold(events(r));
  EXPECT_EQ(folded["content"][1]["text"], "Hello! How can I help you today?");
  EXPECT_EQ(folded["stop_reason"], "end_turn");
  const Reply plain = call("/v1/messages?beta=true", claude_code_body(false), headers);
  ASSERT_EQ(plain.status, 200) << plain.body;
  EXPECT_EQ(without_ids(plain.json()), without_ids(folded));
  // count_tokens gives what the reply was billed: input + cache reads.
  const Json u = plain.json()["usage"];
  EXPECT_EQ(count_tokens(claude_code_body(false)),
            u["input_tokens"].get<int64_t>() + u["cache_read_input_tokens"].get<int64_t>());
  const Reply counted = call("/v1/messages/count_tokens?beta=true", claude_code_body(false), headers);
  EXPECT_EQ(counted.status, 200) << counted.body;
}

TEST(ServerMessages, SystemBlocksAndMidConversationSystemMessages) {
  Json blocks = body("hi"), joined = body("hi");
  blocks["system"] = Json::array({{{"type", "text"}, {"text", "You are "}, {"cache_control", {{"type", "ephemeral"}}}},
                                  {{"type", "text"}, {"text", "terse."}}});
  joined["system"] = "You are terse.";
  EXPECT_EQ(count_tokens(blocks), count_tokens(joined));
  EXPECT_GT(count_tokens(joined), count_tokens(body("hi")));
  Json mid = joined;
  mid["messages"].push_back({{"role", "assistant"}, {"content", "ok"}});
  mid["messages"].push_back({{"role", "system"}, {"content", Json::array({{{"type", "text"}, {"text", "Note: cwd changed."}}})}});
  mid["messages"].push_back({{"role", "user"}, {"content", "again"}});
  Json without = mid;
  without["messages"].erase(2);
  EXPECT_GT(count_tokens(mid), count_tokens(without));
  EXPECT_EQ(call("/v1/messages", mid).status, 200);
}

TEST(ServerMessages, DeferredToolsWaitForAToolReference) {
  Json deferred_tool = {{"name", "search_docs"},
                        {"description", "Search the documentation"},
                        {"input_schema", {{"type", "object"}, {"properties", {{"q", {{"type", "string"}}}}}}},
                        {"defer_loading", true}};
  Json conversation = Json::array(
      {{{"role", "user"}, {"content", "find the docs"}},
       {{"role", "assistant"},
        {"content", Json::array({{{"type", "tool_use"}, {"id", "toolu_1"}, {"name", "get_time"}, {"input", Json::object()}}})}},
       {{"role", "user"},
        {"content", Json::array({{{"type", "tool_result"}, {"tool_use_id", "toolu_1"},
                                  {"content", Json::array({{{"type", "text"}, {"text", "found one tool"}}})}}})}}});
  Json base = body("x", {{"tools", kTools}, {"messages", conversation}, {"max_tokens", 20}});
  Json with_deferred = base;
  with_deferred["tools"].push_back(deferred_tool);
  EXPECT_EQ(count_tokens(with_deferred), count_tokens(base)) << "a deferred tool stays out of the prompt";

  Json loaded = with_deferred;
  loaded["messages"][2]["content"][0]["content"].push_back({{"type", "tool_reference"}, {"tool_name", "search_docs"}});
  EXPECT_GT(count_tokens(loaded), count_tokens(with_deferred) + 10) << "a tool_reference loads its tool";
  Json unknown = with_deferred;  // a reference to a tool that is not deferred loads nothing
  unknown["messages"][2]["content"][0]["content"].push_back({{"type", "tool_reference"}, {"tool_name", "get_time"}});
  EXPECT_EQ(count_tokens(unknown), count_tokens(with_deferred));
  EXPECT_EQ(call("/v1/messages", loaded).status, 200);
}

TEST(ServerMessages, ContextManagementClearsOldThinking) {
  auto turns = [](Json cm) {
    Json b = body("x", {{"thinking", kThinking}});
    b["messages"] = Json::array();
    for (int t = 0; t < 3; ++t) {
      b["messages"].push_back({{"role", "user"}, {"content", "question " + std::to_string(t)}});
      b["messages"].push_back(
          {{"role", "assistant"},
           {"content", Json::array({{{"type", "thinking"}, {"thinking", "a long line of thought number " + std::to_string(t)},
                                     {"signature", "s"}},
                                    {{"type", "text"}, {"text", "answer"}}})}});
    }
    b["messages"].push_back({{"role", "user"}, {"content", "last"}});
    if (!cm.is_null()) b["context_management"] = {{"edits", Json::array({cm})}};
    return count_tokens(b);
  };
  const int64_t all = turns({{"type", "clear_thinking_20251015"}, {"keep", "all"}});
  EXPECT_EQ(all, turns(nullptr));
  const int64_t two = turns({{"type", "clear_thinking_20251015"}, {"keep", {{"type", "thinking_turns"}, {"value", 2}}}});
  const int64_t one = turns({{"type", "clear_thinking_20251015"}, {"keep", {{"type", "thinking_turns"}, {"value", 1}}}});
  EXPECT_LT(two, all);
  EXPECT_LT(one, two);
  EXPECT_EQ(turns({{"type", "clear_thinking_20251015"}}), one);  // Anthropic's default keeps one
  const Reply other = call("/v1/messages/count_tokens",
                           body("x", {{"context_management", {{"edits", Json::array({{{"type", "clear_tool_uses_20250919"}}})}}}}));
  EXPECT_EQ(other.status, 400) << other.body;
}

TEST(ServerMessages, EffortAndOmittedThinking) {
  const int64_t plain = count_tokens(body("hi", {{"thinking", kThinking}}));
  EXPECT_GT(count_tokens(body("hi", {{"thinking", kThinking}, {"output_config", {{"effort", "high"}}}})), plain);
  EXPECT_EQ(count_tokens(body("hi", {{"output_config", {{"effort", "high"}}}})), count_tokens(body("hi")))
      << "effort without thinking changes nothing";
  EXPECT_EQ(call("/v1/messages/count_tokens", body("hi", {{"output_config", {{"effort", "huge"}}}})).status, 400);

  const Json omitted = {{"type", "adaptive"}, {"display", "omitted"}};
  const Json shown = call("/v1/messages", body("SCRIPT_CHAT hello", {{"thinking", kThinking}})).json();
  const Json j = call("/v1/messages", body("SCRIPT_CHAT hello", {{"thinking", omitted}})).json();
  ASSERT_EQ(j["content"].size(), 2u) << j.dump();
  EXPECT_EQ(j["content"][0]["type"], "thinking");
  EXPECT_EQ(j["content"][0]["thinking"], "");
  EXPECT_EQ(j["content"][0]["signature"], shown["content"][0]["signature"]);
  EXPECT_EQ(j["content"][1]["text"], "Hello! How can I help you today?");
  const auto evs = events(call("/v1/messages", body("SCRIPT_CHAT hello", {{"thinking", omitted}, {"stream", true}})));
  EXPECT_EQ(shape(evs)[2], "content_block_start@0 thinking");
  EXPECT_EQ(shape(evs)[3], "content_block_delta@0 signature_delta");  // no thinking_delta at all
  EXPECT_EQ(without_ids(fold(evs)), without_ids(j));
}

// thinking.type enabled needs budget_tokens >= 1024 < max_tokens, more than the scripted
// server's context: checked on the parser, with a context of K3's default size.
TEST(ServerMessages, ThinkingEnabledBudgetsBecomeEfforts) {
  ParseContext ctx;
  ctx.tokenizer = scripted_server().tok.get();
  ctx.served_models = {"k3-tiny"};
  ctx.vocab_size = 1024;
  ctx.max_model_len = 65536;
  auto parse = [&](Json thinking, int64_t max_tokens = 40000) {
    return parse_messages_request(body("hi", {{"thinking", thinking}, {"max_tokens", max_tokens}}), ctx, false);
  };
  auto effort = [&](int64_t budget) {
    const MessagesRequest r = parse({{"type", "enabled"}, {"budget_tokens", budget}});
    EXPECT_TRUE(r.chat.options.thinking);
    EXPECT_EQ(r.params.start_channel, tokenizer::Channel::think);
    return r.chat.options.thinking_effort.value_or("(none)");
  };
  EXPECT_EQ(effort(1024), "low");
  EXPECT_EQ(effort(4096), "low");
  EXPECT_EQ(effort(16384), "medium");
  EXPECT_EQ(effort(32768), "high");
  EXPECT_EQ(effort(32769), "max");
  EXPECT_TRUE(parse({{"type", "enabled"}, {"budget_tokens", 2048}, {"display", "summarized"}}).show_thinking);
  EXPECT_FALSE(parse({{"type", "enabled"}, {"budget_tokens", 2048}, {"display", "omitted"}}).show_thinking);
  const MessagesRequest off = parse({{"type", "disabled"}});
  EXPECT_FALSE(off.chat.options.thinking);
  EXPECT_EQ(off.params.start_channel, tokenizer::Channel::response);
  auto refused = [&](Json thinking, int64_t max_tokens, const std::string& param) {
    try {
      parse(thinking, max_tokens);
      ADD_FAILURE() << "accepted: " << thinking.dump();
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.param, param) << e.what();
    }
  };
  refused({{"type", "enabled"}}, 4000, "thinking.budget_tokens");
  refused({{"type", "enabled"}, {"budget_tokens", 512}}, 4000, "thinking.budget_tokens");
  refused({{"type", "enabled"}, {"budget_tokens", 4000}}, 4000, "max_tokens");
  refused({{"type", "sometimes"}}, 4000, "thinking.type");
  refused({{"type", "adaptive"}, {"display", "full"}}, 4000, "thinking.display");
}

// ---- tool_choice ----

Json tools_body(Json tool_choice, bool stream = false) {
  return body("SCRIPT_TOOLS weather?", {{"tools", kTools}, {"thinking", kThinking}, {"tool_choice", tool_choice}, {"stream", stream}});
}

TEST(ServerMessages, ToolChoiceAnyAndAuto) {
  for (const Json& tc : {Json{{"type", "any"}}, Json{{"type", "auto"}}}) {
    const Json j = call("/v1/messages", tools_body(tc)).json();
    EXPECT_EQ(block_types(j), (std::vector<std::string>{"thinking", "tool_use", "tool_use"})) << tc.dump();
    EXPECT_EQ(j["stop_reason"], "tool_use");
  }
  EXPECT_GT(count_tokens(tools_body({{"type", "any"}})), count_tokens(tools_body({{"type", "auto"}})));  // "MUST call tools"
}

TEST(ServerMessages, ToolChoiceNamedRefusesTheOtherCall) {
  const Json j = call("/v1/messages", tools_body({{"type", "tool"}, {"name", "get_time"}})).json();
  EXPECT_EQ(block_types(j), (std::vector<std::string>{"thinking", "text", "tool_use"})) << j.dump();
  EXPECT_EQ(j["content"][1]["text"], call_text("get_weather"));
  EXPECT_EQ(j["content"][2]["name"], "get_time");
  EXPECT_EQ(j["content"][2]["input"], (Json{{"tz", "CET"}}));
  EXPECT_EQ(j["stop_reason"], "tool_use");
  const Json folded = fold(events(call("/v1/messages", tools_body({{"type", "tool"}, {"name", "get_time"}}, true))));
  EXPECT_EQ(without_ids(folded), without_ids(j));
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

// ---- errors ----

// The reply is Anthropic's error: {"type": "error", "error": {"type", "message"}}.
void expect_error(const Reply& r, int status, const std::string& type, const std::string& needle = "") {
  EXPECT_EQ(r.status, status) << r.body;
  Json j;
  try {
    j = r.json();
  } catch (...) {
    ADD_FAILURE() << "not JSON: " << r.body;
    return;
  }
  EXPECT_EQ(j["type"], "error") << r.body;
  EXPECT_EQ(j["error"]["type"], type) << r.body;
  EXPECT_TRUE(j["error"]["message"].is_string() && !j["error"]["message"].get<std::string>().empty()) << r.body;
  EXPECT_FALSE(j.contains("param") || j["error"].contains("param")) << "OpenAI's shape leaked: " << r.body;
  if (!needle.empty()) {
    EXPECT_NE(r.body.find(needle), std::string::npos) << r.body;
  }
}

TEST(ServerMessages, ErrorsInAnthropicsShape) {
  Json image = body("x");
  image["messages"][0]["content"] = Json::array(
      {{{"type", "text"}, {"text", "what is this?"}},
       {{"type", "image"}, {"source", {{"type", "base64"}, {"media_type", "image/png"}, {"data", "iVBORw0KGgo="}}}}});
  expect_error(call("/v1/messages", image), 400, "invalid_request_error", "messages[0].content[1]");
  expect_error(call("/v1/messages", body("x", {{"model", "claude-opus-4"}})), 404, "not_found_error", "claude-opus-4");
  Json no_max = body("x");
  no_max.erase("max_tokens");
  expect_error(call("/v1/messages", no_max), 400, "invalid_request_error", "max_tokens");
  EXPECT_EQ(count_tokens(no_max), count_tokens(body("x")));  // count_tokens needs no max_tokens
  expect_error(call("/v1/messages", body("x", {{"temperature", 1.5}})), 400, "invalid_request_error", "temperature");
  expect_error(call("/v1/messages", body("x", {{"mcp_servers", Json::array({{{"type", "url"}}})}})), 400,
               "invalid_request_error", "mcp_servers");
  expect_error(call("/v1/messages/count_tokens", image), 400, "invalid_request_error");

  const testing::Reply big = testing::send(scripted_server().port, "POST", "/v1/messages",
                                           "{\"x\": \"" + std::string(9u << 20, 'a') + "\"}");
  expect_error({big.status, big.body}, 413, "request_too_large");
  const testing::Reply route = testing::send(scripted_server().port, "POST", "/v1/messages/batches", "{}");
  expect_error({route.status, route.body}, 404, "not_found_error", "/v1/messages/batches");
  const testing::Reply method = testing::get(scripted_server().port, "/v1/messages");
  expect_error({method.status, method.body}, 405, "invalid_request_error", "POST");
  const testing::Reply junk = testing::send(scripted_server().port, "POST", "/v1/messages", "{not json");
  expect_error({junk.status, junk.body}, 400, "invalid_request_error");
  EXPECT_EQ(testing::get(scripted_server().port, "/health").status, 200);
}

}  // namespace
}  // namespace k3::server

namespace k3::server {
namespace {

// Sampling defaults are the API's: temperature 1 when the request names none.
TEST(ServerMessages, TemperatureDefaultsToOne) {
  ParseContext ctx;
  ctx.tokenizer = testing::scripted_server().tok.get();
  ctx.served_models = {"k3-tiny"};
  ctx.vocab_size = 1024;
  ctx.max_model_len = 4096;
  Json b = {{"model", "k3-tiny"}, {"max_tokens", 4}, {"messages", Json::array({{{"role", "user"}, {"content", "hi"}}})}};
  EXPECT_EQ(parse_messages_request(b, ctx, false).params.base.sampling.temperature, 1.0f);
  b["temperature"] = 0.25;
  EXPECT_EQ(parse_messages_request(b, ctx, false).params.base.sampling.temperature, 0.25f);
}

}  // namespace
}  // namespace k3::server

namespace k3::server {
namespace {

// A slow step (a long prefill) leaves the stream silent: pings keep it alive, each named.
TEST(ServerMessages, PingsWhileTheModelIsSilent) {
  ServerConfig config = testing::test_server_config();
  config.stream_ping_interval = std::chrono::milliseconds(40);
  testing::ScriptedServer slow(std::chrono::milliseconds(150), config);
  const Json b = {{"model", "k3-tiny"},   {"max_tokens", 3},
                  {"temperature", 0},     {"stream", true},
                  {"messages", Json::array({{{"role", "user"}, {"content", "SCRIPT_STORY"}}})}};
  const testing::Reply r = testing::post(slow.port, "/v1/messages", b);
  ASSERT_EQ(r.status, 200) << r.body;
  int pings = 0, named_pings = 0;
  for (size_t pos = 0; (pos = r.body.find("{\"type\":\"ping\"}", pos)) != std::string::npos; ++pos) ++pings;
  for (size_t pos = 0; (pos = r.body.find("event: ping\ndata: {\"type\":\"ping\"}", pos)) != std::string::npos; ++pos)
    ++named_pings;
  EXPECT_GE(pings, 3) << r.body;  // one after message_start, then one per silent 40 ms (steps take 150)
  EXPECT_EQ(pings, named_pings);
  EXPECT_NE(r.body.find("event: message_stop"), std::string::npos);
}

}  // namespace
}  // namespace k3::server
