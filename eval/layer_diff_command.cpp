// eval/layer_diff_command.cpp: the k3eval_layer_diff program's command: one model run as two
// sides (eval/layer_diff.h), every traced intermediate diffed per step; a table on stdout and an
// optional JSON bundle.
//
//   k3eval_layer_diff --a device=cuda,precision=bf16 --b device=cuda,precision=bf16,decode_backend=latency_specialized
//                     [--model DIR | --config k3-tiny --seed 0] [--prompt-len 8 | --token-ids 1,2,3]
//                     [--steps 16] [--threshold 0.999] [--no-prefill-trace] [--prefill-chunk N] [--free-run] [--out diff.json] [--check]
#include "eval/layer_diff_command.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "checkpoint/checkpoint.h"
#include "cli/args.h"
#include "core/error.h"
#include "eval/layer_diff.h"
#include "evidence/environment.h"

namespace k3::eval {

namespace {

namespace fs = std::filesystem;

constexpr const char* kDefaultModel = "models/k3-code-15m";  // as cli/model_options.h: the bundled model

// A random checkpoint (--config NAME --seed N) written to a fresh temporary folder, removed at exit.
class TempCheckpoint {
 public:
  TempCheckpoint(const std::string& config, uint64_t seed, checkpoint::InitStyle init) {
    static std::atomic<int> counter{0};
    dir_ = fs::temp_directory_path() /
           ("k3-layer-diff-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(dir_);
    checkpoint::WriteOptions opt;
    opt.seed = seed;
    opt.init = init;
    checkpoint::write_random_checkpoint(config::resolve_config(config), opt, dir_);
  }
  ~TempCheckpoint() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  TempCheckpoint(const TempCheckpoint&) = delete;
  TempCheckpoint& operator=(const TempCheckpoint&) = delete;
  const fs::path& dir() const { return dir_; }

 private:
  fs::path dir_;
};

SideSpec side_option(const cli::Args& args, const char* name) {
  try {
    return parse_side(args.get(name));
  } catch (const core::Error& e) {
    throw core::Error(std::string("layer-diff: --") + name + ": " + e.what());
  }
}

}  // namespace

int layer_diff_command(std::span<char* const> argv) {
  cli::Args args(
      "layer-diff",
      {{"a", "SPEC",
        "side A, the reference: device=cpu|cuda,precision=fp32|bf16,decode_backend=auto|"
        "latency_specialized,kv_cache=bf16|fp8,kda_prefill=chunked|recurrent (keys optional)",
        "", true},
       {"b", "SPEC", "side B, compared with A (same keys)", "", true},
       {"model", "DIR", std::string("checkpoint folder [default: ") + kDefaultModel + " unless --config]", ""},
       {"config", "NAME|PATH", "instead of --model: a random checkpoint of this config (e.g. k3-tiny) in a temp folder",
        ""},
       {"seed", "N", "with --config: the weights' seed", "0"},
       {"init", "realistic|sensitive", "with --config: weight init (spec §14.1 / §14.3)", "realistic"},
       {"token-ids", "1,2,3", "the prompt's token ids (default: --prompt-len fixed ids)", ""},
       {"prompt-len", "N", "without --token-ids: a prompt of N ids (i * 7919 mod vocab)", "8"},
       {"steps", "N", "decode steps after the prompt (--free-run: greedy tokens per side)", "16"},
       {"threshold", "C", "flag intermediates whose worst cosine is below C", "0.999"},
       {"min-top1", "P", "with --check: the least top-1 agreement that passes", "0.99"},
       {"no-prefill-trace", "", "the prefill step compares only its last-row logits (long prompts)", ""},
       {"prefill-chunk", "N",
        "prefill the prompt in steps of at most N tokens (0: one step); only the last is compared", "0"},
       {"free-run", "", "each side generates --steps greedy tokens on its own; report the first divergence", ""},
       {"out", "FILE", "write the JSON bundle (per-step rows, summaries, environment) here", ""},
       {"check", "",
        "exit 1 when an intermediate is below --threshold, top-1 agreement is below --min-top1, "
        "or (--free-run) the tokens diverge",
        ""}},
      argv);
  if (args.help_requested()) {
    std::cout << args.usage();
    return 0;
  }
  const SideSpec side_a = side_option(args, "a"), side_b = side_option(args, "b");
  K3_CHECK(!(args.has("model") && args.has("config")), "layer-diff: give --model or --config, not both");
  K3_CHECK(!(args.has("token-ids") && args.has("prompt-len")),
           "layer-diff: give --token-ids or --prompt-len, not both");
  const std::string init = args.get("init");
  K3_CHECK(init == "realistic" || init == "sensitive",
           "layer-diff: --init must be realistic or sensitive, got '" + init + "'");
  eval::LayerDiffConfig config;
  config.decode_steps = args.get_int("steps");
  K3_CHECK(config.decode_steps >= 0, "layer-diff: --steps must be >= 0, got " + std::to_string(config.decode_steps));
  config.threshold = args.get_double("threshold");
  K3_CHECK(config.threshold <= 1, "layer-diff: --threshold must be <= 1 (a cosine), got " + args.get("threshold"));
  const double min_top1 = args.get_double("min-top1");
  K3_CHECK(min_top1 >= 0 && min_top1 <= 1, "layer-diff: --min-top1 must be in [0, 1], got " + args.get("min-top1"));
  config.free_run = args.flag("free-run");
  config.trace_prefill = !args.flag("no-prefill-trace");
  config.prefill_chunk = args.get_int("prefill-chunk");
  K3_CHECK(config.prefill_chunk >= 0,
           "layer-diff: --prefill-chunk must be >= 0, got " + std::to_string(config.prefill_chunk));
  const int64_t prompt_len = args.get_int("prompt-len");
  K3_CHECK(prompt_len >= 1, "layer-diff: --prompt-len must be >= 1, got " + std::to_string(prompt_len));

  std::unique_ptr<TempCheckpoint> temp;
  fs::path dir = args.has("model") ? fs::path(args.get("model")) : fs::path(kDefaultModel);
  std::string source = dir.string();
  if (args.has("config")) {
    temp = std::make_unique<TempCheckpoint>(args.get("config"), args.get_u64("seed"),
                                            init == "sensitive" ? checkpoint::InitStyle::sensitive
                                                                : checkpoint::InitStyle::realistic);
    dir = temp->dir();
    source = args.get("config") + " seed " + std::to_string(args.get_u64("seed")) + " init " + init + " (temporary)";
  }
  const auto runner_a = eval::open_side(dir, side_a);
  const auto runner_b = eval::open_side(dir, side_b);
  if (args.has("token-ids")) {
    config.prompt = args.get_ids("token-ids");
  } else {
    for (int64_t i = 0; i < prompt_len; ++i)
      config.prompt.push_back(static_cast<int32_t>((i * 7919) % runner_a->config().vocab_size));
  }

  eval::LayerDiffReport report = eval::run_layer_diff(*runner_a, side_a, *runner_b, side_b, config);
  report.model = source;
  report.environment = evidence::environment();
  std::cout << eval::format_table(report);
  if (args.has("out")) {
    std::ofstream f(args.get("out"));
    K3_CHECK(f.good(), "layer-diff: cannot write --out " + args.get("out"));
    f << eval::to_json(report).dump(2) << "\n";
    std::cout << "wrote " << args.get("out") << "\n";
  }
  if (!args.flag("check")) return 0;
  const bool pass = config.free_run ? report.first_divergence < 0
                                    : !report.any_below && report.top1_agreement >= min_top1;
  std::cout << "check: " << (pass ? "PASS" : "FAIL") << "\n";
  return pass ? 0 : 1;
}

}  // namespace k3::eval
