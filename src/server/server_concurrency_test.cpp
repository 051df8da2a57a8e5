// server/server_concurrency_test.cpp: many clients at once and clients that leave, on the real
// tiny model: 64 concurrent streams all complete; a client that disconnects mid-stream, gives
// up on a non-streaming request, or leaves while its long prompt is still prefilling has its
// request aborted, and after every scenario the engine holds no request, no KV page and no KDA
// slot (no leaks); 200 streams (more than the engine runs at once) with random disconnects end
// each either complete or cleanly aborted. Draining (a server of its own): in-flight streams get
// a final error event, new requests 503.
//
// No test here waits on the clock: each waits for the state it needs (engine stats, the
// server's inflight(), /health) under a deadline that only guards against a hang and names
// what never happened; a client leaves at a moment the engine's counters show, on a raw socket.
// (Draining's grace period is time by definition; its test says why its margins hold.)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>

#include "core/rng.h"
#include "server/server_test_util.h"

namespace k3::server {
namespace {

using testing::engine_idle;
using testing::model_server;
using testing::send;

// Far beyond what a loaded 2-core CI machine needs: a hang guard, not a timing bound.
constexpr std::chrono::seconds kPatience{60};

// Polls `done` until it holds; past `limit` the failure names what never happened.
template <class F>
::testing::AssertionResult eventually(const std::string& what, F&& done, std::chrono::seconds limit = kPatience) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= until)
      return ::testing::AssertionFailure() << what << " never happened (waited " << limit.count() << " s)";
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a poll interval, not a timing
  }
  return ::testing::AssertionSuccess();
}

// The engine ends holding nothing (no request, page or slot); else what it still holds.
::testing::AssertionResult engine_settles(engine::Engine& e, std::chrono::seconds limit = kPatience) {
  if (engine_idle(e, limit)) return ::testing::AssertionSuccess();
  const engine::EngineStats s = e.stats();
  return ::testing::AssertionFailure() << "the engine never emptied in " << limit.count() << " s: " << s.running
                                       << " running, " << s.waiting << " waiting, " << s.cache.blocks_in_use
                                       << " pages and " << s.cache.slots_in_use << " slots in use, "
                                       << s.submitted - s.finished << " of " << s.submitted
                                       << " submitted requests unfinished";
}

// A client on a raw socket: sends one request, never reads, and leaves (closes) exactly when
// the test says - not when a read timeout happens to fire.
class RawClient {
 public:
  RawClient(int port, const std::string& path, const std::string& body) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    if (fd_ < 0 || ::connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) return;
    const std::string req = "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
                            "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    size_t sent = 0;
    while (sent < req.size()) {
      const ssize_t n = ::send(fd_, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return;
      sent += static_cast<size_t>(n);
    }
    sent_ = true;
  }
  ~RawClient() { leave(); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;
  bool sent() const { return sent_; }
  void leave() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  bool sent_ = false;
};

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
  ASSERT_TRUE(engine_settles(m.engine()));  // stats are published after each step: let them settle
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
  EXPECT_TRUE(engine_settles(m.engine()));
  const engine::EngineStats after = m.engine().stats();
  EXPECT_EQ(after.generated_tokens - before.generated_tokens, kClients * kTokens);
  EXPECT_EQ(after.aborted, before.aborted);
}

TEST(ServerConcurrency, StreamingDisconnectAbortsAndFreesTheCache) {
  testing::ModelServer& m = model_server();
  ASSERT_TRUE(engine_settles(m.engine()));  // stats are published after each step: let them settle
  const engine::EngineStats before = m.engine().stats();
  int events = 0;
  const auto r = send(m.port, "POST", "/v1/completions", stream_body(1000, 480), [&](const std::string& got) {
    events = static_cast<int>(testing::sse_data(got).size());
    return events < 3;  // leave after three chunks
  });
  EXPECT_EQ(r.status, 0);  // cancelled by us
  EXPECT_GE(events, 3);
  EXPECT_TRUE(engine_settles(m.engine()));
  const engine::EngineStats after = m.engine().stats();
  EXPECT_EQ(after.aborted - before.aborted, 1);
  EXPECT_LT(after.generated_tokens - before.generated_tokens, 480);  // aborted, not run to the end
}

TEST(ServerConcurrency, NonStreamingClientThatGivesUpAbortsItsRequest) {
  testing::ModelServer& m = model_server();
  ASSERT_TRUE(engine_settles(m.engine()));  // stats are published after each step: let them settle
  const engine::EngineStats before = m.engine().stats();
  {
    RawClient client(m.port, "/v1/completions",
                     dump_json(Json{{"prompt", "slow one"}, {"max_tokens", 480}, {"ignore_eos", true}}));
    ASSERT_TRUE(client.sent());
    // It gives up once its request is generating: the reply (all 480 tokens) is still far off.
    ASSERT_TRUE(eventually("a first generated token of the request",
                           [&] { return m.engine().stats().generated_tokens > before.generated_tokens; }));
  }
  EXPECT_TRUE(engine_settles(m.engine()));
  const engine::EngineStats after = m.engine().stats();
  EXPECT_EQ(after.aborted - before.aborted, 1);
  EXPECT_LT(after.generated_tokens - before.generated_tokens, 480);
}

// A client that leaves while its long prompt (~400 tokens: chunks of 384 and the rest, since
// chunks end on 64-token boundaries; the first takes a few hundred ms on the CPU) is being
// prefilled, before any token: the handler notices (the connection probe, or the stream's
// socket peek) and aborts the request - as a rule between the two chunks - which frees what the
// prefill took. Both ways of waiting for a reply, non-streaming and streaming.
TEST(ServerConcurrency, ClientThatLeavesDuringPrefillLeavesNothingBehind) {
  testing::ModelServer& m = model_server();
  static int run = 0;  // a fresh prompt each time (--gtest_repeat): no prefix-cache hit shortens the prefill
  for (const bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streaming" : "non-streaming");
    // The client leaves once the engine has the request and no token of it exists yet. That
    // was during the prefill if the prefill had begun before the abort came (the counters say
    // so afterwards); on a stalled machine the moment can fall outside it (the poll saw the
    // request only after its first token, or the abort overtook the admission). Such an attempt
    // must still free everything, and the case is tried again with a fresh prompt.
    bool left_during_prefill = false;
    std::string attempts;  // what each attempt saw, for the failure message
    int attempt = 0;
    while (++attempt <= 5 && !left_during_prefill) {
      SCOPED_TRACE("attempt " + std::to_string(attempt));
      ASSERT_TRUE(engine_settles(m.engine()));
      const engine::EngineStats before = m.engine().stats();
      core::Rng rng(static_cast<uint64_t>(++run));
      std::string prompt = "prefill " + std::to_string(run) + ":";  // unique from its first tokens
      while (m.tokenizer().encode(prompt).size() < 400) prompt += " w" + std::to_string(rng.next_u64() % 1000);
      const auto prompt_tokens = static_cast<int64_t>(m.tokenizer().encode(prompt).size());
      const int64_t max_tokens = 512 - prompt_tokens;  // the rest of the context, ~110 tokens
      bool no_token_yet = false;
      {
        RawClient client(
            m.port, "/v1/completions",
            dump_json(Json{{"prompt", prompt}, {"max_tokens", max_tokens}, {"ignore_eos", true}, {"stream", stream}}));
        ASSERT_TRUE(client.sent());
        ASSERT_TRUE(eventually("the engine receiving the request",
                               [&] { return m.engine().stats().submitted > before.submitted; }));
        no_token_yet = m.engine().stats().generated_tokens == before.generated_tokens;
        client.leave();
      }
      EXPECT_TRUE(engine_settles(m.engine()));
      const engine::EngineStats after = m.engine().stats();
      EXPECT_EQ(after.submitted - before.submitted, 1);
      EXPECT_EQ(after.aborted - before.aborted, 1) << "the request was not aborted";
      EXPECT_LT(after.generated_tokens - before.generated_tokens, max_tokens) << "it ran to the end";
      EXPECT_TRUE(eventually("every handler having replied (inflight 0)", [&] { return m.http->inflight() == 0; }));
      const int64_t prefilled = after.prefill_tokens - before.prefill_tokens;
      left_during_prefill = no_token_yet && prefilled > 0;
      attempts += "\n  attempt " + std::to_string(attempt) + ": " + (no_token_yet ? "no token" : "a token") +
                  " when it left, " + std::to_string(prefilled) + " of " + std::to_string(prompt_tokens) +
                  " prompt tokens prefilled";
    }
    RecordProperty(stream ? "attempts_streaming" : "attempts_non_streaming", attempt - 1);
    EXPECT_TRUE(left_during_prefill) << "in 5 attempts the client never left between its request's admission and "
                                        "its first token:"
                                     << attempts;
  }
}

TEST(ServerConcurrency, TwoHundredStreamsWithRandomDisconnectsLeakNothing) {
  testing::ModelServer& m = model_server();
  ASSERT_TRUE(engine_settles(m.engine()));  // stats are published after each step: let them settle
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
  EXPECT_TRUE(engine_settles(m.engine()));
  const engine::EngineStats after = m.engine().stats();
  // Each client that left was aborted (or had just finished when it left); nothing is held.
  EXPECT_EQ(after.submitted - before.submitted, kClients);
  EXPECT_LE(after.aborted - before.aborted, left.load());
  EXPECT_GE(after.aborted - before.aborted, left.load() / 2);
  EXPECT_EQ(after.cache.blocks_in_use, 0);
  EXPECT_EQ(after.cache.slots_in_use, 0);
  EXPECT_TRUE(eventually("every handler having replied (inflight 0)", [&] { return m.http->inflight() == 0; }))
      << m.http->inflight() << " still in flight";
}

// A server of its own (draining is one-way), over a scripted engine slowed to 5 ms a step. The
// 1.5 s grace period sits between the two streams: the short one needs at most 50 more steps
// of it (30 ms a step would still do), the long one more than 470, >= 2.35 s, since each step
// sleeps 5 ms; and the short one is still running when the drain begins (>= 49 steps left).
TEST(ServerDrain, InflightStreamsFinishOrGetAFinalErrorAndNewRequestsGet503) {
  testing::ScriptedServer s(std::chrono::milliseconds(5));
  std::atomic<bool> long_started{false}, short_started{false};
  testing::Reply long_reply, short_reply;
  std::thread long_client([&] {
    long_reply = send(s.port, "POST", "/v1/completions",
                      dump_json(Json{{"prompt", "x"}, {"max_tokens", 480}, {"stream", true}}), [&](const std::string&) {
                        long_started = true;
                        return true;
                      });
  });
  std::thread short_client([&] {
    short_reply = send(s.port, "POST", "/v1/completions",
                       dump_json(Json{{"prompt", "y"}, {"max_tokens", 50}, {"stream", true}}), [&](const std::string&) {
                         short_started = true;
                         return true;
                       });
  });
  // Both streams are in flight before the drain starts (else a slow machine may deliver the short
  // request after it, and a 503 would be right).
  EXPECT_TRUE(eventually("both streams starting", [&] { return long_started && short_started; }));
  EXPECT_EQ(s.http->inflight(), 2) << "a stream ended before the drain began";
  std::thread drainer([&] { s.http->drain(std::chrono::milliseconds(1500)); });
  // New requests are refused once the drain has begun, which /health shows (503).
  EXPECT_TRUE(eventually("/health answering 503 (the drain beginning)",
                         [&] { return testing::get(s.port, "/health").status == 503; }));
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
  EXPECT_TRUE(engine_settles(*s.engine));
}

}  // namespace
}  // namespace k3::server
