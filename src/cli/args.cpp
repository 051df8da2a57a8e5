// cli/args.cpp: Args.
#include "cli/args.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string_view>

#include "core/error.h"

namespace k3::cli {

Args::Args(std::string command, std::vector<OptionSpec> specs, std::span<char* const> argv)
    : command_(std::move(command)), specs_(std::move(specs)) {
  for (size_t i = 0; i < argv.size(); ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      help_ = true;
      continue;
    }
    K3_CHECK(arg.rfind("--", 0) == 0, command_ + ": unexpected argument '" + arg + "' (options start with --)");
    std::string name = arg.substr(2), value;
    bool inline_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    const OptionSpec& s = spec(name);
    K3_CHECK(!values_.count(name), command_ + ": --" + name + " given twice");
    if (s.value.empty()) {
      K3_CHECK(!inline_value, command_ + ": --" + name + " is a flag and takes no value");
      values_[name] = "1";
      continue;
    }
    if (!inline_value) {
      K3_CHECK(i + 1 < argv.size(), command_ + ": --" + name + " needs a value (" + s.value + ")");
      value = argv[++i];
      while (s.multiple && i + 1 < argv.size() && std::string_view(argv[i + 1]).rfind("--", 0) != 0)
        value += std::string("\n") + argv[++i];
    }
    values_[name] = value;
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
  const std::string all = get(name);
  std::vector<std::string> out;
  for (size_t begin = 0; begin < all.size();) {
    const size_t end = std::min(all.find('\n', begin), all.size());
    out.push_back(all.substr(begin, end - begin));
    begin = end + 1;
  }
  return out;
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
  return it != values_.end() ? it->second : s.fallback;
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
