// tokenizer/output_parser.cpp: the streaming parser of K3 assistant output (XTML channels and
// typed tool calls).
#include "tokenizer/output_parser.h"

#include <nlohmann/json.hpp>

#include "tokenizer/k3_tokens.h"

namespace k3::tokenizer {

namespace {

// An event that carries only text (no call).
OutputEvent text_event(OutputEvent::Kind kind, std::string_view text) { return {kind, std::string(text), {}, {}}; }
OutputEvent error_event(const std::string& text) { return text_event(OutputEvent::Kind::error, text); }

using k3_tokens::kClose;
using k3_tokens::kEndOfMsg;
using k3_tokens::kOpen;
using k3_tokens::kSep;

constexpr size_t kMaxHeader = 4096;  // longest "<|open|>tag attrs<|sep|>" waited for

enum class Mark : uint8_t { text, partial, open, close, end, stray, cut };
struct Marker {
  Mark kind = Mark::text;
  size_t length = 0;
  std::string tag, attrs;
};

// What starts at b[0] ('<'): a whole marker, the beginning of one (more input needed), text,
// a stray control token (a lone <|sep|>, or an <|open|> / <|close|> whose header does not end in
// <|sep|> within kMaxHeader bytes), which is dropped, or (final) a marker the end of the output
// cut off inside its header (max_tokens): the rest of the output, dropped too, never content.
Marker scan(std::string_view b, bool final) {
  for (std::string_view m : {kOpen, kClose, kEndOfMsg, kSep}) {
    if (b.substr(0, m.size()) == m) {
      if (m == kEndOfMsg) return {Mark::end, m.size(), {}, {}};
      if (m == kSep) return {Mark::stray, m.size(), std::string(m), {}};
      const size_t sep = b.substr(0, m.size() + kMaxHeader).find(kSep, m.size());
      if (sep == std::string_view::npos) {
        if (b.size() < m.size() + kMaxHeader) return {final ? Mark::cut : Mark::partial, final ? b.size() : 0, {}, {}};
        return {Mark::stray, m.size(), std::string(m) + " without <|sep|>", {}};
      }
      const std::string_view header = b.substr(m.size(), sep - m.size());
      const size_t space = header.find(' ');
      Marker mk{m == kOpen ? Mark::open : Mark::close, sep + kSep.size(), std::string(header.substr(0, space)), {}};
      if (space != std::string_view::npos) mk.attrs = header.substr(space);
      return mk;
    }
    if (b.size() < m.size() && m.substr(0, b.size()) == b) return {final ? Mark::text : Mark::partial, 0, {}, {}};
  }
  return {};
}

// The first marker (or partial marker) in b: its offset (npos if none) and kind.
size_t find_marker(std::string_view b, bool final, Marker& mk) {
  for (size_t pos = b.find('<'); pos != std::string_view::npos; pos = b.find('<', pos + 1)) {
    mk = scan(b.substr(pos), final);
    if (mk.kind != Mark::text) return pos;
  }
  return std::string_view::npos;
}

// Attributes ` key="value"` (values with &amp; / &quot; decoded); false when malformed.
bool parse_attrs(std::string_view s, std::vector<std::pair<std::string, std::string>>& out) {
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] != ' ') return false;
    const size_t eq = s.find("=\"", i + 1);
    if (eq == std::string_view::npos) return false;
    const size_t end = s.find('"', eq + 2);
    if (end == std::string_view::npos) return false;
    std::string value;
    const std::string_view raw = s.substr(eq + 2, end - eq - 2);
    for (size_t k = 0; k < raw.size(); ++k) {
      if (raw.compare(k, 5, "&amp;") == 0) {
        value += '&';
        k += 4;
      } else if (raw.compare(k, 6, "&quot;") == 0) {
        value += '"';
        k += 5;
      } else {
        value += raw[k];
      }
    }
    out.emplace_back(std::string(s.substr(i + 1, eq - i - 1)), std::move(value));
    i = end + 1;
  }
  return true;
}

std::string attr(const std::vector<std::pair<std::string, std::string>>& attrs, std::string_view key) {
  for (const auto& [k, v] : attrs)
    if (k == key) return v;
  return {};
}

std::string trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  return std::string(s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1));
}

bool blank(std::string_view s) { return s.find_first_not_of(" \t\r\n") == std::string_view::npos; }

std::string json_string(std::string_view s) {
  return nlohmann::json(std::string(s)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Checks a typed argument value; returns its JSON text or sets `error`.
std::string typed_value(const std::string& type, const std::string& raw, std::string& error) {
  if (type == "string") return json_string(raw);
  const std::string v = trim(raw);
  const nlohmann::json parsed = nlohmann::json::parse(v, nullptr, false);
  const bool ok = !parsed.is_discarded() &&
                  ((type == "number" && parsed.is_number()) || (type == "boolean" && parsed.is_boolean()) ||
                   (type == "null" && parsed.is_null()) || (type == "object" && parsed.is_object()) ||
                   (type == "array" && parsed.is_array()));
  if (type != "number" && type != "boolean" && type != "null" && type != "object" && type != "array") {
    error = "unknown argument type '" + type + "'";
  } else if (!ok) {
    error = "value '" + v.substr(0, 200) + "' is not a valid JSON " + type;
  }
  return v;
}

}  // namespace

OutputParser::OutputParser(Channel start) : state_(start == Channel::think ? State::think : State::response) {}

void OutputParser::fail_call(const std::string& why) {
  if (!call_failed_) call_failed_ = true, error_ = why;
}

void OutputParser::emit_arguments(std::string piece, std::vector<OutputEvent>& events) {
  if (call_failed_ || piece.empty()) return;
  events.push_back({OutputEvent::Kind::tool_call_arguments, std::move(piece), call_, {}});
}

void OutputParser::stream_string_value(std::vector<OutputEvent>& events, bool final) {
  size_t end = value_.size();
  if (!final) {  // hold back a character whose bytes have not all arrived
    size_t lead = end;
    while (lead > value_streamed_ && end - lead < 4 && (static_cast<unsigned char>(value_[lead - 1]) & 0xC0) == 0x80)
      --lead;
    if (lead > value_streamed_) {
      const auto b = static_cast<unsigned char>(value_[lead - 1]);
      const size_t need = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
      if (end - (lead - 1) < need) end = lead - 1;
    }
  }
  if (end <= value_streamed_) return;
  // JSON escaping is per character, so escaped pieces concatenate to the escaped whole.
  const std::string quoted = json_string(std::string_view(value_).substr(value_streamed_, end - value_streamed_));
  emit_arguments(quoted.substr(1, quoted.size() - 2), events);
  value_streamed_ = end;
}

void OutputParser::end_call(std::vector<OutputEvent>& events) {
  if (!call_failed_) {
    if (has_json_block_) {
      const std::string v = trim(value_);
      const nlohmann::json parsed = nlohmann::json::parse(v, nullptr, false);
      if (!args_.empty()) {
        fail_call("a call has both <argument> and <json> blocks");
      } else if (parsed.is_discarded() || !parsed.is_object()) {
        fail_call("the json block is not a JSON object");
      } else {
        call_.arguments = v;
        emit_arguments(v, events);  // checked whole first: a json block streams at its end
      }
    } else {
      call_.arguments = "{";
      for (size_t i = 0; i < args_.size(); ++i)
        call_.arguments += (i ? "," : "") + json_string(args_[i].first) + ":" + args_[i].second;
      call_.arguments += "}";
      emit_arguments(arguments_open_ ? "}" : "{}", events);
    }
  }
  if (call_failed_) {
    events.push_back({OutputEvent::Kind::error,
                      "tool call " + std::to_string(call_.index) + " ('" + call_.name + "'): " + error_, call_,
                      call_raw_});
  } else {
    events.push_back({OutputEvent::Kind::tool_call, {}, call_, call_raw_});
  }
  call_raw_.clear();
}

bool OutputParser::step(std::vector<OutputEvent>& events, bool final) {
  if (buf_.empty()) return false;
  if (state_ == State::done) {
    buf_.clear();
    return false;
  }
  Marker mk;
  const size_t pos = find_marker(buf_, final, mk);
  const std::string_view before = std::string_view(buf_).substr(0, pos == std::string_view::npos ? buf_.size() : pos);
  const bool in_channel = state_ == State::think || state_ == State::response;

  // Text before the marker. Outside channels and values it is an error, reported once the
  // next marker shows where it ends (so the report does not depend on how the text was chunked).
  const bool structural = state_ == State::tools || state_ == State::call || state_ == State::after_message;
  if (!before.empty() && structural && pos == std::string_view::npos && !final && buf_.size() < 65536) return false;
  if (!before.empty()) {
    if (in_channel || state_ == State::between) {
      events.push_back(
          text_event(state_ == State::think ? OutputEvent::Kind::reasoning : OutputEvent::Kind::content, before));
    } else if (state_ == State::argument || state_ == State::json) {
      value_ += before;
      if (state_ == State::argument && arg_type_ == "string") stream_string_value(events, false);
    } else if (!blank(before)) {
      const std::string what = "unexpected text '" + std::string(before.substr(0, 200)) + "'";
      if (state_ == State::call) {
        if (!call_failed_) call_failed_ = true, error_ = what + " inside the call";
      } else {
        events.push_back(
            error_event(what + (state_ == State::tools ? " in the tools block" : " after the message closed")));
      }
    }
    if (in_call()) call_raw_ += before;
    buf_.erase(0, before.size());
    return true;
  }
  if (mk.kind == Mark::partial) return false;

  auto consume = [&] {
    if (in_call()) call_raw_.append(buf_, 0, mk.length);
    buf_.erase(0, mk.length);
  };
  const std::string marker = std::string(mk.kind == Mark::open ? "<|open|>" : "<|close|>") + mk.tag;

  if (mk.kind == Mark::cut) {  // an open call fails at finish() ("ended inside the call")
    consume();
    return true;
  }
  if (mk.kind == Mark::stray) {
    consume();
    if (state_ == State::call || state_ == State::argument || state_ == State::json) {
      fail_call("stray " + mk.tag);
    } else {
      events.push_back(error_event("stray " + mk.tag + " dropped"));
    }
    return true;
  }
  if (mk.kind == Mark::end) {  // <|end_of_msg|>: the turn is over wherever we are
    if (state_ == State::call || state_ == State::argument || state_ == State::json) {
      fail_call("the output ended inside the call");
      end_call(events);
    } else if (state_ == State::tools) {
      events.push_back(error_event("the output ended inside the tools block"));
    }
    consume();
    state_ = State::done;
    return true;
  }
  switch (state_) {
    case State::think:
    case State::response: {
      const std::string channel = state_ == State::think ? "think" : "response";
      if (mk.kind == Mark::close) {
        consume();
        if (mk.tag == "message") {
          state_ = State::after_message;
        } else {
          if (mk.tag != channel) events.push_back(error_event(marker + " closed the " + channel + " channel"));
          state_ = State::between;
        }
      } else {
        state_ = State::between;  // an <|open|> closes the channel implicitly; reprocess it
      }
      return true;
    }
    case State::between:
      consume();
      if (mk.kind == Mark::open && mk.tag == "think") {
        state_ = State::think;
      } else if (mk.kind == Mark::open && mk.tag == "response") {
        state_ = State::response;
      } else if (mk.kind == Mark::open && mk.tag == "tools") {
        state_ = State::tools;
      } else if (mk.kind == Mark::close && mk.tag == "message") {
        state_ = State::after_message;
      } else {
        events.push_back(error_event("unexpected " + marker + " between channels"));
      }
      return true;
    case State::tools: {
      if (mk.kind == Mark::open && mk.tag == "call") call_raw_.assign(buf_, 0, mk.length);
      consume();
      if (mk.kind == Mark::open && mk.tag == "call") {
        std::vector<std::pair<std::string, std::string>> attrs;
        call_ = {next_index_++, {}, {}};
        args_.clear();
        value_.clear();
        has_json_block_ = false;
        arguments_open_ = false;
        call_failed_ = false;
        error_.clear();
        if (!parse_attrs(mk.attrs, attrs)) fail_call("malformed attributes '" + mk.attrs + "'");
        call_.name = attr(attrs, "tool");
        if (call_.name.empty()) fail_call("the call has no tool=\"...\" name");
        if (!call_failed_) events.push_back({OutputEvent::Kind::tool_call_begin, {}, call_, {}});
        state_ = State::call;
      } else if (mk.kind == Mark::close && (mk.tag == "tools" || mk.tag == "message")) {
        state_ = mk.tag == "tools" ? State::between : State::after_message;
      } else {
        events.push_back(error_event("unexpected " + marker + " in the tools block"));
      }
      return true;
    }
    case State::call: {
      consume();
      if (mk.kind == Mark::open && (mk.tag == "argument" || mk.tag == "json")) {
        std::vector<std::pair<std::string, std::string>> attrs;
        if (!parse_attrs(mk.attrs, attrs)) fail_call("malformed attributes '" + mk.attrs + "'");
        arg_key_ = attr(attrs, "key");
        arg_type_ = attr(attrs, "type");
        if (mk.tag == "argument" && arg_key_.empty()) fail_call("an argument has no key=\"...\"");
        if (mk.tag == "json") has_json_block_ = true;
        for (const auto& [k, unused] : args_)
          if (mk.tag == "argument" && k == arg_key_) fail_call("argument '" + arg_key_ + "' is given twice");
        value_.clear();
        value_streamed_ = 0;
        state_ = mk.tag == "argument" ? State::argument : State::json;
        if (state_ == State::argument && arg_type_ == "string") {  // its value streams as it comes
          emit_arguments((arguments_open_ ? "," : "{") + json_string(arg_key_) + ":\"", events);
          arguments_open_ = !call_failed_;
        }
      } else if (mk.kind == Mark::close && mk.tag == "call") {
        end_call(events);
        state_ = State::tools;
      } else {
        fail_call("unexpected " + marker + " inside the call");
      }
      return true;
    }
    case State::argument:
    case State::json: {
      const bool is_argument = state_ == State::argument;
      if (mk.kind == Mark::close && mk.tag == (is_argument ? "argument" : "json")) consume();
      else fail_call("the " + std::string(is_argument ? "argument" : "json") + " block was not closed");
      if (is_argument) {
        std::string error;
        const std::string v = typed_value(arg_type_, value_, error);
        if (!error.empty()) fail_call("argument '" + arg_key_ + "': " + error);
        if (arg_type_ == "string") {
          stream_string_value(events, true);
          emit_arguments("\"", events);
        } else {
          emit_arguments((arguments_open_ ? "," : "{") + json_string(arg_key_) + ":" + v, events);
          arguments_open_ = !call_failed_;
        }
        args_.emplace_back(arg_key_, v);
        value_.clear();
      }
      state_ = State::call;  // a json block keeps value_ until the call closes
      return true;
    }
    case State::after_message:
      consume();
      events.push_back(error_event("unexpected " + marker + " after the message closed"));
      return true;
    case State::done: break;
  }
  return false;
}

void OutputParser::feed(std::string_view text, std::vector<OutputEvent>& events) {
  buf_.append(text);
  while (step(events, false)) {
  }
}

void OutputParser::finish(std::vector<OutputEvent>& events) {
  while (step(events, true)) {
  }
  buf_.clear();
  if (state_ == State::call || state_ == State::argument || state_ == State::json) {
    if (!call_failed_) call_failed_ = true, error_ = "the output ended inside the call";
    end_call(events);
  } else if (state_ == State::tools) {
    events.push_back(error_event("the output ended inside the tools block"));
  }
  if (state_ != State::done && state_ != State::after_message) state_ = State::between;
}

ParsedOutput parse_output(std::string_view text, Channel start) {
  OutputParser parser(start);
  std::vector<OutputEvent> events;
  parser.feed(text, events);
  parser.finish(events);
  ParsedOutput out;
  for (OutputEvent& e : events) {
    switch (e.kind) {
      case OutputEvent::Kind::reasoning: out.reasoning += e.text; break;
      case OutputEvent::Kind::content: out.content += e.text; break;
      case OutputEvent::Kind::tool_call: out.tool_calls.push_back(std::move(e.call)); break;
      case OutputEvent::Kind::error: out.errors.push_back(std::move(e.text)); break;
      case OutputEvent::Kind::tool_call_begin:
      case OutputEvent::Kind::tool_call_arguments: break;
    }
  }
  out.complete = parser.done();
  return out;
}

}  // namespace k3::tokenizer
