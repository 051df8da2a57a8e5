// model/run_state.h: per-sequence state carried between forward calls (spec §5.8, §6.3).
//
// The CPU oracle keeps each sequence's caches contiguous: KDA recurrent + conv state per
// KDA layer, and a growable MLA latent cache per MLA layer. (The engine's paged caches
// live in cache/; this is the simple form the oracle and the CLI use.)
#pragma once
#include <cstdint>
#include <vector>

#include "config/k3_config.h"
#include "core/tensor.h"

namespace k3::model {

enum class KvCacheDtype : uint8_t { bf16, fp8_e4m3 };

// One MLA layer's latent cache: rows [c_n (kv_lora) | k_pe (rope)], f32 storage holding
// bf16 values in bf16 mode ("bf16" cache), or fp8 e4m3 codes.
struct MlaLayerCache {
  core::Tensor entries;  // [capacity, kv_lora + rope] f32 or f8_e4m3
  int64_t size = 0;      // rows in use
  // Grows capacity (doubling) so that `rows` more entries fit; keeps contents.
  void reserve_more(int64_t rows);
  core::TensorView rows(int64_t begin, int64_t end) const;  // [end-begin, width]
};

struct SequenceState {
  int64_t num_tokens = 0;               // tokens already folded into the state
  std::vector<core::Tensor> kda_state;  // per layer (undefined for MLA layers): f32 [H, D(v), D(k)]
  std::vector<core::Tensor> conv_state; // per layer: f32 [3 (q,k,v), P, K-1], oldest input first
  std::vector<MlaLayerCache> mla;       // per layer (empty for KDA layers)

  static SequenceState create(const config::K3Config& c, KvCacheDtype kv_dtype);
};

}  // namespace k3::model
