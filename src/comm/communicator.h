// comm/communicator.h: the tensor-parallel collective interface one rank sees (spec §11).
//
// A Communicator belongs to one rank of a group of size() ranks; every rank calls the same
// collectives in the same order with tensors of the same shape and dtype (a mismatch is a
// core::Error on every rank, not a hang). Implementations: comm/thread_comm.h (CPU, one thread per
// rank; the oracle and the CI path) and comm/nccl_comm.h (one thread per GPU, NCCL).
//
// Numeric contract (what makes TP=N equal TP=1 bit for bit where the math allows it):
//   * a sum over ranks is taken in rank order 0, 1, ..., n-1 for every element, accumulated in fp32
//     (acc = x_0; acc = acc + x_1; ...), with no fused multiply-add and no reassociation;
//   * for bf16 tensors the fp32 sum is rounded to bf16 once, at the end (never per hop);
//   * every rank gets the identical result, independent of which rank arrived first.
// Tensors are contiguous; CPU communicators take Device::cpu views, NCCL ones Device::cuda views.
#pragma once
#include <cstdint>
#include <string>

#include "core/error.h"
#include "core/tensor.h"

namespace k3::comm {

// Which axis all_gather concatenates the ranks' chunks along.
enum class GatherAxis : uint8_t {
  // in [R, ...] per rank -> out [n*R, ...]: rank q's rows at [q*R, (q+1)*R). Undoes
  // reduce_scatter_sum (sequence-parallel token split); the layout NCCL produces natively.
  first,
  // in [..., C] per rank -> out [..., n*C]: rank q's columns at [q*C, (q+1)*C) of every row. This is
  // what vocab-parallel lm_head needs: per-rank logits [T, V/tp] -> full logits [T, V].
  last,
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Where the tensors passed to this communicator must live.
  virtual core::Device device() const = 0;

  // In place: x <- sum over ranks of x (rank order, fp32 accumulation, bf16 rounded once).
  // x: f32 or bf16, any shape, same on every rank. Row-parallel o_proj / down-proj partial sums.
  virtual void all_reduce_sum(const core::TensorView& x) = 0;

  // out <- concatenation of every rank's `in` along `axis` (see GatherAxis). Any dtype; `out` has
  // the dtype of `in` and n times its extent along `axis`, the other dims equal.
  virtual void all_gather(const core::TensorView& in, const core::TensorView& out, GatherAxis axis) = 0;

  // in [n*R, ...] (same on every rank) -> out [R, ...] = rows [rank*R, (rank+1)*R) of the rank-order
  // sum of every rank's `in`; each element equals what all_reduce_sum would give. f32 or bf16.
  virtual void reduce_scatter_sum(const core::TensorView& in, const core::TensorView& out) = 0;

  // In place: x <- root's x on every rank. Any dtype.
  virtual void broadcast(const core::TensorView& x, int root) = 0;

  // Returns once every rank has entered barrier() (for NCCL: once this rank's stream has passed it).
  virtual void barrier() = 0;

  // Gives up on the whole group: ranks waiting in (or later entering) a collective throw
  // core::Error naming `reason` instead of waiting for a rank that will never come.
  virtual void abort(const std::string& reason) = 0;
};

// Argument checks shared by the implementations: ok, or a reason naming the argument and the
// expected vs actual shape/dtype/device. `n` is the group size.
core::Status all_reduce_check(const core::TensorView& x, core::Device device);
core::Status all_gather_check(const core::TensorView& in, const core::TensorView& out, GatherAxis axis, int n,
                              core::Device device);
core::Status reduce_scatter_check(const core::TensorView& in, const core::TensorView& out, int n, core::Device device);
core::Status broadcast_check(const core::TensorView& x, int root, int n, core::Device device);

const char* gather_axis_name(GatherAxis axis);

}  // namespace k3::comm
