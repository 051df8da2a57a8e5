// comm/custom_allreduce.h: a custom all-reduce for small decode messages across the GPUs of one
// host (one thread per GPU in one process, like comm/nccl_comm.h), reading and writing peers'
// buffers directly through CUDA peer access, plus the fused "reduce -> residual add -> AttnRes Mix
// -> RMSNorm" step the model runs right after every row-parallel partial sum (spec §3, §3.1, §11).
// Built only when CUDA and NCCL are found (src/comm/CMakeLists.txt); it does not use NCCL itself.
//
// Numerics are those of comm/communicator.h: every element is summed over the ranks in rank order
// 0..n-1 in fp32 (acc = x_0; acc = acc + x_1; ... never fused, never reassociated), bf16 rounded
// once at the end; every rank gets the same bits, equal to ThreadComm and to
// NcclSumMode::rank_order. The fused op equals running the unfused CUDA ops (to_activation, add,
// attn_res_mix, rmsnorm of kernels/) in sequence on one GPU, bit for bit: it repeats their
// reduction orders exactly (see custom_fused.cu).
//
// Transport (custom_allreduce_kernels.cuh): "LL" lines of 16 bytes {data0, flag, data1, flag}; each
// 8-byte half is written by one store, so a reader that sees both flag words equal to the call's
// sequence number also sees that line's 8 payload bytes. Writers push (remote stores into the
// reader's buffer over NVLink); readers poll their own memory and zero each line after reading it,
// so no stale flag can ever match again, even after the 32-bit sequence wraps. The sequence number
// lives in device memory and is bumped by the last block of each kernel, so calls are CUDA-graph
// capturable (no host sync, no allocation, nothing the host must count). The buffer is double
// buffered by sequence parity: a rank that starts call k+2 has received every peer's data of call
// k+1, so every peer has finished call k, and nothing of call k is still being read.
//
// Rules for callers: every rank makes the same calls in the same order with the same shapes (a
// mismatch hangs until the kernels' 20 s watchdog traps); one rank's calls are ordered on its
// streams (one stream at a time, or streams ordered by events); kernels spin-wait on peers, so all
// ranks' kernels must be able to run concurrently (each rank on its own GPU, as here).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/common.h"
#include "kernels/norm/rmsnorm.h"

namespace k3::comm {

// Most ranks a group may have (the TP degrees of spec §11 on one host).
inline constexpr int kCustomMaxRanks = 8;
// Most bank rows the fused op mixes besides the prefix (K3 uses 8; the CUDA Mix takes 16 sources).
inline constexpr int kCustomMaxBankRows = 15;

// The fused step after a row-parallel partial sum, on one rank (all activations [T, D], rows
// contiguous; act = bf16 in engine mode or f32, the same dtype for all of them):
//   a          = to_activation(sum over ranks of partial)          (rank order, fp32)
//   prefix_out = restart ? a : round(prefix + a)                    (ctx.add)
//   h          = Mix(bank[0..], prefix_out; query, mix_norm)        (kernels/attn_res)
//   x_out      = RMSNorm(h; norm_weight, norm_eps, style)           (kernels/norm)
struct FusedResidualMixNormArgs {
  core::TensorView partial;                // f32 [T, D]: this rank's partial sum (not modified)
  core::TensorView prefix;                 // act [T, D]; data == nullptr means restart (prefix_out = a)
  std::span<const core::TensorView> bank;  // act [T, D] each, 0..kCustomMaxBankRows views (bank rows)
  core::TensorView query;                  // bf16/f32 [D] or [1, D]: the next Mix's res_proj.weight
  core::TensorView mix_norm;               // bf16/f32 [D]: the next Mix's res_norm.weight
  core::TensorView norm_weight;            // bf16/f32 [D]: the next RMSNorm's weight
  core::TensorView prefix_out;             // act [T, D]: may alias prefix, not partial or a bank row
  core::TensorView x_out;                  // act [T, D]: the next sublayer's input
  float mix_eps = 1e-5f;
  float norm_eps = 1e-5f;
  kernels::RmsNormStyle style = kernels::RmsNormStyle::moonshot;
  kernels::Precision precision = kernels::Precision::bf16;
};

struct CustomShared;  // the group's buffers and peer pointers, defined in custom_allreduce.cu

// One rank's handle. Every call is enqueued on `stream` (a stream of this rank's GPU) and returns
// without waiting; bad arguments throw core::Error naming the argument before anything is enqueued.
class CustomAllReduce {
 public:
  CustomAllReduce(std::shared_ptr<CustomShared> shared, int rank);
  int rank() const { return rank_; }
  int size() const;
  int device() const;
  // Largest message (bytes of x, or of the fused op's f32 partial) a call accepts.
  int64_t max_bytes() const;
  // Messages up to this many bytes use the one-shot form in all_reduce_sum, larger ones two-stage.
  int64_t two_stage_threshold() const { return two_stage_threshold_; }
  void set_two_stage_threshold(int64_t bytes) { two_stage_threshold_ = bytes; }

  // In place x <- sum over ranks (f32 or bf16, contiguous, 8-byte aligned, nbytes <= max_bytes):
  // one-shot up to two_stage_threshold(), else two-stage. Same bits either way.
  void all_reduce_sum(const core::TensorView& x, cudaStream_t stream);
  // One-shot: every rank pushes all of x to every peer and sums all n copies itself.
  void all_reduce_one_shot(const core::TensorView& x, cudaStream_t stream);
  // Two-stage: reduce-scatter (rank q sums its 1/n of the 8-byte lines, in rank order) then
  // all-gather of the sums. Moves 2(n-1)/n of x per rank instead of n-1 times x; for larger T.
  // Messages too small to give every rank a line run one-shot.
  void all_reduce_two_stage(const core::TensorView& x, cudaStream_t stream);
  // The fused step (see FusedResidualMixNormArgs); D <= 8192 with D % 8 == 0, or D <= 1024.
  void fused_residual_mix_norm(const FusedResidualMixNormArgs& a, cudaStream_t stream);

  // Argument checks behind the calls: ok, or a reason naming the argument and what was expected.
  core::Status all_reduce_check(const core::TensorView& x) const;
  core::Status fused_check(const FusedResidualMixNormArgs& a) const;

  // Sets this rank's sequence counter (waits for the device). Tests use it on every rank to run
  // calls across the 32-bit wrap; the group must be idle.
  void set_sequence_for_testing(uint32_t value);
  // The counter's current value (waits for the device).
  uint32_t sequence() const;

 private:
  friend class CustomAllReduceGroup;
  void enter() const;  // current device = this rank's GPU
  void fused_launch(const FusedResidualMixNormArgs& a, cudaStream_t stream);
  // Fills fused_max_clusters_ for every launch form (at set-up: no driver query during a capture).
  void query_fused_occupancy();

  std::shared_ptr<CustomShared> shared_;
  int rank_ = 0;
  int64_t two_stage_threshold_ = 0;
  // Most clusters of the fused kernel that fit on the GPU at once, by launch form (custom_fused.cu).
  std::map<int, int> fused_max_clusters_;
};

class CustomAllReduceGroup {
 public:
  // Ranks on CUDA devices `devices` (rank r on devices[r], 2..kCustomMaxRanks distinct devices,
  // every pair peer-accessible); each rank's buffer holds messages up to max_bytes. Throws
  // core::Error naming the problem (see peer_access_status).
  static std::unique_ptr<CustomAllReduceGroup> create(const std::vector<int>& devices, int64_t max_bytes);
  ~CustomAllReduceGroup();
  CustomAllReduceGroup(const CustomAllReduceGroup&) = delete;
  CustomAllReduceGroup& operator=(const CustomAllReduceGroup&) = delete;

  int size() const { return static_cast<int>(ranks_.size()); }
  // Rank r's handle; use it from one thread at a time (normally the thread that owns GPU r).
  CustomAllReduce& rank(int r);

  // Whether these devices can form a group: ok, or why not (too few/many, a device that does not
  // exist or is listed twice, a pair without peer access). Touches no device memory.
  static core::Status devices_status(const std::vector<int>& devices);

 private:
  explicit CustomAllReduceGroup(std::shared_ptr<CustomShared> shared);
  std::shared_ptr<CustomShared> shared_;
  std::vector<std::unique_ptr<CustomAllReduce>> ranks_;
};

}  // namespace k3::comm
