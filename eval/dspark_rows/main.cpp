// eval/dspark_rows/main.cpp: k3eval_dspark_rows: the DSpark draft model (src/draft/draft_model.h) run on
// given taps, so another implementation (train/dspark_torch.py, through train/dspark_check.py) can
// be compared with it.
//
//   k3eval_dspark_rows --target DIR --draft DIR --case FILE --out FILE [--precision fp32|bf16]
// FILE (safetensors): "taps" f32 [P, n * H] (the context: target positions 0..P-1), "x0" i32 [1]
// (the newest token, at position P), "prev" i32 [K] (a token per block row, for the Markov term).
// Writes "base_logits" f32 [K, Vd] (the block pass: row j = U_{j+1}) and "markov" f32 [K, Vd]
// (row j = W2 . W1[prev[j]]). Exit codes: 0 ok, 2 bad input.
#include <cstdlib>
#include <exception>
#include <iostream>
#include <span>

#include "checkpoint/safetensors.h"
#include "cli/args.h"
#include "core/error.h"
#include "draft/draft_model.h"
#include "draft/draft_weights.h"
#include "runner/model_runner.h"

namespace {

int run(std::span<char* const> argv) {
  using namespace k3;
  cli::Args args("k3eval_dspark_rows",
                 {{"target", "DIR", "the target's checkpoint folder (its embedding, its op registry)", "", true},
                  {"draft", "DIR", "the DSpark draft checkpoint folder", "", true},
                  {"case", "FILE", "safetensors: taps f32 [P, n*H], x0 i32 [1], prev i32 [K]", "", true},
                  {"out", "FILE", "safetensors: base_logits f32 [K, Vd], markov f32 [K, Vd]", "", true},
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
  const draft::LoadedDraft loaded = draft::load_draft(args.get("draft"), target->config(), target->host_weights());
  draft::DraftOptions o;
  o.precision = mo.precision;
  const draft::DraftModel m(loaded.config, loaded.weights, target->registry(), o);

  const auto file = checkpoint::SafetensorsFile::open(args.get("case"));
  const core::Tensor taps = file.tensor("taps"), x0 = file.tensor("x0"), prev = file.tensor("prev");
  const int64_t K = loaded.config.block_size;
  K3_CHECK(taps.dtype() == core::DType::f32 && taps.shape().rank() == 2, "case: taps must be f32 [P, n*H]");
  K3_CHECK(x0.dtype() == core::DType::i32 && x0.numel() == 1, "case: x0 must be i32 [1]");
  K3_CHECK(prev.dtype() == core::DType::i32 && prev.numel() == K, "case: prev must be i32 [block_size]");
  draft::DraftCache cache = m.new_cache();
  m.append_context(cache, taps.view());
  const draft::BlockOutput block = m.forward_block(cache, x0.data<const int32_t>()[0]);
  core::Tensor markov = core::Tensor::zeros(core::DType::f32, {K, loaded.config.draft_vocab_size});
  for (int64_t j = 0; j < K; ++j) {
    const std::vector<float> row = m.markov_bias(prev.data<const int32_t>()[j]);
    std::copy(row.begin(), row.end(), markov.data<float>() + j * loaded.config.draft_vocab_size);
  }
  checkpoint::write_safetensors(args.get("out"),
                                {{"base_logits", block.base_logits.view()}, {"markov", markov.view()}});
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
