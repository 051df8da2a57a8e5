// backends/cuda/memory_pool.h: a caching pool of device memory on plain cudaMalloc (no managed
// memory), so per-step buffers cost no cudaMalloc/cudaFree after warm-up.
//
// Blocks are reused in stream order: a block freed while kernels on the pool's stream may still
// read it can be handed out again only to work queued later on that same stream. Users of another
// stream must synchronise before freeing. Thread-safe.
#pragma once
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace k3::backends::cuda {

struct PoolStats {
  size_t in_use_bytes = 0;    // handed out, not yet returned
  size_t cached_bytes = 0;    // returned, kept for reuse
  size_t peak_in_use_bytes = 0;
  size_t cuda_mallocs = 0;    // cudaMalloc calls so far (cache misses)
};

class DevicePool : public std::enable_shared_from_this<DevicePool> {
 public:
  // A pool for `device`; blocks are cudaMalloc'd with that device current.
  static std::shared_ptr<DevicePool> create(int device);
  ~DevicePool();
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  // At least `bytes` (rounded up to 512), 256-byte aligned. On cudaErrorMemoryAllocation the
  // cached blocks are freed and the allocation retried once; then a core::Error says how much
  // was asked, in use and cached.
  void* allocate(size_t bytes);
  // Returns a block from allocate() to the cache. Unknown pointers throw core::Error.
  void deallocate(void* ptr);
  // A shared_ptr owning `bytes` of pool memory (returned on last release). Keeps the pool alive.
  std::shared_ptr<void> allocate_shared(size_t bytes);
  // cudaFree's every cached (not in use) block.
  void release_cached();
  PoolStats stats() const;
  int device() const { return device_; }

 private:
  explicit DevicePool(int device) : device_(device) {}
  void release_cached_locked();

  int device_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;          // size -> block, best fit by lower_bound
  std::unordered_map<void*, size_t> in_use_;   // block -> size
  PoolStats stats_;
};

}  // namespace k3::backends::cuda
