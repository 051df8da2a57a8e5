// core/log.cpp: core/log.h on spdlog: one stderr logger, a text pattern or a JSON formatter.
#include "core/log.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <ctime>
#include <memory>
#include <string>

#include "core/error.h"

namespace k3::log {
namespace {

// Levels as spdlog knows them; `off` also silences error lines.
spdlog::level::level_enum to_spdlog(Level l) {
  switch (l) {
    case Level::trace: return spdlog::level::trace;
    case Level::debug: return spdlog::level::debug;
    case Level::info: return spdlog::level::info;
    case Level::warn: return spdlog::level::warn;
    case Level::error: return spdlog::level::err;
    case Level::off: return spdlog::level::off;
  }
  return spdlog::level::info;
}

const char* level_name(spdlog::level::level_enum l) {
  switch (l) {
    case spdlog::level::trace: return "trace";
    case spdlog::level::debug: return "debug";
    case spdlog::level::info: return "info";
    case spdlog::level::warn: return "warning";
    case spdlog::level::err: return "error";
    case spdlog::level::critical: return "critical";
    default: return "off";
  }
}

// 2026-12-02T00:10:00.123Z, UTC, so lines from several machines sort together.
void append_utc(spdlog::memory_buf_t& out, spdlog::log_clock::time_point t) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
  const std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[40];
  const size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  out.append(buf, buf + n);
  const int frac = static_cast<int>(ms % 1000);
  const char tail[] = {'.', static_cast<char>('0' + frac / 100), static_cast<char>('0' + frac / 10 % 10),
                       static_cast<char>('0' + frac % 10), 'Z'};
  out.append(tail, tail + sizeof tail);
}

void append(spdlog::memory_buf_t& out, std::string_view s) { out.append(s.data(), s.data() + s.size()); }

// JSON string contents: quotes, backslashes and control characters escaped; other bytes as they are
// (the messages are UTF-8).
void append_json_escaped(spdlog::memory_buf_t& out, std::string_view s) {
  static const char* hex = "0123456789abcdef";
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (c == '\n') {
      append(out, "\\n");
    } else if (c == '\t') {
      append(out, "\\t");
    } else if (c == '\r') {
      append(out, "\\r");
    } else if (u < 0x20) {
      append(out, "\\u00");
      out.push_back(hex[u >> 4]);
      out.push_back(hex[u & 15]);
    } else {
      out.push_back(c);
    }
  }
}

class TextFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    append_utc(dest, msg.time);
    dest.push_back(' ');
    const std::string_view level = level_name(msg.level);
    append(dest, level);
    for (size_t i = level.size(); i < 8; ++i) dest.push_back(' ');
    append(dest, std::string_view(msg.payload.data(), msg.payload.size()));
    dest.push_back('\n');
  }
  std::unique_ptr<spdlog::formatter> clone() const override { return std::make_unique<TextFormatter>(); }
};

class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    append(dest, "{\"ts\":\"");
    append_utc(dest, msg.time);
    append(dest, "\",\"level\":\"");
    append(dest, level_name(msg.level));
    append(dest, "\",\"logger\":\"k3serve\",\"msg\":\"");
    append_json_escaped(dest, std::string_view(msg.payload.data(), msg.payload.size()));
    append(dest, "\"}\n");
  }
  std::unique_ptr<spdlog::formatter> clone() const override { return std::make_unique<JsonFormatter>(); }
};

// The one logger: made on first use with the defaults, so a line written before configure() (a
// test, a library used on its own) still reaches stderr.
spdlog::logger& logger() {
  static const std::shared_ptr<spdlog::logger> l = [] {
    auto made = std::make_shared<spdlog::logger>("k3serve", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    made->set_formatter(std::make_unique<TextFormatter>());
    made->set_level(spdlog::level::info);
    made->flush_on(spdlog::level::trace);  // every line at once: a crash or a kill loses none
    return made;
  }();
  return *l;
}

}  // namespace

Level parse_level(std::string_view name) {
  if (name == "trace") return Level::trace;
  if (name == "debug") return Level::debug;
  if (name == "info") return Level::info;
  if (name == "warning" || name == "warn") return Level::warn;
  if (name == "error") return Level::error;
  if (name == "off") return Level::off;
  throw core::Error("--log-level must be one of trace, debug, info, warning, error, off; got '" + std::string(name) +
                    "'");
}

Format parse_format(std::string_view name) {
  if (name == "text") return Format::text;
  if (name == "json") return Format::json;
  throw core::Error("--log-format must be text or json; got '" + std::string(name) + "'");
}

void configure(Level level, Format format) {
  spdlog::logger& l = logger();
  if (format == Format::json) l.set_formatter(std::make_unique<JsonFormatter>());
  else l.set_formatter(std::make_unique<TextFormatter>());
  l.set_level(to_spdlog(level));
}

bool enabled(Level level) { return level != Level::off && logger().should_log(to_spdlog(level)); }

void write(Level level, std::string_view message) {
  if (level == Level::off) return;
  logger().log(to_spdlog(level), spdlog::string_view_t(message.data(), message.size()));
}

}  // namespace k3::log
