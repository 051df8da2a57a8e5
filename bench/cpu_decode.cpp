// bench/cpu_decode.cpp: CPU oracle speed on a small model: one prefill of P tokens, then D
// single-token decode steps, repeated; prints a table and writes a JSON result bundle.
//
//   k3bench_cpu_decode [--model DIR] [--prefill 150] [--decode 50] [--repeats 5] [--out FILE]
// Without --model it writes k3-tiny seed 0 to a temporary folder first.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "bench/bundle.h"
#include "checkpoint/checkpoint.h"
#include "cli/args.h"
#include "engine/one_shot.h"
#include "evidence/environment.h"
#include "runner/model_runner.h"

using namespace k3;

int main(int argc, char** argv) {
  try {
    cli::Args args("k3bench_cpu_decode",
                   {{"model", "DIR", "checkpoint folder (default: k3-tiny seed 0 in a temp folder)", ""},
                    {"prefill", "N", "prompt tokens", "150"},
                    {"decode", "N", "decode steps", "50"},
                    {"repeats", "N", "timed repeats (after one warm-up)", "5"},
                    {"precision", "bf16|fp32", "numeric mode", "bf16"},
                    {"out", "FILE", "JSON bundle path", "cpu_decode.json"}},
                   {argv + 1, static_cast<size_t>(argc - 1)});
    if (args.help_requested()) {
      std::cout << args.usage();
      return 0;
    }
    std::filesystem::path dir = args.get("model");
    std::filesystem::path tmp;
    if (dir.empty()) {
      tmp = std::filesystem::temp_directory_path() / ("k3bench-" + std::to_string(::getpid()));
      checkpoint::write_random_checkpoint(config::builtin_config("k3-tiny"), {}, tmp);
      dir = tmp;
    }
    model::ModelOptions opt;
    K3_CHECK(args.get("precision") == "bf16" || args.get("precision") == "fp32", "--precision must be bf16 or fp32");
    opt.precision = args.get("precision") == "fp32" ? kernels::Precision::fp32 : kernels::Precision::bf16;
    auto runner = runner::ModelRunner::open(dir, opt);
    const int64_t P = args.get_int("prefill"), D = args.get_int("decode"), R = args.get_int("repeats");
    K3_CHECK(P >= 1 && D >= 1 && R >= 1, "--prefill, --decode and --repeats must be >= 1");
    std::vector<int32_t> prompt(static_cast<size_t>(P));
    for (int64_t i = 0; i < P; ++i)
      prompt[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919) % runner->config().vocab_size);

    std::vector<double> prefill_s, decode_s, total_s;
    for (int64_t r = 0; r <= R; ++r) {
      engine::GenerateStats st;
      engine::generate(*runner, prompt, D + 1, {}, nullptr, &st);  // D decode steps after the prefill
      if (r == 0) continue;                                        // warm-up
      prefill_s.push_back(st.prefill_seconds);
      decode_s.push_back(st.decode_seconds);
      total_s.push_back(st.prefill_seconds + st.decode_seconds);
    }
    if (!tmp.empty()) std::filesystem::remove_all(tmp);

    const double pm = bench::median(prefill_s), dm = bench::median(decode_s), tm = bench::median(total_s);
    std::printf("%-26s %12s\n", "k3bench_cpu_decode", "median");
    std::printf("%-26s %10.1f ms\n", ("prefill " + std::to_string(P) + " tokens").c_str(), pm * 1e3);
    std::printf("%-26s %10.1f ms  (%.1f tok/s)\n", ("decode " + std::to_string(D) + " steps").c_str(), dm * 1e3,
                D / dm);
    std::printf("%-26s %10.1f ms\n", "total", tm * 1e3);

    nlohmann::json bundle = {
        {"benchmark", "cpu_decode"},
        {"environment", evidence::environment()},
        {"model",
         {{"dir", tmp.empty() ? dir.string() : "k3-tiny seed 0 (temporary)"},
          {"config_hash", runner->config().hash()}}},
        {"config", {{"prefill_tokens", P}, {"decode_steps", D}, {"repeats", R}, {"precision", args.get("precision")}}},
        {"samples", {{"prefill_s", prefill_s}, {"decode_s", decode_s}, {"total_s", total_s}}},
        {"summary",
         {{"prefill_ms", pm * 1e3}, {"decode_ms", dm * 1e3}, {"decode_tok_per_s", D / dm}, {"total_ms", tm * 1e3}}},
    };
    std::ofstream(args.get("out")) << bundle.dump(2) << "\n";
    std::cout << "wrote " << args.get("out") << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
}
