// cli/args.h: a strict command-line parser for k3serve's subcommands.
//
// Every option is declared with its help text; an unknown option, a missing value, a
// repeated option or a malformed number is an error naming the option.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace k3::cli {

struct OptionSpec {
  std::string name;      // without the leading "--"
  std::string value;     // placeholder for the help ("N", "DIR"); empty for a flag
  std::string help;
  std::string fallback;  // default value shown in help and returned by get(); empty: none
  bool required = false;
  bool multiple = false;  // one or more values: the words up to the next --option (vLLM's nargs="+")
};

class Args {
 public:
  // Parses argv (after the subcommand). Throws core::Error on any problem.
  Args(std::string command, std::vector<OptionSpec> specs, std::span<char* const> argv);

  bool help_requested() const { return help_; }
  std::string usage() const;
  bool flag(const std::string& name) const;
  bool has(const std::string& name) const;
  std::string get(const std::string& name) const;  // value or the declared default
  int64_t get_int(const std::string& name) const;
  uint64_t get_u64(const std::string& name) const;
  double get_double(const std::string& name) const;
  // A `multiple` option's values in order (the default alone when absent; none when it is empty).
  std::vector<std::string> get_list(const std::string& name) const;
  // "1,2,3" -> {1,2,3}; every item an integer in [0, 2^31).
  std::vector<int32_t> get_ids(const std::string& name) const;

 private:
  const OptionSpec& spec(const std::string& name) const;
  std::string command_;
  std::vector<OptionSpec> specs_;
  std::map<std::string, std::string> values_;
  bool help_ = false;
};

}  // namespace k3::cli
