// backends/cuda/device.h: which CUDA devices exist and what they are (name, SMs, L2, memory).
#pragma once
#include <cstddef>
#include <string>

namespace k3::backends::cuda {

// Number of usable CUDA devices. Never throws: with no driver, no GPU or a failing runtime it
// returns 0 and, when `why` is given, says why (for test skip messages and supports() reasons).
int device_count(std::string* why = nullptr);

struct DeviceInfo {
  int index = 0;
  std::string name;                             // e.g. "NVIDIA H200"
  int cc_major = 0, cc_minor = 0;               // compute capability (9.0 on Hopper)
  int sm_count = 0;                             // multiprocessors
  size_t l2_bytes = 0;                          // L2 cache size
  size_t global_bytes = 0;                      // device memory
  size_t smem_optin_per_block = 0;              // largest dynamic shared memory a block may opt in to
  int driver_version = 0, runtime_version = 0;  // e.g. 13000 = 13.0
};
DeviceInfo device_info(int device);

}  // namespace k3::backends::cuda
