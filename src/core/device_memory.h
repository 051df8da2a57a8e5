// core/device_memory.h: what model code needs from a device besides its ops: allocation, fills,
// copies and transfers, behind one interface so the same model code runs on the CPU and on CUDA.
//
// All work is queued in the device's order (one stream on CUDA); download_f32() and synchronize()
// wait for it. Views may be contiguous or row-strided rank 2 (inner stride 1) where noted.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace k3::core {

// Device work recorded once and replayed (a CUDA graph): every replay queues the same kernels on
// the same addresses, so inputs change by rewriting those buffers in place.
class CapturedWork {
 public:
  virtual ~CapturedWork() = default;
  virtual void replay() = 0;
  virtual size_t kernel_launches() const = 0;  // kernels one replay launches
};

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  virtual Device device() const = 0;
  // Uninitialised contiguous tensor on this device.
  virtual Tensor empty(DType dtype, Shape shape) = 0;
  // Sets every byte of `dst` (contiguous, or row-strided rank 2) to `byte`. 0xff makes f32, bf16
  // and fp8 e4m3 values NaN (poisoned buffers) and integers -1.
  virtual void fill_bytes(const TensorView& dst, uint8_t byte) = 0;
  // A new tensor on this device holding a host view's values: same dtype, or f32 -> bf16
  // (round to nearest even) when `as` is bf16.
  virtual Tensor upload(const TensorView& host, DType as) = 0;
  Tensor upload(const TensorView& host) { return upload(host, host.dtype); }
  // dst (this device, contiguous) = host (a contiguous CPU view of the same dtype and shape);
  // returns once the host view may be reused.
  virtual void copy_from_host(const TensorView& dst, const TensorView& host) = 0;
  // dst = src, both on this device, same dtype and shape (contiguous or row-strided rank 2).
  virtual void copy(const TensorView& dst, const TensorView& src) = 0;
  // A new contiguous CPU f32 tensor with the values of `src` (f32, bf16 or f8_e4m3 on this
  // device); waits for queued work.
  virtual Tensor download_f32(const TensorView& src) = 0;
  // Waits for everything queued on this device.
  virtual void synchronize() = 0;
  // Makes this memory's device the calling thread's current one (CUDA: cudaSetDevice), so work
  // queued next lands on it whatever device the thread used before (several GPUs in one process:
  // tensor-parallel ranks, or a TP runner created after a one-GPU model on the same thread).
  virtual void make_current() {}
  // Records the device work `body` queues without running it (CUDA graphs); body may allocate
  // through empty() (the capture keeps those blocks for its replays) but must not transfer to or
  // from the host or synchronize. Devices that cannot capture return nullptr.
  virtual std::unique_ptr<CapturedWork> capture(const std::function<void()>& body) {
    (void)body;
    return nullptr;
  }

  // Stream-ordered timestamps for profiling (k3bench_decode_gpu --profile): mark() records the
  // moment the work queued so far has run (CPU: now; CUDA: an event on the stream; never call it
  // inside capture()); take_marks_ms() waits for the device and returns the marks since the last
  // take, in ms after the first of them. A device without marks returns none.
  virtual void mark() {}
  virtual std::vector<double> take_marks_ms() { return {}; }

  Tensor zeros(DType dtype, Shape shape) {
    Tensor t = empty(dtype, shape);
    fill_bytes(t.view(), 0);
    return t;
  }
};

// A new CPU memory (plain heap tensors, its own profiling marks); the caller owns it.
std::shared_ptr<DeviceMemory> make_host_memory();

}  // namespace k3::core
