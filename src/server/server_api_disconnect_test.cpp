// server/server_api_disconnect_test.cpp: the Anthropic and Responses front ends free what a
// client leaves behind, as chat does (server_concurrency_test.cpp): a stream dropped after a
// few events and a non-streamed request given up on both abort their engine request, and the
// engine ends with no request, page or slot in use (there is no ignore_eos in these APIs, so an
// answer the random model ends early is retried with another prompt).
#include <functional>

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

// The random model may end its answer (eos) before the client leaves, or just before the
// server notices it left; then that attempt says nothing about aborts, and another prompt is
// tried. Every attempt must leave the engine idle, and one must end in the abort.
constexpr int kAttempts = 5;

void expect_stream_drop_frees_everything(const std::string& path, const std::function<Json(int)>& body) {
  testing::ModelServer& m = model_server();
  bool left = false;
  for (int attempt = 0; attempt < kAttempts && !left; ++attempt) {
    ASSERT_TRUE(engine_idle(m.engine()));
    const engine::EngineStats before = m.engine().stats();
    int events = 0;
    const auto r = send(m.port, "POST", path, dump_json(body(attempt)), [&](const std::string& got) {
      events = event_count(got);
      return events < 6;  // leave after six events (past the opening ones, into the tokens)
    });
    EXPECT_TRUE(engine_idle(m.engine(), std::chrono::seconds(10))) << path << ": something is still held";
    const int64_t aborted = m.engine().stats().aborted - before.aborted;
    EXPECT_LE(aborted, 1) << path;
    if (r.status != 0 || aborted == 0) continue;  // it ended by itself before the server saw the client go
    left = true;
    EXPECT_GE(events, 6);
  }
  EXPECT_TRUE(left) << path << ": in " << kAttempts << " attempts the answer always ended before the client left";
}

void expect_given_up_request_frees_everything(const std::string& path, const std::function<Json(int)>& body) {
  testing::ModelServer& m = model_server();
  bool left = false;
  for (int attempt = 0; attempt < kAttempts && !left; ++attempt) {
    ASSERT_TRUE(engine_idle(m.engine()));
    const engine::EngineStats before = m.engine().stats();
    bool replied = false;
    {
      httplib::Client cli("127.0.0.1", m.port);
      cli.set_read_timeout(0, 150000);  // gives up after 150 ms
      replied = static_cast<bool>(cli.Post(path, dump_json(body(attempt)), "application/json"));
    }
    EXPECT_TRUE(engine_idle(m.engine(), std::chrono::seconds(10))) << path << ": something is still held";
    const int64_t aborted = m.engine().stats().aborted - before.aborted;
    EXPECT_LE(aborted, 1) << path;
    if (replied || aborted == 0) continue;  // it ended by itself before the server saw the client go
    left = true;
  }
  EXPECT_TRUE(left) << path << ": in " << kAttempts << " attempts the answer always ended before the client left";
}

TEST(ServerApiDisconnect, MessagesStreamDroppedMidwayFreesEverything) {
  expect_stream_drop_frees_everything("/v1/messages", [](int k) { return messages_body(10 + k, true); });
}

TEST(ServerApiDisconnect, MessagesRequestGivenUpFreesEverything) {
  expect_given_up_request_frees_everything("/v1/messages", [](int k) { return messages_body(20 + k, false); });
}

TEST(ServerApiDisconnect, ResponsesStreamDroppedMidwayFreesEverything) {
  expect_stream_drop_frees_everything("/v1/responses", [](int k) { return responses_body(30 + k, true); });
}

TEST(ServerApiDisconnect, ResponsesRequestGivenUpFreesEverything) {
  expect_given_up_request_frees_everything("/v1/responses", [](int k) { return responses_body(40 + k, false); });
}

}  // namespace
}  // namespace k3::server
