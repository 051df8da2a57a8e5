// comm/custom_allreduce_kernels.cuh: device pieces the custom all-reduce kernels share (included by
// comm/custom_*.cu only): the LL line transport, the per-call sequence number kept in device
// memory, and the launch parameters.
//
// An LL line is 16 bytes {data0, flag, data1, flag} (uint32 words) written with one vector store:
// each 8-byte half {data, flag} lands whole, so a reader that sees both flags equal to the call's
// sequence number has that line's 8 payload bytes (2 f32 or 4 bf16). Lines live in the reader's
// buffer: [parity (seq & 1)][lines of the call's layout]; the reader zeroes every line it read.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "comm/custom_allreduce.h"

namespace k3::comm {

// The group's memory: per rank r (on devices[r]) an LL buffer of 2 * parity_lines lines and two
// counter words {counter, arrive}; every rank's kernels get all n buffer pointers (peer access).
struct CustomShared {
  std::vector<int> devices;         // [n]
  std::vector<int> sm_counts;       // [n]
  std::vector<uint4*> buffers;      // [n]
  std::vector<uint32_t*> counters;  // [n], 2 words each
  int64_t max_bytes = 0;
  int64_t parity_lines = 0;
  ~CustomShared();
};

}  // namespace k3::comm

namespace k3::comm::custom_detail {

// Threads of the one-shot / two-stage kernels (grid-stride over lines, at most one block per SM).
constexpr int kLineThreads = 256;
// A rank waiting this long for a peer's line gives up: the kernel traps (a sticky CUDA error on
// that rank) instead of hanging the process forever on a rank that never came.
constexpr uint64_t kWatchdogNs = 20ull * 1000 * 1000 * 1000;

// What every kernel of a rank needs to reach the group (plain values: lives in kernel parameters).
struct Link {
  uint4* buffers[kCustomMaxRanks];  // every rank's LL buffer (peer pointers), parity 0 at the base
  int64_t parity_lines = 0;         // lines per parity half of a buffer
  uint32_t* counter = nullptr;      // this rank's sequence number of the last completed call
  uint32_t* arrive = nullptr;       // blocks of the current call that finished (reset by the last)
  int rank = 0, n = 0;
};

// The Link of `rank` (host side).
inline Link make_link(const CustomShared& g, int rank) {
  Link k;
  for (size_t q = 0; q < g.buffers.size(); ++q) k.buffers[q] = g.buffers[q];
  k.parity_lines = g.parity_lines;
  k.counter = g.counters[static_cast<size_t>(rank)];
  k.arrive = k.counter + 1;
  k.rank = rank;
  k.n = static_cast<int>(g.buffers.size());
  return k;
}

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint4 ll_load(const uint4* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

__device__ __forceinline__ void ll_store(uint4* p, uint4 v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

__device__ __forceinline__ uint4 ll_line(uint2 payload, uint32_t seq) {
  return make_uint4(payload.x, seq, payload.y, seq);
}

// Spins until the line at p carries `seq` in both flags; returns its payload. Traps after
// kWatchdogNs (a peer that never arrives).
__device__ __forceinline__ uint2 ll_wait(const uint4* p, uint32_t seq) {
  uint4 v = ll_load(p);
  if (v.y != seq || v.w != seq) {
    const uint64_t t0 = global_ns();
    uint32_t spins = 0;
    do {
      v = ll_load(p);
      if ((++spins & 1023u) == 0 && global_ns() - t0 > kWatchdogNs) {
        printf("comm::custom_allreduce: no data from a peer for 20 s (seq %u); trapping\n", seq);
        __trap();
      }
    } while (v.y != seq || v.w != seq);
  }
  return make_uint2(v.x, v.z);
}

// ll_wait, then zero the line: no flag of this call stays behind to match a later call.
__device__ __forceinline__ uint2 ll_take(uint4* p, uint32_t seq) {
  const uint2 d = ll_wait(p, seq);
  ll_store(p, make_uint4(0, 0, 0, 0));
  return d;
}

// The sequence number of this call: the last completed call's + 1, skipping 0 (a zeroed line's
// flag). Read once per block by thread 0 and shared; every thread calls it.
__device__ __forceinline__ uint32_t seq_begin(const Link& k, uint32_t* s_seq) {
  if (threadIdx.x == 0) {
    uint32_t s = *reinterpret_cast<volatile const uint32_t*>(k.counter) + 1u;
    *s_seq = s == 0 ? 1u : s;
  }
  __syncthreads();
  return *s_seq;
}

// The last block of the grid to get here publishes `seq` as the last completed call: every block
// has read the counter (seq_begin) before it arrives, so none sees the new value. The next kernel
// on the stream reads it (kernel boundaries order the writes).
__device__ __forceinline__ void seq_end(const Link& k, uint32_t seq) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    const uint32_t blocks = gridDim.x * gridDim.y * gridDim.z;
    if (atomicAdd(k.arrive, 1u) == blocks - 1) {
      *reinterpret_cast<volatile uint32_t*>(k.arrive) = 0;
      *reinterpret_cast<volatile uint32_t*>(k.counter) = seq;
      __threadfence();
    }
  }
}

}  // namespace k3::comm::custom_detail
