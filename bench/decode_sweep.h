// bench/decode_sweep.h: the in-process decode sweep behind k3bench_decode_gpu:
// one loaded checkpoint, decode-only steps timed for every context length x batch x decode backend
// (auto, latency_specialized) x mode (eager, graph, verify, verify-graph). bench/decode_sweep.cpp says how the
// context is built, timed and counted; bench/decode_gpu.cpp is the program around it (its command
// line fills DecodeSweepOptions; bench/decode_sweep_test.cpp runs it on the CPU).
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/k3_config.h"
#include "core/tensor.h"
#include "kernels/common.h"
#include "model/fused_decode.h"
#include "model/layers/context.h"

namespace k3::bench {

struct DecodeSweepOptions {
  std::filesystem::path model, out = "decode_gpu.json";
  bool make = false;
  std::string config = "k3-proxy-tp8";
  std::vector<std::string> modes = {"eager", "graph"};  // in the fixed order eager, graph, verify, verify-graph
  std::vector<int64_t> batches = {1, 8, 64};            // ascending, distinct
  std::vector<int64_t> ctxs = {8192};                   // as given (the first is config.ctx_tokens)
  std::vector<model::DecodeBackend> backends = {model::DecodeBackend::standard};  // as given, distinct
  int steps = 16, warmup = 2;
  uint64_t seed = 1;
#ifdef K3_HAVE_CUDA
  core::Device device = core::Device::cuda;
#else
  core::Device device = core::Device::cpu;  // a CPU-only build has nothing else
#endif
  int tp = 1;  // > 1: runner::TpRunner, rank r on GPU r, NCCL collectives inside every step
  // With tp > 1: decode context parallelism (model::ModelOptions::dcp = tp): each rank holds every
  // tp-th token of each sequence's latent cache and the MLA attention combines partial results.
  bool dcp = false;
  // With tp > 1: expert parallelism (model::ModelOptions::expert_parallel): each rank holds E / tp
  // whole routed experts instead of a slice of every expert (config/shard.h).
  bool ep = false;
  int spec_k = 7, spec_al = 6;  // modes "verify", "verify-graph": K drafts per sequence, AL tokens kept per step
  // Activations (kernels::Precision): bf16 serves; fp32 makes the backends' greedy tokens comparable
  // token for token (no bf16 rounding noise to flip a nearly tied route).
  kernels::Precision precision = kernels::Precision::bf16;
  // After each eager row, one more eager step with every op call timed by stream-ordered marks
  // (core::DeviceMemory::mark): the step's profile per op and implementation (calls, time, time per
  // layer, share of the step), printed under the row and kept in its bundle row. One GPU only.
  bool profile = false;
  // Non-empty: after each eager row, one more eager step with every op call that has two or more
  // capable implementations timed on each (bench/op_tuner.h), and the tuning table they give written
  // here (tuning/<gpu>.json). Needs --modes eager and one GPU; the step reruns in-place ops, so the
  // rows after it decode from a disturbed state (their times stand, their tokens do not).
  std::filesystem::path tune;
  int tune_runs = 15;
};

// Bytes of every tensor of c's checkpoint as stored (checkpoint::expected_params).
int64_t inventory_bytes(const config::K3Config& c);

// Whether DIR holds a checkpoint (config.json + its safetensors).
bool has_checkpoint(const std::filesystem::path& dir);
// With no checkpoint in `dir` and `make` set, writes a random one of `config` (a built-in name or a
// config.json path, config::resolve_config; MXFP4 experts, `seed`) after checking the disk has room
// for it; returns the seconds that took (0: the checkpoint there is reused). Throws core::Error
// when there is none and `make` is unset, or the disk lacks room.
// vocab_size > 0 writes the config with that vocabulary (and requires it of a checkpoint already there).
double make_checkpoint_if_needed(const std::filesystem::path& dir, const std::string& config, uint64_t seed, bool make,
                                 int32_t vocab_size = 0);

// Opens the checkpoint in o.model (it must exist), runs the sweep (progress and the table on
// stdout) and returns the result bundle: `environment` (evidence/environment.h; "gpu" replaced by the CUDA device's facts
// when there is one) and `make_seconds` (the time it took to write the checkpoint, 0: reused) go
// into it as they are. Throws core::Error on any failure.
nlohmann::json run_decode_sweep(const DecodeSweepOptions& o, nlohmann::json environment, double make_seconds);

}  // namespace k3::bench
