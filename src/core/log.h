// core/log.h: the process's log: levelled, timestamped lines on stderr, as text or as one JSON
// object per line for log collectors. spdlog writes them (only log.cpp sees it); the launcher
// (cli/) sets the level and format once from --log-level / --log-format, library code only writes.
//
//   text: 2026-12-02T00:10:00.123Z info  serving model 'k3-tiny' on http://127.0.0.1:8000/v1 ...
//   json: {"ts":"2026-12-02T00:10:00.123Z","level":"info","msg":"serving model 'k3-tiny' ..."}
#pragma once
#include <string_view>

namespace k3::log {

enum class Level { trace, debug, info, warn, error, off };
enum class Format { text, json };

// "trace" | "debug" | "info" | "warning" (or "warn") | "error" | "off"; throws core::Error naming
// the accepted values otherwise. The same for formats ("text" | "json").
Level parse_level(std::string_view name);
Format parse_format(std::string_view name);

// Sets the level below which lines are dropped and the line format (default: info, text).
void configure(Level level, Format format);
bool enabled(Level level);

void write(Level level, std::string_view message);
inline void debug(std::string_view m) { write(Level::debug, m); }
inline void info(std::string_view m) { write(Level::info, m); }
inline void warn(std::string_view m) { write(Level::warn, m); }
inline void error(std::string_view m) { write(Level::error, m); }

}  // namespace k3::log
