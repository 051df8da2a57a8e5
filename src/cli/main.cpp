// cli/main.cpp: the k3serve program: dispatches to a subcommand.
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <span>
#include <string>

#include "cli/commands.h"
#include "core/error.h"

namespace {

constexpr const char* kUsage =
    "usage: k3serve <command> [options]   (k3serve <command> --help for its options)\n"
    "commands:\n"
    "  make-checkpoint  write a deterministic random checkpoint (e.g. --config k3-tiny)\n"
    "  logits           teacher-forced logits of token ids, as a safetensors file\n"
    "  generate         generate token ids from a prompt of token ids\n"
    "  serve            serve the model over an OpenAI-compatible HTTP API\n"
    "  train-tokenizer  learn a K3-layout BPE tokenizer from a JSON Lines corpus (train/README.md)\n"
    "  encode-corpus    a JSON Lines corpus as a uint32 token stream, for train/train_k3.py\n"
    "  bench-serve      load-test a running server (random, shared-prefix, agentic, trace) -> bundle\n"
    "  bench-compare    compare bench-serve bundles: ratios, bootstrap CIs, regressions, SVG plots\n"
    "(the layer-by-layer diff of two ways of running a model is eval/'s k3eval_layer_diff)\n";

// bench-serve and bench-compare live in the k3serve-bench program beside this one (cli/bench/), so
// the server's build leaves the load generator out; run it with the same arguments. Returns only
// when it cannot run, with the exit status.
int run_bench_program(char** argv) {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  const std::filesystem::path bench = (ec ? std::filesystem::path(argv[0]) : self).parent_path() / "k3serve-bench";
  if (::access(bench.c_str(), X_OK) != 0) {
    std::cerr << "error: " << argv[1] << " is in the k3serve-bench program, which this build does not have (no "
              << bench.string() << "): build it with `cmake --build --preset default --target k3serve-bench` "
              << "(scripts/test.sh builds everything)\n";
    return 2;
  }
  argv[0] = const_cast<char*>(bench.c_str());
  ::execv(bench.c_str(), argv);
  std::cerr << "error: cannot run " << bench.string() << ": " << std::strerror(errno) << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  // The launcher's environment, set before any thread starts: NVLink multicast off for NCCL
  // (comm/nccl_comm.h says why; library code never writes the environment).
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  const std::span<char* const> rest(argv + 2, static_cast<size_t>(argc - 2));
  try {
    if (command == "make-checkpoint") return k3::cli::make_checkpoint_command(rest);
    if (command == "logits") return k3::cli::logits_command(rest);
    if (command == "generate") return k3::cli::generate_command(rest);
    if (command == "serve") return k3::cli::serve_command(rest);
    if (command == "train-tokenizer") return k3::cli::train_tokenizer_command(rest);
    if (command == "encode-corpus") return k3::cli::encode_corpus_command(rest);
    if (command == "bench-serve" || command == "bench-compare") return run_bench_program(argv);
    std::cerr << "error: unknown command '" << command << "'\n" << kUsage;
    return 2;
  } catch (const k3::core::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "internal error: " << e.what() << "\n";
    return 1;
  }
}
