// config/shard.cpp: the per-rank config of plain tensor parallelism (spec §11).
#include "config/shard.h"

#include <algorithm>

#include "core/error.h"

namespace k3::config {

namespace {

bool uses(const K3Config& c, AttnKind kind) {
  return std::find(c.attn_kinds.begin(), c.attn_kinds.end(), kind) != c.attn_kinds.end();
}

bool uses(const K3Config& c, FfnKind kind) {
  for (int l = 0; l < c.num_hidden_layers; ++l)
    if (c.ffn_kind(l) == kind) return true;
  return false;
}

// value / tp, or a core::Error naming the field: "tp=4 does not divide num_attention_heads = 6 (MLA heads)".
int divide(int value, int tp, const char* field, const char* what) {
  if (value % tp != 0)
    throw core::Error("tensor parallelism: tp=" + std::to_string(tp) + " does not divide " + field + " = " +
                      std::to_string(value) + " (" + what + " are split evenly over the ranks)");
  return value / tp;
}

}  // namespace

void check_shard(const TpShard& shard) {
  K3_CHECK(shard.size >= 1 && shard.rank >= 0 && shard.rank < shard.size,
           "tensor parallelism: rank " + std::to_string(shard.rank) + " of a group of " + std::to_string(shard.size) +
               " ranks is out of range");
}

void check_expert_parallel(bool expert_parallel, int tp) {
  K3_CHECK(!expert_parallel || tp > 1, "expert parallelism (--enable-expert-parallel) needs --tp > 1, got --tp " +
                                           std::to_string(tp) + " (one rank holds every expert anyway)");
}

K3Config shard_config(const K3Config& full, int tp, ShardOptions options) {
  K3_CHECK(tp >= 1, "tensor parallelism: tp must be >= 1, got " + std::to_string(tp));
  check_expert_parallel(options.expert_parallel, tp);
  K3Config c = full;
  if (tp == 1) return c;
  c.vocab_size = divide(full.vocab_size, tp, "vocab_size", "the vocabulary rows of embed_tokens and lm_head");
  if (uses(full, AttnKind::kda))
    c.kda.num_heads = divide(full.kda.num_heads, tp, "linear_attn_config.num_heads", "KDA heads");
  if (uses(full, AttnKind::mla)) c.mla.num_heads = divide(full.mla.num_heads, tp, "num_attention_heads", "MLA heads");
  if (uses(full, FfnKind::dense))
    c.intermediate_size = divide(full.intermediate_size, tp, "intermediate_size", "dense FFN intermediate channels");
  if (uses(full, FfnKind::moe) && options.expert_parallel) {
    // Whole experts per rank: E / tp of them, moe_intermediate_size untouched; the shared experts'
    // intermediate is still split.
    c.moe.expert_parallel_size = tp;
    divide(full.moe.num_experts, tp, "num_experts", "the routed experts (expert parallelism: whole experts per rank)");
    if (full.moe.shared_intermediate() > 0)
      c.moe.shared_intermediate_size = divide(full.moe.shared_intermediate(), tp,
                                              "num_shared_experts * moe_intermediate_size",
                                              "the shared experts' intermediate channels");
  } else if (uses(full, FfnKind::moe)) {
    c.moe.moe_intermediate_size = divide(full.moe.moe_intermediate_size, tp, "moe_intermediate_size",
                                         "every routed and shared expert's intermediate channels");
    if (full.mxfp4.enabled && c.moe.moe_intermediate_size % full.mxfp4.group_size != 0)
      throw core::Error("tensor parallelism: tp=" + std::to_string(tp) + " leaves each rank " +
                        std::to_string(c.moe.moe_intermediate_size) +
                        " of moe_intermediate_size = " + std::to_string(full.moe.moe_intermediate_size) +
                        ", not a multiple of the MXFP4 group size " + std::to_string(full.mxfp4.group_size) +
                        " (each rank's w2 slice must hold whole scale groups along its input)");
  }
  return c;
}

}  // namespace k3::config
