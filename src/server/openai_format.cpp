// server/openai_format.cpp: OpenAI response JSON.
#include "server/openai_format.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "tokenizer/utf8.h"

namespace k3::server {

namespace {

double clamp_logprob(float lp) { return std::max(static_cast<double>(lp), -9999.0); }

// A token's text as a client sees it alone: its bytes, with a partial UTF-8 character
// replaced by U+FFFD (the exact bytes go in "bytes").
std::string token_text(const tokenizer::Tokenizer& tok, int32_t id) {
  try {
    const std::string_view bytes = tok.token_bytes(id);
    std::string out;
    tokenizer::utf8::append_replacing(bytes, true, out);
    return out;
  } catch (...) {
    return "\xEF\xBF\xBD";
  }
}

Json token_bytes(const tokenizer::Tokenizer& tok, int32_t id) {
  Json b = Json::array();
  try {
    for (unsigned char c : tok.token_bytes(id)) b.push_back(static_cast<int>(c));
  } catch (...) {
  }
  return b;
}

int64_t char_count(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace

void ChoiceResult::add(const ChoiceDelta& d, std::vector<std::string> ids) {
  text += d.text;
  reasoning += d.reasoning;
  tool_calls.insert(tool_calls.end(), d.tool_calls.begin(), d.tool_calls.end());
  tool_call_ids.insert(tool_call_ids.end(), ids.begin(), ids.end());
  logprobs.insert(logprobs.end(), d.logprobs.begin(), d.logprobs.end());
  if (!d.finish_reason.empty()) finish_reason = d.finish_reason;
}

std::string random_id(const std::string& prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s = prefix;
  for (int i = 0; i < 24; ++i) s += kHex[rng() & 15];
  return s;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

Json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

Json tool_call_json(const tokenizer::ParsedToolCall& call, const std::string& id, bool with_index) {
  Json j;
  if (with_index) j["index"] = call.index;
  j["id"] = id;
  j["type"] = "function";
  j["function"] = {{"name", call.name}, {"arguments", call.arguments}};
  return j;
}

Json completion_logprobs(const tokenizer::Tokenizer& tok, const std::vector<TokenLogprob>& entries,
                         int64_t& text_offset) {
  Json tokens = Json::array(), token_logprobs = Json::array(), top = Json::array(), offsets = Json::array();
  for (const TokenLogprob& e : entries) {
    const std::string text = token_text(tok, e.token);
    tokens.push_back(text);
    token_logprobs.push_back(clamp_logprob(e.logprob));
    Json t = Json::object();
    for (const auto& [id, lp] : e.top) {
      const std::string key = token_text(tok, id);
      if (!t.contains(key)) t[key] = clamp_logprob(lp);  // two ids with one text: the likelier
    }
    top.push_back(std::move(t));
    offsets.push_back(text_offset);
    text_offset += char_count(text);
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
}

Json chat_logprobs_content(const tokenizer::Tokenizer& tok, const std::vector<TokenLogprob>& entries) {
  Json content = Json::array();
  for (const TokenLogprob& e : entries) {
    Json top = Json::array();
    for (const auto& [id, lp] : e.top)
      top.push_back({{"token", token_text(tok, id)}, {"logprob", clamp_logprob(lp)}, {"bytes", token_bytes(tok, id)}});
    content.push_back({{"token", token_text(tok, e.token)},
                       {"logprob", clamp_logprob(e.logprob)},
                       {"bytes", token_bytes(tok, e.token)},
                       {"top_logprobs", top}});
  }
  return content;
}

Json finish_reason_json(const std::string& reason) {
  if (reason.empty()) return nullptr;
  return reason;
}

Json completion_chunk(const ResponseMeta& m, int index, const std::string& text, const Json& logprobs,
                      const std::string& finish_reason) {
  return {{"id", m.id},
          {"object", "text_completion"},
          {"created", m.created},
          {"model", m.model},
          {"choices", Json::array({{{"index", index},
                                    {"text", text},
                                    {"logprobs", logprobs},
                                    {"finish_reason", finish_reason_json(finish_reason)}}})}};
}

Json chat_chunk(const ResponseMeta& m, int index, const Json& delta, const Json& logprobs,
                const std::string& finish_reason) {
  return {{"id", m.id},
          {"object", "chat.completion.chunk"},
          {"created", m.created},
          {"model", m.model},
          {"choices", Json::array({{{"index", index},
                                    {"delta", delta},
                                    {"logprobs", logprobs},
                                    {"finish_reason", finish_reason_json(finish_reason)}}})}};
}

Json usage_chunk(const ResponseMeta& m, bool chat, const Usage& u) {
  return {{"id", m.id},
          {"object", chat ? "chat.completion.chunk" : "text_completion"},
          {"created", m.created},
          {"model", m.model},
          {"choices", Json::array()},
          {"usage", usage_json(u)}};
}

Json completion_response(const tokenizer::Tokenizer& tok, const ResponseMeta& m,
                         const std::vector<ChoiceResult>& choices, bool logprobs, const Usage& u) {
  Json list = Json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    int64_t offset = 0;
    list.push_back({{"index", i},
                    {"text", choices[i].text},
                    {"logprobs", logprobs ? completion_logprobs(tok, choices[i].logprobs, offset) : Json(nullptr)},
                    {"finish_reason", finish_reason_json(choices[i].finish_reason)}});
  }
  return {{"id", m.id},      {"object", "text_completion"}, {"created", m.created}, {"model", m.model},
          {"choices", list}, {"usage", usage_json(u)}};
}

Json chat_response(const tokenizer::Tokenizer& tok, const ResponseMeta& m, const std::vector<ChoiceResult>& choices,
                   bool logprobs, const Usage& u) {
  Json list = Json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& c = choices[i];
    Json message = {{"role", "assistant"}};
    message["content"] = c.text.empty() && !c.tool_calls.empty() ? Json(nullptr) : Json(c.text);
    if (!c.reasoning.empty()) message["reasoning_content"] = c.reasoning;
    if (!c.tool_calls.empty()) {
      Json calls = Json::array();
      for (size_t k = 0; k < c.tool_calls.size(); ++k)
        calls.push_back(tool_call_json(c.tool_calls[k], c.tool_call_ids[k], false));
      message["tool_calls"] = calls;
    }
    list.push_back({{"index", i},
                    {"message", message},
                    {"logprobs", logprobs ? Json{{"content", chat_logprobs_content(tok, c.logprobs)}} : Json(nullptr)},
                    {"finish_reason", finish_reason_json(c.finish_reason)}});
  }
  return {{"id", m.id},      {"object", "chat.completion"}, {"created", m.created}, {"model", m.model},
          {"choices", list}, {"usage", usage_json(u)}};
}

}  // namespace k3::server
