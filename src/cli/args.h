// cli/args.h: the strict command-line parser every k3serve subcommand (and bench program) uses.
//
// CLI11 (Debian's libcli11-dev) does the parsing underneath: --name=value and --name value, a
// `multiple` option's values up to the next option, -h/--help. This wrapper stays because each
// subcommand declares its options as ONE list of OptionSpec (help, placeholder, default, required),
// shared by its parsing, its usage text and the option lists model_options.h hands several
// subcommands; and because every problem must reach main() as a core::Error naming the option (an
// unknown option, a missing value, a repeated option, a flag given a value, a malformed number, a
// required option left out), worded the same whichever CLI11 version is installed (2.1 on
// Debian 12, 2.4 on the GPU machine). CLI11 stays out of this header: it is only in args.cpp.
#pragma once
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace k3::cli {

struct OptionSpec {
  std::string name;   // without the leading "--"
  std::string value;  // placeholder for the help ("N", "DIR"); empty for a flag
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
  std::string get(const std::string& name) const;  // value or the declared default (`multiple`: joined by '\n')
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
  std::map<std::string, std::vector<std::string>> values_;  // the options given (a flag: "1")
  bool help_ = false;
};

}  // namespace k3::cli
