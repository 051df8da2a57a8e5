// server/choice_decoder.cpp: ChoiceDecoder.
#include "server/choice_decoder.h"

#include "core/error.h"
#include "tokenizer/k3_tokens.h"

namespace k3::server {

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// The K3 markers the output parser reads; they pass even when special tokens are skipped.
bool is_marker(std::string_view text) {
  namespace t = tokenizer::k3_tokens;
  return text == t::kOpen || text == t::kClose || text == t::kSep || text == t::kEndOfMsg;
}

}  // namespace

ChoiceDecoder::ChoiceDecoder(const tokenizer::Tokenizer& tokenizer, DecoderOptions options)
    : tokenizer_(tokenizer),
      options_(std::move(options)),
      // Chat decodes special tokens itself (the parser needs the markers), so its detokenizer
      // keeps them; completions let the detokenizer skip them when asked.
      detok_(tokenizer, !options_.chat && options_.skip_special_tokens),
      parser_(options_.start),
      stop_(options_.stop) {}

ChoiceDelta ChoiceDecoder::push(const engine::TokenEvent& e) {
  ChoiceDelta d;
  if (finished_) return d;
  if (e.token >= 0) {
    ++tokens_;
    if (options_.logprobs) d.logprobs.push_back({e.token, e.logprob, e.top_logprobs});
    // eos / a stop token id ends the request with reason stop: counted, not shown.
    const bool terminal_stop = e.finished && e.reason == engine::FinishReason::stop;
    if (!terminal_stop) feed_token(e.token, d);
    reasoning_tokens_ += !d.reasoning.empty() && d.text.empty() && d.tool_call_pieces.empty();
  }
  if (!finished_ && e.finished) finish(e, d);
  return d;
}

void ChoiceDecoder::feed_token(int32_t id, ChoiceDelta& d) {
  // The model's vocabulary may be larger than the tokenizer's (padding rows): such an id has
  // no text and shows as U+FFFD rather than failing the request.
  const bool known = id < tokenizer_.vocab_size() && [&] {
    try {
      tokenizer_.token_bytes(id);
      return true;
    } catch (const core::Error&) {
      return false;
    }
  }();
  if (!options_.chat) {
    feed_visible(known ? detok_.push(id) : detok_.finish() + std::string(kReplacement), d);
    return;
  }
  if (!known) {
    feed_parser(detok_.finish() + std::string(kReplacement), d, false);
  } else if (tokenizer_.is_special(id)) {
    std::string text = detok_.finish();  // bytes held for a character the special token cut
    const std::string_view bytes = tokenizer_.token_bytes(id);
    if (is_marker(bytes) || !(options_.skip_special_tokens && tokenizer_.is_skippable(id))) text += bytes;
    feed_parser(text, d, false);
  } else {
    feed_parser(detok_.push(id), d, false);
  }
}

void ChoiceDecoder::feed_parser(std::string_view text, ChoiceDelta& d, bool final) {
  events_.clear();
  if (!text.empty()) parser_.feed(text, events_);
  if (final) parser_.finish(events_);
  using Kind = tokenizer::OutputEvent::Kind;
  for (tokenizer::OutputEvent& ev : events_) {
    if (finished_) break;  // a stop string (or the one call allowed) ended the choice
    const auto index = static_cast<size_t>(ev.call.index);
    switch (ev.kind) {
      case Kind::reasoning: d.reasoning += ev.text; break;
      case Kind::content: feed_visible(ev.text, d); break;
      case Kind::tool_call_begin:
        if (calls_.size() <= index) calls_.resize(index + 1, CallState::pending), call_names_.resize(index + 1);
        calls_[index] = call_allowed(ev.call) ? CallState::pending : CallState::refused;
        call_names_[index] = ev.call.name;
        break;
      case Kind::tool_call_arguments:
        if (index >= calls_.size() || calls_[index] == CallState::refused) break;
        d.tool_call_pieces.push_back({ev.call.index, calls_[index] == CallState::pending,
                                      calls_[index] == CallState::pending ? call_names_[index] : std::string(),
                                      std::move(ev.text)});
        calls_[index] = CallState::streaming;
        break;
      case Kind::tool_call:
        if (index < calls_.size() && calls_[index] == CallState::refused) {
          refuse_call(ev,
                      "tool call " + std::to_string(ev.call.index) + " ('" + ev.call.name +
                          "') is not allowed by tool_choice / parallel_tool_calls",
                      d);
          break;
        }
        had_tool_calls_ = true;
        d.tool_calls.push_back(std::move(ev.call));
        if (options_.tools.single) {  // parallel_tool_calls false: this call is the answer
          finished_ = stopped_early_ = true;
          d.finish_reason = "tool_calls";
        }
        break;
      case Kind::error:
        if (ev.raw.empty()) {
          parse_errors_.push_back(std::move(ev.text));
          break;
        }
        if (index < calls_.size() && calls_[index] == CallState::streaming)
          d.tool_call_pieces.push_back({ev.call.index, false, {}, {}, true});
        refuse_call(ev, ev.text, d);  // a malformed call: its text is shown as content
        break;
    }
  }
}

bool ChoiceDecoder::call_allowed(const tokenizer::ParsedToolCall& call) const {
  const ToolPolicy& p = options_.tools;
  if (!p.allowed) return false;
  if (!p.only_name.empty() && call.name != p.only_name) return false;
  return !(p.single && had_tool_calls_);
}

void ChoiceDecoder::refuse_call(const tokenizer::OutputEvent& ev, const std::string& why, ChoiceDelta& d) {
  parse_errors_.push_back(why);
  feed_visible(ev.raw, d);
}

void ChoiceDecoder::feed_visible(std::string_view text, ChoiceDelta& d) {
  if (text.empty() || finished_) return;
  d.text += stop_.feed(text);
  if (stop_.stopped()) {
    finished_ = stopped_early_ = true;
    d.finish_reason = "stop";
  }
}

void ChoiceDecoder::finish(const engine::TokenEvent& e, ChoiceDelta& d) {
  if (options_.chat) feed_parser(detok_.finish(), d, true);
  else feed_visible(detok_.finish(), d);
  if (finished_) return;  // the flush completed a stop string
  d.text += stop_.finish();
  finished_ = true;
  switch (e.reason) {
    case engine::FinishReason::stop: d.finish_reason = had_tool_calls_ ? "tool_calls" : "stop"; break;
    case engine::FinishReason::length: d.finish_reason = "length"; break;
    case engine::FinishReason::abort: d.finish_reason = "abort"; break;
    case engine::FinishReason::error:
      d.finish_reason = "error";
      d.error = e.error.empty() ? "the engine failed the request" : e.error;
      break;
  }
}

}  // namespace k3::server
