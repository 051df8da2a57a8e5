// server/request_params_test.cpp: request bodies resolved into engine requests, and every kind
// of bad field answered with the right status and the field's name: unknown fields, wrong
// types, out-of-range values, unsupported OpenAI options, another model's name, prompts and
// completions that do not fit the context, malformed chat messages and tools.
#include "server/request_params.h"

#include <gtest/gtest.h>

#include "server/output_grammar.h"
#include "server/server_test_util.h"

namespace k3::server {
namespace {

class RequestParams : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tok_ = new tokenizer::Tokenizer(tokenizer::Tokenizer::load_k3(testing::tiny_model_dir()));
    grammars_ = new structured::GrammarCache(grammar_vocabulary(*tok_, 1024, -1));
  }
  static void TearDownTestSuite() {
    delete grammars_;
    delete tok_;
  }

  ParseContext ctx() const {
    ParseContext c;
    c.tokenizer = tok_;
    c.served_models = {"k3-tiny"};
    c.vocab_size = 1024;
    c.max_model_len = 512;
    c.random_seed = 99;
    c.grammars = grammars_;
    return c;
  }
  static Json chat_body(Json extra = Json::object()) {
    Json b = {{"model", "k3-tiny"}, {"messages", Json::array({{{"role", "user"}, {"content", "Hi"}}})}};
    for (auto& [k, v] : extra.items()) b[k] = v;
    return b;
  }
  static Json completion_body(Json extra = Json::object()) {
    Json b = {{"model", "k3-tiny"}, {"prompt", "Hello"}};
    for (auto& [k, v] : extra.items()) b[k] = v;
    return b;
  }
  // The request fails with `status` and names `param` (empty: no param expected).
  void expect_error(bool chat, const Json& body, int status, const std::string& param, const std::string& code = {}) {
    try {
      if (chat) parse_chat_request(body, ctx());
      else parse_completion_request(body, ctx());
      ADD_FAILURE() << "accepted: " << dump_json(body);
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, status) << e.what();
      EXPECT_EQ(e.param, param) << e.what();
      if (!code.empty()) {
        EXPECT_EQ(e.code, code) << e.what();
      }
      EXPECT_NE(std::string(e.what()).find(param.substr(0, param.find('['))), std::string::npos)
          << "the message should name the field: " << e.what();
    }
  }
  static tokenizer::Tokenizer* tok_;
  static structured::GrammarCache* grammars_;
};
tokenizer::Tokenizer* RequestParams::tok_ = nullptr;
structured::GrammarCache* RequestParams::grammars_ = nullptr;

TEST_F(RequestParams, CompletionFieldsResolveIntoEngineRequests) {
  const GenerationParams p = parse_completion_request(
      completion_body({{"prompt", Json::array({"Hello", Json::array({1, 2, 3})})},
                       {"n", 2},
                       {"max_tokens", 7},
                       {"temperature", 0.5},
                       {"top_p", 0.9},
                       {"top_k", 40},
                       {"min_p", 0.05},
                       {"repetition_penalty", 1.1},
                       {"presence_penalty", -0.5},
                       {"frequency_penalty", 1.5},
                       {"logit_bias", {{"17", -100}, {"42", 2.5}}},
                       {"seed", 1234},
                       {"stop", Json::array({"\n", "END"})},
                       {"stop_token_ids", Json::array({5, 6})},
                       {"ignore_eos", true},
                       {"logprobs", 3},
                       {"stream", true},
                       {"stream_options", {{"include_usage", true}}},
                       {"user", "someone"}}),
      ctx());
  ASSERT_EQ(p.prompts.size(), 2u);
  EXPECT_EQ(p.prompts[0], tok_->encode("Hello"));
  EXPECT_EQ(p.prompts[1], (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(p.num_choices(), 4);
  EXPECT_TRUE(p.stream && p.include_usage && p.logprobs);
  EXPECT_EQ(p.stop, (std::vector<std::string>{"\n", "END"}));
  for (int c = 0; c < 4; ++c) {
    const engine::GenerateRequest r = p.choice(c);
    EXPECT_EQ(r.prompt, p.prompts[static_cast<size_t>(c / 2)]);
    EXPECT_EQ(r.sampling.seed, 1234u + static_cast<uint64_t>(c));
    EXPECT_EQ(r.max_tokens, 7);
    EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
    EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
    EXPECT_EQ(r.sampling.top_k, 40);
    EXPECT_FLOAT_EQ(r.sampling.min_p, 0.05f);
    EXPECT_FLOAT_EQ(r.sampling.repetition_penalty, 1.1f);
    EXPECT_FLOAT_EQ(r.sampling.presence_penalty, -0.5f);
    EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, 1.5f);
    EXPECT_EQ(r.sampling.logprobs, 3);
    ASSERT_EQ(r.sampling.logit_bias.size(), 2u);
    EXPECT_EQ(r.sampling.logit_bias[0], (std::pair<int32_t, float>{17, -100.0f}));
    EXPECT_EQ(r.stop_token_ids, (std::vector<int32_t>{5, 6}));
    EXPECT_TRUE(r.ignore_eos);
  }
}

TEST_F(RequestParams, LogprobsWithoutTopEntriesStillAskForTheSampledTokensLogprob) {
  // chat logprobs: true without top_logprobs, and completions logprobs: 0, return each sampled
  // token's logprob (the sampler computes it only when asked).
  const GenerationParams chat = parse_chat_request(chat_body({{"logprobs", true}}), ctx());
  EXPECT_TRUE(chat.logprobs);
  EXPECT_TRUE(chat.choice(0).sampling.logprob);
  EXPECT_EQ(chat.choice(0).sampling.logprobs, 0);
  const GenerationParams zero = parse_completion_request(completion_body({{"logprobs", 0}}), ctx());
  EXPECT_TRUE(zero.logprobs);
  EXPECT_TRUE(zero.choice(0).sampling.logprob);
  EXPECT_FALSE(parse_chat_request(chat_body({{"logprobs", false}}), ctx()).choice(0).sampling.logprob);
  EXPECT_FALSE(parse_completion_request(completion_body(), ctx()).choice(0).sampling.logprob);
}

TEST_F(RequestParams, DefaultsNullsAndIntegralFloats) {
  // null means "not given"; 2.0 is an integer; the completions default is 16 tokens, the chat
  // default whatever the context has left; without a seed the server's random one is used.
  const GenerationParams p = parse_completion_request(
      completion_body({{"temperature", nullptr}, {"stop", nullptr}, {"n", 2.0}}), ctx());
  EXPECT_EQ(p.n, 2);
  EXPECT_EQ(p.choice(0).max_tokens, 16);
  EXPECT_EQ(p.choice(0).sampling.temperature, 0.0f);
  EXPECT_EQ(p.choice(1).sampling.seed, 100u);
  EXPECT_FALSE(p.logprobs);
  const GenerationParams c = parse_chat_request(chat_body(), ctx());
  EXPECT_EQ(c.choice(0).max_tokens, 512 - static_cast<int64_t>(c.prompts[0].size()));
  EXPECT_EQ(c.start_channel, tokenizer::Channel::think);
  const GenerationParams nothink = parse_chat_request(
      chat_body({{"chat_template_kwargs", {{"thinking", false}}}, {"max_completion_tokens", 5}}), ctx());
  EXPECT_EQ(nothink.start_channel, tokenizer::Channel::response);
  EXPECT_EQ(nothink.choice(0).max_tokens, 5);
}

TEST_F(RequestParams, ChatPromptIsTheK3Rendering) {
  const Json messages = Json::array(
      {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi"}}});
  const Json tools = Json::array(
      {{{"type", "function"}, {"function", {{"name", "get_weather"}, {"parameters", {{"type", "object"}}}}}}});
  const GenerationParams p = parse_chat_request(chat_body({{"messages", messages}, {"tools", tools}}), ctx());
  tokenizer::ChatOptions o;
  EXPECT_EQ(p.prompts[0], tokenizer::encode_chat(*tok_, messages, tools, o));
  EXPECT_TRUE(p.has_tools);
}

TEST_F(RequestParams, UnknownFieldsAreNamed) {
  expect_error(false, completion_body({{"temprature", 1}}), 400, "temprature", "unknown_parameter");
  expect_error(true, chat_body({{"functions", Json::array()}}), 400, "functions", "unknown_parameter");
  expect_error(false, completion_body({{"top_logprobs", 2}}), 400, "top_logprobs", "unknown_parameter");
  expect_error(true, chat_body({{"stream", true}, {"stream_options", {{"include_usage", true}, {"x", 1}}}}), 400,
               "stream_options.x", "unknown_parameter");
  expect_error(true, chat_body({{"chat_template_kwargs", {{"enable_thinking", true}}}}), 400,
               "chat_template_kwargs.enable_thinking", "unknown_parameter");
}

TEST_F(RequestParams, WrongTypesAreNamed) {
  expect_error(false, completion_body({{"temperature", "hot"}}), 400, "temperature", "invalid_type");
  expect_error(false, completion_body({{"max_tokens", 1.5}}), 400, "max_tokens", "invalid_type");
  expect_error(false, completion_body({{"stream", 1}}), 400, "stream", "invalid_type");
  expect_error(false, completion_body({{"stop", 5}}), 400, "stop", "invalid_type");
  expect_error(false, completion_body({{"stop", Json::array({"a", 5})}}), 400, "stop[1]", "invalid_type");
  expect_error(false, completion_body({{"prompt", 5}}), 400, "prompt", "invalid_type");
  expect_error(false, completion_body({{"prompt", Json::array({1, "a"})}}), 400, "prompt", "invalid_type");
  expect_error(false, completion_body({{"seed", "x"}}), 400, "seed", "invalid_type");
  expect_error(false, completion_body({{"logit_bias", Json::array()}}), 400, "logit_bias", "invalid_type");
  expect_error(true, chat_body({{"logprobs", 3}}), 400, "logprobs", "invalid_type");
  expect_error(true, chat_body({{"messages", "hi"}}), 400, "messages", "invalid_type");
  expect_error(true, chat_body({{"tools", Json::object()}}), 400, "tools", "invalid_type");
}

TEST_F(RequestParams, OutOfRangeValuesAreNamed) {
  expect_error(false, completion_body({{"temperature", -0.1}}), 400, "temperature");
  expect_error(false, completion_body({{"temperature", 2.5}}), 400, "temperature");
  expect_error(false, completion_body({{"top_p", 0}}), 400, "top_p");
  expect_error(false, completion_body({{"top_k", -2}}), 400, "top_k");
  expect_error(false, completion_body({{"min_p", 1.5}}), 400, "min_p");
  expect_error(false, completion_body({{"repetition_penalty", 0}}), 400, "repetition_penalty");
  expect_error(false, completion_body({{"presence_penalty", 2.5}}), 400, "presence_penalty");
  expect_error(false, completion_body({{"frequency_penalty", -3}}), 400, "frequency_penalty");
  expect_error(false, completion_body({{"n", 0}}), 400, "n");
  expect_error(false, completion_body({{"n", 17}}), 400, "n");
  expect_error(false, completion_body({{"max_tokens", 0}}), 400, "max_tokens");
  expect_error(false, completion_body({{"logprobs", 21}}), 400, "logprobs");
  expect_error(true, chat_body({{"logprobs", true}, {"top_logprobs", 21}}), 400, "top_logprobs");
  expect_error(true, chat_body({{"top_logprobs", 2}}), 400, "top_logprobs");  // needs logprobs: true
  expect_error(false, completion_body({{"logit_bias", {{"5", 101}}}}), 400, "logit_bias");
  expect_error(false, completion_body({{"logit_bias", {{"1024", 1}}}}), 400, "logit_bias");
  expect_error(false, completion_body({{"logit_bias", {{"-1", 1}}}}), 400, "logit_bias");
  expect_error(false, completion_body({{"logit_bias", {{"17", 1}, {"017", 2}}}}), 400, "logit_bias");
  expect_error(false, completion_body({{"stop_token_ids", Json::array({1024})}}), 400, "stop_token_ids");
  expect_error(false, completion_body({{"prompt", Json::array({1, 2, 5000})}}), 400, "prompt");
  expect_error(false, completion_body({{"stop", ""}}), 400, "stop");
  expect_error(false,
               completion_body({{"stop", Json::array({"1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12",
                                                      "13", "14", "15", "16", "17"})}}),
               400, "stop");
  expect_error(false, completion_body({{"stream_options", {{"include_usage", true}}}}), 400, "stream_options");
}

TEST_F(RequestParams, ContextLimitsNameThePromptOrMaxTokens) {
  std::string longer;
  for (int i = 0; i < 600; ++i) longer += "word" + std::to_string(i) + " ";
  expect_error(false, completion_body({{"prompt", longer}}), 400, "prompt", "context_length_exceeded");
  expect_error(false, completion_body({{"max_tokens", 512}}), 400, "max_tokens", "context_length_exceeded");
  expect_error(true, chat_body({{"messages", Json::array({{{"role", "user"}, {"content", longer}}})}}), 400, "messages",
               "context_length_exceeded");
  expect_error(false, completion_body({{"prompt", ""}}), 400, "prompt");
  expect_error(false, completion_body({{"prompt", Json::array()}}), 400, "prompt");
}

TEST_F(RequestParams, UnsupportedOptionsAreRefusedNotIgnored) {
  expect_error(false, completion_body({{"echo", true}}), 400, "echo", "unsupported_value");
  expect_error(false, completion_body({{"best_of", 3}}), 400, "best_of", "unsupported_value");
  expect_error(false, completion_body({{"suffix", "tail"}}), 400, "suffix", "unsupported_value");
  expect_error(true, chat_body({{"tool_choice", "required"}}), 400, "tool_choice");
  expect_error(true,
               chat_body({{"tools", Json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}})},
                          {"tool_choice", {{"type", "function"}, {"function", {{"name", "g"}}}}}}),
               400, "tool_choice");  // a named tool that is not declared
  expect_error(true, chat_body({{"reasoning_effort", "extreme"}}), 400, "reasoning_effort");
  expect_error(true, chat_body({{"response_format", {{"type", "yaml"}}}}), 400, "response_format.type");
  // Harmless values of the same fields pass.
  EXPECT_NO_THROW(parse_completion_request(completion_body({{"echo", false}, {"best_of", 1}, {"suffix", ""}}), ctx()));
  EXPECT_NO_THROW(parse_chat_request(chat_body({{"parallel_tool_calls", true},
                                                {"tool_choice", "auto"},
                                                {"response_format", {{"type", "json_object"}}}}),
                                     ctx()));
}

TEST_F(RequestParams, ToolChoiceAndParallelCallsBecomeTheToolPolicy) {
  const Json tools = Json::array(
      {{{"type", "function"}, {"function", {{"name", "f"}}}}, {{"type", "function"}, {"function", {{"name", "g"}}}}});
  GenerationParams named = parse_chat_request(
      chat_body({{"tools", tools},
                 {"tool_choice", {{"type", "function"}, {"function", {{"name", "g"}}}}},
                 {"parallel_tool_calls", false}}),
      ctx());
  EXPECT_TRUE(named.tool_policy.allowed);
  EXPECT_EQ(named.tool_policy.only_name, "g");
  EXPECT_TRUE(named.tool_policy.single);
  const GenerationParams none = parse_chat_request(chat_body({{"tools", tools}, {"tool_choice", "none"}}), ctx());
  EXPECT_FALSE(none.tool_policy.allowed);
  const GenerationParams plain = parse_chat_request(chat_body({{"tools", tools}}), ctx());
  EXPECT_TRUE(plain.tool_policy.allowed && plain.tool_policy.only_name.empty() && !plain.tool_policy.single);
  // The prompt follows: a named choice renders a tool-choice system message naming the tool.
  const std::string text = tok_->decode(named.prompts[0]);
  EXPECT_NE(text.find("You MUST call the tool `g`"), std::string::npos) << text;
}

TEST_F(RequestParams, FieldsWithNoEffectAreAcceptedAndUnknownOnesCollected) {
  std::vector<std::string> ignored;
  ParseContext c = ctx();
  c.ignored_fields = &ignored;
  EXPECT_NO_THROW(
      parse_chat_request(chat_body({{"user", "u1"},
                                    {"metadata", {{"k", "v"}}},
                                    {"store", false},
                                    {"service_tier", "auto"},
                                    {"prompt_cache_key", "abc"},
                                    {"safety_identifier", "s"},
                                    {"client_metadata", {{"x", 1}}},
                                    {"messages", Json::array({{{"role", "developer"}, {"content", "Be brief."}},
                                                              {{"role", "user"}, {"content", "Hi"}}})}}),
                         c));
  EXPECT_EQ(ignored, std::vector<std::string>{"client_metadata"});
  // Without a collector (strict objects) an unknown field is still a 400 naming it.
  expect_error(true, chat_body({{"client_metadata", 1}}), 400, "client_metadata", "unknown_parameter");
  expect_error(true, chat_body({{"metadata", "not an object"}}), 400, "metadata");
}

TEST_F(RequestParams, AnotherModelIs404) {
  expect_error(false, completion_body({{"model", "gpt-4"}}), 404, "model", "model_not_found");
  EXPECT_NO_THROW(parse_completion_request(Json{{"prompt", "no model field is fine"}}, ctx()));
}

TEST_F(RequestParams, MalformedMessagesAndToolsNameThePath) {
  expect_error(true, chat_body({{"messages", Json::array({{{"content", "no role"}}})}}), 400, "messages[0].role");
  expect_error(true, chat_body({{"messages", Json::array({{{"role", "wizard"}, {"content", "x"}}})}}), 400,
               "messages[0].role");
  expect_error(true,
               chat_body({{"tools", Json::array({{{"type", "function"}, {"function", {{"description", "x"}}}}})}}), 400,
               "tools[0].function.name");
  expect_error(true, chat_body({{"tools", Json::array({{{"type", "retrieval"}}})}}), 400, "tools[0].type");
  expect_error(true, chat_body({{"messages", Json::array()}}), 400, "messages");
}

TEST_F(RequestParams, BodiesThatAreNotJsonObjects) {
  for (const std::string body : {"", "   ", "{", "[1,2]", "\"text\"", "{\"a\":1}x", "nul", "{\"a\": 01}"}) {
    try {
      parse_body(body);
      ADD_FAILURE() << "accepted: " << body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.code, "invalid_json");
    }
  }
  EXPECT_THROW(parse_body(std::string(100000, '[') + std::string(100000, ']')), ApiError);  // no stack overflow
  EXPECT_THROW(parse_body("{\"a\": \"\xff\xfe\"}"), ApiError);                              // bad UTF-8
  EXPECT_THROW(parse_body("{\"a\": \"\\ud800\"}"), ApiError);                               // lone surrogate
  EXPECT_NO_THROW(parse_body("{\"a\": \"caf\xc3\xa9 \\ud83d\\ude80\"}"));
}

TEST_F(RequestParams, TokenizeAndDetokenizeBodies) {
  const TokenizeParams t = parse_tokenize_request(Json{{"prompt", "Hello world"}, {"return_token_strs", true}}, ctx());
  EXPECT_EQ(t.tokens, tok_->encode("Hello world"));
  EXPECT_TRUE(t.return_token_strs);
  const TokenizeParams m = parse_tokenize_request(
      Json{{"messages", Json::array({{{"role", "user"}, {"content", "Hi"}}})}, {"add_generation_prompt", true}}, ctx());
  EXPECT_EQ(m.tokens, tokenizer::encode_chat(*tok_, Json::array({{{"role", "user"}, {"content", "Hi"}}}), nullptr, {}));
  EXPECT_THROW(parse_tokenize_request(Json{{"prompt", "a"}, {"messages", Json::array()}}, ctx()), ApiError);
  EXPECT_THROW(parse_tokenize_request(Json{{"text", "a"}}, ctx()), ApiError);
  EXPECT_EQ(parse_detokenize_request(Json{{"tokens", Json::array({1, 2})}}, ctx()), (std::vector<int32_t>{1, 2}));
  EXPECT_THROW(parse_detokenize_request(Json{{"tokens", Json::array({-1})}}, ctx()), ApiError);
  EXPECT_THROW(parse_detokenize_request(Json{{"tokens", "1,2"}}, ctx()), ApiError);
}

}  // namespace
}  // namespace k3::server
