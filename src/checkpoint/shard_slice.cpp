// checkpoint/shard_slice.cpp: cutting a rank's block out of a mapped checkpoint tensor.
#include "checkpoint/shard_slice.h"

#include <cstring>
#include <memory>

#include "core/error.h"

namespace k3::checkpoint {

namespace {

std::string describe(const core::Tensor& t) { return std::string(core::dtype_name(t.dtype())) + " " + t.shape().str(); }

}  // namespace

core::Tensor shard_block(const core::Tensor& full, const core::Shape& local, config::TpShard shard,
                         const std::string& name) {
  config::check_shard(shard);
  const core::Shape& fs = full.shape();
  K3_CHECK(full.view().is_contiguous(), "tensor parallelism: tensor '" + name + "' is not contiguous");
  const auto esize = static_cast<int64_t>(core::dtype_size(full.dtype()));
  const auto aligned = [&](const void* p) {
    return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(esize) == 0;
  };
  if (fs == local) return aligned(full.data<void>()) ? full : core::Tensor::copy_of(full.view());  // replicated
  int axis = -1;
  bool fits = fs.rank() == local.rank();
  for (int d = 0; fits && d < fs.rank(); ++d) {
    if (fs[d] == local[d]) continue;
    fits = axis < 0 && local[d] * shard.size == fs[d];
    axis = d;
  }
  K3_CHECK(fits && axis >= 0,
           "tensor parallelism: tensor '" + name + "' is " + describe(full) + " in the checkpoint but " + local.str() +
               " per rank, which is not a block of one axis split " + std::to_string(shard.size) + " ways");
  // [outer, full[axis], inner] -> [outer, local[axis], inner] at offset rank * local[axis].
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= fs[d];
  for (int d = axis + 1; d < fs.rank(); ++d) inner *= fs[d];
  const int64_t block = local[axis] * inner * esize;  // bytes of the rank's block per outer index
  const int64_t stride = fs[axis] * inner * esize;    // bytes per outer index in the full tensor
  const char* first = static_cast<const char*>(full.data<void>()) + shard.rank * block;
  if (outer == 1 && aligned(first)) {  // one contiguous run: a view sharing the mapping
    auto keep = std::make_shared<core::Tensor>(full);
    return core::Tensor(core::TensorView::contiguous(const_cast<char*>(first), full.dtype(), local), keep);
  }
  core::Tensor out = core::Tensor::zeros(full.dtype(), local);
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(out.data<char>() + o * block, first + o * stride, static_cast<size_t>(block));
  return out;
}

core::Tensor shard_a_log(const core::Tensor& full, int64_t num_heads, config::TpShard shard, const std::string& name) {
  config::check_shard(shard);
  K3_CHECK(full.dtype() == core::DType::f32 && full.shape().rank() == 1 && full.numel() >= num_heads &&
               num_heads % shard.size == 0,
           "tensor parallelism: tensor '" + name + "' is " + describe(full) + ", expected F32 with at least " +
               std::to_string(num_heads) + " entries (one per KDA head) split " + std::to_string(shard.size) + " ways");
  const int64_t heads = num_heads / shard.size;
  core::Tensor out = core::Tensor::zeros(core::DType::f32, {heads});
  // memcpy: a file need not align the tensor for f32.
  std::memcpy(out.data<float>(), static_cast<const char*>(full.data<void>()) + shard.rank * heads * 4,
              static_cast<size_t>(heads) * 4);
  return out;
}

}  // namespace k3::checkpoint
