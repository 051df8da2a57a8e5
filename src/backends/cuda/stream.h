// backends/cuda/stream.h: owning wrappers of a CUDA stream and a CUDA event (checked calls).
#pragma once
#include <cuda_runtime.h>

namespace k3::backends::cuda {

// A non-blocking stream (it does not synchronise with the legacy default stream).
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  Stream(Stream&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }

  cudaStream_t get() const { return s_; }
  // Waits for all work queued so far; asynchronous kernel faults surface here as core::Error.
  void synchronize() const;

 private:
  cudaStream_t s_ = nullptr;
};

// An event for ordering (wait) and timing (elapsed_ms).
class Event {
 public:
  explicit Event(bool timing = true);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& o) noexcept : e_(o.e_) { o.e_ = nullptr; }

  cudaEvent_t get() const { return e_; }
  void record(cudaStream_t stream);
  void synchronize() const;
  // Milliseconds from `start` to this event (both recorded and complete).
  float elapsed_ms_since(const Event& start) const;

 private:
  cudaEvent_t e_ = nullptr;
};

}  // namespace k3::backends::cuda
