// backends/cuda/memory_pool.cpp: DevicePool, with the graph ownership of blocks (memory_pool.h).
#include "backends/cuda/memory_pool.h"

#include <cuda_runtime.h>

#include <algorithm>
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

// cudaMalloc during a stream capture: the capturing thread's mode (thread-local, see graph.h)
// forbids it as "potentially unsafe", yet a new allocation is exactly what the capture needs (new
// address space that the graph then owns: it is never cudaFree'd while the graph lives). The mode
// is relaxed for this one call and restored after.
cudaError_t malloc_while_capturing(void** p, size_t bytes) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  K3_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  const cudaError_t err = cudaMalloc(p, bytes);
  K3_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  return err;
}
}  // namespace

std::shared_ptr<DevicePool> DevicePool::create(int device) {
  return std::shared_ptr<DevicePool>(new DevicePool(device));
}

DevicePool::~DevicePool() {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [size, p] : free_) (void)cudaFree(p);
  for (auto& [owner, list] : graph_free_)
    for (auto& [size, p] : list) (void)cudaFree(p);
  for (auto& [p, b] : multi_held_) (void)cudaFree(p);
  // Blocks still in use belong to tensors that outlive the pool only through a bug; their
  // keep-alives hold the pool, so this cannot happen through allocate_shared.
  for (auto& [p, b] : in_use_) (void)cudaFree(p);
}

void* DevicePool::take_fitting(std::multimap<size_t, void*>& free_list, size_t want, size_t* size) {
  auto it = free_list.lower_bound(want);
  if (it == free_list.end() || !fits(it->first, want)) return nullptr;
  *size = it->first;
  void* p = it->second;
  free_list.erase(it);
  return p;
}

void* DevicePool::allocate(size_t bytes) {
  const size_t want = round_up(bytes == 0 ? 1 : bytes);
  std::lock_guard<std::mutex> lk(mu_);
  void* p = nullptr;
  size_t size = want;
  if (capturing_ != 0) {  // the capturing graph's own blocks first: they are no use to anyone else
    auto own = graph_free_.find(capturing_);
    if (own != graph_free_.end()) p = take_fitting(own->second, want, &size);
  }
  if (p == nullptr) {
    p = take_fitting(free_, want, &size);
    if (p != nullptr) stats_.cached_bytes -= size;
  }
  if (p == nullptr) {
    size = want;
    int prev = 0;
    K3_CUDA_CHECK(cudaGetDevice(&prev));
    if (prev != device_) K3_CUDA_CHECK(cudaSetDevice(device_));
    cudaError_t err = capturing_ != 0 ? malloc_while_capturing(&p, want) : cudaMalloc(&p, want);
    if (err == cudaErrorMemoryAllocation && capturing_ == 0) {
      (void)cudaGetLastError();
      release_cached_locked();
      err = cudaMalloc(&p, want);
    }
    if (prev != device_) (void)cudaSetDevice(prev);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      throw core::Error("device " + std::to_string(device_) + " out of memory allocating " + std::to_string(want) +
                        " bytes (pool: " + std::to_string(stats_.in_use_bytes) + " bytes in use, " +
                        (capturing_ != 0 ? std::to_string(stats_.cached_bytes) +
                                               " cached bytes kept: blocks cannot be freed during a CUDA graph capture)"
                                         : std::string("cached blocks released)")));
    }
    K3_CUDA_CHECK(err);
    ++stats_.cuda_mallocs;
  }
  Block b;
  b.size = size;
  if (capturing_ != 0) b.owners.push_back(capturing_);
  in_use_.emplace(p, std::move(b));
  stats_.in_use_bytes += size;
  stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  return p;
}

void DevicePool::file_free_locked(void* p, Block b) {
  if (b.owners.empty()) {
    free_.emplace(b.size, p);
    stats_.cached_bytes += b.size;
  } else if (b.owners.size() == 1) {
    graph_free_[b.owners[0]].emplace(b.size, p);
  } else {
    multi_held_.emplace(p, std::move(b));
  }
}

void DevicePool::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lk(mu_);
  auto it = in_use_.find(ptr);
  K3_CHECK(it != in_use_.end(), "DevicePool::deallocate: pointer was not allocated by this pool");
  Block b = std::move(it->second);
  in_use_.erase(it);
  stats_.in_use_bytes -= b.size;
  // Freed during a capture: the captured work may have used it, so the graph owns it from now on.
  if (capturing_ != 0 && std::find(b.owners.begin(), b.owners.end(), capturing_) == b.owners.end())
    b.owners.push_back(capturing_);
  file_free_locked(ptr, std::move(b));
}

std::shared_ptr<void> DevicePool::allocate_shared(size_t bytes) {
  void* p = allocate(bytes);
  std::shared_ptr<DevicePool> self = shared_from_this();
  return std::shared_ptr<void>(p, [self](void* q) { self->deallocate(q); });
}

void DevicePool::release_cached() {
  std::lock_guard<std::mutex> lk(mu_);
  K3_CHECK(capturing_ == 0,
           "DevicePool::release_cached: not allowed during a CUDA graph capture (cudaFree would "
           "invalidate it)");
  release_cached_locked();
}

void DevicePool::release_cached_locked() {
  for (auto& [size, p] : free_) (void)cudaFree(p);
  free_.clear();
  stats_.cached_bytes = 0;
}

PoolStats DevicePool::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  PoolStats s = stats_;
  for (const auto& [owner, list] : graph_free_)
    for (const auto& [size, p] : list) s.graph_cached_bytes += size;
  for (const auto& [p, b] : multi_held_) s.graph_cached_bytes += b.size;
  for (const auto& [p, b] : in_use_)
    if (!b.owners.empty()) s.graph_owned_in_use_bytes += b.size;
  return s;
}

uint64_t DevicePool::new_graph_owner() {
  std::lock_guard<std::mutex> lk(mu_);
  return next_owner_++;
}

void DevicePool::begin_capture(uint64_t owner) {
  std::lock_guard<std::mutex> lk(mu_);
  K3_CHECK(owner != 0, "DevicePool::begin_capture: owner 0 is not a graph");
  K3_CHECK(capturing_ == 0, "DevicePool::begin_capture: graph " + std::to_string(capturing_) +
                                " is already being captured on this pool (one capture at a time)");
  capturing_ = owner;
}

void DevicePool::end_capture() {
  std::lock_guard<std::mutex> lk(mu_);
  capturing_ = 0;
}

uint64_t DevicePool::capturing() const {
  std::lock_guard<std::mutex> lk(mu_);
  return capturing_;
}

void DevicePool::release_graph(uint64_t owner) {
  if (owner == 0) return;
  std::lock_guard<std::mutex> lk(mu_);
  if (capturing_ == owner) capturing_ = 0;
  const auto drop = [owner](std::vector<uint64_t>& owners) {
    owners.erase(std::remove(owners.begin(), owners.end(), owner), owners.end());
  };
  if (auto own = graph_free_.find(owner); own != graph_free_.end()) {
    for (auto& [size, p] : own->second) {
      free_.emplace(size, p);
      stats_.cached_bytes += size;
    }
    graph_free_.erase(own);
  }
  for (auto it = multi_held_.begin(); it != multi_held_.end();) {
    drop(it->second.owners);
    if (it->second.owners.size() < 2) {
      file_free_locked(it->first, std::move(it->second));
      it = multi_held_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& [p, b] : in_use_) drop(b.owners);
}

size_t DevicePool::graph_cached_bytes(uint64_t owner) const {
  std::lock_guard<std::mutex> lk(mu_);
  size_t bytes = 0;
  if (auto own = graph_free_.find(owner); own != graph_free_.end())
    for (const auto& [size, p] : own->second) bytes += size;
  for (const auto& [p, b] : multi_held_)
    if (std::find(b.owners.begin(), b.owners.end(), owner) != b.owners.end()) bytes += b.size;
  return bytes;
}

}  // namespace k3::backends::cuda
