// cli/bench/bench_compare.cpp: `k3serve bench-compare A.json B.json ... --out DIR`: a side-by-side
// report of bench-serve bundles against the first (loadgen/compare.h): markdown on stdout and in
// DIR/report.md, DIR/report.json, SVG plots. Exit 3 with --fail-on-regression when one is flagged.
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/bench/commands.h"
#include "core/error.h"
#include "loadgen/bundle.h"
#include "loadgen/compare.h"

namespace k3::cli {

int bench_compare_command(std::span<char* const> raw_argv) {
  const std::vector<OptionSpec> specs = {
      {"out", "DIR", "folder for report.md, report.json and the SVG plots", "bench_compare"},
      {"seed", "N", "bootstrap seed", "0"},
      {"resamples", "N", "bootstrap resamples", "1000"},
      {"level", "X", "confidence level of the intervals", "0.95"},
      {"tolerance", "X", "a CI must clear 1 +- X to count as a change (run-to-run noise)", "0.05"},
      {"fail-on-regression", "", "exit 3 when a regression is flagged", ""},
  };
  // Bundle paths are the arguments that are neither options nor their values.
  std::vector<std::string> paths;
  std::vector<char*> options;
  for (size_t i = 0; i < raw_argv.size(); ++i) {
    const std::string a = raw_argv[i];
    if (a.rfind("--", 0) != 0 && a != "-h") {
      paths.push_back(a);
      continue;
    }
    options.push_back(raw_argv[i]);
    const std::string name = a.substr(2, a.find('=') == std::string::npos ? std::string::npos : a.find('=') - 2);
    const bool takes_value = a.find('=') == std::string::npos && name != "fail-on-regression" && name != "help";
    if (takes_value && i + 1 < raw_argv.size()) options.push_back(raw_argv[++i]);
  }
  Args args("bench-compare", specs, options);
  if (args.help_requested()) {
    std::cout << "usage: k3serve bench-compare BASELINE.json OTHER.json... [options]\n" << args.usage();
    return 0;
  }
  K3_CHECK(!paths.empty(), "bench-compare: give one or more bundle files (the first is the baseline)");
  std::vector<loadgen::LoadedBundle> bundles;
  for (const std::string& p : paths) {
    nlohmann::json b = loadgen::read_bundle(p);
    bundles.push_back({loadgen::bundle_name(b, p), p, std::move(b)});
  }
  loadgen::CompareOptions o;
  o.seed = args.get_u64("seed");
  o.resamples = static_cast<int>(args.get_int("resamples"));
  o.level = args.get_double("level");
  o.tolerance = args.get_double("tolerance");
  const loadgen::CompareResult r = loadgen::compare_bundles(bundles, o, args.get("out"));
  std::cout << r.markdown;
  std::cout << "report: " << (std::filesystem::path(args.get("out")) / "report.md").string() << std::endl;
  return args.flag("fail-on-regression") && r.regressions > 0 ? 3 : 0;
}

}  // namespace k3::cli
