// backends/cuda/stream.cpp: Stream and Event.
#include "backends/cuda/stream.h"

#include "backends/cuda/check.h"

namespace k3::backends::cuda {

Stream::Stream() { K3_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
Stream::~Stream() {
  if (s_) (void)cudaStreamDestroy(s_);  // destructors never throw; a fault was reported already
}
void Stream::synchronize() const { K3_CUDA_CHECK(cudaStreamSynchronize(s_)); }

Event::Event(bool timing) {
  K3_CUDA_CHECK(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
}
Event::~Event() {
  if (e_) (void)cudaEventDestroy(e_);
}
void Event::record(cudaStream_t stream) { K3_CUDA_CHECK(cudaEventRecord(e_, stream)); }
void Event::synchronize() const { K3_CUDA_CHECK(cudaEventSynchronize(e_)); }
float Event::elapsed_ms_since(const Event& start) const {
  float ms = 0.0f;
  K3_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e_, e_));
  return ms;
}

}  // namespace k3::backends::cuda
