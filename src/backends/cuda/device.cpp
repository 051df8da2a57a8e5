// backends/cuda/device.cpp: device discovery.
#include "backends/cuda/device.h"

#include <cuda_runtime.h>

#include "backends/cuda/check.h"

namespace k3::backends::cuda {

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear it: the caller carries on without CUDA
    if (why)
      *why = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
    return 0;
  }
  if (n == 0 && why) *why = "cudaGetDeviceCount reports 0 CUDA devices";
  return n;
}

DeviceInfo device_info(int device) {
  cudaDeviceProp p{};
  K3_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  DeviceInfo d;
  d.index = device;
  d.name = p.name;
  d.cc_major = p.major;
  d.cc_minor = p.minor;
  d.sm_count = p.multiProcessorCount;
  d.l2_bytes = static_cast<size_t>(p.l2CacheSize);
  d.global_bytes = p.totalGlobalMem;
  d.smem_optin_per_block = p.sharedMemPerBlockOptin;
  K3_CUDA_CHECK(cudaDriverGetVersion(&d.driver_version));
  K3_CUDA_CHECK(cudaRuntimeGetVersion(&d.runtime_version));
  return d;
}

}  // namespace k3::backends::cuda
