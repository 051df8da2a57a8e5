// cli/args.cpp: Args on CLI11. CLI11 splits the words into options and values; the checks users
// read the messages of are made here (in the per-occurrence callback and after the parse), so each
// is a core::Error worded by k3serve, not by the installed CLI11 version.
#include "cli/args.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string_view>

#include <CLI/CLI.hpp>

#include "core/error.h"

namespace k3::cli {
namespace {

// The option a word names: "--name=value" and "--name" -> "name"; anything else -> "".
std::string option_name(std::string_view word) {
  if (word.size() < 3 || word.substr(0, 2) != "--") return "";
  return std::string(
      word.substr(2, word.find('=') == std::string_view::npos ? std::string_view::npos : word.find('=') - 2));
}

// CLI11's words, reversed as App::parse wants them. "--name=" becomes "--name" "": CLI11 would
// read an empty inline value as no value and take the next word instead (the next option, even).
std::vector<std::string> cli11_words(std::span<char* const> argv) {
  std::vector<std::string> words;
  for (const char* a : argv) {
    const std::string_view w = a;
    if (w.size() > 3 && w.substr(0, 2) == "--" && w.back() == '=' && w.find('=') == w.size() - 1) {
      words.emplace_back(w.substr(0, w.size() - 1));
      words.emplace_back();
    } else {
      words.emplace_back(w);
    }
  }
  return {words.rbegin(), words.rend()};
}

}  // namespace

Args::Args(std::string command, std::vector<OptionSpec> specs, std::span<char* const> argv)
    : command_(std::move(command)), specs_(std::move(specs)) {
  CLI::App app("", command_);
  // Unknown words are kept (remaining()) rather than thrown, so the error below names the first
  // one and shows the usage.
  app.allow_extras();
  for (const OptionSpec& s : specs_) {
    // trigger_on_parse: called once per occurrence as it is parsed, so a second one is seen here.
    CLI::callback_t record = [this, &s](const CLI::results_t& r) {
      K3_CHECK(!values_.count(s.name), command_ + ": --" + s.name + " given twice");
      if (s.value.empty()) {
        // A bare flag reaches here as "true"; --flag=X as X (so --flag=true passes, meaning the same).
        K3_CHECK(r.size() == 1 && r[0] == "true", command_ + ": --" + s.name + " is a flag and takes no value");
        values_[s.name] = {"1"};  // get() of a given flag
      } else {
        values_[s.name] = r;
      }
      return true;
    };
    CLI::Option* o = app.add_option("--" + s.name, std::move(record), s.help)->trigger_on_parse();
    if (s.value.empty()) {
      o->expected(0);  // what CLI11's add_flag sets
    } else {
      o->type_name(s.value);
      // CLI11 takes the first value whatever it looks like (a "-2", a "--x"), the others while
      // they are not options, as the hand-written parser did.
      if (s.multiple) o->expected(1, CLI::detail::expected_max_vector_size)->allow_extra_args();
    }
  }
  try {
    app.parse(cli11_words(argv));
  } catch (const CLI::CallForHelp&) {
    help_ = true;  // thrown once every word is parsed: the checks above and below still apply
  } catch (const CLI::ArgumentMismatch& e) {
    // An option's first value is taken whatever it is, so a value can only be missing at the end:
    // the last word is the option that lacks it.
    const std::string name = argv.empty() ? "" : option_name(argv.back());
    for (const auto& s : specs_)
      if (s.name == name && !s.value.empty())
        throw core::Error(command_ + ": --" + name + " needs a value (" + s.value + ")");
    throw core::Error(command_ + ": " + e.what());
  } catch (const CLI::ParseError& e) {
    throw core::Error(command_ + ": " + e.what());
  }
  if (const std::vector<std::string> extra = app.remaining(); !extra.empty()) {
    if (extra[0].rfind("--", 0) == 0) spec(option_name(extra[0]));  // an unknown option: throws, with the usage
    // Not an option, or a known one after a "--" (CLI11's end of options).
    throw core::Error(command_ + ": unexpected argument '" + extra[0] + "' (options start with --)");
  }
  if (help_) return;
  for (const auto& s : specs_)
    K3_CHECK(!s.required || values_.count(s.name), command_ + ": --" + s.name + " is required\n" + usage());
}

const OptionSpec& Args::spec(const std::string& name) const {
  for (const auto& s : specs_)
    if (s.name == name) return s;
  throw core::Error(command_ + ": unknown option --" + name + "\n" + usage());
}

// The usage is written here, not by CLI11's formatter: one layout (placeholder, "(required)",
// "[default: X]") whichever CLI11 version is installed.
std::string Args::usage() const {
  std::string u = "usage: k3serve " + command_ + " [options]\n";
  for (const auto& s : specs_) {
    std::string left = "  --" + s.name + (s.value.empty() ? "" : " " + s.value);
    if (left.size() < 28) left.resize(28, ' ');
    u += left + " " + s.help;
    if (s.required) u += " (required)";
    if (!s.fallback.empty()) u += " [default: " + s.fallback + "]";
    u += "\n";
  }
  return u;
}

std::vector<std::string> Args::get_list(const std::string& name) const {
  const OptionSpec& s = spec(name);
  auto it = values_.find(name);
  if (it != values_.end()) return it->second;
  return s.fallback.empty() ? std::vector<std::string>{} : std::vector<std::string>{s.fallback};
}

bool Args::flag(const std::string& name) const {
  spec(name);
  return values_.count(name) > 0;
}

bool Args::has(const std::string& name) const {
  spec(name);
  return values_.count(name) > 0;
}

std::string Args::get(const std::string& name) const {
  const OptionSpec& s = spec(name);
  auto it = values_.find(name);
  if (it == values_.end()) return s.fallback;
  std::string joined;
  for (size_t i = 0; i < it->second.size(); ++i) joined += (i ? "\n" : "") + it->second[i];
  return joined;
}

int64_t Args::get_int(const std::string& name) const {
  const std::string v = get(name);
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  K3_CHECK(!v.empty() && end && *end == '\0' && errno == 0,
           command_ + ": --" + name + " expects an integer, got '" + v + "'");
  return x;
}

uint64_t Args::get_u64(const std::string& name) const {
  const std::string v = get(name);
  char* end = nullptr;
  errno = 0;
  const unsigned long long x = std::strtoull(v.c_str(), &end, 10);
  K3_CHECK(!v.empty() && v[0] != '-' && end && *end == '\0' && errno == 0,
           command_ + ": --" + name + " expects a non-negative integer, got '" + v + "'");
  return x;
}

double Args::get_double(const std::string& name) const {
  const std::string v = get(name);
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  K3_CHECK(!v.empty() && end && *end == '\0' && std::isfinite(x),
           command_ + ": --" + name + " expects a number, got '" + v + "'");
  return x;
}

std::vector<int32_t> Args::get_ids(const std::string& name) const {
  const std::string v = get(name);
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= v.size()) {
    const size_t comma = v.find(',', pos);
    const std::string item = v.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    char* end = nullptr;
    errno = 0;
    const long long x = std::strtoll(item.c_str(), &end, 10);
    K3_CHECK(!item.empty() && end && *end == '\0' && errno == 0 && x >= 0 && x < (1ll << 31),
             command_ + ": --" + name + " expects comma-separated token ids, got '" + item + "'");
    ids.push_back(static_cast<int32_t>(x));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return ids;
}

}  // namespace k3::cli
