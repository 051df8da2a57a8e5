// checkpoint/shard_slice.h: one tensor-parallel rank's block of a checkpoint tensor (spec §11),
// cut straight from the mapped file: no rank ever holds a full copy of a sharded tensor.
//
// The rule compares the tensor's full shape (as stored, from the full config's inventory) with
// its per-rank shape (the inventory of config::shard_config(full, tp)):
//   * equal                       -> replicated: the tensor itself;
//   * one dim d differs, full[d] = local[d] * tp -> entries [rank * local[d], (rank + 1) * local[d])
//     along d. Column-parallel weights ([out, in] rows, conv [P, 1, K] rows, dt_bias, the
//     embedding / lm_head vocabulary rows) are cut along dim 0, which is one contiguous run of the
//     file and stays a view into the mapping; row-parallel weights (o_proj, down_proj, w2) are cut
//     along their input columns, a strided block that is copied (only the block). MXFP4 codes
//     [out, in/2] and scales [out, in/32] follow the same rule, so with a per-rank input width that
//     is a multiple of 32 the cut falls on whole bytes and whole scale groups, consistently.
// KDA A_log is the exception (spec §4): stored [head_dim] or [num_heads] with only the first
// num_heads entries used, it gives rank r the entries [r * H/tp, (r + 1) * H/tp) of those first H.
#pragma once
#include <cstdint>
#include <string>

#include "config/shard.h"
#include "core/tensor.h"

namespace k3::checkpoint {

// The rank's block of `full` (a contiguous tensor) for a parameter of per-rank shape `local`, by
// the rule above. Views keep `full`'s storage alive. A block (or replicated tensor) whose start is
// not aligned for its dtype (a file that does not align tensors) is copied. Throws core::Error naming `name` when the
// shapes do not relate by the rule.
core::Tensor shard_block(const core::Tensor& full, const core::Shape& local, config::TpShard shard,
                         const std::string& name);

// KDA A_log (rank-1 f32 of at least num_heads entries): the rank's num_heads / tp heads, a copy
// [num_heads / tp]. Throws core::Error naming `name` when the shapes do not fit.
core::Tensor shard_a_log(const core::Tensor& full, int64_t num_heads, config::TpShard shard, const std::string& name);

}  // namespace k3::checkpoint
