// server/server_completions_test.cpp: POST /v1/completions over loopback HTTP: exact texts and
// finish reasons (scripted executor), streaming equal to non-streaming, stop strings that span
// tokens (trimmed, never leaked while streaming), n and batched prompts, legacy logprobs,
// UTF-8 split across tokens, usage; and on the real tiny model: seeds, logit_bias,
// stop_token_ids and prefix-cache hits reported as cached_tokens.
#include "server/server_test_util.h"

namespace k3::server {
namespace {

using testing::model_server;
using testing::ModelServer;
using testing::post;
using testing::scripted_server;
using testing::stream_chunks;

std::string script_text(const std::string& trigger, bool drop_eos = true) {
  for (const auto& [t, text] : testing::script_texts())
    if (t == trigger) {
      std::string s = text;
      if (drop_eos && s.ends_with("<|end_of_msg|>")) s.resize(s.size() - std::string("<|end_of_msg|>").size());
      return s;
    }
  return {};
}
int64_t script_tokens(const std::string& trigger) {
  return static_cast<int64_t>(testing::encode_script(*scripted_server().tok, script_text(trigger, false)).size());
}

Json completion(Json extra) {
  Json b = {{"model", "k3-tiny"}, {"prompt", "SCRIPT_STORY"}, {"max_tokens", 200}};
  for (auto& [k, v] : extra.items()) b[k] = v;
  return b;
}

// Concatenated text per choice index, and the finish reasons, of a completions stream.
struct Streamed {
  std::map<int, std::string> text;
  std::map<int, std::string> finish;
  std::map<int, Json> logprobs;  // concatenated legacy arrays
  Json usage;
};
Streamed fold(const std::vector<Json>& chunks) {
  Streamed s;
  for (const Json& c : chunks) {
    EXPECT_EQ(c["object"], "text_completion");
    if (c.contains("usage")) s.usage = c["usage"];
    for (const Json& ch : c["choices"]) {
      const int i = ch["index"].get<int>();
      s.text[i] += ch["text"].get<std::string>();
      if (!ch["finish_reason"].is_null()) {
        EXPECT_FALSE(s.finish.contains(i)) << "two finish reasons for choice " << i;
        s.finish[i] = ch["finish_reason"].get<std::string>();
      }
      if (!ch["logprobs"].is_null()) {
        Json& lp = s.logprobs[i];
        for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
          for (const Json& v : ch["logprobs"][k]) lp[k].push_back(v);
      }
    }
  }
  return s;
}

TEST(ServerCompletions, ScriptedTextStopsAtEosWithUsage) {
  const auto r = post(scripted_server().port, "/v1/completions", completion({}));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.content_type.find("application/json"), std::string::npos);
  const Json j = r.json();
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "k3-tiny");
  EXPECT_TRUE(j["id"].get<std::string>().starts_with("cmpl-"));
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["text"], script_text("SCRIPT_STORY"));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  const int64_t prompt_len = static_cast<int64_t>(scripted_server().tok->encode("SCRIPT_STORY").size());
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt_len);
  EXPECT_EQ(j["usage"]["completion_tokens"], script_tokens("SCRIPT_STORY"));  // eos counted
  EXPECT_EQ(j["usage"]["total_tokens"], prompt_len + script_tokens("SCRIPT_STORY"));
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
}

TEST(ServerCompletions, MaxTokensFinishesWithLength) {
  const auto r = post(scripted_server().port, "/v1/completions", completion({{"max_tokens", 5}}));
  ASSERT_EQ(r.status, 200) << r.body;
  const Json j = r.json();
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);
  const auto ids = testing::encode_script(*scripted_server().tok, script_text("SCRIPT_STORY"));
  EXPECT_EQ(j["choices"][0]["text"], scripted_server().tok->decode(std::span(ids).first(5)));
}

TEST(ServerCompletions, StreamEqualsNonStreamAndEndsWithUsageAndDone) {
  const auto r = post(scripted_server().port, "/v1/completions",
                      completion({{"stream", true}, {"stream_options", {{"include_usage", true}}}}));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.content_type.find("text/event-stream"), std::string::npos);
  const auto chunks = stream_chunks(r);
  ASSERT_GE(chunks.size(), 3u);
  const Streamed s = fold(chunks);
  EXPECT_EQ(s.text.at(0), script_text("SCRIPT_STORY"));
  EXPECT_EQ(s.finish.at(0), "stop");
  // The usage chunk comes last, with no choices.
  EXPECT_TRUE(chunks.back()["choices"].empty());
  EXPECT_EQ(s.usage["completion_tokens"], script_tokens("SCRIPT_STORY"));
  for (size_t i = 0; i + 1 < chunks.size(); ++i) EXPECT_FALSE(chunks[i].contains("usage"));
}

double finished_count(const std::string& reason) {
  const std::string page = testing::get(scripted_server().port, "/metrics").body;
  const std::string key = "vllm:request_success_total{engine=\"0\",model_name=\"k3-tiny\",finished_reason=\"" + reason +
                          "\"} ";
  const size_t at = page.find(key);
  return at == std::string::npos ? -1.0 : std::stod(page.substr(at + key.size()));
}

TEST(ServerCompletions, StopStringSpanningTokensIsTrimmedAndNeverStreamed) {
  ASSERT_TRUE(testing::engine_idle(*scripted_server().engine));
  const double aborts_before = finished_count("abort"), stops_before = finished_count("stop");
  const std::string story = script_text("SCRIPT_STORY");
  const std::string stop = "tiny model";
  // The stop string really spans tokens: no single token of the story holds it.
  const auto ids = testing::encode_script(*scripted_server().tok, story);
  for (int32_t id : ids) ASSERT_EQ(std::string(scripted_server().tok->token_bytes(id)).find(stop), std::string::npos);
  const std::string expected = story.substr(0, story.find(stop));

  const auto r = post(scripted_server().port, "/v1/completions", completion({{"stop", stop}}));
  ASSERT_EQ(r.status, 200) << r.body;
  const Json j = r.json();
  EXPECT_EQ(j["choices"][0]["text"], expected);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_LT(j["usage"]["completion_tokens"].get<int64_t>(), script_tokens("SCRIPT_STORY"));

  const auto rs = post(scripted_server().port, "/v1/completions",
                       completion({{"stop", Json::array({stop})}, {"stream", true}}));
  const Streamed s = fold(stream_chunks(rs));
  EXPECT_EQ(s.text.at(0), expected);
  EXPECT_EQ(s.finish.at(0), "stop");
  EXPECT_EQ(rs.body.find("tiny m"), std::string::npos) << "a held prefix of the stop string leaked";

  // Earliest of several; a stop string whose prefix occurs but which never completes changes nothing.
  const Json several = post(scripted_server().port, "/v1/completions",
                            completion({{"stop", Json::array({"the story", "It served"})}}))
                           .json();
  EXPECT_EQ(several["choices"][0]["text"], story.substr(0, story.find("It served")));
  const Json never = post(scripted_server().port, "/v1/completions", completion({{"stop", "the endX"}})).json();
  EXPECT_EQ(never["choices"][0]["text"], story);
  EXPECT_EQ(never["choices"][0]["finish_reason"], "stop");
  // The server ends a stop-string match by aborting the engine request; /metrics counts a stop.
  ASSERT_TRUE(testing::engine_idle(*scripted_server().engine));
  EXPECT_EQ(finished_count("abort"), aborts_before);
  EXPECT_EQ(finished_count("stop"), stops_before + 4);
}

TEST(ServerCompletions, SeveralChoicesAndBatchedPrompts) {
  const auto r = post(
      scripted_server().port, "/v1/completions",
      completion({{"prompt", Json::array({"SCRIPT_STORY", "something else"})}, {"n", 2}, {"max_tokens", 30}}));
  ASSERT_EQ(r.status, 200) << r.body;
  const Json j = r.json();
  ASSERT_EQ(j["choices"].size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(j["choices"][i]["index"], i);
  // Choices 0-1 answer the first prompt (30 tokens of the story), 2-3 the second (filler).
  EXPECT_TRUE(script_text("SCRIPT_STORY").starts_with(j["choices"][0]["text"].get<std::string>()));
  EXPECT_EQ(j["choices"][0]["text"], j["choices"][1]["text"]);
  EXPECT_TRUE(j["choices"][2]["text"].get<std::string>().starts_with("lorem ipsum"));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(j["choices"][i]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 120);
  const auto& tok = *scripted_server().tok;
  EXPECT_EQ(j["usage"]["prompt_tokens"], tok.encode("SCRIPT_STORY").size() + tok.encode("something else").size());

  const Streamed s = fold(stream_chunks(
      post(scripted_server().port, "/v1/completions", completion({{"n", 3}, {"stream", true}, {"max_tokens", 10}}))));
  ASSERT_EQ(s.finish.size(), 3u);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(s.text.at(i), j["choices"][0]["text"].get<std::string>().substr(0, s.text.at(i).size()));
}

TEST(ServerCompletions, LegacyLogprobsShape) {
  const Json j =
      post(scripted_server().port, "/v1/completions", completion({{"logprobs", 2}, {"max_tokens", 12}})).json();
  const Json& lp = j["choices"][0]["logprobs"];
  ASSERT_TRUE(lp.is_object()) << j.dump();
  for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) ASSERT_EQ(lp[k].size(), 12u) << k;
  std::string joined;
  for (size_t i = 0; i < 12; ++i) {
    EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
    EXPECT_GT(lp["token_logprobs"][i].get<double>(), -0.1);  // the script's token is the peak
    EXPECT_GE(lp["top_logprobs"][i].size(), 1u);
    EXPECT_LE(lp["top_logprobs"][i].size(), 2u);
    EXPECT_TRUE(lp["top_logprobs"][i].contains(lp["tokens"][i].get<std::string>()));
    EXPECT_EQ(lp["text_offset"][i].get<int64_t>(), static_cast<int64_t>(joined.size()));  // ASCII story
    joined += lp["tokens"][i].get<std::string>();
  }
  EXPECT_EQ(joined, j["choices"][0]["text"]);

  const Streamed s = fold(stream_chunks(post(scripted_server().port, "/v1/completions",
                                             completion({{"logprobs", 2}, {"max_tokens", 12}, {"stream", true}}))));
  EXPECT_EQ(s.logprobs.at(0)["tokens"], lp["tokens"]);
  EXPECT_EQ(s.logprobs.at(0)["text_offset"], lp["text_offset"]);
}

TEST(ServerCompletions, Utf8SplitAcrossTokensArrivesWhole) {
  const std::string expected = script_text("SCRIPT_UTF8");
  const auto ids = testing::encode_script(*scripted_server().tok, expected);
  EXPECT_GT(ids.size(), 10u);
  const Json j = post(scripted_server().port, "/v1/completions", completion({{"prompt", "SCRIPT_UTF8"}})).json();
  EXPECT_EQ(j["choices"][0]["text"], expected);
  // Every chunk parses (valid UTF-8) and they add up to the same text.
  const auto r = post(scripted_server().port, "/v1/completions",
                      completion({{"prompt", "SCRIPT_UTF8"}, {"stream", true}}));
  EXPECT_EQ(fold(stream_chunks(r)).text.at(0), expected);
}

TEST(ServerCompletions, RealModelSeedsLogitBiasAndStopTokenIds) {
  ModelServer& m = model_server();
  const Json sampled = {{"prompt", "The weather today"}, {"max_tokens", 12}, {"temperature", 1.0}, {"seed", 7}};
  const Json a = post(m.port, "/v1/completions", sampled).json();
  const Json b = post(m.port, "/v1/completions", sampled).json();
  EXPECT_EQ(a["choices"][0]["text"], b["choices"][0]["text"]);  // same seed, same text
  Json with_n = sampled;
  with_n["n"] = 4;
  with_n["ignore_eos"] = true;
  const Json n = post(m.port, "/v1/completions", with_n).json();
  ASSERT_EQ(n["choices"].size(), 4u);
  std::set<std::string> distinct;
  for (const Json& c : n["choices"]) distinct.insert(c["text"].get<std::string>());
  EXPECT_GT(distinct.size(), 1u) << "choices share one seed";
  EXPECT_EQ(n["usage"]["completion_tokens"], 48);

  const int32_t x = m.tokenizer().encode("x")[0];
  const Json forced = post(m.port, "/v1/completions",
                           Json{{"prompt", "abc"}, {"max_tokens", 5}, {"logit_bias", {{std::to_string(x), 100}}}})
                          .json();
  EXPECT_EQ(forced["choices"][0]["text"], "xxxxx");
  const Json stopped = post(m.port, "/v1/completions",
                            Json{{"prompt", "abc"},
                                 {"max_tokens", 5},
                                 {"logit_bias", {{std::to_string(x), 100}}},
                                 {"stop_token_ids", Json::array({x})}})
                           .json();
  EXPECT_EQ(stopped["choices"][0]["text"], "");  // the stop token's text is not part of the output
  EXPECT_EQ(stopped["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(stopped["usage"]["completion_tokens"], 1);
}

TEST(ServerCompletions, RealModelReportsPrefixCacheHitsAsCachedTokens) {
  ModelServer& m = model_server();
  std::vector<int32_t> prompt;
  for (int i = 0; i < 150; ++i) prompt.push_back(static_cast<int32_t>((i * 37 + 11) % 700));
  const Json body = {{"prompt", prompt}, {"max_tokens", 2}};
  const Json first = post(m.port, "/v1/completions", body).json();
  EXPECT_EQ(first["usage"]["prompt_tokens"], 150);
  const Json second = post(m.port, "/v1/completions", body).json();
  // KDA checkpoints every 64 tokens and the last prompt token is always computed: 128 reused.
  EXPECT_EQ(second["usage"]["prompt_tokens_details"]["cached_tokens"], 128) << second.dump();
  EXPECT_EQ(first["choices"][0]["text"], second["choices"][0]["text"]);
}

}  // namespace
}  // namespace k3::server
