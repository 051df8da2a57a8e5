// cli/make_checkpoint.cpp: `k3serve make-checkpoint`: deterministic random weights.
#include <iostream>

#include "checkpoint/checkpoint.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "config/k3_config.h"
#include "core/error.h"
#include "tokenizer/tiny_tokenizer.h"

namespace k3::cli {

int make_checkpoint_command(std::span<char* const> argv) {
  Args args("make-checkpoint",
            {{"config", "NAME|PATH", "built-in config (k3-tiny) or a config.json", "", true},
             {"seed", "N", "random seed", "0"},
             {"out", "DIR", "output folder", "", true},
             {"mxfp4", "", "store routed experts as MXFP4 (compressed-tensors)", ""},
             {"init", "realistic|sensitive", "weight init: spec §14.1 or §14.3", "realistic"},
             {"shard-bytes", "N", "split into shards of about N bytes (0: one file)", "0"}},
            argv);
  if (args.help_requested()) {
    std::cout << args.usage();
    return 0;
  }
  config::K3Config cfg = config::resolve_config(args.get("config"));
  checkpoint::WriteOptions opt;
  opt.seed = args.get_u64("seed");
  opt.mxfp4 = args.flag("mxfp4");
  const std::string init = args.get("init");
  K3_CHECK(init == "realistic" || init == "sensitive", "--init must be realistic or sensitive, got '" + init + "'");
  opt.init = init == "realistic" ? checkpoint::InitStyle::realistic : checkpoint::InitStyle::sensitive;
  opt.max_shard_bytes = args.get_int("shard-bytes");
  K3_CHECK(opt.max_shard_bytes >= 0, "--shard-bytes must be >= 0");
  checkpoint::write_random_checkpoint(cfg, opt, args.get("out"));
  // A small K3-format tokenizer beside the weights (none when vocab_size < 512), so the model
  // serves text end to end.
  tokenizer::write_tiny_tokenizer(cfg.vocab_size, args.get("out"));
  std::cerr << "wrote " << args.get("out") << " (config hash " << cfg.hash() << ", seed " << opt.seed
            << (opt.mxfp4 ? ", MXFP4 experts" : "") << ")\n";
  return 0;
}

}  // namespace k3::cli
