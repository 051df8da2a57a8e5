// config/shard.h: plain tensor parallelism over `tp` ranks (spec §11): the per-rank config and
// the rank's place in the group.
//
// A rank runs the ordinary model code on a config whose sharded sizes are divided by tp:
//   KDA heads, MLA heads          -> column-parallel q/k/v/g/b/f_b, q_b, kv_b, g; row-parallel o_proj
//   moe_intermediate_size         -> every routed expert keeps 1/tp of its intermediate (w1/w3 rows,
//                                    w2 columns), and so do the shared experts (S * I / tp)
//   intermediate_size (dense FFN) -> gate/up rows, down columns
//   vocab_size                    -> vocab-parallel embedding and lm_head rows
// Expert parallelism (ShardOptions::expert_parallel, vLLM's --enable-expert-parallel; spec §11 "EP
// variant"), instead of the TP-sharded routed experts: rank r holds the WHOLE routed experts
// [r * E / tp, (r + 1) * E / tp) (E = num_experts; moe_intermediate_size stays whole, so the MXFP4
// 32-group check does not apply to it) and none of the others; the shared experts stay TP-sharded
// (MoeConfig::shared_intermediate_size = num_shared_experts * moe_intermediate_size / tp). This is
// the all-reduce form of EP: every rank holds the whole batch (activations are replicated under
// TP), computes only the routes to its experts and adds its f32 partial sum to the latent
// all-reduce the TP-sharded experts use anyway, so no all-to-all is needed (an all-to-all
// dispatch/combine belongs with data parallelism, where ranks hold different tokens).
// Everything else (router, latent down/up and norm, q_a/kv_a and their norms, f_a, o_norm, every
// RMSNorm and AttnRes weight) is replicated. The per-rank config describes the rank's tensors and
// nothing more: facts that stay global (the full vocabulary that token ids are checked against,
// which A_log entries belong to a rank) come from the full config and the TpShard.
#pragma once
#include <cstdint>
#include <string>

#include "config/k3_config.h"

namespace k3::config {

// Rank `rank` of a tensor-parallel group of `size` ranks. {0, 1} is the unsharded model.
struct TpShard {
  int rank = 0;
  int size = 1;
  bool expert_parallel = false;  // the routed experts split whole over the ranks (see above)
  // The rank's contiguous block [begin(n), begin(n) + n / size) of an axis of extent n (n must
  // be divisible by size; shard_config checks every axis it divides).
  int64_t begin(int64_t n) const { return n / size * rank; }
  int64_t extent(int64_t n) const { return n / size; }
};

// The config one rank of `tp` holds (see above). Throws core::Error naming the field, its value
// and tp when tp < 1, when tp does not divide a sharded size the model uses (KDA heads only with
// KDA layers, MLA heads only with MLA layers, moe_intermediate_size only with MoE layers,
// intermediate_size only with dense layers; vocab_size always), or when MXFP4 experts would get a
// per-rank intermediate that is not a multiple of the 32-wide scale group (w2's input groups).
struct ShardOptions {
  bool expert_parallel = false;  // whole routed experts per rank (see above); needs tp > 1
};
// With expert_parallel: throws core::Error unless tp > 1 and tp divides num_experts (with MoE
// layers), and divides num_shared_experts * moe_intermediate_size (the shared experts' split).
K3Config shard_config(const K3Config& full, int tp, ShardOptions options = {});

// Throws core::Error "expert parallelism (--enable-expert-parallel) needs --tp > 1, got --tp 1"
// when expert_parallel is set with tp 1.
void check_expert_parallel(bool expert_parallel, int tp);

// Throws core::Error unless 0 <= shard.rank < shard.size and shard.size >= 1.
void check_shard(const TpShard& shard);

}  // namespace k3::config
