// server/server_auth_test.cpp: --api-key and --served-model-name over loopback HTTP, on
// servers of their own over the scripted engine: every API route answers 401 in its API's
// shape without the key or with a wrong one, and serves with it (Bearer or x-api-key);
// liveness and metrics stay open. Several served names: each is accepted and echoed, listed
// by /v1/models, and any other is a 404.
#include "server/server_test_util.h"

namespace k3::server {
namespace {

using testing::scripted_server;

// An ApiServer of its own over the scripted server's engine and tokenizer (made first, so it
// outlives this one).
struct OwnServer {
  std::unique_ptr<ApiServer> http;
  int port = 0;
  explicit OwnServer(ServerConfig c) {
    testing::ScriptedServer& s = scripted_server();
    http = std::make_unique<ApiServer>(std::move(c), *s.engine, *s.tok);
    port = http->start();
  }
  ~OwnServer() { http->stop(); }
};

OwnServer& keyed_server() {
  static OwnServer s([] {
    ServerConfig c = testing::test_server_config();
    c.api_key = "sekrit";
    c.http_threads = 16;
    return c;
  }());
  return s;
}

OwnServer& named_server() {
  static OwnServer s([] {
    ServerConfig c = testing::test_server_config();
    c.served_model_names = {"a", "b"};
    c.http_threads = 16;
    return c;
  }());
  return s;
}

struct Reply {
  int status = 0;
  std::string body;
  Json json() const { return Json::parse(body); }
};

Reply send(int port, const std::string& method, const std::string& path, const Json& body,
           const httplib::Headers& headers) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(60, 0);
  auto res = method == "GET" ? cli.Get(path, headers) : cli.Post(path, headers, dump_json(body), "application/json");
  return res ? Reply{res->status, res->body} : Reply{};
}

struct Route {
  std::string path;
  Json body;
  bool anthropic = false;
};

// One small request per generation route (and the others the key guards).
std::vector<Route> routes(const std::string& model = "k3-tiny") {
  const Json user = Json::array({{{"role", "user"}, {"content", "SCRIPT_CHAT hi"}}});
  return {{"/v1/chat/completions", {{"model", model}, {"messages", user}, {"max_tokens", 4}}},
          {"/v1/completions", {{"model", model}, {"prompt", "SCRIPT_STORY"}, {"max_tokens", 4}}},
          {"/v1/responses",
           {{"model", model}, {"input", "SCRIPT_CHAT hi"}, {"max_output_tokens", 4}, {"temperature", 0}}},
          {"/v1/messages", {{"model", model}, {"messages", user}, {"max_tokens", 4}}, true},
          {"/v1/messages?beta=true", {{"model", model}, {"messages", user}, {"max_tokens", 4}}, true},
          {"/v1/messages/count_tokens", {{"model", model}, {"messages", user}}, true},
          {"/tokenize", {{"model", model}, {"prompt", "hello"}}}};
}

double http_errors(int port, int status) {
  const std::string page = send(port, "GET", "/metrics", nullptr, {}).body;
  const std::string key = "k3serve:http_errors_total{engine=\"0\",model_name=\"k3-tiny\",status=\"" +
                          std::to_string(status) + "\"} ";
  const size_t at = page.find(key);
  return at == std::string::npos ? 0.0 : std::stod(page.substr(at + key.size()));
}

void expect_401(const Reply& r, const Route& route, const std::string& needle) {
  EXPECT_EQ(r.status, 401) << route.path << ": " << r.body;
  Json j;
  try {
    j = r.json();
  } catch (...) {
    ADD_FAILURE() << route.path << ": not JSON: " << r.body;
    return;
  }
  if (route.anthropic) {
    EXPECT_EQ(j["type"], "error") << r.body;
    EXPECT_EQ(j["error"]["type"], "authentication_error") << r.body;
  } else {
    EXPECT_EQ(j["error"]["type"], "authentication_error") << r.body;
    EXPECT_EQ(j["error"]["code"], "invalid_api_key") << r.body;
    EXPECT_TRUE(j["error"].contains("param")) << r.body;
  }
  EXPECT_NE(j["error"]["message"].get<std::string>().find(needle), std::string::npos) << r.body;
}

TEST(ServerAuth, MissingOrWrongKeyIs401InEachApisShape) {
  const int port = keyed_server().port;
  for (const Route& route : routes()) {
    expect_401(send(port, "POST", route.path, route.body, {}), route, "missing API key");
    expect_401(send(port, "POST", route.path, route.body, {{"Authorization", "Bearer wrong"}}), route,
               "invalid API key");
    expect_401(send(port, "POST", route.path, route.body, {{"x-api-key", "wrong"}}), route, "invalid API key");
    expect_401(send(port, "POST", route.path, route.body, {{"Authorization", "Bearer sekrit2"}}), route,
               "invalid API key");
    expect_401(send(port, "POST", route.path, route.body, {{"Authorization", "Basic sekrit"}}), route,
               "invalid API key");
    expect_401(send(port, "POST", route.path, route.body, {{"Authorization", "Bearer "}}), route, "invalid API key");
  }
  // The key is checked before the body is read: a bad body without the key is a 401, not a 400.
  expect_401(send(port, "POST", "/v1/chat/completions", "not an object", {}), routes()[0], "missing API key");
  const Reply models = send(port, "GET", "/v1/models", nullptr, {});
  EXPECT_EQ(models.status, 401) << models.body;
}

TEST(ServerAuth, RightKeyServes) {
  const int port = keyed_server().port;
  for (const Route& route : routes())
    for (const httplib::Headers& h :
         {httplib::Headers{{"Authorization", "Bearer sekrit"}}, httplib::Headers{{"x-api-key", "sekrit"}}}) {
      const Reply r = send(port, "POST", route.path, route.body, h);
      EXPECT_EQ(r.status, 200) << route.path << " " << h.begin()->first << ": " << r.body;
    }
  // A wrong Authorization does not hide a right x-api-key (Anthropic's clients send both).
  EXPECT_EQ(send(port, "POST", "/v1/messages", routes()[3].body,
                 {{"Authorization", "Basic x"}, {"x-api-key", "sekrit"}})
                .status,
            200);
  EXPECT_EQ(send(port, "GET", "/v1/models", nullptr, {{"x-api-key", "sekrit"}}).status, 200);
  // Errors past the key keep their own status.
  Json bad = routes()[0].body;
  bad["max_tokens"] = -1;
  EXPECT_EQ(send(port, "POST", "/v1/chat/completions", bad, {{"Authorization", "Bearer sekrit"}}).status, 400);
}

TEST(ServerAuth, HealthAndMetricsNeedNoKey) {
  const int port = keyed_server().port;
  EXPECT_EQ(send(port, "GET", "/health", nullptr, {}).status, 200);
  const Reply m = send(port, "GET", "/metrics", nullptr, {});
  EXPECT_EQ(m.status, 200);
  EXPECT_NE(m.body.find("vllm:num_requests_running"), std::string::npos);
}

TEST(ServerAuth, EachRefusalIsCountedOnce) {
  const int port = keyed_server().port;
  const double before = http_errors(port, 401);
  send(port, "POST", "/v1/chat/completions", routes()[0].body, {});
  send(port, "POST", "/v1/messages", routes()[3].body, {{"x-api-key", "wrong"}});
  EXPECT_EQ(http_errors(port, 401), before + 2);
}

TEST(ServerAuth, SeveralServedNames) {
  const int port = named_server().port;
  for (const std::string name : {"a", "b"})
    for (const Route& route : routes(name)) {
      const Reply r = send(port, "POST", route.path, route.body, {});
      ASSERT_EQ(r.status, 200) << name << " " << route.path << ": " << r.body;
      if (route.path.find("count_tokens") != std::string::npos || route.path == "/tokenize") continue;
      EXPECT_EQ(r.json()["model"], name) << route.path;
    }
  const Json models = send(port, "GET", "/v1/models", nullptr, {}).json();
  ASSERT_EQ(models["data"].size(), 2u) << models.dump();
  EXPECT_EQ(models["data"][0]["id"], "a");
  EXPECT_EQ(models["data"][1]["id"], "b");
  const Reply one = send(port, "GET", "/v1/models/b", nullptr, {});
  EXPECT_EQ(one.status, 200) << one.body;
  if (one.status == 200) {
    EXPECT_EQ(one.json()["id"], "b");
  }
  EXPECT_EQ(send(port, "GET", "/v1/models/k3-tiny", nullptr, {}).status, 404);
  for (const Route& route : routes("k3-tiny")) {
    const Reply r = send(port, "POST", route.path, route.body, {});
    EXPECT_EQ(r.status, 404) << route.path << ": " << r.body;
    if (r.status != 404) continue;
    const Json e = r.json();
    if (route.anthropic) {
      EXPECT_EQ(e["error"]["type"], "not_found_error") << r.body;
    } else {
      EXPECT_EQ(e["error"]["code"], "model_not_found") << r.body;
    }
    EXPECT_NE(r.body.find("'a', 'b'"), std::string::npos) << "names the served ones: " << r.body;
  }
}

}  // namespace
}  // namespace k3::server
