// cli/make_checkpoint.cpp: `k3serve make-checkpoint`: deterministic random weights.
#include <filesystem>
#include <iostream>

#include "checkpoint/checkpoint.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "config/k3_config.h"
#include "core/error.h"
#include "draft/draft_config.h"
#include "draft/draft_weights.h"
#include "draft/eagle3_config.h"
#include "draft/eagle3_weights.h"
#include "tokenizer/tiny_tokenizer.h"

namespace k3::cli {

namespace {

// `--draft-for TARGET`: a DSpark (src/draft/draft_weights.h) or, with --draft-kind eagle3, an EAGLE-3
// (src/draft/eagle3_weights.h) draft checkpoint for that target.
int make_draft_checkpoint(const Args& args) {
  K3_CHECK(!args.has("config"), "make-checkpoint: give --config or --draft-for, not both");
  K3_CHECK(!args.flag("mxfp4") && args.get_int("shard-bytes") == 0,
           "make-checkpoint: --mxfp4 and --shard-bytes do not apply to a draft model");
  std::string target = args.get("draft-for");
  if (std::filesystem::is_directory(target)) target = (std::filesystem::path(target) / "config.json").string();
  const config::K3Config tcfg = config::resolve_config(target);
  const std::string source = args.has("draft-config") ? args.get("draft-config") : "the default draft";
  const std::string kind = args.get("draft-kind");
  if (kind == "eagle3") {
    const draft::Eagle3Config ecfg = args.has("draft-config") ? draft::resolve_eagle3_config(args.get("draft-config"))
                                                              : draft::default_eagle3_for(tcfg);
    draft::check_matches_target(ecfg, tcfg, source);
    draft::write_random_eagle3(ecfg, args.get_u64("seed"), args.get("out"));
    std::cerr << "wrote EAGLE-3 draft " << args.get("out") << " for " << args.get("draft-for") << " ("
              << draft::eagle3_param_count(ecfg, ecfg.hidden_size != ecfg.target_hidden_size) << " parameters, seed "
              << args.get_u64("seed") << ")\n";
    return 0;
  }
  K3_CHECK(kind == "dspark", "make-checkpoint: --draft-kind must be dspark or eagle3, got '" + kind + "'");
  const draft::DraftConfig dcfg = args.has("draft-config") ? draft::resolve_draft_config(args.get("draft-config"))
                                                           : draft::default_draft_for(tcfg);
  draft::check_matches_target(dcfg, tcfg, source);
  draft::write_random_draft(dcfg, args.get_u64("seed"), args.get("out"));
  std::cerr << "wrote draft " << args.get("out") << " for " << args.get("draft-for") << " ("
            << draft::draft_param_count(dcfg) << " parameters, seed " << args.get_u64("seed") << ")\n";
  return 0;
}

}  // namespace

int make_checkpoint_command(std::span<char* const> argv) {
  Args args(
      "make-checkpoint",
      {{"config", "NAME|PATH", "built-in config (k3-tiny) or a config.json (required unless --draft-for)", ""},
       {"seed", "N", "random seed", "0"},
       {"out", "DIR", "output folder", "", true},
       {"mxfp4", "", "store routed experts as MXFP4 (compressed-tensors)", ""},
       {"init", "realistic|sensitive", "weight init: spec §14.1 or §14.3", "realistic"},
       {"shard-bytes", "N", "split into shards of about N bytes (0: one file)", "0"},
       {"draft-for", "NAME|PATH",
        "write a draft model (--draft-kind) for this target (config name, config.json or folder)", ""},
       {"draft-kind", "dspark|eagle3", "with --draft-for: the kind of draft model", "dspark"},
       {"draft-config", "NAME|PATH", "with --draft-for: the draft's config (default: the builtin/derived one)", ""}},
      argv);
  if (args.help_requested()) {
    std::cout << args.usage();
    return 0;
  }
  if (args.has("draft-for")) return make_draft_checkpoint(args);
  K3_CHECK(!args.has("draft-kind") && !args.has("draft-config"),
           "make-checkpoint: --draft-kind and --draft-config only apply with --draft-for");
  K3_CHECK(args.has("config"), "make-checkpoint: --config is required (or --draft-for for a draft model)");
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
