// eval/eagle3_rows/main.cpp: k3eval_eagle3_rows: the EAGLE-3 draft model (src/draft/eagle3_model.h) run
// on given taps and tokens, so another implementation (train/eagle3_torch.py, through
// train/eagle3_check.py) can be compared with it row by row.
//
//   k3eval_eagle3_rows --target DIR --draft DIR --case FILE --out FILE [--precision fp32|bf16]
// FILE (safetensors): "taps" f32 [T, n * Ht] (the concatenated taps of positions 0..T-1), "tokens"
// i32 [T] (row p's token, the target's token at p + 1), "chain_token" i32 [1]. Writes "logits"
// f32 [T, Vd] (the context rows at positions 0..T-1, one request, causal) and "chain_logits" f32
// [1, Vd] (a chain row at position T: chain_token with the pre-norm output of row T - 1 as its
// hidden, attending to every context row and itself). Exit codes: 0 ok, 2 bad input.
#include <cstdlib>
#include <exception>
#include <iostream>
#include <span>

#include "checkpoint/safetensors.h"
#include "cli/args.h"
#include "core/error.h"
#include "draft/eagle3_model.h"
#include "runner/model_runner.h"

namespace {

int run(std::span<char* const> argv) {
  using namespace k3;
  cli::Args args("k3eval_eagle3_rows",
                 {{"target", "DIR", "the target's checkpoint folder (its embedding, its op registry)", "", true},
                  {"draft", "DIR", "the EAGLE-3 draft checkpoint folder", "", true},
                  {"case", "FILE", "safetensors: taps f32 [T, n*Ht], tokens i32 [T], chain_token i32 [1]", "", true},
                  {"out", "FILE", "safetensors: logits f32 [T, Vd], chain_logits f32 [1, Vd]", "", true},
                  {"precision", "fp32|bf16", "draft arithmetic", "fp32"}},
                 argv);
  if (args.help_requested()) {
    std::cout << args.usage();
    return 0;
  }
  const std::string p = args.get("precision");
  K3_CHECK(p == "fp32" || p == "bf16", "--precision must be fp32 or bf16, got '" + p + "'");
  model::ModelOptions mo;
  mo.precision = p == "fp32" ? kernels::Precision::fp32 : kernels::Precision::bf16;
  auto target = runner::ModelRunner::open(args.get("target"), mo);
  const draft::LoadedEagle3 loaded = draft::load_eagle3(args.get("draft"), target->config(), target->host_weights());
  draft::Eagle3Options eo;
  eo.precision = mo.precision;
  const draft::Eagle3Model m(loaded.config, loaded.weights, target->registry(), eo);

  const auto file = checkpoint::SafetensorsFile::open(args.get("case"));
  const core::Tensor taps = file.tensor("taps"), tokens = file.tensor("tokens"), chain = file.tensor("chain_token");
  K3_CHECK(taps.dtype() == core::DType::f32 && taps.shape().rank() == 2, "case: taps must be f32 [T, n*Ht]");
  K3_CHECK(tokens.dtype() == core::DType::i32 && tokens.shape().rank() == 1 && tokens.dim(0) == taps.dim(0),
           "case: tokens must be i32 [T] with T = taps rows");
  K3_CHECK(chain.dtype() == core::DType::i32 && chain.numel() == 1, "case: chain_token must be i32 [1]");
  const int64_t t = taps.dim(0);
  const std::vector<int32_t> ids(tokens.data<const int32_t>(), tokens.data<const int32_t>() + t);

  const core::Tensor hidden = m.fuse_taps(taps.view());
  draft::Eagle3Cache cache;
  draft::Eagle3Cache* caches[] = {&cache};
  const int64_t context_rows[] = {t};
  const draft::Eagle3Output context = m.forward(caches, context_rows, ids, hidden.view());
  const core::Tensor logits = m.logits(context.normed.view());
  const int64_t chain_rows[] = {1};
  const int32_t chain_ids[] = {chain.data<const int32_t>()[0]};
  const draft::Eagle3Output next = m.forward(caches, chain_rows, chain_ids,
                                             draft::rows_of(context.prenorm.view(), t - 1, 1));
  const core::Tensor chain_logits = m.logits(next.normed.view());
  checkpoint::write_safetensors(args.get("out"), {{"logits", logits.view()}, {"chain_logits", chain_logits.view()}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(std::span<char* const>(argv + 1, static_cast<size_t>(argc - 1)));
  } catch (const k3::core::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "internal error: " << e.what() << "\n";
    return 1;
  }
}
