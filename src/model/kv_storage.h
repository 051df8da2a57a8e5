// model/kv_storage.h: the memory behind the caches, addressed by ids that cache/ hands out.
//
// cache/ does the bookkeeping (which block, slot or checkpoint belongs to whom, ref counts,
// prefix hashes, LRU) and never touches data; KvStorage holds the data, on the model's
// device, and knows nothing of requests:
//   MLA latent pages:  per MLA layer [num_blocks, block_size, kv_lora + rope]  (bf16-as-f32 or fp8)
//                      block b holds block_size consecutive tokens of a sequence in EVERY MLA layer
//   KDA slots:         per KDA layer state [num_slots, H, D(v), D(k)] f32 and conv [num_slots, 3, P, K-1]
//   KDA checkpoints:   the same shapes with num_checkpoints rows: a copy of a slot (all KDA
//                      layers) taken at a block-aligned token boundary, for prefix-cache hits
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "config/k3_config.h"
#include "core/device_memory.h"
#include "core/tensor.h"
#include "kernels/common.h"

namespace k3::model {

enum class KvCacheDtype : uint8_t { bf16, fp8_e4m3 };

struct KvStorageConfig {
  int32_t num_blocks = 0;       // MLA pages
  int32_t block_size = 16;      // tokens per page
  int32_t num_slots = 0;        // KDA state slots (one per running sequence)
  int32_t num_checkpoints = 0;  // KDA state checkpoints (prefix cache)
  KvCacheDtype kv_dtype = KvCacheDtype::bf16;
};

class KvStorage {
 public:
  // Everything lives in `memory` (the model's device). The conv state and bf16 MLA pages take the
  // activation dtype of that device and precision (kernels::activation_dtype).
  KvStorage(const config::K3Config& config, const KvStorageConfig& storage,
            std::shared_ptr<core::DeviceMemory> memory = core::make_host_memory(),
            kernels::Precision precision = kernels::Precision::bf16);

  const KvStorageConfig& storage_config() const { return cfg_; }
  // Bytes one page id costs (all MLA layers), one slot and one checkpoint (all KDA layers).
  static int64_t bytes_per_block(const config::K3Config& c, int32_t block_size, KvCacheDtype dtype);
  static int64_t bytes_per_kda_state(const config::K3Config& c);

  // [num_blocks, block_size, width] pages of an MLA layer.
  const core::Tensor& mla_pages(int layer) const;
  // [H, D, D] recurrent state and [3, P, K-1] conv state of a KDA layer in a slot.
  core::TensorView kda_state(int layer, int32_t slot) const;
  core::TensorView conv_state(int layer, int32_t slot) const;
  // Every slot of a KDA layer: state [num_slots, H, D, D] and conv state [num_slots, 3, P, K-1]
  // (the batched ops index them with SeqBatch::slot).
  const core::Tensor& kda_states(int layer) const;
  const core::Tensor& conv_states(int layer) const;

  void reset_slot(int32_t slot);                              // zeroes every KDA layer's state
  void save_checkpoint(int32_t slot, int32_t checkpoint);     // slot -> checkpoint
  void restore_checkpoint(int32_t checkpoint, int32_t slot);  // checkpoint -> slot

 private:
  void check_slot(int32_t slot) const;
  void check_checkpoint(int32_t checkpoint) const;
  void copy_row(const core::Tensor& src, int64_t src_row, const core::Tensor& dst, int64_t dst_row);
  config::K3Config config_;
  KvStorageConfig cfg_;
  std::shared_ptr<core::DeviceMemory> memory_;
  std::vector<core::Tensor> mla_pages_;   // per layer (undefined for KDA layers)
  std::vector<core::Tensor> kda_state_;   // per layer [num_slots, H, D, D]
  std::vector<core::Tensor> conv_state_;  // per layer [num_slots, 3, P, K-1]
  std::vector<core::Tensor> ckpt_state_;  // per layer [num_checkpoints, H, D, D]
  std::vector<core::Tensor> ckpt_conv_;   // per layer [num_checkpoints, 3, P, K-1]
};

// What a sequence owns in the storage. Its block table belongs to whoever allocates the pages (the
// engine's cache manager, which hands it over in each step's plan; a LocalCache; a test): the state
// holds a view of it, which must cover num_tokens + the step's tokens and stay valid through the
// forward (and the commit of a verify step).
struct SequenceState {
  int64_t num_tokens = 0;                // tokens already folded into the state
  int32_t kda_slot = -1;                 // KDA slot (every KDA layer)
  std::span<const int32_t> block_table;  // MLA page ids, in token order
};

}  // namespace k3::model
