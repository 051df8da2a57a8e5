// server/server_messages_requests_test.cpp: POST /v1/messages with bodies as Claude Code sends
// them (cache_control, mid-conversation system messages, deferred tools loaded by
// tool_reference, context_management, effort, omitted thinking, ?beta=true), the sampling
// defaults, pings while the model is silent, errors in Anthropic's shape, count_tokens.
#include "server/messages_test_util.h"

namespace k3::server {
namespace {

using namespace messages_test;

// ---- requests as Claude Code sends them ----

Json claude_code_body(bool stream) {
  Json b = body("SCRIPT_CHAT hello",
                {{"thinking", kThinking}, {"tools", kTools}, {"stream", stream}, {"max_tokens", 50}});
  b["system"] = Json::array(
      {{{"type", "text"}, {"text", "You are Claude Code."}, {"cache_control", {{"type", "ephemeral"}}}},
       {{"type", "text"}, {"text", " Be brief."}}});
  b["messages"] = Json::array(
      {{{"role", "user"},
        {"content", Json::array({{{"type", "text"}, {"text", "first"}, {"cache_control", {{"type", "ephemeral"}}}}})}},
       {{"role", "assistant"},
        {"content", Json::array({{{"type", "thinking"}, {"thinking", "hmm"}, {"signature", "x"}},
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
  mid["messages"].push_back(
      {{"role", "system"}, {"content", Json::array({{{"type", "text"}, {"text", "Note: cwd changed."}}})}});
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
        {"content",
         Json::array({{{"type", "tool_use"}, {"id", "toolu_1"}, {"name", "get_time"}, {"input", Json::object()}}})}},
       {{"role", "user"},
        {"content", Json::array({{{"type", "tool_result"},
                                  {"tool_use_id", "toolu_1"},
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
           {"content", Json::array({{{"type", "thinking"},
                                     {"thinking", "a long line of thought number " + std::to_string(t)},
                                     {"signature", "s"}},
                                    {{"type", "text"}, {"text", "answer"}}})}});
    }
    b["messages"].push_back({{"role", "user"}, {"content", "last"}});
    if (!cm.is_null()) b["context_management"] = {{"edits", Json::array({cm})}};
    return count_tokens(b);
  };
  const int64_t all = turns({{"type", "clear_thinking_20251015"}, {"keep", "all"}});
  EXPECT_EQ(all, turns(nullptr));
  const int64_t two = turns(
      {{"type", "clear_thinking_20251015"}, {"keep", {{"type", "thinking_turns"}, {"value", 2}}}});
  const int64_t one = turns(
      {{"type", "clear_thinking_20251015"}, {"keep", {{"type", "thinking_turns"}, {"value", 1}}}});
  EXPECT_LT(two, all);
  EXPECT_LT(one, two);
  EXPECT_EQ(turns({{"type", "clear_thinking_20251015"}}), one);  // Anthropic's default keeps one
  const Reply other = call(
      "/v1/messages/count_tokens",
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

// Sampling defaults are the API's: temperature 1 when the request names none.
TEST(ServerMessages, TemperatureDefaultsToOne) {
  ParseContext ctx;
  ctx.tokenizer = testing::scripted_server().tok.get();
  ctx.served_models = {"k3-tiny"};
  ctx.vocab_size = 1024;
  ctx.max_model_len = 4096;
  Json b = {
      {"model", "k3-tiny"}, {"max_tokens", 4}, {"messages", Json::array({{{"role", "user"}, {"content", "hi"}}})}};
  EXPECT_EQ(parse_messages_request(b, ctx, false).params.base.sampling.temperature, 1.0f);
  b["temperature"] = 0.25;
  EXPECT_EQ(parse_messages_request(b, ctx, false).params.base.sampling.temperature, 0.25f);
}

// A slow step (a long prefill) leaves the stream silent: pings keep it alive, each named.
TEST(ServerMessages, PingsWhileTheModelIsSilent) {
  ServerConfig config = testing::test_server_config();
  config.stream_ping_interval = std::chrono::milliseconds(40);
  testing::ScriptedServer slow(std::chrono::milliseconds(150), config);
  const Json b = {{"model", "k3-tiny"},
                  {"max_tokens", 3},
                  {"temperature", 0},
                  {"stream", true},
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
