// cli/logits.cpp: `k3serve logits`: teacher-forced logits of a token sequence, written as
// one F32 tensor "logits" [T, vocab] in a safetensors file.
#include <iostream>

#include "checkpoint/safetensors.h"
#include "cli/commands.h"
#include "cli/log_options.h"
#include "cli/model_options.h"
#include "engine/one_shot.h"
#include "runner/model_runner.h"
#include "runner/tp_runner.h"

namespace k3::cli {

int logits_command(std::span<char* const> argv) {
  std::vector<OptionSpec> specs = model_option_specs();
  specs.push_back({"token-ids", "1,2,3", "input token ids", "", true});
  specs.push_back({"out", "FILE", "output .safetensors file", "", true});
  specs.push_back(
      {"decode-from", "N", "prefill the first N tokens, decode the rest one at a time (default: all prefill)", ""});
  specs.push_back(tp_option_spec());
  specs.push_back(expert_parallel_option_spec());
  for (OptionSpec& s : log_option_specs()) specs.push_back(std::move(s));
  Args args("logits", specs, argv);
  if (args.help_requested()) {
    std::cout << args.usage();
    return 0;
  }
  configure_log(args);
  const std::vector<int32_t> ids = args.get_ids("token-ids");
  model::ModelOptions options = parse_model_options(args);
  const int tp = parse_tp(args);
  parse_expert_parallel(args, tp, options);
  const int64_t decode_from = args.has("decode-from") ? args.get_int("decode-from") : static_cast<int64_t>(ids.size());
  core::Tensor logits;
  if (tp > 1) {
    auto runner = runner::TpRunner::open(args.get("model"), tp, options, parse_kv_cache(args),
                                         load_progress_on_terminal(args.get("model")));
    logits = engine::logits(*runner, ids, decode_from);
  } else {
    auto runner = runner::ModelRunner::open(args.get("model"), options, parse_kv_cache(args),
                                            load_progress_on_terminal(args.get("model")));
    logits = engine::logits(*runner, ids, decode_from);
  }
  checkpoint::write_safetensors(args.get("out"), {{"logits", logits.view()}});
  std::cerr << "wrote logits " << logits.shape().str() << " to " << args.get("out") << "\n";
  return 0;
}

}  // namespace k3::cli
