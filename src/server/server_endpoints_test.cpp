// server/server_endpoints_test.cpp: GET /v1/models, /health, /metrics (vLLM names present and
// counts moving after requests), POST /tokenize and /detokenize (vLLM shapes), and keep-alive
// connections serving several requests.
#include "server/server_test_util.h"

namespace k3::server {
namespace {

using testing::get;
using testing::model_server;
using testing::post;

double metric(const std::string& page, const std::string& sample) {
  const size_t at = page.find("\n" + sample + " ");
  if (at == std::string::npos) return -1;
  return std::stod(page.substr(at + sample.size() + 2));
}

TEST(ServerEndpoints, ModelsAndHealth) {
  const auto r = get(model_server().port, "/v1/models");
  ASSERT_EQ(r.status, 200);
  const Json j = r.json();
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "k3-tiny");
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_EQ(j["data"][0]["max_model_len"], 512);
  EXPECT_EQ(get(model_server().port, "/health").status, 200);
}

TEST(ServerEndpoints, MetricsNamesPresentAndCountsMove) {
  const int port = model_server().port;
  const std::string l = "{engine=\"0\",model_name=\"k3-tiny\"}";
  ASSERT_TRUE(testing::engine_idle(model_server().engine()));  // stats settle after each step
  const auto before = get(port, "/metrics");
  ASSERT_EQ(before.status, 200);
  EXPECT_NE(before.content_type.find("text/plain"), std::string::npos);
  for (const char* name :
       {"vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds",
        "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total", "vllm:num_requests_running", "vllm:num_requests_waiting",
        "vllm:num_preemptions_total", "vllm:kv_cache_usage_perc", "vllm:request_success_total"})
    EXPECT_NE(before.body.find("# TYPE " + std::string(name) + " "), std::string::npos) << name;

  const Json body = {{"prompt", "count me"}, {"max_tokens", 6}, {"ignore_eos", true}};
  ASSERT_EQ(post(port, "/v1/completions", body).status, 200);
  ASSERT_TRUE(testing::engine_idle(model_server().engine()));
  const std::string after = get(port, "/metrics").body;
  const int64_t prompt_len = static_cast<int64_t>(model_server().tokenizer().encode("count me").size());
  EXPECT_EQ(metric(after, "vllm:prompt_tokens_total" + l) - metric(before.body, "vllm:prompt_tokens_total" + l),
            static_cast<double>(prompt_len));
  EXPECT_EQ(metric(after, "vllm:generation_tokens_total" + l) - metric(before.body, "vllm:generation_tokens_total" + l),
            6);
  EXPECT_EQ(metric(after, "vllm:time_to_first_token_seconds_count" + l) -
                metric(before.body, "vllm:time_to_first_token_seconds_count" + l),
            1);
  EXPECT_EQ(metric(after, "vllm:inter_token_latency_seconds_count" + l) -
                metric(before.body, "vllm:inter_token_latency_seconds_count" + l),
            5);
  EXPECT_EQ(metric(after, "vllm:e2e_request_latency_seconds_count" + l) -
                metric(before.body, "vllm:e2e_request_latency_seconds_count" + l),
            1);
  const std::string length =
      "vllm:request_success_total{engine=\"0\",model_name=\"k3-tiny\",finished_reason=\"length\"}";
  EXPECT_EQ(metric(after, length) - metric(before.body, length), 1);
  EXPECT_EQ(metric(after, "vllm:num_requests_running" + l), 0);
}

TEST(ServerEndpoints, TokenizeAndDetokenize) {
  const int port = model_server().port;
  const auto& tok = model_server().tokenizer();
  const Json t = post(port, "/tokenize", Json{{"prompt", "Hello, world! 東京"}, {"return_token_strs", true}}).json();
  const auto ids = tok.encode("Hello, world! 東京", tokenizer::Specials::allow);
  EXPECT_EQ(t["tokens"].get<std::vector<int32_t>>(), ids);
  EXPECT_EQ(t["count"], ids.size());
  EXPECT_EQ(t["max_model_len"], 512);
  EXPECT_EQ(t["token_strs"].size(), ids.size());
  const Json d = post(port, "/detokenize", Json{{"tokens", ids}}).json();
  EXPECT_EQ(d["prompt"], "Hello, world! 東京");

  const Json messages = Json::array({{{"role", "user"}, {"content", "Hi"}}});
  const Json c = post(port, "/tokenize", Json{{"messages", messages}}).json();
  EXPECT_EQ(c["tokens"].get<std::vector<int32_t>>(), tokenizer::encode_chat(tok, messages, nullptr, {}));
  // The same prompt the chat endpoint would run: its usage says so.
  const Json chat = post(port, "/v1/chat/completions", Json{{"messages", messages}, {"max_tokens", 1}}).json();
  EXPECT_EQ(chat["usage"]["prompt_tokens"], c["count"]);

  EXPECT_EQ(post(port, "/tokenize", Json{{"prompt", 5}}).status, 400);
  EXPECT_EQ(post(port, "/detokenize", Json{{"tokens", Json::array({1, 99999})}}).status, 400);
}

TEST(ServerEndpoints, KeepAliveConnectionServesManyRequests) {
  httplib::Client cli("127.0.0.1", model_server().port);
  cli.set_keep_alive(true);
  for (int i = 0; i < 5; ++i) {
    auto r = cli.Post("/v1/completions", dump_json(Json{{"prompt", "again"}, {"max_tokens", 2}}), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    auto h = cli.Get("/health");
    ASSERT_TRUE(h);
    EXPECT_EQ(h->status, 200);
  }
}

}  // namespace
}  // namespace k3::server
