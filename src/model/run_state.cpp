// model/run_state.cpp: SequenceState creation and MLA cache growth.
#include "model/run_state.h"

#include <algorithm>
#include <cstring>

namespace k3::model {

void MlaLayerCache::reserve_more(int64_t rows) {
  const int64_t need = size + rows;
  const int64_t cap = entries.dim(0);
  if (need <= cap) return;
  const int64_t new_cap = std::max<int64_t>(need, std::max<int64_t>(16, cap * 2));
  core::Tensor grown = core::Tensor::zeros(entries.dtype(), {new_cap, entries.dim(1)});
  if (size > 0)
    std::memcpy(grown.data<void>(), entries.data<void>(),
                static_cast<size_t>(size * entries.dim(1)) * core::dtype_size(entries.dtype()));
  entries = std::move(grown);
}

core::TensorView MlaLayerCache::rows(int64_t begin, int64_t end) const {
  K3_CHECK(0 <= begin && begin <= end && end <= entries.dim(0), "MLA cache rows out of range");
  const int64_t width = entries.dim(1);
  char* base = static_cast<char*>(entries.data<void>()) +
               begin * width * static_cast<int64_t>(core::dtype_size(entries.dtype()));
  return core::TensorView::contiguous(base, entries.dtype(), {end - begin, width});
}

SequenceState SequenceState::create(const config::K3Config& c, KvCacheDtype kv_dtype) {
  SequenceState s;
  const int layers = c.num_hidden_layers;
  s.kda_state.resize(layers);
  s.conv_state.resize(layers);
  s.mla.resize(layers);
  const int64_t H = c.kda.num_heads, D = c.kda.head_dim, P = c.kda.proj_dim();
  const int64_t K = c.kda.short_conv_kernel_size;
  for (int l = 0; l < layers; ++l) {
    if (c.attn_kind(l) == config::AttnKind::kda) {
      s.kda_state[l] = core::Tensor::zeros(core::DType::f32, {H, D, D});
      s.conv_state[l] = core::Tensor::zeros(core::DType::f32, {3, P, K - 1});
    } else {
      const auto dt = kv_dtype == KvCacheDtype::fp8_e4m3 ? core::DType::f8_e4m3 : core::DType::f32;
      s.mla[l].entries = core::Tensor::zeros(dt, {0, c.mla.cache_dim()});
    }
  }
  return s;
}

}  // namespace k3::model
