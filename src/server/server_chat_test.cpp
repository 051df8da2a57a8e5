// server/server_chat_test.cpp: POST /v1/chat/completions over loopback HTTP: K3 output parsed
// into reasoning_content / content / tool_calls (arguments valid JSON), streamed and not;
// finish_reason tool_calls; malformed calls dropped and counted; stop strings on the content
// channel, multibyte ones whose characters the tokens split included; chat logprobs shape; the
// real tiny model end to end.
#include "server/server_test_util.h"

namespace k3::server {
namespace {

using testing::get;
using testing::model_server;
using testing::post;
using testing::scripted_server;
using testing::stream_chunks;

Json chat(const std::string& user, Json extra = Json::object()) {
  Json b = {{"model", "k3-tiny"},
            {"messages",
             Json::array({{{"role", "system"}, {"content", "You are terse."}}, {{"role", "user"}, {"content", user}}})},
            {"max_tokens", 200}};
  for (auto& [k, v] : extra.items()) b[k] = v;
  return b;
}

const Json kTools = Json::array(
    {{{"type", "function"},
      {"function",
       {{"name", "get_weather"},
        {"description", "Weather for a city"},
        {"parameters",
         {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}, {"days", {{"type", "number"}}}}}}}}}},
     {{"type", "function"}, {"function", {{"name", "get_time"}, {"parameters", {{"type", "object"}}}}}}});

struct Folded {
  std::string content, reasoning, finish, role;
  std::vector<Json> tool_calls;  // assembled per index
  std::vector<Json> logprobs;
  int chunks = 0;
};
Folded fold(const std::vector<Json>& chunks) {
  Folded f;
  for (const Json& c : chunks) {
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    for (const Json& ch : c["choices"]) {
      EXPECT_EQ(ch["index"], 0);
      const Json& d = ch["delta"];
      ++f.chunks;
      if (d.contains("role")) f.role = d["role"];
      if (d.contains("content") && d["content"].is_string()) f.content += d["content"].get<std::string>();
      if (d.contains("reasoning_content")) f.reasoning += d["reasoning_content"].get<std::string>();
      if (d.contains("tool_calls"))
        for (const Json& t : d["tool_calls"]) {
          const auto i = t["index"].get<size_t>();
          if (f.tool_calls.size() <= i) f.tool_calls.resize(i + 1, Json::object());
          Json& acc = f.tool_calls[i];
          if (t.contains("id")) acc["id"] = t["id"];
          if (t.contains("type")) acc["type"] = t["type"];
          if (t["function"].contains("name")) acc["name"] = t["function"]["name"];
          acc["arguments"] = acc.value("arguments", std::string()) + t["function"].value("arguments", std::string());
        }
      if (!ch["logprobs"].is_null())
        for (const Json& e : ch["logprobs"]["content"]) f.logprobs.push_back(e);
      if (!ch["finish_reason"].is_null()) {
        EXPECT_TRUE(f.finish.empty()) << "two finish reasons";
        f.finish = ch["finish_reason"];
      }
    }
  }
  return f;
}

TEST(ServerChat, ReasoningAndContentNonStreaming) {
  const auto r = post(scripted_server().port, "/v1/chat/completions", chat("SCRIPT_CHAT hello"));
  ASSERT_EQ(r.status, 200) << r.body;
  const Json j = r.json();
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_TRUE(j["id"].get<std::string>().starts_with("chatcmpl-"));
  const Json& msg = j["choices"][0]["message"];
  EXPECT_EQ(msg["role"], "assistant");
  EXPECT_EQ(msg["content"], "Hello! How can I help you today?");
  EXPECT_EQ(msg["reasoning_content"], "The user greets me; I greet back.");
  EXPECT_FALSE(msg.contains("tool_calls"));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), 10);
}

TEST(ServerChat, ReasoningAndContentStreaming) {
  const auto r = post(scripted_server().port, "/v1/chat/completions",
                      chat("SCRIPT_CHAT hello", {{"stream", true}, {"stream_options", {{"include_usage", true}}}}));
  ASSERT_EQ(r.status, 200) << r.body;
  const auto chunks = stream_chunks(r);
  ASSERT_FALSE(chunks.empty());
  EXPECT_EQ(chunks.front()["choices"][0]["delta"]["role"], "assistant");  // the role opens the stream
  const Folded f = fold(chunks);
  EXPECT_EQ(f.content, "Hello! How can I help you today?");
  EXPECT_EQ(f.reasoning, "The user greets me; I greet back.");
  EXPECT_EQ(f.finish, "stop");
  EXPECT_TRUE(f.tool_calls.empty());
  EXPECT_EQ(chunks.back()["usage"]["completion_tokens"],
            post(scripted_server().port, "/v1/chat/completions", chat("SCRIPT_CHAT hello"))
                .json()["usage"]["completion_tokens"]);
}

TEST(ServerChat, ToolCallsNonStreaming) {
  const auto r = post(scripted_server().port, "/v1/chat/completions",
                      chat("SCRIPT_TOOLS weather?", {{"tools", kTools}}));
  ASSERT_EQ(r.status, 200) << r.body;
  const Json j = r.json();
  const Json& msg = j["choices"][0]["message"];
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_TRUE(msg["content"].is_null());
  EXPECT_EQ(msg["reasoning_content"], "I need the weather.");
  ASSERT_EQ(msg["tool_calls"].size(), 2u) << j.dump();
  const Json& a = msg["tool_calls"][0];
  EXPECT_EQ(a["type"], "function");
  EXPECT_EQ(a["function"]["name"], "get_weather");
  EXPECT_EQ(nlohmann::json::parse(a["function"]["arguments"].get<std::string>()),
            (nlohmann::json{{"city", "Paris"}, {"days", 3}}));
  const Json& b = msg["tool_calls"][1];
  EXPECT_EQ(b["function"]["name"], "get_time");
  EXPECT_EQ(nlohmann::json::parse(b["function"]["arguments"].get<std::string>()), (nlohmann::json{{"tz", "CET"}}));
  EXPECT_TRUE(a["id"].get<std::string>().starts_with("call_"));
  EXPECT_NE(a["id"], b["id"]);

  // The calls round-trip: sending them back with tool results renders a valid next prompt.
  Json next = chat("SCRIPT_CHAT thanks");
  next["messages"].push_back(msg);
  next["messages"].push_back({{"role", "tool"}, {"tool_call_id", a["id"]}, {"content", "sunny"}});
  next["messages"].push_back({{"role", "tool"}, {"tool_call_id", b["id"]}, {"content", "12:00"}});
  next["tools"] = kTools;
  next["max_tokens"] = 20;
  const auto again = post(scripted_server().port, "/v1/chat/completions", next);
  EXPECT_EQ(again.status, 200) << again.body;
}

TEST(ServerChat, ToolCallsStreaming) {
  const auto r = post(scripted_server().port, "/v1/chat/completions",
                      chat("SCRIPT_TOOLS weather?", {{"tools", kTools}, {"stream", true}}));
  ASSERT_EQ(r.status, 200) << r.body;
  const Folded f = fold(stream_chunks(r));
  EXPECT_EQ(f.finish, "tool_calls");
  EXPECT_EQ(f.reasoning, "I need the weather.");
  EXPECT_EQ(f.content, "");
  ASSERT_EQ(f.tool_calls.size(), 2u);
  EXPECT_EQ(f.tool_calls[0]["name"], "get_weather");
  EXPECT_EQ(f.tool_calls[0]["type"], "function");
  EXPECT_TRUE(f.tool_calls[0]["id"].get<std::string>().starts_with("call_"));
  EXPECT_EQ(nlohmann::json::parse(f.tool_calls[0]["arguments"].get<std::string>()),
            (nlohmann::json{{"city", "Paris"}, {"days", 3}}));
  EXPECT_EQ(f.tool_calls[1]["name"], "get_time");
}

// A malformed call is never dropped silently: its text reaches the client as content.
TEST(ServerChat, MalformedToolCallReachesTheClientAsContentAndIsCounted) {
  auto errors = [] {
    const std::string page = get(scripted_server().port, "/metrics").body;
    const std::string key = "k3serve:tool_call_parse_errors_total{engine=\"0\",model_name=\"k3-tiny\"} ";
    const size_t at = page.find(key);
    return at == std::string::npos ? -1.0 : std::stod(page.substr(at + key.size()));
  };
  const double before = errors();
  const Json j =
      post(scripted_server().port, "/v1/chat/completions", chat("SCRIPT_BADTOOL", {{"tools", kTools}})).json();
  const Json& msg = j["choices"][0]["message"];
  EXPECT_EQ(msg["content"],
            "Calling.<|open|>call tool=\"f\" index=\"1\"<|sep|><|open|>argument key=\"n\" type=\"number\"<|sep|>"
            "12abc<|close|>argument<|sep|><|close|>call<|sep|>");
  EXPECT_FALSE(msg.contains("tool_calls"));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(errors(), before + 1);
}

// Arguments stream as they are generated: several fragments per call, which concatenate to the
// arguments of the non-streamed reply.
TEST(ServerChat, ToolCallArgumentsStreamInFragments) {
  const auto r = post(scripted_server().port, "/v1/chat/completions",
                      chat("SCRIPT_TOOLS weather?", {{"tools", kTools}, {"stream", true}}));
  int fragments = 0;
  for (const Json& c : stream_chunks(r))
    for (const Json& t : c["choices"][0]["delta"].value("tool_calls", Json::array()))
      fragments += t["index"] == 0 && !t["function"].value("arguments", std::string()).empty();
  EXPECT_GE(fragments, 3);  // {"city":" / Paris... / ","days":3 / }
  const Json j =
      post(scripted_server().port, "/v1/chat/completions", chat("SCRIPT_TOOLS weather?", {{"tools", kTools}})).json();
  const Folded f = fold(stream_chunks(r));
  EXPECT_EQ(f.tool_calls[0]["arguments"], j["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]);
  EXPECT_EQ(f.tool_calls[1]["arguments"], j["choices"][0]["message"]["tool_calls"][1]["function"]["arguments"]);
}

// A call that fails after it began streaming cannot be taken back in chat: its text follows as
// content, the finish reason is stop, and the non-streamed reply has no call at all.
TEST(ServerChat, CallFailingAfterItBeganFollowsAsContent) {
  const Json b = chat("SCRIPT_LATEBADTOOL", {{"tools", kTools}});
  const Json j = post(scripted_server().port, "/v1/chat/completions", b).json();
  EXPECT_FALSE(j["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  Json sb = b;
  sb["stream"] = true;
  const Folded f = fold(stream_chunks(post(scripted_server().port, "/v1/chat/completions", sb)));
  EXPECT_EQ(f.content, j["choices"][0]["message"]["content"]);
  EXPECT_EQ(f.finish, "stop");
  ASSERT_EQ(f.tool_calls.size(), 1u);  // what had streamed of it
  EXPECT_EQ(f.tool_calls[0]["name"], "f");
}

TEST(ServerChat, StopStringsApplyToContentOnly) {
  // "I greet" is in the reasoning and must not stop it; "help you" spans tokens of the content.
  const Json j = post(scripted_server().port, "/v1/chat/completions",
                      chat("SCRIPT_CHAT hello", {{"stop", Json::array({"help you", "I greet"})}}))
                     .json();
  EXPECT_EQ(j["choices"][0]["message"]["reasoning_content"], "The user greets me; I greet back.");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hello! How can I ");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  const Folded f = fold(stream_chunks(post(scripted_server().port, "/v1/chat/completions",
                                           chat("SCRIPT_CHAT hello", {{"stop", "help you"}, {"stream", true}}))));
  EXPECT_EQ(f.content, "Hello! How can I ");
  EXPECT_EQ(f.finish, "stop");
}

// SCRIPT_UTF8 answers "naïve café — 東京 🚀 done." on the content channel (thinking off), and
// the tiny vocabulary has no token for any of its non-ASCII characters: each arrives as single
// bytes. A stop string of such characters matches across those tokens, its held prefix never
// leaks (streamed content is exactly the text before it), and one that only begins to match -
// a character or a first byte in common - releases everything, whole.
TEST(ServerChat, MultibyteStopStringSplitAcrossTokens) {
  std::string text;
  for (const auto& [trigger, script] : testing::script_texts())
    if (trigger == "SCRIPT_UTF8") text = script.substr(0, script.find("<|end_of_msg|>"));
  ASSERT_EQ(text, "naïve café — 東京 🚀 done.");
  const std::string stop = "東京";
  const size_t at = text.find(stop);
  ASSERT_NE(at, std::string::npos);
  // The stop string's bytes really are split across tokens, inside its characters.
  const tokenizer::Tokenizer& tok = *scripted_server().tok;
  const std::vector<int32_t> ids = testing::encode_script(tok, text);
  size_t offset = 0;
  int boundaries_inside_characters = 0;
  for (int32_t id : ids) {
    const std::string bytes(tok.token_bytes(id));
    ASSERT_EQ(bytes.find(stop), std::string::npos) << "one token holds the whole stop string";
    offset += bytes.size();
    if (offset > at && offset < at + stop.size() && (static_cast<unsigned char>(text[offset]) & 0xC0) == 0x80)
      ++boundaries_inside_characters;
  }
  ASSERT_EQ(offset, text.size());
  EXPECT_GE(boundaries_inside_characters, 2) << "the tokens do not split the stop string's characters";

  const Json no_thinking = {{"thinking", false}};
  const auto r = post(scripted_server().port, "/v1/chat/completions",
                      chat("SCRIPT_UTF8", {{"stop", stop}, {"chat_template_kwargs", no_thinking}}));
  ASSERT_EQ(r.status, 200) << r.body;
  const Json j = r.json();
  EXPECT_EQ(j["choices"][0]["message"]["content"], text.substr(0, at));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_LT(j["usage"]["completion_tokens"].get<size_t>(), ids.size());  // ended at the match, not at eos
  const Folded f = fold(stream_chunks(post(
      scripted_server().port, "/v1/chat/completions",
      chat("SCRIPT_UTF8", {{"stop", Json::array({stop})}, {"chat_template_kwargs", no_thinking}, {"stream", true}}))));
  EXPECT_EQ(f.content, text.substr(0, at));  // nothing of 東 (held while 京 was awaited) leaked
  EXPECT_EQ(f.finish, "stop");

  // "🚀 now" matches up to the space and "cafè" shares é's first byte (C3): neither completes.
  for (const char* never : {"🚀 now", "cafè"}) {
    const Json n = post(scripted_server().port, "/v1/chat/completions",
                        chat("SCRIPT_UTF8", {{"stop", never}, {"chat_template_kwargs", no_thinking}}))
                       .json();
    EXPECT_EQ(n["choices"][0]["message"]["content"], text) << never;
    const Folded g = fold(stream_chunks(
        post(scripted_server().port, "/v1/chat/completions",
             chat("SCRIPT_UTF8", {{"stop", never}, {"chat_template_kwargs", no_thinking}, {"stream", true}}))));
    EXPECT_EQ(g.content, text) << never;
    EXPECT_EQ(g.finish, "stop") << never;  // the script's eos
  }
}

TEST(ServerChat, LogprobsShape) {
  const Json j = post(scripted_server().port, "/v1/chat/completions",
                      chat("SCRIPT_CHAT hello", {{"logprobs", true}, {"top_logprobs", 2}}))
                     .json();
  const Json& content = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), j["usage"]["completion_tokens"].get<size_t>());
  for (const Json& e : content) {
    EXPECT_TRUE(e["token"].is_string());
    EXPECT_LE(e["logprob"].get<double>(), 0.0);
    ASSERT_TRUE(e["bytes"].is_array());
    for (const Json& b : e["bytes"]) EXPECT_TRUE(b.get<int>() >= 0 && b.get<int>() <= 255);
    ASSERT_EQ(e["top_logprobs"].size(), 2u);
    EXPECT_EQ(e["top_logprobs"][0]["token"], e["token"]);  // the script's token is the most likely
    EXPECT_TRUE(e["top_logprobs"][1].contains("bytes"));
  }
  const Json none = post(scripted_server().port, "/v1/chat/completions", chat("SCRIPT_CHAT hello")).json();
  EXPECT_TRUE(none["choices"][0]["logprobs"].is_null());
  const Folded f = fold(stream_chunks(post(scripted_server().port, "/v1/chat/completions",
                                           chat("SCRIPT_CHAT hello", {{"logprobs", true}, {"stream", true}}))));
  EXPECT_EQ(f.logprobs.size(), content.size());
}

TEST(ServerChat, SeveralChoicesStream) {
  const auto r = post(scripted_server().port, "/v1/chat/completions",
                      chat("SCRIPT_CHAT hi", {{"n", 3}, {"stream", true}}));
  std::map<int, std::string> content, finish;
  for (const Json& c : stream_chunks(r))
    for (const Json& ch : c["choices"]) {
      const int i = ch["index"];
      if (ch["delta"].contains("content")) content[i] += ch["delta"]["content"].get<std::string>();
      if (!ch["finish_reason"].is_null()) finish[i] = ch["finish_reason"];
    }
  ASSERT_EQ(finish.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(content[i], "Hello! How can I help you today?");
    EXPECT_EQ(finish[i], "stop");
  }
}

TEST(ServerChat, RealModelEndToEnd) {
  testing::ModelServer& m = model_server();
  const auto r = post(m.port, "/v1/chat/completions",
                      chat("Hello there", {{"max_tokens", 12}, {"temperature", 0.7}, {"seed", 3}, {"tools", kTools}}));
  ASSERT_EQ(r.status, 200) << r.body;
  const Json j = r.json();
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_LE(j["usage"]["completion_tokens"].get<int>(), 12);
  const std::string finish = j["choices"][0]["finish_reason"];
  EXPECT_TRUE(finish == "stop" || finish == "length" || finish == "tool_calls") << finish;
  const auto s = post(m.port, "/v1/chat/completions",
                      chat("Hello there",
                           {{"max_tokens", 12}, {"stream", true}, {"chat_template_kwargs", {{"thinking", false}}}}));
  ASSERT_EQ(s.status, 200);
  EXPECT_FALSE(fold(stream_chunks(s)).finish.empty());
}

}  // namespace
}  // namespace k3::server
