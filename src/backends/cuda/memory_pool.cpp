// backends/cuda/memory_pool.cpp: DevicePool.
#include "backends/cuda/memory_pool.h"

#include <cuda_runtime.h>

#include <string>

#include "backends/cuda/check.h"

namespace k3::backends::cuda {

namespace {
constexpr size_t kGranule = 512;
size_t round_up(size_t n) { return (n + kGranule - 1) / kGranule * kGranule; }
// A cached block serves a request when it wastes at most half of itself (small requests must not
// pin huge blocks); blocks above 64 MiB must match within 1/8.
bool fits(size_t block, size_t want) {
  if (block < want) return false;
  return want >= (size_t{64} << 20) ? block - want <= block / 8 : block <= 2 * want;
}
}  // namespace

std::shared_ptr<DevicePool> DevicePool::create(int device) {
  return std::shared_ptr<DevicePool>(new DevicePool(device));
}

DevicePool::~DevicePool() {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [size, p] : free_) (void)cudaFree(p);
  // Blocks still in use belong to tensors that outlive the pool only through a bug; their
  // keep-alives hold the pool, so this cannot happen through allocate_shared.
  for (auto& [p, size] : in_use_) (void)cudaFree(p);
}

void* DevicePool::allocate(size_t bytes) {
  const size_t want = round_up(bytes == 0 ? 1 : bytes);
  std::lock_guard<std::mutex> lk(mu_);
  auto it = free_.lower_bound(want);
  void* p = nullptr;
  size_t size = want;
  if (it != free_.end() && fits(it->first, want)) {
    size = it->first;
    p = it->second;
    free_.erase(it);
    stats_.cached_bytes -= size;
  } else {
    int prev = 0;
    K3_CUDA_CHECK(cudaGetDevice(&prev));
    if (prev != device_) K3_CUDA_CHECK(cudaSetDevice(device_));
    cudaError_t err = cudaMalloc(&p, want);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      release_cached_locked();
      err = cudaMalloc(&p, want);
    }
    if (prev != device_) (void)cudaSetDevice(prev);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      throw core::Error("device " + std::to_string(device_) + " out of memory allocating " +
                        std::to_string(want) + " bytes (pool: " + std::to_string(stats_.in_use_bytes) +
                        " bytes in use, cached blocks released)");
    }
    K3_CUDA_CHECK(err);
    ++stats_.cuda_mallocs;
  }
  in_use_.emplace(p, size);
  stats_.in_use_bytes += size;
  if (stats_.in_use_bytes > stats_.peak_in_use_bytes) stats_.peak_in_use_bytes = stats_.in_use_bytes;
  return p;
}

void DevicePool::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lk(mu_);
  auto it = in_use_.find(ptr);
  K3_CHECK(it != in_use_.end(), "DevicePool::deallocate: pointer was not allocated by this pool");
  const size_t size = it->second;
  in_use_.erase(it);
  stats_.in_use_bytes -= size;
  free_.emplace(size, ptr);
  stats_.cached_bytes += size;
}

std::shared_ptr<void> DevicePool::allocate_shared(size_t bytes) {
  void* p = allocate(bytes);
  std::shared_ptr<DevicePool> self = shared_from_this();
  return std::shared_ptr<void>(p, [self](void* q) { self->deallocate(q); });
}

void DevicePool::release_cached() {
  std::lock_guard<std::mutex> lk(mu_);
  release_cached_locked();
}

void DevicePool::release_cached_locked() {
  for (auto& [size, p] : free_) (void)cudaFree(p);
  free_.clear();
  stats_.cached_bytes = 0;
}

PoolStats DevicePool::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

}  // namespace k3::backends::cuda
