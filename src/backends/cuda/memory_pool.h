// backends/cuda/memory_pool.h: a caching pool of device memory on plain cudaMalloc (no managed
// memory), so per-step buffers cost no cudaMalloc/cudaFree after warm-up.
//
// Blocks are reused in stream order: a block freed while kernels on the pool's stream may still
// read it can be handed out again only to work queued later on that same stream. Users of another
// stream must synchronise before freeing. Thread-safe.
//
// CUDA graphs (backends/cuda/graph.h): a replay writes into every block the captured work used,
// long after the capture freed them, so those blocks must never go to anyone else while the graph
// lives. Between begin_capture(owner) and end_capture() every block the pool hands out, and every
// block freed (whoever allocated it: the captured work may have used it), is tagged as owned by
// that graph. An owned block that is freed, during or after the capture, is held back for its
// graph: later allocations of the same capture may reuse it (the captured work is one
// stream-ordered chain), allocations outside it never see it. release_graph(owner), when the graph
// is destroyed, returns the graph's free blocks to the shared cache and makes its still-live
// blocks ordinary. A block used by two live graphs (freed during the second one's capture) is
// held until both are gone.
//
// What the pool cannot see: a block allocated BEFORE a capture, read or written by the captured
// work and freed after it (weights, caches, inputs). Whoever captures keeps those alive as long as
// the graph (Graph's documentation says so too).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace k3::backends::cuda {

struct PoolStats {
  size_t in_use_bytes = 0;  // handed out, not yet returned (graph-owned ones included)
  size_t cached_bytes = 0;  // returned, kept for reuse by anyone (the shared cache)
  size_t peak_in_use_bytes = 0;
  size_t cuda_mallocs = 0;              // cudaMalloc calls so far (cache misses)
  size_t graph_cached_bytes = 0;        // returned blocks held back for live graphs (reused only by them)
  size_t graph_owned_in_use_bytes = 0;  // handed-out blocks owned by a live graph
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
  // was asked, in use and cached. During a capture the capturing graph's own free blocks are
  // tried first, and an out-of-memory is reported at once (cudaFree may not run while capturing).
  void* allocate(size_t bytes);
  // Returns a block from allocate() to the cache (or to its graph's list). Unknown pointers throw
  // core::Error.
  void deallocate(void* ptr);
  // A shared_ptr owning `bytes` of pool memory (returned on last release). Keeps the pool alive.
  std::shared_ptr<void> allocate_shared(size_t bytes);
  // cudaFree's every block of the shared cache (blocks held for live graphs stay).
  void release_cached();
  PoolStats stats() const;
  int device() const { return device_; }

  // ---- graph ownership (called by Graph; tests may call them directly)
  // A fresh owner id (never 0) for one graph of this pool.
  uint64_t new_graph_owner();
  // Starts tagging blocks for `owner`. Throws core::Error when a capture is already active on the
  // pool (one capture at a time) or owner is 0.
  void begin_capture(uint64_t owner);
  // Stops tagging (the owner's blocks stay owned until release_graph). No-op without a capture.
  void end_capture();
  // The owner being captured now, 0 when none.
  uint64_t capturing() const;
  // The graph `owner` was destroyed: its free blocks join the shared cache (in stream order, like
  // any freed block: a replay queued earlier on the pool's stream still finishes first) and its
  // live blocks become ordinary. Also ends the capture when `owner` is the one being captured.
  void release_graph(uint64_t owner);
  // Bytes of free blocks held for `owner` (tests, diagnostics).
  size_t graph_cached_bytes(uint64_t owner) const;

 private:
  explicit DevicePool(int device) : device_(device) {}
  void release_cached_locked();
  // Removes and returns a block of `free_list` that fits `want` (nullptr when none); *size gets its size.
  static void* take_fitting(std::multimap<size_t, void*>& free_list, size_t want, size_t* size);

  struct Block {
    size_t size = 0;
    std::vector<uint64_t> owners;  // live graphs that own it (usually none or one)
  };
  // Files a freed block: the shared cache, its one graph's list, or held for several graphs.
  void file_free_locked(void* p, Block b);

  int device_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;        // shared cache: size -> block, best fit by lower_bound
  std::unordered_map<void*, Block> in_use_;  // handed-out block -> size, owners
  std::unordered_map<uint64_t, std::multimap<size_t, void*>> graph_free_;  // free blocks of one graph
  std::unordered_map<void*, Block> multi_held_;  // free blocks owned by two or more live graphs
  uint64_t capturing_ = 0;
  uint64_t next_owner_ = 1;
  PoolStats stats_;  // in_use_bytes, cached_bytes (shared cache only), peak, cuda_mallocs
};

}  // namespace k3::backends::cuda
