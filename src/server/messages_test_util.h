// server/messages_test_util.h: what the /v1/messages tests share: request bodies for the
// scripted server, the event list of an Anthropic stream, folding a stream into the reply it
// stands for, and comparisons without random ids.
#pragma once
#include "server/anthropic_request.h"
#include "server/server_test_util.h"

namespace k3::server::messages_test {

using testing::scripted_server;

struct Reply {
  int status = 0;
  std::string body;
  Json json() const { return Json::parse(body); }
};

inline Reply call(const std::string& path, const Json& body, const httplib::Headers& headers = {}) {
  httplib::Client cli("127.0.0.1", scripted_server().port);
  cli.set_read_timeout(60, 0);
  auto res = cli.Post(path, headers, dump_json(body), "application/json");
  return res ? Reply{res->status, res->body} : Reply{};
}

// max_tokens: SCRIPT_TOOLS is 129 tokens; with the tools declared (~200) that fits 512.
// Greedy: the scripted model replays its script exactly only then (the API's default is 1).
inline Json body(const std::string& user, Json extra = Json::object()) {
  Json b = {{"model", "k3-tiny"},
            {"max_tokens", 140},
            {"temperature", 0},
            {"messages", Json::array({{{"role", "user"}, {"content", user}}})}};
  for (auto& [k, v] : extra.items()) b[k] = v;
  return b;
}

inline const Json kThinking = {{"type", "adaptive"}};  // (enabled needs budget_tokens >= 1024 > this max_model_len)

inline const Json kTools = Json::array(
    {{{"name", "get_weather"},
      {"description", "Weather for a city"},
      {"input_schema",
       {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}, {"days", {{"type", "number"}}}}}}}},
     {{"name", "get_time"}, {"input_schema", {{"type", "object"}}}, {"cache_control", {{"type", "ephemeral"}}}}});

inline std::string script(const std::string& trigger) {
  for (const auto& [t, text] : testing::script_texts())
    if (t == trigger) return text;
  return {};
}
inline int64_t script_tokens(const std::string& trigger) {
  return static_cast<int64_t>(testing::encode_script(*scripted_server().tok, script(trigger)).size());
}
// The text of the SCRIPT_TOOLS call to `name`, markers included (what a refused call shows).
inline std::string call_text(const std::string& name) {
  const std::string s = script("SCRIPT_TOOLS"), end = "<|close|>call<|sep|>";
  const size_t begin = s.find("<|open|>call tool=\"" + name + "\"");
  return s.substr(begin, s.find(end, begin) + end.size() - begin);
}

inline int64_t count_tokens(const Json& b) {
  const Reply r = call("/v1/messages/count_tokens", b);
  EXPECT_EQ(r.status, 200) << r.body;
  return r.status == 200 ? r.json()["input_tokens"].get<int64_t>() : -1;
}

using Event = testing::NamedEvent;
// The events of an Anthropic stream.
inline std::vector<Event> events(const Reply& r) { return testing::named_events(r.body); }

// One line per event, "name@index block-or-delta type", runs of the same line folded into "... +".
inline std::vector<std::string> shape(const std::vector<Event>& evs) {
  std::vector<std::string> lines;
  std::string last;
  for (const Event& e : evs) {
    std::string line = e.name;
    if (e.data.contains("index")) line += "@" + std::to_string(e.data["index"].get<int>());
    if (e.data.contains("content_block")) line += " " + e.data["content_block"]["type"].get<std::string>();
    if (e.name == "content_block_delta") line += " " + e.data["delta"]["type"].get<std::string>();
    if (line == last) {
      if (lines.back().back() != '+') lines.back() += " +";
      continue;
    }
    lines.push_back(line);
    last = line;
  }
  return lines;
}

// The stream folded into the reply it stands for: content blocks (tool inputs parsed from their
// partial_json), stop reason and sequence, final usage.
inline Json fold(const std::vector<Event>& evs) {
  Json msg = evs.at(0).data["message"];
  std::vector<std::string> partial;
  for (const Event& e : evs) {
    if (e.name == "content_block_start") {
      EXPECT_EQ(e.data["index"], msg["content"].size()) << "blocks are numbered in order";
      msg["content"].push_back(e.data["content_block"]);
      partial.emplace_back();
    } else if (e.name == "content_block_delta") {
      EXPECT_EQ(e.data["index"].get<size_t>() + 1, msg["content"].size()) << "a delta for a block not open";
      Json& b = msg["content"].back();
      const Json& d = e.data["delta"];
      if (d["type"] == "thinking_delta")
        b["thinking"] = b["thinking"].get<std::string>() + d["thinking"].get<std::string>();
      if (d["type"] == "signature_delta")
        b["signature"] = b["signature"].get<std::string>() + d["signature"].get<std::string>();
      if (d["type"] == "text_delta") b["text"] = b["text"].get<std::string>() + d["text"].get<std::string>();
      if (d["type"] == "input_json_delta") partial.back() += d["partial_json"].get<std::string>();
    } else if (e.name == "content_block_stop") {
      Json& b = msg["content"].back();
      if (b["type"] == "tool_use") b["input"] = Json::parse(partial.back().empty() ? "{}" : partial.back());
    } else if (e.name == "message_delta") {
      for (auto& [k, v] : e.data["delta"].items()) msg[k] = v;
      msg["usage"] = e.data["usage"];
    }
  }
  return msg;
}

// A reply without its ids (message and tool_use ids are random), keys in any order.
inline nlohmann::json without_ids(Json msg) {
  msg.erase("id");
  for (Json& b : msg["content"]) b.erase("id");
  return nlohmann::json::parse(msg.dump());
}

// The types of a reply's content blocks, in order.
inline std::vector<std::string> block_types(const Json& msg) {
  std::vector<std::string> t;
  for (const Json& b : msg["content"]) t.push_back(b["type"]);
  return t;
}

}  // namespace k3::server::messages_test
