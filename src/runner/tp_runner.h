// runner/tp_runner.h: tensor parallelism (spec §11): `tp` rank models of one checkpoint run in lock
// step, one thread per rank.
//   * device cpu: the ranks talk through comm::ThreadGroup. This is the oracle that proves TP=N
//     gives the logits of TP=1 (CI runs it on two cores).
//   * device cuda: rank r runs on GPU r (CUDA devices 0..tp-1) with its own backends::cuda::Context
//     (stream, memory pool, cuBLASLt), its own op registry and device weights, and the ranks talk
//     through comm::NcclGroup (NVLS off, rank-order sums: the same numbers as the CPU group) whose
//     collectives are queued on the rank's op stream, so a step needs no cross-stream waits. Each
//     call's rank threads make their GPU current before running anything.
//
// Each rank holds config::shard_config(full, tp) and its weight slices, read straight from the
// mmap'd checkpoint (checkpoint::load_weights with a TpShard), and its own caches. Every call runs
// all ranks through the same forward() sequence; the logits every rank ends with are the same
// (all-gathered). engine::TpExecutor runs engine steps on the ranks (engine/one_shot.h for the CLI's
// generate and logits).
//
// Expert parallelism (options.expert_parallel, tp > 1): rank r holds the whole routed experts
// [r * E / tp, (r + 1) * E / tp) instead of a slice of every expert (config::ShardOptions); the
// routed partial sums meet in the same latent all-reduce (the all-reduce form of EP).
//
// Decode context parallelism (options.dcp = tp; 1 = off, kernels/mla/mla_cp.h): every sequence's
// MLA cache is also split over the ranks by token (position p on rank p % tp), so each rank's
// caches (new_cache) hold ceil(tokens / tp) positions: tp times the context for the same memory.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "comm/communicator.h"
#include "config/shard.h"
#include "kernels/registry.h"
#include "model/kv_storage.h"
#include "model/local_cache.h"
#include "model/model.h"
#include "runner/model_runner.h"
#include "runner/sampler.h"

namespace k3::runner {

class TpRunner {
 public:
  // Reads DIR/config.json, checks that tp divides the sharded sizes (config::shard_config, whose
  // error names the field) and loads every rank's slices (on options.device; for cuda, rank r's go
  // to GPU r, one rank at a time so the host holds one rank's slices at most). cuda needs a build
  // with NCCL and at least tp GPUs (else core::Error saying which). `progress` sees rank 0's load.
  // tp = 1 is allowed (a one-rank group: the plain model). options.dcp must be 1 or tp (core::Error
  // "dcp N must be 1 or the tensor-parallel size M").
  static std::unique_ptr<TpRunner> open(const std::filesystem::path& dir, int tp, const model::ModelOptions& options,
                                        model::KvCacheDtype kv_cache = model::KvCacheDtype::bf16,
                                        const checkpoint::LoadProgressFn& progress = nullptr);
  TpRunner(const std::filesystem::path& dir, int tp, const model::ModelOptions& options, model::KvCacheDtype kv_cache,
           const checkpoint::LoadProgressFn& progress);
  ~TpRunner();
  TpRunner(const TpRunner&) = delete;
  TpRunner& operator=(const TpRunner&) = delete;

  const config::K3Config& config() const { return full_; }              // the whole model's
  const config::K3Config& rank_config() const { return rank_config_; }  // what each rank holds
  int tp() const { return static_cast<int>(ranks_.size()); }
  int dcp() const { return options_.dcp; }
  bool expert_parallel() const { return options_.expert_parallel; }
  const model::Model& model(int rank) const;
  model::KvCacheDtype kv_cache() const { return kv_cache_; }

  // Runs fn(rank, model, comm) on every rank at once, one thread each, and joins them; the models'
  // collectives pair up across the threads, so every rank must make the same forward() calls.
  // Tests and benchmarks use it to drive forward() with their own caches (new_cache(), or a
  // KvStorage on memory(rank)). If a
  // rank throws, the others are released (the group is aborted) and the first exception is
  // rethrown here; the next call starts on a fresh group.
  using RankFn = std::function<void(int rank, const model::Model& model, comm::Communicator& comm)>;
  void run(const RankFn& fn) const;

  // Rank `rank`'s device memory (where its KvStorage must live) and a one-sequence cache on it for
  // max_tokens tokens (ceil(max_tokens / dcp) local positions under decode context parallelism).
  const std::shared_ptr<core::DeviceMemory>& memory(int rank) const;
  model::LocalCache new_cache(int rank, int64_t max_tokens) const;
  // Records every rank's op calls in `recorder` (thread-safe; nullptr: none), as ModelRunner's; with
  // `only_rank`, that rank's alone (the others' recorders are left as they are). A rank's own thread
  // may set its own rank's recorder inside run().
  void set_op_recorder(kernels::OpRecorder* recorder, std::optional<int> only_rank = std::nullopt);

 private:
  struct Rank;
  struct Group;               // the ranks' communicators: comm::ThreadGroup or comm::NcclGroup
  void build_models() const;  // (re)creates the group and every rank's Model on it

  config::K3Config full_, rank_config_;
  model::ModelOptions options_;
  model::KvCacheDtype kv_cache_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  mutable std::unique_ptr<Group> group_;
};

}  // namespace k3::runner
