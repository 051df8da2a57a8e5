// server/server_responses_test.cpp: POST /v1/responses (OpenAI's Responses API) over the
// scripted server: string and item input (rendering the same prompt as the equivalent chat
// request), output items (reasoning with reasoning_text, summary, encrypted_content that
// round-trips; message output_text; function_call with the chat API's arguments), incomplete
// responses, golden event sequences with consistent sequence numbers and indices whose
// response.completed equals the reply, hosted and namespace tools, the store behind
// previous_response_id, and the fields refused or accepted.
#include "server/server_test_util.h"

namespace k3::server {
namespace {

using testing::scripted_server;

// ---- helpers ----

struct Reply {
  int status = 0;
  std::string body;
  Json json() const { return Json::parse(body); }
};

Reply call(const std::string& path, const Json& body) {
  httplib::Client cli("127.0.0.1", scripted_server().port);
  cli.set_read_timeout(60, 0);
  auto res = cli.Post(path, dump_json(body), "application/json");
  return res ? Reply{res->status, res->body} : Reply{};
}

// temperature 0: the API's default is 1, and the scripted model replays its script only greedily.
Json body(Json input, Json extra = Json::object()) {
  Json b = {{"model", "k3-tiny"}, {"input", std::move(input)}, {"temperature", 0}, {"max_output_tokens", 140}};
  for (auto& [k, v] : extra.items()) b[k] = v;
  return b;
}
// The reply of a request that must succeed ({"output": []} when it did not, so tests go on).
Json respond(const Json& b) {
  const Reply r = call("/v1/responses", b);
  EXPECT_EQ(r.status, 200) << r.body;
  return r.status == 200 ? r.json() : Json{{"output", Json::array()}, {"usage", Json::object()}};
}
int64_t input_tokens(const Json& b) {
  Json small = b;
  small["max_output_tokens"] = 1;  // the prompt is all that is looked at
  return respond(small)["usage"].value("input_tokens", int64_t{-1});
}

// strict: false, since Responses tools are strict by default and a strict tool's arguments must be
// a JSON block: these scripts write K3's argument elements, and malformed calls.
const Json kTools = Json::array(
    {{{"type", "function"},
      {"name", "get_weather"},
      {"description", "Weather for a city"},
      {"parameters",
       {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}, {"days", {{"type", "number"}}}}}}},
      {"strict", false}},
     {{"type", "function"}, {"name", "get_time"}, {"parameters", {{"type", "object"}}}, {"strict", false}}});
// The same tools as chat completions declares them.
Json chat_tools() {
  Json out = Json::array();
  for (const Json& t : kTools) {
    Json fn = t;
    fn.erase("type");
    out.push_back({{"type", "function"}, {"function", fn}});
  }
  return out;
}

std::string script(const std::string& trigger) {
  for (const auto& [t, text] : testing::script_texts())
    if (t == trigger) return text;
  return {};
}

Json message(const std::string& role, const std::string& text) {
  return {{"type", "message"},
          {"role", role},
          {"content", Json::array({{{"type", role == "assistant" ? "output_text" : "input_text"}, {"text", text}}})}};
}

using Event = testing::NamedEvent;
// The events of a stream, checking that sequence_number counts 0, 1, 2, ...
std::vector<Event> events(const Reply& r) {
  EXPECT_EQ(r.status, 200) << r.body;
  std::vector<Event> out = testing::named_events(r.body);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i].data["sequence_number"], i) << out[i].name;
  return out;
}

// One line per event: type, @output_index, the item's type on output_item events; runs of the
// same line folded into "... +".
std::vector<std::string> shape(const std::vector<Event>& evs) {
  std::vector<std::string> lines;
  std::string last;
  for (const Event& e : evs) {
    std::string line = e.name.substr(std::string("response.").size());
    if (e.data.contains("output_index")) line += "@" + std::to_string(e.data["output_index"].get<int>());
    if (e.data.contains("item")) line += " " + e.data["item"]["type"].get<std::string>();
    if (line == last) {
      if (lines.back().back() != '+') lines.back() += " +";
      continue;
    }
    lines.push_back(line);
    last = line;
  }
  return lines;
}

// Indices agree: every event of an item names the item opened last at its output_index, with
// its id; items open and close in order; the deltas of an item add up to its .done text and
// to the final item, which are the final output but for malformed calls (done as incomplete).
// Returns the final response (response.completed / .incomplete).
Json check_stream(const std::vector<Event>& evs) {
  std::vector<Json> items;        // as output_item.added announced them
  std::vector<std::string> text;  // per item: its deltas joined (reasoning, output text or arguments)
  bool open = false;
  for (const Event& e : evs) {
    const Json& d = e.data;
    if (e.name == "response.output_item.added") {
      EXPECT_FALSE(open) << "an item opened before the last one closed";
      EXPECT_EQ(d["output_index"], items.size());
      items.push_back(d["item"]);
      text.emplace_back();
      open = true;
      continue;
    }
    if (!d.contains("output_index")) continue;
    EXPECT_TRUE(open) << e.name << " outside an item";
    if (items.empty()) continue;
    EXPECT_EQ(d["output_index"].get<size_t>() + 1, items.size()) << e.name;
    if (e.name == "response.output_item.done") {
      EXPECT_EQ(d["item"]["id"], items.back()["id"]);
      EXPECT_EQ(d["item"]["type"], items.back()["type"]);
      const Json& item = d["item"];
      const Json& joined = item["type"] == "function_call" ? item["arguments"] : item["content"][0]["text"];
      EXPECT_EQ(joined, text.back()) << item.dump();
      items.back() = item;
      open = false;
      continue;
    }
    EXPECT_EQ(d["item_id"], items.back()["id"]) << e.name;
    if (d.contains("content_index")) {
      EXPECT_EQ(d["content_index"], 0) << e.name;
    }
    if (e.name == "response.output_text.delta" || e.name == "response.reasoning_text.delta" ||
        e.name == "response.function_call_arguments.delta")
      text.back() += d["delta"].get<std::string>();
    if (e.name == "response.output_text.done" || e.name == "response.reasoning_text.done") {
      EXPECT_EQ(d["text"], text.back()) << e.name;
    }
    if (e.name == "response.function_call_arguments.done") {
      EXPECT_EQ(d["arguments"], text.back());
      EXPECT_EQ(d["name"], items.back()["name"]);
    }
  }
  EXPECT_FALSE(open);
  const Json& first = evs.at(0).data["response"];
  EXPECT_EQ(first["status"], "in_progress");
  EXPECT_TRUE(first["output"].empty());
  EXPECT_TRUE(first["usage"].is_null());
  const Json final_response = evs.back().data["response"];
  // A call that turned out malformed was done as incomplete and is not in the final output.
  std::erase_if(items, [](const Json& i) { return i["type"] == "function_call" && i["status"] == "incomplete"; });
  EXPECT_EQ(final_response["output"].size(), items.size());
  for (size_t i = 0; i < items.size() && i < final_response["output"].size(); ++i)
    EXPECT_EQ(final_response["output"][i], items[i]) << i;
  return final_response;
}

// Output items without their random ids, keys in any order.
nlohmann::json without_ids(Json output) {
  for (Json& item : output) {
    item.erase("id");
    item.erase("call_id");
  }
  return nlohmann::json::parse(output.dump());
}

// ---- replies ----

TEST(ServerResponses, StringInputReply) {
  const Json j = respond(body("SCRIPT_CHAT hello"));
  EXPECT_TRUE(j["id"].get<std::string>().starts_with("resp_"));
  EXPECT_EQ(j["object"], "response");
  EXPECT_EQ(j["status"], "completed");
  EXPECT_TRUE(j["incomplete_details"].is_null());
  EXPECT_TRUE(j["error"].is_null());
  EXPECT_EQ(j["model"], "k3-tiny");
  EXPECT_FALSE(j.contains("warnings"));
  ASSERT_EQ(j["output"].size(), 2u) << j.dump();
  const Json& rs = j["output"][0];
  EXPECT_EQ(rs["type"], "reasoning");
  EXPECT_TRUE(rs["id"].get<std::string>().starts_with("rs_"));
  EXPECT_EQ(rs["content"], Json::array({{{"type", "reasoning_text"}, {"text", "The user greets me; I greet back."}}}));
  EXPECT_EQ(rs["summary"], Json::array());  // none asked for
  EXPECT_FALSE(rs.contains("encrypted_content"));
  const Json& msg = j["output"][1];
  EXPECT_EQ(msg["type"], "message");
  EXPECT_TRUE(msg["id"].get<std::string>().starts_with("msg_"));
  EXPECT_EQ(msg["role"], "assistant");
  EXPECT_EQ(msg["status"], "completed");
  EXPECT_EQ(msg["content"], Json::array({{{"type", "output_text"},
                                          {"text", "Hello! How can I help you today?"},
                                          {"annotations", Json::array()}}}));
  const Json& u = j["usage"];
  const auto script_len = static_cast<int64_t>(
      testing::encode_script(*scripted_server().tok, script("SCRIPT_CHAT")).size());
  EXPECT_EQ(u["output_tokens"], script_len);
  EXPECT_GT(u["output_tokens_details"]["reasoning_tokens"].get<int64_t>(), 3);
  EXPECT_LT(u["output_tokens_details"]["reasoning_tokens"].get<int64_t>(), script_len);
  EXPECT_EQ(u["total_tokens"], u["input_tokens"].get<int64_t>() + script_len);
  EXPECT_EQ(u["input_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(j["temperature"], 0);  // request fields echoed
  EXPECT_EQ(j["max_output_tokens"], 140);
  EXPECT_EQ(j["store"], true);
}

// Items render the prompt the equivalent chat request renders.
TEST(ServerResponses, ItemInputIsTheChatConversation) {
  const Json items = Json::array(
      {message("developer", "Be terse."),
       message("system", "Tools are slow."),
       message("user", "weather in Paris?"),
       {{"type", "reasoning"},
        {"id", "rs_1"},
        {"summary", Json::array()},
        {"content", Json::array({{{"type", "reasoning_text"}, {"text", "Call the tool."}}})}},
       message("assistant", "Checking."),
       {{"type", "function_call"},
        {"call_id", "call_1"},
        {"name", "get_weather"},
        {"arguments", "{\"city\":\"Paris\"}"}},
       {{"type", "function_call_output"}, {"call_id", "call_1"}, {"output", "sunny"}},
       {{"role", "user"}, {"content", "SCRIPT_CHAT thanks"}}});  // a bare {role, content} is a message
  const Json chat = {
      {"model", "k3-tiny"},
      {"max_tokens", 1},
      {"tools", chat_tools()},
      {"messages",
       Json::array({{{"role", "system"}, {"content", "Be here."}},
                    {{"role", "developer"}, {"content", "Be terse."}},
                    {{"role", "system"}, {"content", "Tools are slow."}},
                    {{"role", "user"}, {"content", "weather in Paris?"}},
                    {{"role", "assistant"},
                     {"content", "Checking."},
                     {"reasoning_content", "Call the tool."},
                     {"tool_calls",
                      Json::array({{{"id", "call_1"},
                                    {"type", "function"},
                                    {"function", {{"name", "get_weather"}, {"arguments", "{\"city\":\"Paris\"}"}}}}})}},
                    {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "sunny"}},
                    {{"role", "user"}, {"content", "SCRIPT_CHAT thanks"}}})}};
  const Reply c = call("/v1/chat/completions", chat);
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(input_tokens(body(items, {{"tools", kTools}, {"instructions", "Be here."}})),
            c.json()["usage"]["prompt_tokens"].get<int64_t>());
  const Json j = respond(body(items, {{"tools", kTools}, {"instructions", "Be here."}, {"max_output_tokens", 50}}));
  ASSERT_EQ(j["output"].size(), 2u) << j.dump();
  EXPECT_EQ(j["output"][1]["content"][0]["text"], "Hello! How can I help you today?");
  EXPECT_EQ(j["instructions"], "Be here.");
}

TEST(ServerResponses, ReasoningSummaryAndEncryptedContent) {
  const Json with_summary = respond(
      body("SCRIPT_CHAT hello", {{"reasoning", {{"effort", "high"}, {"summary", "auto"}}}}));
  EXPECT_EQ(with_summary["output"][0]["summary"],
            Json::array({{{"type", "summary_text"}, {"text", "The user greets me; I greet back."}}}));
  EXPECT_EQ(with_summary["reasoning"], (Json{{"effort", "high"}, {"summary", "auto"}}));

  const Json sealed = respond(
      body("SCRIPT_CHAT hello", {{"store", false}, {"include", Json::array({"reasoning.encrypted_content"})}}));
  const Json& rs = sealed["output"][0];
  ASSERT_TRUE(rs.contains("encrypted_content")) << sealed.dump();
  const std::string blob = rs["encrypted_content"];
  EXPECT_EQ(blob.find("The user greets me"), std::string::npos) << "not in the clear";

  // Sent back with only encrypted_content, the reasoning renders as its text would.
  auto next = [&](const Json& reasoning_item) {
    Json items = Json::array({message("user", "SCRIPT_CHAT hello")});
    if (!reasoning_item.is_null()) items.push_back(reasoning_item);
    items.push_back(message("assistant", "Hello! How can I help you today?"));
    items.push_back(message("user", "and now?"));
    return input_tokens(body(items));
  };
  const int64_t from_blob = next({{"type", "reasoning"}, {"summary", Json::array()}, {"encrypted_content", blob}});
  const int64_t from_text = next(
      {{"type", "reasoning"},
       {"summary", Json::array()},
       {"content", Json::array({{{"type", "reasoning_text"}, {"text", "The user greets me; I greet back."}}})}});
  EXPECT_EQ(from_blob, from_text);
  EXPECT_GT(from_text, next(nullptr));
  // Another server's encrypted reasoning cannot be read: it renders as none.
  EXPECT_EQ(next({{"type", "reasoning"}, {"summary", Json::array()}, {"encrypted_content", "gAAAAB-opaque"}}),
            next(nullptr));
}

TEST(ServerResponses, FunctionCallsMatchTheChatApi) {
  const Json j = respond(body("SCRIPT_TOOLS weather?", {{"tools", kTools}}));
  ASSERT_EQ(j["output"].size(), 3u) << j.dump();
  EXPECT_EQ(j["output"][0]["type"], "reasoning");
  const Reply c = call("/v1/chat/completions",
                       {{"model", "k3-tiny"},
                        {"max_tokens", 140},
                        {"tools", chat_tools()},
                        {"messages", Json::array({{{"role", "user"}, {"content", "SCRIPT_TOOLS weather?"}}})}});
  ASSERT_EQ(c.status, 200) << c.body;
  const Json chat_reply = c.json();
  const Json& chat_calls = chat_reply["choices"][0]["message"]["tool_calls"];
  ASSERT_EQ(chat_calls.size(), 2u) << c.body;
  for (size_t k = 0; k < 2; ++k) {
    const Json& fc = j["output"][k + 1];
    EXPECT_EQ(fc["type"], "function_call");
    EXPECT_TRUE(fc["id"].get<std::string>().starts_with("fc_"));
    EXPECT_TRUE(fc["call_id"].get<std::string>().starts_with("call_"));
    EXPECT_EQ(fc["status"], "completed");
    EXPECT_EQ(fc["name"], chat_calls[k]["function"]["name"]);
    EXPECT_EQ(fc["arguments"], chat_calls[k]["function"]["arguments"]);  // the same string
    EXPECT_FALSE(fc.contains("namespace"));
  }
  EXPECT_EQ(Json::parse(j["output"][1]["arguments"].get<std::string>()), (Json{{"city", "Paris"}, {"days", 3}}));
  EXPECT_NE(j["output"][1]["call_id"], j["output"][2]["call_id"]);
  EXPECT_EQ(j["status"], "completed");
}

TEST(ServerResponses, MaxOutputTokensMakesItIncomplete) {
  const Json j = respond(body("SCRIPT_CHAT hello", {{"max_output_tokens", 5}}));
  EXPECT_EQ(j["status"], "incomplete");
  EXPECT_EQ(j["incomplete_details"], (Json{{"reason", "max_output_tokens"}}));
  EXPECT_EQ(j["usage"]["output_tokens"], 5);
  const auto evs = events(
      call("/v1/responses", body("SCRIPT_CHAT hello", {{"max_output_tokens", 5}, {"stream", true}})));
  EXPECT_EQ(evs.back().name, "response.incomplete");
  const Json last = check_stream(evs);
  EXPECT_EQ(last["status"], "incomplete");
  EXPECT_EQ(without_ids(last["output"]), without_ids(j["output"]));
}

// ---- streams ----

TEST(ServerResponses, GoldenStreamChat) {
  const auto evs = events(call("/v1/responses", body("SCRIPT_CHAT hello", {{"stream", true}})));
  EXPECT_EQ(shape(evs),
            (std::vector<std::string>{"created", "in_progress", "output_item.added@0 reasoning", "content_part.added@0",
                                      "reasoning_text.delta@0 +", "reasoning_text.done@0", "content_part.done@0",
                                      "output_item.done@0 reasoning", "output_item.added@1 message",
                                      "content_part.added@1", "output_text.delta@1 +", "output_text.done@1",
                                      "content_part.done@1", "output_item.done@1 message", "completed"}));
  const Json done = check_stream(evs);
  const Json reply = respond(body("SCRIPT_CHAT hello"));
  EXPECT_EQ(without_ids(done["output"]), without_ids(reply["output"]));
  EXPECT_EQ(done["usage"], reply["usage"]);
  EXPECT_EQ(done["status"], "completed");
}

TEST(ServerResponses, GoldenStreamToolCalls) {
  const auto evs = events(call("/v1/responses", body("SCRIPT_TOOLS weather?", {{"tools", kTools}, {"stream", true}})));
  EXPECT_EQ(shape(evs),
            (std::vector<std::string>{"created", "in_progress", "output_item.added@0 reasoning", "content_part.added@0",
                                      "reasoning_text.delta@0 +", "reasoning_text.done@0", "content_part.done@0",
                                      "output_item.done@0 reasoning", "output_item.added@1 function_call",
                                      "function_call_arguments.delta@1 +", "function_call_arguments.done@1",
                                      "output_item.done@1 function_call", "output_item.added@2 function_call",
                                      "function_call_arguments.delta@2", "function_call_arguments.done@2",
                                      "output_item.done@2 function_call", "completed"}));
  for (const Event& e : evs)
    if (e.name == "response.output_item.added" && e.data["item"]["type"] == "function_call") {
      EXPECT_EQ(e.data["item"]["arguments"], "");  // they come as deltas
      EXPECT_EQ(e.data["item"]["status"], "in_progress");
    }
  const Json done = check_stream(evs);
  const Json reply = respond(body("SCRIPT_TOOLS weather?", {{"tools", kTools}}));
  EXPECT_EQ(without_ids(done["output"]), without_ids(reply["output"]));
}

TEST(ServerResponses, StreamWithSummaryAndEncryptedReasoning) {
  const Json extra = {{"reasoning", {{"summary", "detailed"}}},
                      {"include", Json::array({"reasoning.encrypted_content"})}};
  Json sb = body("SCRIPT_CHAT hello", extra);
  sb["stream"] = true;
  const auto evs = events(call("/v1/responses", sb));
  const std::vector<std::string> lines = shape(evs);
  EXPECT_EQ(std::vector<std::string>(lines.begin(), lines.begin() + 5),
            (std::vector<std::string>{"created", "in_progress", "output_item.added@0 reasoning", "content_part.added@0",
                                      "reasoning_summary_part.added@0"}));
  const Json done = check_stream(evs);
  EXPECT_EQ(without_ids(done["output"]), without_ids(respond(body("SCRIPT_CHAT hello", extra))["output"]));
  EXPECT_TRUE(done["output"][0].contains("encrypted_content"));
}

// A malformed call is shown as text (a message item), never dropped.
TEST(ServerResponses, MalformedCallIsText) {
  const Json j = respond(body("SCRIPT_BADTOOL", {{"tools", kTools}}));
  ASSERT_EQ(j["output"].size(), 2u) << j.dump();
  EXPECT_EQ(j["output"][1]["type"], "message");
  EXPECT_EQ(j["output"][1]["content"][0]["text"],
            "Calling.<|open|>call tool=\"f\" index=\"1\"<|sep|><|open|>argument key=\"n\" type=\"number\"<|sep|>"
            "12abc<|close|>argument<|sep|><|close|>call<|sep|>");
}

// A call begins to stream with its first checked argument, so one whose first argument is
// malformed never shows: the stream's final output is the reply's.
TEST(ServerResponses, MalformedCallStreamsAsTheReplyDoes) {
  const Json done = check_stream(
      events(call("/v1/responses", body("SCRIPT_BADTOOL", {{"tools", kTools}, {"stream", true}}))));
  EXPECT_EQ(without_ids(done["output"]), without_ids(respond(body("SCRIPT_BADTOOL", {{"tools", kTools}}))["output"]));
}

// A max_output_tokens that does not fit the context is named as this API names it.
TEST(ServerResponses, ContextErrorNamesMaxOutputTokens) {
  const Reply r = call("/v1/responses", body("hi", {{"max_output_tokens", 510}}));
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.json()["error"]["param"], "max_output_tokens") << r.body;
  EXPECT_EQ(r.body.find("'max_tokens'"), std::string::npos) << r.body;
}

// A call that fails after it began streaming ends as an incomplete item, and neither the final
// output nor the store keeps it: only its text, as a message.
TEST(ServerResponses, CallFailingAfterItBeganIsLeftOutOfTheOutput) {
  const auto evs = events(call("/v1/responses", body("SCRIPT_LATEBADTOOL", {{"tools", kTools}, {"stream", true}})));
  bool incomplete_done = false;
  for (const auto& e : evs)
    incomplete_done |= e.data["type"] == "response.output_item.done" && e.data["item"]["type"] == "function_call" &&
                       e.data["item"]["status"] == "incomplete";
  EXPECT_TRUE(incomplete_done);
  const Json done = check_stream(evs);
  std::string text;
  for (const Json& item : done["output"]) {
    EXPECT_NE(item["type"], "function_call") << done.dump();
    if (item["type"] == "message") text += item["content"][0]["text"].get<std::string>();
  }
  const Json reply = respond(body("SCRIPT_LATEBADTOOL", {{"tools", kTools}}));
  std::string reply_text;
  for (const Json& item : reply["output"])
    if (item["type"] == "message") reply_text += item["content"][0]["text"].get<std::string>();
  EXPECT_EQ(text, reply_text);
  EXPECT_NE(text.find("12abc"), std::string::npos);
}

// ---- tools ----

TEST(ServerResponses, HostedToolsAreLeftOutWithAWarning) {
  Json tools = kTools;
  tools.push_back({{"type", "web_search"}});
  const Json j = respond(body("SCRIPT_CHAT hello", {{"tools", tools}}));
  ASSERT_TRUE(j.contains("warnings")) << j.dump();
  ASSERT_EQ(j["warnings"].size(), 1u);
  EXPECT_NE(j["warnings"][0].get<std::string>().find("web_search"), std::string::npos) << j["warnings"];
  EXPECT_EQ(input_tokens(body("SCRIPT_CHAT hello", {{"tools", tools}})),
            input_tokens(body("SCRIPT_CHAT hello", {{"tools", kTools}})));
}

TEST(ServerResponses, NamespaceToolsAreFlattened) {
  const Json tools = Json::array({{{"type", "namespace"},
                                   {"name", "weather_service"},
                                   {"description", "Weather"},
                                   {"tools", Json::array({kTools[0]})}},
                                  kTools[1]});
  EXPECT_EQ(input_tokens(body("SCRIPT_TOOLS weather?", {{"tools", tools}})),
            input_tokens(body("SCRIPT_TOOLS weather?", {{"tools", kTools}})));
  const Json j = respond(body("SCRIPT_TOOLS weather?", {{"tools", tools}}));
  ASSERT_EQ(j["output"].size(), 3u) << j.dump();
  EXPECT_EQ(j["output"][1]["name"], "get_weather");
  EXPECT_EQ(j["output"][1]["namespace"], "weather_service");
  EXPECT_FALSE(j["output"][2].contains("namespace"));
  const Json done = check_stream(
      events(call("/v1/responses", body("SCRIPT_TOOLS weather?", {{"tools", tools}, {"stream", true}}))));
  EXPECT_EQ(done["output"][1]["namespace"], "weather_service");
}

// ---- the store ----

TEST(ServerResponses, PreviousResponseIdContinuesTheConversation) {
  const Json first = respond(body("SCRIPT_CHAT hello"));
  const Json second = respond(body("SCRIPT_CHAT more", {{"previous_response_id", first["id"]}}));
  EXPECT_EQ(second["previous_response_id"], first["id"]);
  EXPECT_GT(second["usage"]["input_tokens"].get<int64_t>(), first["usage"]["input_tokens"].get<int64_t>());
  // The same as sending the whole conversation.
  const Json items = Json::array({message("user", "SCRIPT_CHAT hello"), first["output"][0], first["output"][1],
                                  message("user", "SCRIPT_CHAT more")});
  EXPECT_EQ(input_tokens(body(items)), second["usage"]["input_tokens"].get<int64_t>());
  // A streamed response is stored too.
  const Json streamed = check_stream(events(call("/v1/responses", body("SCRIPT_CHAT hi", {{"stream", true}}))));
  EXPECT_EQ(call("/v1/responses", body("SCRIPT_CHAT more", {{"previous_response_id", streamed["id"]}})).status, 200);
}

TEST(ServerResponses, UnstoredResponseIsUnknown) {
  const Json first = respond(body("SCRIPT_CHAT hello", {{"store", false}}));
  EXPECT_EQ(first["store"], false);
  const std::string id = first["id"];
  const Reply r = call("/v1/responses", body("more", {{"previous_response_id", id}}));
  EXPECT_EQ(r.status, 404) << r.body;
  const Json e = r.json()["error"];
  EXPECT_NE(e["message"].get<std::string>().find(id), std::string::npos) << r.body;
  EXPECT_EQ(e["param"], "previous_response_id");
  EXPECT_EQ(e["code"], "previous_response_not_found");
}

// ---- fields ----

TEST(ServerResponses, FieldsAcceptedAndRefused) {
  EXPECT_EQ(call("/v1/responses",
                 body("SCRIPT_CHAT hello", {{"client_metadata", {{"origin", "codex"}}}, {"max_output_tokens", 3}}))
                .status,
            200);
  EXPECT_EQ(call("/v1/responses", body("SCRIPT_CHAT hello", {{"prompt_cache_key", "k"},
                                                             {"store", true},
                                                             {"truncation", "auto"},
                                                             {"metadata", {{"a", "b"}}},
                                                             {"parallel_tool_calls", false},
                                                             {"tool_choice", "auto"},
                                                             {"max_output_tokens", 3}}))
                .status,
            200);
  auto expect_400 = [](const Json& b, const std::string& param) {
    const Reply r = call("/v1/responses", b);
    EXPECT_EQ(r.status, 400) << r.body;
    if (r.status == 400) {
      EXPECT_EQ(r.json()["error"]["param"], param) << r.body;
    }
    EXPECT_NE(r.body.find(param), std::string::npos) << r.body;
  };
  expect_400(body("x", {{"background", true}}), "background");
  expect_400(
      body(Json::array(
          {{{"type", "message"},
            {"role", "user"},
            {"content", Json::array({{{"type", "input_text"}, {"text", "what is this?"}},
                                     {{"type", "input_image"}, {"image_url", "data:image/png;base64,iVBO"}}})}}})),
      "input[0].content[1]");
  expect_400(body("x", {{"reasoning", {{"effort", "extreme"}}}}), "reasoning.effort");
  expect_400(body("x", {{"tool_choice", "required"}}), "tool_choice");  // no tools to call
  expect_400(body(Json::array({{{"type", "web_search_call"}}})), "input[0].type");
  const Reply model = call("/v1/responses", body("x", {{"model", "gpt-5"}}));
  EXPECT_EQ(model.status, 404) << model.body;
}

}  // namespace
}  // namespace k3::server
