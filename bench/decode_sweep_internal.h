// bench/decode_sweep_internal.h: the parts of the decode sweep (bench/decode_sweep.cpp) that live in
// bench/decode_sweep_context.cpp: the synthetic context, the copy bandwidth and spec §12's step bytes.
#pragma once
#include <chrono>
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/k3_config.h"
#include "core/device_memory.h"
#include "model/kv_storage.h"

namespace k3::bench::sweep_detail {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Random bytes for a tensor of `dtype`: f32 / bf16 values U(-amp, amp); fp8 e4m3 values of magnitude
// 0.25..3.75 (never NaN). Filled on every hardware thread, copied to the device in chunks of 256 MiB.
void fill_random(core::DeviceMemory& memory, const core::TensorView& dst, float amp, uint64_t seed);
// The context of one ctx for every slot: random pages and slots (KDA slot i saved to checkpoint i), and
// sequence i's block table = pages_per_seq pages of one shuffle of all the pages, held in `pages` (the
// tables view it: keep it alive while the states are used).
void build_context(core::DeviceMemory& memory, model::KvStorage& kv, const config::K3Config& c, uint64_t seed, int rank,
                   int64_t pages_per_seq, std::vector<model::SequenceState>& seqs, std::vector<int32_t>& pages);
// Device-to-device copy bandwidth (read + write) of a `bytes` copy, bytes per second (median of 10).
double measure_copy_bandwidth(core::DeviceMemory& memory, int64_t bytes);

// The bytes one decode step must move, by spec §12's counting rules.
struct StepBytes {
  double weights = 0, experts = 0, kda_state = 0, mla_kv = 0, attn_res = 0, embedding_rows = 0;
  double expected_experts_per_layer = 0;
  double total() const { return weights + experts + kda_state + mla_kv + attn_res + embedding_rows; }
  nlohmann::json json() const {
    return {{"weights_non_expert_incl_lm_head", weights},
            {"routed_experts", experts},
            {"kda_state_rw", kda_state},
            {"mla_kv_read_write", mla_kv},
            {"attnres_activations", attn_res},
            {"embedding_rows", embedding_rows},
            {"expected_distinct_experts_per_layer", expected_experts_per_layer},
            {"total", total()}};
  }
};
// dcp > 1: one rank's share of the latent cache (every dcp-th token read, a 1 / dcp chance of the write).
StepBytes step_bytes(const config::K3Config& c, const model::KvStorage& kv, int64_t batch, int64_t ctx, int dcp);

}  // namespace k3::bench::sweep_detail
