// server/server_api_disconnect_test.cpp: the Anthropic and Responses front ends free what a
// client leaves behind, as chat does (server_concurrency_test.cpp): a stream dropped after a
// few events and a non-streamed request given up on both abort their engine request, and the
// engine ends with no request, page or slot in use.
#include "server/server_test_util.h"

namespace k3::server {
namespace {

using testing::engine_idle;
using testing::model_server;
using testing::send;

Json messages_body(int seed, bool stream) {
  return {{"model", "k3-tiny"},
          {"max_tokens", 400},
          {"temperature", 1},
          {"stream", stream},
          {"metadata", {{"user_id", std::to_string(seed)}}},
          {"messages", Json::array({{{"role", "user"}, {"content", "disconnect me " + std::to_string(seed)}}})}};
}

Json responses_body(int seed, bool stream) {
  return {{"model", "k3-tiny"},
          {"max_output_tokens", 400},
          {"stream", stream},
          {"store", false},
          {"input", "disconnect me " + std::to_string(seed)}};
}

// Count of SSE events (blank-line separated blocks) received so far.
int event_count(const std::string& got) {
  int n = 0;
  for (size_t pos = got.find("\n\n"); pos != std::string::npos; pos = got.find("\n\n", pos + 2)) ++n;
  return n;
}

void expect_stream_drop_frees_everything(const std::string& path, const Json& body) {
  testing::ModelServer& m = model_server();
  ASSERT_TRUE(engine_idle(m.engine()));
  const engine::EngineStats before = m.engine().stats();
  int events = 0;
  const auto r = send(m.port, "POST", path, dump_json(body), [&](const std::string& got) {
    events = event_count(got);
    return events < 6;  // leave after six events (past the opening ones, into the tokens)
  });
  EXPECT_EQ(r.status, 0);  // cancelled by us
  EXPECT_GE(events, 6);
  EXPECT_TRUE(engine_idle(m.engine(), std::chrono::seconds(10))) << path << ": something is still held";
  const engine::EngineStats after = m.engine().stats();
  EXPECT_EQ(after.aborted - before.aborted, 1) << path;
  EXPECT_LT(after.generated_tokens - before.generated_tokens, 400) << path << ": ran to the end";
}

void expect_given_up_request_frees_everything(const std::string& path, const Json& body) {
  testing::ModelServer& m = model_server();
  ASSERT_TRUE(engine_idle(m.engine()));
  const engine::EngineStats before = m.engine().stats();
  {
    httplib::Client cli("127.0.0.1", m.port);
    cli.set_read_timeout(0, 150000);  // gives up after 150 ms; 400 tokens take far longer
    auto r = cli.Post(path, dump_json(body), "application/json");
    EXPECT_FALSE(r);
  }
  EXPECT_TRUE(engine_idle(m.engine(), std::chrono::seconds(10))) << path << ": something is still held";
  EXPECT_EQ(m.engine().stats().aborted - before.aborted, 1) << path;
}

TEST(ServerApiDisconnect, MessagesStreamDroppedMidwayFreesEverything) {
  expect_stream_drop_frees_everything("/v1/messages", messages_body(1, true));
}

TEST(ServerApiDisconnect, MessagesRequestGivenUpFreesEverything) {
  expect_given_up_request_frees_everything("/v1/messages", messages_body(2, false));
}

TEST(ServerApiDisconnect, ResponsesStreamDroppedMidwayFreesEverything) {
  expect_stream_drop_frees_everything("/v1/responses", responses_body(3, true));
}

TEST(ServerApiDisconnect, ResponsesRequestGivenUpFreesEverything) {
  expect_given_up_request_frees_everything("/v1/responses", responses_body(4, false));
}

}  // namespace
}  // namespace k3::server
