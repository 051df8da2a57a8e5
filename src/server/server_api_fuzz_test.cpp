// server/server_api_fuzz_test.cpp: mutated Anthropic Messages and OpenAI Responses bodies (the
// shapes Claude Code and Codex send) never crash the server, never get a 5xx and never go
// unanswered; every refusal is an error in the API's own shape, and nothing is left running.
#include "server/server_test_util.h"

namespace k3::server {
namespace {

using testing::scripted_server;

struct Api {
  std::string path;
  std::vector<std::string> seeds;
  bool anthropic;
};

const std::vector<Api>& apis() {
  static const std::vector<Api> list = {
      {"/v1/messages",
       {R"({"model": "k3-tiny", "max_tokens": 4, "temperature": 0, "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}], "messages": [{"role": "user", "content": [{"type": "text", "text": "SCRIPT_TOOLS"}]}], "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object", "properties": {"a": {"type": "string"}}}, "defer_loading": false}], "tool_choice": {"type": "auto", "disable_parallel_tool_use": true}, "thinking": {"type": "adaptive", "display": "omitted"}, "output_config": {"effort": "high"}, "stream": true})",
        R"({"model": "k3-tiny", "max_tokens": 3, "stop_sequences": ["x"], "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"}, {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": "b"}}]}, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "r"}], "is_error": false}]}], "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}, "metadata": {"user_id": "u"}})"},
       true},
      {"/v1/responses",
       {R"({"model": "k3-tiny", "max_output_tokens": 4, "temperature": 0, "instructions": "Be brief.", "input": [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "d"}]}, {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "SCRIPT_TOOLS"}]}], "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": false}, {"type": "web_search"}], "tool_choice": "auto", "parallel_tool_calls": true, "reasoning": {"summary": "auto"}, "store": false, "include": ["reasoning.encrypted_content"], "stream": true})", R"({"model": "k3-tiny", "max_output_tokens": 3, "input": [{"type": "message", "role": "user", "content": "hi"}, {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]}, {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{\"a\": 1}"}, {"type": "function_call_output", "call_id": "call_1", "output": "r"}], "text": {"format": {"type": "text"}}, "prompt_cache_key": "k"})"},
       false},
  };
  return list;
}

TEST(ServerApiFuzz, MutatedMessagesAndResponsesBodiesNeverCrashOrGetA5xx) {
  const int port = scripted_server().port;
  core::Rng rng(77);  // (seeds 1-11 were run once too: no failure)
  for (const Api& api : apis()) {
    int ok = 0, rejected = 0;
    for (int trial = 0; trial < 1000; ++trial) {
      const std::string body = testing::mutated_body(api.seeds[rng.next_u64() % api.seeds.size()], rng);
      const testing::Reply r = testing::send(port, "POST", api.path, body);
      ASSERT_NE(r.status, 0) << api.path << ": no reply to: " << body;
      ASSERT_LT(r.status, 500) << api.path << ": " << body << "\n-> " << r.body;
      if (r.status == 200) {
        ++ok;
        continue;
      }
      ++rejected;
      const Json j = r.json();
      if (api.anthropic) {
        EXPECT_EQ(j["type"], "error") << r.body;
        EXPECT_TRUE(j["error"]["type"].is_string() && j["error"]["message"].is_string()) << r.body;
      } else {
        EXPECT_TRUE(j["error"]["message"].is_string() && j["error"]["type"].is_string()) << r.body;
      }
    }
    EXPECT_GT(rejected, 200) << api.path;
    EXPECT_GT(ok, 10) << api.path;
  }
  EXPECT_EQ(testing::get(port, "/health").status, 200);
  EXPECT_TRUE(testing::engine_idle(*scripted_server().engine));
}

}  // namespace
}  // namespace k3::server
