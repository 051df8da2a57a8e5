// cli/generate.cpp: `k3serve generate`: prefill the prompt, sample, print the new ids.
#include <iostream>

#include "cli/commands.h"
#include "cli/log_options.h"
#include "cli/model_options.h"
#include "engine/one_shot.h"
#include "runner/model_runner.h"
#include "runner/tp_runner.h"

namespace k3::cli {

int generate_command(std::span<char* const> argv) {
  std::vector<OptionSpec> specs = model_option_specs();
  specs.push_back({"token-ids", "1,2,3", "prompt token ids", "", true});
  specs.push_back({"max-tokens", "N", "tokens to generate", "16"});
  specs.push_back({"temperature", "T", "0 = greedy", "0"});
  specs.push_back({"top-p", "P", "nucleus sampling mass", "1"});
  specs.push_back({"top-k", "K", "keep the K most likely tokens (0: off)", "0"});
  specs.push_back({"min-p", "P", "drop tokens below P times the most likely", "0"});
  specs.push_back({"seed", "S", "sampling seed", "0"});
  specs.push_back(
      {"repetition-penalty", "R", "divide positive / multiply negative logits of prompt+output ids (1: off)", "1"});
  specs.push_back({"presence-penalty", "P", "subtract P from logits of ids already generated, in [-2, 2]", "0"});
  specs.push_back({"frequency-penalty", "F", "subtract F * count from logits of generated ids, in [-2, 2]", "0"});
  specs.push_back(tp_option_spec());
  specs.push_back(expert_parallel_option_spec());
  specs.push_back({"explain", "",
                   "print the plan of the prefill and first decode step to stderr: the decode path and why, "
                   "and every op with the kernel that ran",
                   ""});
  for (OptionSpec& s : log_option_specs()) specs.push_back(std::move(s));
  Args args("generate", specs, argv);
  if (args.help_requested()) {
    std::cout << args.usage();
    return 0;
  }
  configure_log(args);
  const std::vector<int32_t> prompt = args.get_ids("token-ids");
  runner::SamplingParams sampling;
  sampling.temperature = static_cast<float>(args.get_double("temperature"));
  sampling.top_p = static_cast<float>(args.get_double("top-p"));
  sampling.top_k = static_cast<int>(args.get_int("top-k"));
  sampling.min_p = static_cast<float>(args.get_double("min-p"));
  sampling.seed = args.get_u64("seed");
  sampling.repetition_penalty = static_cast<float>(args.get_double("repetition-penalty"));
  sampling.presence_penalty = static_cast<float>(args.get_double("presence-penalty"));
  sampling.frequency_penalty = static_cast<float>(args.get_double("frequency-penalty"));
  const int64_t max_tokens = args.get_int("max-tokens");
  K3_CHECK(max_tokens >= 0, "--max-tokens must be >= 0");
  const int tp = parse_tp(args);
  model::ModelOptions options = parse_model_options(args);
  parse_expert_parallel(args, tp, options);
  engine::GenerateStats st;
  std::vector<int32_t> out;
  const bool explain = args.flag("explain");
  K3_CHECK(!explain || tp == 1, "--explain needs --tp 1");
  if (options.expert_parallel)
    std::cerr << "expert parallel: each of the " << tp << " ranks holds 1/" << tp << " of the routed experts, whole\n";
  if (tp > 1) {
    auto runner = runner::TpRunner::open(args.get("model"), tp, options, parse_kv_cache(args),
                                         load_progress_on_terminal(args.get("model")));
    out = engine::generate(*runner, prompt, max_tokens, sampling, nullptr, &st);
  } else {
    auto runner = runner::ModelRunner::open(args.get("model"), options, parse_kv_cache(args),
                                            load_progress_on_terminal(args.get("model")));
    out = engine::generate(*runner, prompt, max_tokens, sampling, nullptr, &st,
                           explain ? [](const std::string& plan) { std::cerr << plan; }
                                   : std::function<void(const std::string&)>());
  }
  for (size_t i = 0; i < out.size(); ++i) std::cout << (i ? "," : "") << out[i];
  std::cout << "\n";
  std::cerr << "prompt " << st.prompt_tokens << " tokens in " << st.prefill_seconds << " s; generated "
            << st.generated_tokens << " tokens in " << st.decode_seconds << " s\n";
  return 0;
}

}  // namespace k3::cli
