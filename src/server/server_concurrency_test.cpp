// server/server_concurrency_test.cpp: many clients at once and clients that leave, on the real
// tiny model: 64 concurrent streams all complete; a client that disconnects mid-stream or
// gives up on a non-streaming request has its request aborted, and after every scenario the
// engine holds no request, no KV page and no KDA slot (no leaks); 200 streams (more than the
// engine runs at once) with random disconnects end each either complete or cleanly aborted.
// Draining (a server of its own): in-flight streams get a final error event, new requests 503.
#include <atomic>

#include "core/rng.h"
#include "server/server_test_util.h"

namespace k3::server {
namespace {

using testing::engine_idle;
using testing::model_server;
using testing::send;

std::string stream_body(int i, int max_tokens) {
  return dump_json(Json{{"prompt", "client " + std::to_string(i) + " says hello"},
                        {"max_tokens", max_tokens},
                        {"ignore_eos", true},
                        {"stream", true},
                        {"temperature", 0.8},
                        {"seed", i}});
}

TEST(ServerConcurrency, SixtyFourConcurrentStreamsAllComplete) {
  testing::ModelServer& m = model_server();
  ASSERT_TRUE(engine_idle(m.engine()));  // stats are published after each step: let them settle
  const engine::EngineStats before = m.engine().stats();
  constexpr int kClients = 64, kTokens = 12;
  std::vector<testing::Reply> replies(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i)
    threads.emplace_back([&, i] { replies[i] = send(m.port, "POST", "/v1/completions", stream_body(i, kTokens)); });
  for (auto& t : threads) t.join();
  for (int i = 0; i < kClients; ++i) {
    ASSERT_EQ(replies[i].status, 200) << i << ": " << replies[i].body;
    const auto chunks = testing::stream_chunks(replies[i]);
    std::string finish;
    int with_text = 0;
    for (const Json& c : chunks) {
      if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
      with_text += !c["choices"][0]["text"].get<std::string>().empty();
    }
    EXPECT_EQ(finish, "length") << i;
    EXPECT_GT(with_text, 0) << i;
  }
  EXPECT_TRUE(engine_idle(m.engine()));
  const engine::EngineStats after = m.engine().stats();
  EXPECT_EQ(after.generated_tokens - before.generated_tokens, kClients * kTokens);
  EXPECT_EQ(after.aborted, before.aborted);
}

TEST(ServerConcurrency, StreamingDisconnectAbortsAndFreesTheCache) {
  testing::ModelServer& m = model_server();
  ASSERT_TRUE(engine_idle(m.engine()));  // stats are published after each step: let them settle
  const engine::EngineStats before = m.engine().stats();
  int events = 0;
  const auto r = send(m.port, "POST", "/v1/completions", stream_body(1000, 480), [&](const std::string& got) {
    events = static_cast<int>(testing::sse_data(got).size());
    return events < 3;  // leave after three chunks
  });
  EXPECT_EQ(r.status, 0);  // cancelled by us
  EXPECT_GE(events, 3);
  EXPECT_TRUE(engine_idle(m.engine(), std::chrono::seconds(5)));
  const engine::EngineStats after = m.engine().stats();
  EXPECT_EQ(after.aborted - before.aborted, 1);
  EXPECT_LT(after.generated_tokens - before.generated_tokens, 480);  // aborted, not run to the end
}

TEST(ServerConcurrency, NonStreamingClientThatGivesUpAbortsItsRequest) {
  testing::ModelServer& m = model_server();
  ASSERT_TRUE(engine_idle(m.engine()));  // stats are published after each step: let them settle
  const engine::EngineStats before = m.engine().stats();
  {
    httplib::Client cli("127.0.0.1", m.port);
    cli.set_read_timeout(0, 150000);  // gives up after 150 ms; 480 tokens take far longer
    auto r = cli.Post("/v1/completions",
                      dump_json(Json{{"prompt", "slow one"}, {"max_tokens", 480}, {"ignore_eos", true}}),
                      "application/json");
    EXPECT_FALSE(r);
  }
  EXPECT_TRUE(engine_idle(m.engine(), std::chrono::seconds(5)));
  const engine::EngineStats after = m.engine().stats();
  EXPECT_EQ(after.aborted - before.aborted, 1);
  EXPECT_LT(after.generated_tokens - before.generated_tokens, 480);
}

TEST(ServerConcurrency, TwoHundredStreamsWithRandomDisconnectsLeakNothing) {
  testing::ModelServer& m = model_server();
  ASSERT_TRUE(engine_idle(m.engine()));  // stats are published after each step: let them settle
  const engine::EngineStats before = m.engine().stats();
  constexpr int kClients = 200;
  core::Rng rng(11);
  std::vector<int> leave_after(kClients);  // 0: stays to the end
  for (int& k : leave_after) k = rng.next_u64() % 2 ? 0 : 1 + static_cast<int>(rng.next_u64() % 6);
  std::atomic<int> completed{0}, left{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i)
    threads.emplace_back([&, i] {
      const auto r = send(m.port, "POST", "/v1/completions", stream_body(2000 + i, 24), [&](const std::string& got) {
        return leave_after[i] == 0 || static_cast<int>(testing::sse_data(got).size()) < leave_after[i];
      });
      if (leave_after[i] == 0) {
        EXPECT_EQ(r.status, 200);
        const auto data = testing::sse_data(r.body);
        ASSERT_FALSE(data.empty());
        EXPECT_EQ(data.back(), "[DONE]");
        ++completed;
      } else {
        ++left;
      }
    });
  for (auto& t : threads) t.join();
  int stayers = 0;
  for (int k : leave_after) stayers += k == 0;
  EXPECT_EQ(completed.load(), stayers);
  EXPECT_TRUE(engine_idle(m.engine(), std::chrono::seconds(10)));
  const engine::EngineStats after = m.engine().stats();
  // Each client that left was aborted (or had just finished when it left); nothing is held.
  EXPECT_EQ(after.submitted - before.submitted, kClients);
  EXPECT_LE(after.aborted - before.aborted, left.load());
  EXPECT_GE(after.aborted - before.aborted, left.load() / 2);
  EXPECT_EQ(after.cache.blocks_in_use, 0);
  EXPECT_EQ(after.cache.slots_in_use, 0);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (m.http->inflight() > 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(m.http->inflight(), 0);
}

// A server of its own (draining is one-way), over a scripted engine slowed to 5 ms a step.
TEST(ServerDrain, InflightStreamsFinishOrGetAFinalErrorAndNewRequestsGet503) {
  testing::ScriptedServer s(std::chrono::milliseconds(5));
  std::atomic<bool> long_started{false}, short_started{false};
  testing::Reply long_reply, short_reply;
  std::thread long_client([&] {
    long_reply = send(s.port, "POST", "/v1/completions",
                      dump_json(Json{{"prompt", "x"}, {"max_tokens", 400}, {"stream", true}}), [&](const std::string&) {
                        long_started = true;
                        return true;
                      });
  });
  std::thread short_client([&] {
    short_reply = send(s.port, "POST", "/v1/completions",
                       dump_json(Json{{"prompt", "y"}, {"max_tokens", 30}, {"stream", true}}), [&](const std::string&) {
                         short_started = true;
                         return true;
                       });
  });
  // Both streams are in flight before the drain starts (else a slow machine may deliver the short
  // request after it, and a 503 would be right).
  while (!long_started || !short_started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::thread drainer([&] { s.http->drain(std::chrono::milliseconds(1000)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto refused = testing::post(s.port, "/v1/completions", Json{{"prompt", "late"}, {"max_tokens", 2}});
  EXPECT_EQ(refused.status, 503) << refused.body;
  EXPECT_EQ(refused.json()["error"]["code"], "server_shutting_down");
  EXPECT_EQ(testing::get(s.port, "/health").status, 503);
  EXPECT_EQ(testing::get(s.port, "/v1/models").status, 200);  // read-only endpoints still answer
  drainer.join();
  long_client.join();
  short_client.join();

  // The short stream finished within the grace period, normally.
  const auto short_chunks = testing::stream_chunks(short_reply);
  ASSERT_FALSE(short_chunks.empty());
  EXPECT_EQ(short_chunks.back()["choices"][0]["finish_reason"], "length");
  // The long one was cut: a final error event, then [DONE].
  const auto data = testing::sse_data(long_reply.body);
  ASSERT_GE(data.size(), 2u);
  EXPECT_EQ(data.back(), "[DONE]");
  const Json last = Json::parse(data[data.size() - 2]);
  EXPECT_EQ(last["error"]["code"], "server_shutting_down") << last.dump();
  EXPECT_EQ(s.http->inflight(), 0);
  EXPECT_TRUE(engine_idle(*s.engine));
}

}  // namespace
}  // namespace k3::server
