// model/kv_storage.cpp: KvStorage.
#include "model/kv_storage.h"

#include <cstring>

namespace k3::model {

namespace {
// Row `r` of a [rows, ...] tensor as a view with the remaining dims.
core::TensorView slice0(const core::Tensor& t, int64_t r) { return t.view().row(r); }
}  // namespace

void KvStorage::copy_row(const core::Tensor& src, int64_t src_row, const core::Tensor& dst, int64_t dst_row) {
  memory_->copy(slice0(dst, dst_row), slice0(src, src_row));
}

KvStorage::KvStorage(const config::K3Config& config, const KvStorageConfig& storage,
                     std::shared_ptr<core::DeviceMemory> memory, kernels::Precision precision)
    : config_(config), cfg_(storage), memory_(std::move(memory)) {
  K3_CHECK(memory_ != nullptr, "KvStorage: no device memory");
  const core::DType act = kernels::activation_dtype(memory_->device(), precision);
  const core::DType page = cfg_.kv_dtype == KvCacheDtype::fp8_e4m3 ? core::DType::f8_e4m3 : act;
  K3_CHECK(cfg_.num_blocks >= 0 && cfg_.block_size >= 1 && cfg_.num_slots >= 0 && cfg_.num_checkpoints >= 0,
           "KvStorage: sizes must be non-negative and block_size >= 1");
  const int layers = config_.num_hidden_layers;
  mla_pages_.resize(layers);
  kda_state_.resize(layers);
  conv_state_.resize(layers);
  ckpt_state_.resize(layers);
  ckpt_conv_.resize(layers);
  const int64_t H = config_.kda.num_heads, D = config_.kda.head_dim, P = config_.kda.proj_dim();
  const int64_t K1 = config_.kda.short_conv_kernel_size - 1;
  for (int l = 0; l < layers; ++l) {
    if (config_.attn_kind(l) == config::AttnKind::mla) {
      mla_pages_[l] = memory_->zeros(page, {cfg_.num_blocks, cfg_.block_size, config_.mla.cache_dim()});
    } else {
      kda_state_[l] = memory_->zeros(core::DType::f32, {cfg_.num_slots, H, D, D});
      conv_state_[l] = memory_->zeros(act, {cfg_.num_slots, 3, P, K1});
      ckpt_state_[l] = memory_->zeros(core::DType::f32, {cfg_.num_checkpoints, H, D, D});
      ckpt_conv_[l] = memory_->zeros(act, {cfg_.num_checkpoints, 3, P, K1});
    }
  }
}

int64_t KvStorage::bytes_per_block(const config::K3Config& c, int32_t block_size, KvCacheDtype dtype) {
  int64_t mla_layers = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) mla_layers += c.attn_kind(l) == config::AttnKind::mla;
  const int64_t elem = dtype == KvCacheDtype::fp8_e4m3 ? 1 : 2;  // the device layout (bf16 or fp8)
  return mla_layers * block_size * c.mla.cache_dim() * elem;
}

int64_t KvStorage::bytes_per_kda_state(const config::K3Config& c) {
  int64_t kda_layers = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) kda_layers += c.attn_kind(l) == config::AttnKind::kda;
  const int64_t H = c.kda.num_heads, D = c.kda.head_dim, P = c.kda.proj_dim();
  const int64_t K1 = c.kda.short_conv_kernel_size - 1;
  return kda_layers * (H * D * D * 4 + 3 * P * K1 * 2);  // fp32 state + bf16 conv state
}

const core::Tensor& KvStorage::mla_pages(int layer) const {
  const core::Tensor& t = mla_pages_.at(static_cast<size_t>(layer));
  K3_CHECK(t.defined(), "KvStorage: layer " + std::to_string(layer) + " is not an MLA layer");
  return t;
}

void KvStorage::check_slot(int32_t slot) const {
  K3_CHECK(slot >= 0 && slot < cfg_.num_slots,
           "KvStorage: KDA slot " + std::to_string(slot) + " out of range [0, " + std::to_string(cfg_.num_slots) + ")");
}

void KvStorage::check_checkpoint(int32_t ckpt) const {
  K3_CHECK(ckpt >= 0 && ckpt < cfg_.num_checkpoints, "KvStorage: KDA checkpoint " + std::to_string(ckpt) +
                                                         " out of range [0, " + std::to_string(cfg_.num_checkpoints) +
                                                         ")");
}

core::TensorView KvStorage::kda_state(int layer, int32_t slot) const {
  check_slot(slot);
  const core::Tensor& t = kda_state_.at(static_cast<size_t>(layer));
  K3_CHECK(t.defined(), "KvStorage: layer " + std::to_string(layer) + " is not a KDA layer");
  return slice0(t, slot);
}

core::TensorView KvStorage::conv_state(int layer, int32_t slot) const {
  check_slot(slot);
  const core::Tensor& t = conv_state_.at(static_cast<size_t>(layer));
  K3_CHECK(t.defined(), "KvStorage: layer " + std::to_string(layer) + " is not a KDA layer");
  return slice0(t, slot);
}

const core::Tensor& KvStorage::kda_states(int layer) const {
  const core::Tensor& t = kda_state_.at(static_cast<size_t>(layer));
  K3_CHECK(t.defined(), "KvStorage: layer " + std::to_string(layer) + " is not a KDA layer");
  return t;
}

const core::Tensor& KvStorage::conv_states(int layer) const {
  const core::Tensor& t = conv_state_.at(static_cast<size_t>(layer));
  K3_CHECK(t.defined(), "KvStorage: layer " + std::to_string(layer) + " is not a KDA layer");
  return t;
}

void KvStorage::reset_slot(int32_t slot) {
  check_slot(slot);
  for (size_t l = 0; l < kda_state_.size(); ++l) {
    if (!kda_state_[l].defined()) continue;
    for (const core::Tensor* t : {&kda_state_[l], &conv_state_[l]}) memory_->fill_bytes(slice0(*t, slot), 0);
  }
}

void KvStorage::save_checkpoint(int32_t slot, int32_t checkpoint) {
  check_slot(slot);
  check_checkpoint(checkpoint);
  for (size_t l = 0; l < kda_state_.size(); ++l) {
    if (!kda_state_[l].defined()) continue;
    copy_row(kda_state_[l], slot, ckpt_state_[l], checkpoint);
    copy_row(conv_state_[l], slot, ckpt_conv_[l], checkpoint);
  }
}

void KvStorage::restore_checkpoint(int32_t checkpoint, int32_t slot) {
  check_slot(slot);
  check_checkpoint(checkpoint);
  for (size_t l = 0; l < kda_state_.size(); ++l) {
    if (!kda_state_[l].defined()) continue;
    copy_row(ckpt_state_[l], checkpoint, kda_state_[l], slot);
    copy_row(ckpt_conv_[l], checkpoint, conv_state_[l], slot);
  }
}

}  // namespace k3::model
