// backends/cuda/context.cpp: Context creation and the device table cache.
#include "backends/cuda/context.h"

#include <algorithm>
#include <string>

#include "backends/cuda/check.h"

namespace k3::backends::cuda {

namespace {
int set_device(int device) {
  K3_CUDA_CHECK(cudaSetDevice(device));
  return device;
}
}  // namespace

// set_device runs first (info_ is the first member), so the stream, pool and handle belong to it.
Context::Context(int device) : info_(device_info(set_device(device))), pool_(DevicePool::create(device)) {
  // Outside the pool: the pool's statistics and graph ownership stay about tensors.
  void* p = nullptr;
  K3_CUDA_CHECK(cudaMalloc(&p, kTickets * sizeof(uint32_t)));
  tickets_ = std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
  K3_CUDA_CHECK(cudaMemset(p, 0, kTickets * sizeof(uint32_t)));
  K3_CUDA_CHECK(cudaDeviceSynchronize());  // the memset is on the legacy stream; stream() may not wait for it
}

std::shared_ptr<Context> Context::create(int device) {
  std::string why;
  const int n = device_count(&why);
  K3_CHECK(n > 0, "no usable CUDA device: " + why);
  K3_CHECK(device >= 0 && device < n,
           "CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(n) + " found)");
  return std::shared_ptr<Context>(new Context(device));
}

const void* Context::device_table(std::span<const uint64_t> words) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the words
  for (uint64_t w : words) h = (h ^ w) * 0x100000001b3ull;
  std::lock_guard<std::mutex> lk(table_mu_);
  for (auto it = tables_.begin(); it != tables_.end(); ++it) {
    if (it->hash == h && it->words.size() == words.size() &&
        std::equal(words.begin(), words.end(), it->words.begin())) {
      tables_.splice(tables_.begin(), tables_, it);
      return tables_.front().device.get();
    }
  }
  Table t;
  t.hash = h;
  t.words.assign(words.begin(), words.end());
  t.device = pool_->allocate_shared(words.size() * sizeof(uint64_t));
  K3_CUDA_CHECK(cudaMemcpyAsync(t.device.get(), t.words.data(), words.size() * sizeof(uint64_t), cudaMemcpyHostToDevice,
                                stream()));
  // The host copy must stay valid until the copy ran: t.words lives in the cache; a table evicted
  // later is freed in stream order (its device block is reused only by later work).
  tables_.push_front(std::move(t));
  if (tables_.size() > 64) tables_.pop_back();
  return tables_.front().device.get();
}

void Context::allow_smem(const void* kernel, size_t bytes) {
  std::lock_guard<std::mutex> lk(kernel_mu_);
  size_t& allowed = smem_allowed_[kernel];
  if (bytes <= allowed) return;
  set_device(info_.index);
  cudaFuncAttributes attr{};
  K3_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  if (bytes + attr.sharedSizeBytes > 48 * 1024)
    K3_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  allowed = bytes;
}

int Context::blocks_per_sm(const void* kernel, int threads, size_t smem) {
  allow_smem(kernel, smem);
  std::lock_guard<std::mutex> lk(kernel_mu_);
  const auto key = std::pair{kernel, smem};
  if (const auto it = blocks_per_sm_.find(key); it != blocks_per_sm_.end()) return it->second;
  int n = 0;
  K3_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem));
  return blocks_per_sm_[key] = std::max(n, 1);
}

}  // namespace k3::backends::cuda
