// backends/cuda/context.h: what the CUDA ops of one device share: the stream they run on, the
// device memory pool (outputs, scratch), the cuBLASLt handle and a cache of small device tables.
//
// Explicit object, no globals: register_cuda_ops() creates one and the registered ops capture it.
// Every op queues its work on stream() and returns without synchronising.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "backends/cuda/blas_lt.h"
#include "backends/cuda/device.h"
#include "backends/cuda/memory_pool.h"
#include "backends/cuda/stream.h"

namespace k3::backends::cuda {

class Context {
 public:
  // Makes `device` current and creates the stream, pool and cuBLASLt handle for it.
  static std::shared_ptr<Context> create(int device = 0);

  int device() const { return info_.index; }
  const DeviceInfo& info() const { return info_; }
  cudaStream_t stream() const { return stream_.get(); }
  DevicePool& pool() { return *pool_; }
  const std::shared_ptr<DevicePool>& pool_ptr() const { return pool_; }
  BlasLt& blas() { return blas_; }

  // Device scratch of at least `bytes`, returned to the pool when the pointer is released (safe
  // right after queuing the kernels that use it: reuse is in stream order).
  std::shared_ptr<void> scratch(size_t bytes) { return pool_->allocate_shared(bytes); }

  // A device copy of `words` (e.g. per-expert weight pointers), uploaded once and cached by
  // content, so a call with the same table costs a hash and a compare. Keeps the last 64 tables.
  const void* device_table(std::span<const uint64_t> words);

  // Zero-initialised device counters for kernels that elect their last CTA: every CTA takes a
  // ticket (atomicAdd), the one that draws the last number runs the kernel's epilogue and puts the
  // counter back to 0 before it exits, so every counter reads 0 between kernels (also across CUDA
  // graph replays). Kernels on stream() run one after another past their PDL wait, so they never
  // hold one at the same time. kTickets of them, allocated with the context (never during capture).
  static constexpr int kTickets = 64;
  uint32_t* tickets() const { return static_cast<uint32_t*>(tickets_.get()); }

  // Largest dynamic shared memory a block may use after opting in (cudaFuncSetAttribute).
  size_t smem_optin() const { return info_.smem_optin_per_block; }

  // Per-kernel facts on this context's device, asked of the driver once and then remembered (the
  // limit and the occupancy are properties of the function on one device):
  // Raises `kernel`'s dynamic shared memory limit to `bytes` when a launch needs more than the
  // default allows (48 KiB for static + dynamic together) and more than any launch before it.
  void allow_smem(const void* kernel, size_t bytes);
  // Blocks of `threads` threads using `smem` dynamic bytes that fit on one SM at once (at least 1),
  // after allow_smem(kernel, smem).
  int blocks_per_sm(const void* kernel, int threads, size_t smem);

 private:
  explicit Context(int device);
  DeviceInfo info_;
  Stream stream_;
  std::shared_ptr<DevicePool> pool_;
  BlasLt blas_;
  std::shared_ptr<void> tickets_;  // uint32_t [kTickets], zero between kernels

  struct Table {
    uint64_t hash = 0;
    std::vector<uint64_t> words;
    std::shared_ptr<void> device;
  };
  std::mutex table_mu_;
  std::list<Table> tables_;  // most recently used first

  std::mutex kernel_mu_;
  std::map<const void*, size_t> smem_allowed_;                   // kernel -> dynamic bytes allowed
  std::map<std::pair<const void*, size_t>, int> blocks_per_sm_;  // (kernel, smem) -> blocks per SM
};

}  // namespace k3::backends::cuda
