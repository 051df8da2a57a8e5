// server/server_errors_test.cpp: bad input over HTTP: every error reply is OpenAI's error JSON
// with the right status (400, 404, 405, 413, 503) and names the field; a fuzz of malformed and
// mutated bodies never gets a 5xx, never goes unanswered and never takes the server down.
#include "core/rng.h"
#include "server/server_test_util.h"

namespace k3::server {
namespace {

using testing::get;
using testing::post;
using testing::scripted_server;
using testing::send;

// The reply is an OpenAI error: status, JSON body {"error": {message, type, param, code}}.
Json expect_error(const testing::Reply& r, int status, const std::string& param = "") {
  EXPECT_EQ(r.status, status) << r.body;
  EXPECT_NE(r.content_type.find("application/json"), std::string::npos) << r.content_type;
  Json j;
  try {
    j = r.json();
  } catch (...) {
    ADD_FAILURE() << "not JSON: " << r.body;
    return j;
  }
  EXPECT_TRUE(j["error"]["message"].is_string()) << r.body;
  EXPECT_FALSE(j["error"]["message"].get<std::string>().empty());
  EXPECT_TRUE(j["error"]["type"].is_string());
  EXPECT_TRUE(j["error"].contains("param") && j["error"].contains("code"));
  if (!param.empty()) {
    EXPECT_EQ(j["error"]["param"], param) << r.body;
  }
  return j;
}

TEST(ServerErrors, MalformedBodies) {
  const int port = scripted_server().port;
  expect_error(send(port, "POST", "/v1/completions", "{not json"), 400);
  expect_error(send(port, "POST", "/v1/completions", ""), 400);
  expect_error(send(port, "POST", "/v1/chat/completions", "[1,2,3]"), 400);
  expect_error(send(port, "POST", "/v1/completions", "{\"prompt\": \"\xC3\x28\"}"), 400);  // bad UTF-8
  expect_error(send(port, "POST", "/v1/completions", std::string(5000, '[')), 400);
  // An unknown top-level field changes nothing: accepted (and counted in /metrics); a nested
  // object's unknown key is still named.
  auto ignored = [&] {
    const std::string page = get(port, "/metrics").body;
    const std::string key =
        "k3serve:ignored_request_fields_total{engine=\"0\",model_name=\"k3-tiny\","
        "api=\"completions\",field=\"frobnicate\"} ";
    const size_t at = page.find(key);
    return at == std::string::npos ? 0.0 : std::stod(page.substr(at + key.size()));
  };
  const double before = ignored();
  EXPECT_EQ(post(port, "/v1/completions", Json{{"prompt", "x"}, {"max_tokens", 1}, {"frobnicate", 1}}).status, 200);
  EXPECT_EQ(ignored(), before + 1);
  const Json e = expect_error(post(port, "/v1/completions",
                                   Json{{"prompt", "x"}, {"stream", true}, {"stream_options", {{"frobnicate", 1}}}}),
                              400, "stream_options.frobnicate");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  expect_error(post(port, "/v1/completions", Json{{"prompt", "x"}, {"temperature", "warm"}}), 400, "temperature");
  expect_error(post(port, "/v1/chat/completions", Json{{"messages", Json::array({{{"role", "user"}}})}, {"n", 99}}),
               400, "n");
  expect_error(post(port, "/v1/chat/completions",
                    Json{{"messages", Json::array({{{"role", "bot"}, {"content", "x"}}})}}),
               400, "messages[0].role");
}

TEST(ServerErrors, ContextLengthModelAndRoutes) {
  const int port = scripted_server().port;
  std::vector<int32_t> long_prompt(600, 5);
  const Json e = expect_error(post(port, "/v1/completions", Json{{"prompt", long_prompt}}), 400, "prompt");
  EXPECT_EQ(e["error"]["code"], "context_length_exceeded");
  expect_error(post(port, "/v1/completions", Json{{"prompt", "hi"}, {"max_tokens", 100000}}), 400, "max_tokens");
  const Json m = expect_error(post(port, "/v1/completions", Json{{"prompt", "hi"}, {"model", "gpt-5"}}), 404, "model");
  EXPECT_EQ(m["error"]["code"], "model_not_found");
  expect_error(get(port, "/v1/nothing"), 404);
  expect_error(send(port, "DELETE", "/v1/models"), 404);
  expect_error(get(port, "/v1/completions"), 405);
  expect_error(post(port, "/v1/models", Json::object()), 405);
}

TEST(ServerErrors, BodyOverTheLimitIs413) {
  const int port = scripted_server().port;
  const std::string big = "{\"prompt\": \"" + std::string(9u << 20, 'a') + "\"}";
  const Json e = expect_error(send(port, "POST", "/v1/completions", big), 413);
  EXPECT_EQ(e["error"]["code"], "request_too_large");
  EXPECT_EQ(get(port, "/health").status, 200);  // still serving
}

// Mutations of valid bodies: flipped bytes, truncations, spliced values, wrong types. Every
// reply is 200 or an OpenAI error below 500, and the server answers /health afterwards.
TEST(ServerErrors, FuzzedBodiesNeverCrashOrGetA5xx) {
  const int port = scripted_server().port;
  const std::vector<std::string> seeds = {
      R"({"prompt": "SCRIPT_STORY", "max_tokens": 4, "stop": ["a", "b"], "logprobs": 2, "n": 2})",
      R"({"messages": [{"role": "user", "content": "SCRIPT_TOOLS"}], "max_tokens": 4, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}], "tool_choice": "auto"})",
      R"({"messages": [{"role": "system", "content": [{"type": "text", "text": "x"}]}, {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]}, {"role": "tool", "tool_call_id": "c1", "content": "r"}], "max_tokens": 3, "logit_bias": {"5": 1}})",
      R"({"prompt": [[1, 2, 3], [4, 5]], "max_tokens": 3, "temperature": 0.5, "top_k": 5, "seed": 1})",
  };
  core::Rng rng(2024);
  int ok = 0, rejected = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const std::string body = testing::mutated_body(seeds[rng.next_u64() % seeds.size()], rng);
    const std::string path = body.find("messages") != std::string::npos ? "/v1/chat/completions" : "/v1/completions";
    const testing::Reply r = send(port, "POST", path, body);
    ASSERT_NE(r.status, 0) << "no reply to: " << body;
    ASSERT_LT(r.status, 500) << body << "\n-> " << r.body;
    if (r.status == 200) {
      ++ok;
    } else {
      ++rejected;
      expect_error(r, r.status);
    }
  }
  EXPECT_GT(rejected, 500);
  EXPECT_GT(ok, 25);
  EXPECT_EQ(get(port, "/health").status, 200);
  EXPECT_TRUE(testing::engine_idle(*scripted_server().engine));
}

}  // namespace
}  // namespace k3::server
