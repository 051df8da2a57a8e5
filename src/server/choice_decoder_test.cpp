// server/choice_decoder_test.cpp: ChoiceDecoder over the tiny tokenizer, fed the scripted
// outputs token by token as the engine delivers them: tool calls streamed as pieces (begin, then
// argument fragments that concatenate to the complete call's arguments), and the ToolPolicy of
// tool_choice / parallel_tool_calls: a refused call's text becomes content (never dropped), the
// one call parallel_tool_calls=false allows ends the choice early.
#include "server/choice_decoder.h"

#include <gtest/gtest.h>

#include <map>

#include "server/server_test_util.h"

namespace k3::server {
namespace {

using Json = nlohmann::json;

class ChoiceDecoderTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tok_ = new tokenizer::Tokenizer(tokenizer::Tokenizer::load_k3(testing::tiny_model_dir()));
  }
  static void TearDownTestSuite() { delete tok_; }

  static std::string script(const std::string& trigger) {
    for (const auto& [t, text] : testing::script_texts())
      if (t == trigger) return text;
    ADD_FAILURE() << "no script " << trigger;
    return {};
  }

  // Everything the decoder said, folded, plus per-delta facts.
  struct Folded {
    std::string text, reasoning, finish;
    std::vector<tokenizer::ParsedToolCall> calls;
    std::map<int, std::string> names;     // call index -> name, from its begin piece
    std::map<int, std::string> streamed;  // call index -> its fragments concatenated
    std::map<int, int> fragments;
    int deltas_after_finish = 0;
    int64_t tokens = 0;
    bool stopped_early = false;
    std::vector<std::string> parse_errors;
  };

  // Feeds `text`'s tokens one event each (the last one, eos, finishing the request), then a few
  // more tokens to show that nothing comes after the finish.
  static Folded decode(const std::string& text, ToolPolicy policy, tokenizer::Channel start = tokenizer::Channel::think,
                       std::vector<std::string> stop = {}) {
    DecoderOptions o;
    o.chat = true;
    o.start = start;
    o.tools = std::move(policy);
    o.stop = std::move(stop);
    ChoiceDecoder dec(*tok_, o);
    const std::vector<int32_t> ids = testing::encode_script(*tok_, text);
    const int32_t eos = *tok_->special_id(tokenizer::k3_tokens::kEndOfMsg);
    EXPECT_EQ(ids.back(), eos);
    Folded f;
    for (size_t i = 0; i < ids.size() + 3; ++i) {
      engine::TokenEvent e;
      e.token = i < ids.size() ? ids[i] : ids[0];
      e.finished = i + 1 == ids.size();
      e.reason = engine::FinishReason::stop;
      const bool was_finished = dec.finished();
      const ChoiceDelta d = dec.push(e);
      if (was_finished) {
        f.deltas_after_finish += !d.empty();
        continue;
      }
      f.text += d.text;
      f.reasoning += d.reasoning;
      for (const ToolCallPiece& p : d.tool_call_pieces) {
        if (p.begin) {
          EXPECT_FALSE(f.names.count(p.index)) << "call " << p.index << " began twice";
          f.names[p.index] = p.name;
        } else {
          EXPECT_TRUE(f.names.count(p.index)) << "a fragment before its call began";
          EXPECT_FALSE(p.arguments.empty());
        }
        f.streamed[p.index] += p.arguments;
        f.fragments[p.index] += !p.arguments.empty();
      }
      for (const tokenizer::ParsedToolCall& c : d.tool_calls) f.calls.push_back(c);
      if (!d.finish_reason.empty()) {
        EXPECT_TRUE(f.finish.empty()) << "two finish reasons";
        f.finish = d.finish_reason;
      }
    }
    EXPECT_TRUE(dec.finished());
    f.tokens = dec.tokens();
    f.stopped_early = dec.stopped_early();
    f.parse_errors = dec.parse_errors();
    return f;
  }

  // Every returned call was streamed, and its fragments make its arguments exactly.
  static void expect_streamed_calls(const Folded& f) {
    for (const tokenizer::ParsedToolCall& c : f.calls) {
      ASSERT_TRUE(f.names.count(c.index)) << "call " << c.index << " was never begun";
      EXPECT_EQ(f.names.at(c.index), c.name);
      EXPECT_EQ(f.streamed.at(c.index), c.arguments) << c.name;
      EXPECT_TRUE(Json::accept(c.arguments)) << c.arguments;
    }
  }

  // The text of the SCRIPT_TOOLS call named `name`, markers included (what a refused call shows).
  static std::string call_text(const std::string& name) {
    const std::string s = script("SCRIPT_TOOLS");
    const size_t begin = s.find("<|open|>call tool=\"" + name + "\"");
    const std::string end = "<|close|>call<|sep|>";
    const size_t stop = s.find(end, begin);
    return s.substr(begin, stop + end.size() - begin);
  }

  static tokenizer::Tokenizer* tok_;
};
tokenizer::Tokenizer* ChoiceDecoderTest::tok_ = nullptr;

TEST_F(ChoiceDecoderTest, ToolCallsStreamAsTheyAreGenerated) {
  const Folded f = decode(script("SCRIPT_TOOLS"), {});
  EXPECT_EQ(f.reasoning, "I need the weather.");
  EXPECT_EQ(f.text, "");
  ASSERT_EQ(f.calls.size(), 2u);
  EXPECT_EQ(f.calls[0].index, 0);
  EXPECT_EQ(f.calls[0].name, "get_weather");
  EXPECT_EQ(Json::parse(f.calls[0].arguments), (Json{{"city", "Paris"}, {"days", 3}}));
  EXPECT_EQ(f.calls[1].index, 1);
  EXPECT_EQ(f.calls[1].name, "get_time");
  EXPECT_EQ(Json::parse(f.calls[1].arguments), (Json{{"tz", "CET"}}));
  expect_streamed_calls(f);
  EXPECT_GE(f.fragments.at(0), 4);  // {"city":" / Paris / " / ,"days":3 / } at least
  EXPECT_EQ(f.finish, "tool_calls");
  EXPECT_FALSE(f.stopped_early);
  EXPECT_TRUE(f.parse_errors.empty());
  EXPECT_EQ(f.deltas_after_finish, 0);
  EXPECT_EQ(f.tokens, static_cast<int64_t>(testing::encode_script(*tok_, script("SCRIPT_TOOLS")).size()));
}

TEST_F(ChoiceDecoderTest, NamedToolRefusesTheOthersAsContent) {
  ToolPolicy p;
  p.only_name = "get_time";
  const Folded f = decode(script("SCRIPT_TOOLS"), p);
  EXPECT_EQ(f.text, call_text("get_weather"));  // the refused call, exactly as generated
  ASSERT_EQ(f.calls.size(), 1u);
  EXPECT_EQ(f.calls[0].name, "get_time");
  EXPECT_EQ(f.calls[0].index, 1);
  EXPECT_FALSE(f.names.count(0)) << "the refused call must not be streamed as a call";
  expect_streamed_calls(f);
  EXPECT_EQ(f.finish, "tool_calls");
  EXPECT_EQ(f.parse_errors.size(), 1u);  // counted, not dropped silently
}

TEST_F(ChoiceDecoderTest, NoneRefusesEveryCall) {
  ToolPolicy p;
  p.allowed = false;
  const Folded f = decode(script("SCRIPT_TOOLS"), p);
  EXPECT_EQ(f.text, call_text("get_weather") + call_text("get_time"));
  EXPECT_TRUE(f.calls.empty());
  EXPECT_TRUE(f.names.empty());
  EXPECT_EQ(f.finish, "stop");
  EXPECT_EQ(f.parse_errors.size(), 2u);
}

TEST_F(ChoiceDecoderTest, SingleCallEndsTheChoiceEarly) {
  ToolPolicy p;
  p.single = true;
  const Folded f = decode(script("SCRIPT_TOOLS"), p);
  ASSERT_EQ(f.calls.size(), 1u);
  EXPECT_EQ(f.calls[0].name, "get_weather");
  expect_streamed_calls(f);
  EXPECT_FALSE(f.names.count(1)) << "nothing of the second call is streamed";
  EXPECT_EQ(f.text, "");
  EXPECT_EQ(f.finish, "tool_calls");
  EXPECT_TRUE(f.stopped_early);  // the caller aborts the engine request
  EXPECT_EQ(f.deltas_after_finish, 0);
  EXPECT_LT(f.tokens, static_cast<int64_t>(testing::encode_script(*tok_, script("SCRIPT_TOOLS")).size()));
}

TEST_F(ChoiceDecoderTest, SingleNamedCallSkipsTheRefusedOne) {
  ToolPolicy p;
  p.only_name = "get_time";
  p.single = true;
  const Folded f = decode(script("SCRIPT_TOOLS"), p);
  EXPECT_EQ(f.text, call_text("get_weather"));
  ASSERT_EQ(f.calls.size(), 1u);
  EXPECT_EQ(f.calls[0].name, "get_time");
  EXPECT_EQ(f.finish, "tool_calls");
  EXPECT_TRUE(f.stopped_early);
}

TEST_F(ChoiceDecoderTest, MalformedCallBecomesContent) {
  const Folded f = decode(script("SCRIPT_BADTOOL"), {});
  EXPECT_EQ(f.reasoning, "Hmm.");
  EXPECT_EQ(f.text,
            "Calling.<|open|>call tool=\"f\" index=\"1\"<|sep|><|open|>argument key=\"n\" type=\"number\"<|sep|>"
            "12abc<|close|>argument<|sep|><|close|>call<|sep|>");
  EXPECT_TRUE(f.calls.empty());
  EXPECT_EQ(f.finish, "stop");
  ASSERT_EQ(f.parse_errors.size(), 1u);
  EXPECT_NE(f.parse_errors[0].find("not a valid JSON number"), std::string::npos) << f.parse_errors[0];
  EXPECT_EQ(f.fragments.count(0) ? f.fragments.at(0) : 0, 0);  // a typed value is checked before it streams
}

// A stop string applies to the content: a refused call's text can complete one.
TEST_F(ChoiceDecoderTest, StopStringInARefusedCallsText) {
  ToolPolicy p;
  p.allowed = false;
  const Folded f = decode(script("SCRIPT_TOOLS"), p, tokenizer::Channel::think, {"get_time"});
  EXPECT_EQ(f.text, call_text("get_weather") + "<|open|>call tool=\"");
  EXPECT_EQ(f.finish, "stop");
  EXPECT_TRUE(f.stopped_early);
}

// Thinking off: the output starts in the response channel; a script that still thinks shows
// its reasoning as content (the closing think marker is a parse error, not a crash).
TEST_F(ChoiceDecoderTest, ResponseStartTakesStrayReasoningAsContent) {
  const Folded f = decode(script("SCRIPT_CHAT"), {}, tokenizer::Channel::response);
  EXPECT_EQ(f.reasoning, "");
  EXPECT_EQ(f.text, "The user greets me; I greet back.Hello! How can I help you today?");
  EXPECT_EQ(f.finish, "stop");
}

}  // namespace
}  // namespace k3::server
