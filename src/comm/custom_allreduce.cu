// comm/custom_allreduce.cu: the custom all-reduce group (peer buffers, set-up, checks) and the two
// plain all-reduce kernels over 8-byte payload lines (see custom_allreduce.h):
//   one-shot:  push every line of x to every peer; sum the n copies of each line in rank order;
//   two-stage: push line l to its owner rank (l / C, C = ceil(lines / n)); the owner sums it in rank
//              order and pushes the sum to every peer (reduce-scatter + all-gather in one kernel).
// Both sum in fp32 with __fadd_rn (never contracted) and round bf16 once, as comm/rank_sum.cu does,
// so both give the bits of ThreadComm. The fused step lives in custom_fused.cu.
#include "comm/custom_allreduce.h"

#include <set>
#include <string>

#include "backends/cuda/check.h"
#include "backends/cuda/device.h"
#include "comm/communicator.h"
#include "comm/custom_allreduce_kernels.cuh"

namespace k3::comm {

using namespace custom_detail;

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Restores the caller's current device when set-up code switches between GPUs.
struct DeviceGuard {
  int saved = -1;
  DeviceGuard() { (void)cudaGetDevice(&saved); }
  ~DeviceGuard() {
    if (saved >= 0) (void)cudaSetDevice(saved);
  }
};

// ---- device: payload lines of x and their rank-order sums

// Line l of x (bytes [8l, 8l + 8)), zero past the end of x.
__device__ __forceinline__ uint2 load_payload(const char* x, int64_t nbytes, int64_t l) {
  const int64_t off = l * 8;
  if (off + 8 <= nbytes) return *reinterpret_cast<const uint2*>(x + off);
  uint2 d = make_uint2(0, 0);
  unsigned char* b = reinterpret_cast<unsigned char*>(&d);
  for (int i = 0; off + i < nbytes; ++i) b[i] = static_cast<unsigned char>(x[off + i]);
  return d;
}

__device__ __forceinline__ void store_payload(char* x, int64_t nbytes, int64_t l, uint2 d) {
  const int64_t off = l * 8;
  if (off + 8 <= nbytes) {
    *reinterpret_cast<uint2*>(x + off) = d;
    return;
  }
  const unsigned char* b = reinterpret_cast<const unsigned char*>(&d);
  for (int i = 0; off + i < nbytes; ++i) x[off + i] = static_cast<char>(b[i]);
}

// Same rounding as core::f32_to_bf16_bits and comm/rank_sum.cu (RNE, NaN kept a quiet NaN).
__device__ __forceinline__ uint32_t f32_to_bf16_bits(float x) {
  uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x0040u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return u >> 16;
}

// The fp32 running sum of one line: 2 f32 or 4 bf16 (element 0 in the low half of word 0).
template <bool kBf16>
struct LineSum {
  float v[kBf16 ? 4 : 2];
  __device__ __forceinline__ static void unpack(uint2 d, float (&out)[kBf16 ? 4 : 2]) {
    if constexpr (kBf16) {
      out[0] = __uint_as_float(d.x << 16), out[1] = __uint_as_float(d.x & 0xffff0000u);
      out[2] = __uint_as_float(d.y << 16), out[3] = __uint_as_float(d.y & 0xffff0000u);
    } else {
      out[0] = __uint_as_float(d.x), out[1] = __uint_as_float(d.y);
    }
  }
  __device__ __forceinline__ void init(uint2 d) { unpack(d, v); }
  __device__ __forceinline__ void add(uint2 d) {
    float w[kBf16 ? 4 : 2];
    unpack(d, w);
#pragma unroll
    for (int i = 0; i < (kBf16 ? 4 : 2); ++i) v[i] = __fadd_rn(v[i], w[i]);  // never fused
  }
  __device__ __forceinline__ uint2 result() const {
    if constexpr (kBf16) {
      return make_uint2(f32_to_bf16_bits(v[0]) | (f32_to_bf16_bits(v[1]) << 16),
                        f32_to_bf16_bits(v[2]) | (f32_to_bf16_bits(v[3]) << 16));
    } else {
      return make_uint2(__float_as_uint(v[0]), __float_as_uint(v[1]));
    }
  }
};

struct LineParams {
  char* x;         // the tensor reduced in place
  int64_t nbytes;  // its bytes
  int64_t lines;   // ceil(nbytes / 8)
  Link link;
};

// One-shot. Buffer layout per parity: [source rank q][lines].
template <bool kBf16>
__global__ void __launch_bounds__(kLineThreads) one_shot_kernel(LineParams p) {
  __shared__ uint32_t s_seq;
  const Link& k = p.link;
  const uint32_t seq = seq_begin(k, &s_seq);
  const int64_t par = (seq & 1u) * k.parity_lines;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  for (int64_t l = first; l < p.lines; l += stride) {
    const uint4 line = ll_line(load_payload(p.x, p.nbytes, l), seq);
    for (int i = 1; i < k.n; ++i) {  // start at the next rank: the peers' links share the load
      const int q = (k.rank + i) % k.n;
      ll_store(k.buffers[q] + par + k.rank * p.lines + l, line);
    }
  }
  uint4* mine = k.buffers[k.rank] + par;
  for (int64_t l = first; l < p.lines; l += stride) {  // the lines this thread pushed: x unchanged
    const uint2 own = load_payload(p.x, p.nbytes, l);
    LineSum<kBf16> acc;
    acc.init(k.rank == 0 ? own : ll_take(mine + l, seq));
    for (int q = 1; q < k.n; ++q) acc.add(q == k.rank ? own : ll_take(mine + q * p.lines + l, seq));
    store_payload(p.x, p.nbytes, l, acc.result());
  }
  seq_end(k, seq);
}

// Two-stage. Rank q owns lines [q*C, q*C + count(q)); buffer layout per parity: reduce-scatter
// [source rank][C] then all-gather [owner rank][C].
template <bool kBf16>
__global__ void __launch_bounds__(kLineThreads) two_stage_kernel(LineParams p, int64_t chunk) {
  __shared__ uint32_t s_seq;
  const Link& k = p.link;
  const uint32_t seq = seq_begin(k, &s_seq);
  const int64_t par = (seq & 1u) * k.parity_lines;
  const int64_t gather = int64_t{k.n} * chunk;  // offset of the all-gather area
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  uint4* mine = k.buffers[k.rank] + par;
  // 1. Every line to its owner (this rank's own lines stay for step 2).
  for (int64_t l = first; l < p.lines; l += stride) {
    const int64_t o = l / chunk;
    if (o == k.rank) continue;
    ll_store(k.buffers[o] + par + k.rank * chunk + (l - o * chunk), ll_line(load_payload(p.x, p.nbytes, l), seq));
  }
  // 2. Sum this rank's lines in rank order, keep the sum in x and push it to every peer.
  const int64_t own_begin = k.rank * chunk;
  const int64_t own_end = own_begin + chunk < p.lines ? own_begin + chunk : p.lines;
  for (int64_t l = own_begin + first; l < own_end; l += stride) {
    const int64_t j = l - own_begin;
    const uint2 own = load_payload(p.x, p.nbytes, l);
    LineSum<kBf16> acc;
    acc.init(k.rank == 0 ? own : ll_take(mine + j, seq));
    for (int q = 1; q < k.n; ++q) acc.add(q == k.rank ? own : ll_take(mine + q * chunk + j, seq));
    const uint2 sum = acc.result();
    store_payload(p.x, p.nbytes, l, sum);
    const uint4 line = ll_line(sum, seq);
    for (int i = 1; i < k.n; ++i) {
      const int q = (k.rank + i) % k.n;
      ll_store(k.buffers[q] + par + gather + k.rank * chunk + j, line);
    }
  }
  // 3. Every other owner's sums into x. (Line l was read in step 1 before its owner could sum it.)
  for (int64_t l = first; l < p.lines; l += stride) {
    const int64_t o = l / chunk;
    if (o == k.rank) continue;
    store_payload(p.x, p.nbytes, l, ll_take(mine + gather + o * chunk + (l - o * chunk), seq));
  }
  seq_end(k, seq);
}

unsigned line_blocks(int64_t lines, int sm_count) {
  const int64_t need = ceil_div(lines, kLineThreads);
  return static_cast<unsigned>(need < sm_count ? need : sm_count);  // all blocks resident
}

}  // namespace

// ---- CustomShared / CustomAllReduceGroup -------------------------------------------------------

CustomShared::~CustomShared() {
  DeviceGuard guard;
  for (size_t r = 0; r < devices.size(); ++r) {
    (void)cudaSetDevice(devices[r]);  // destructors never throw
    if (r < buffers.size() && buffers[r]) (void)cudaFree(buffers[r]);
    if (r < counters.size() && counters[r]) (void)cudaFree(counters[r]);
  }
}

core::Status CustomAllReduceGroup::devices_status(const std::vector<int>& devices) {
  const int n = static_cast<int>(devices.size());
  if (n < 2 || n > kCustomMaxRanks)
    return core::Status::fail("comm::CustomAllReduceGroup: devices must list 2.." + std::to_string(kCustomMaxRanks) +
                              " GPUs, got " + std::to_string(n));
  std::string why;
  const int available = backends::cuda::device_count(&why);
  std::set<int> seen;
  for (int d : devices) {
    if (d < 0 || d >= available)
      return core::Status::fail("comm::CustomAllReduceGroup: CUDA device " + std::to_string(d) + " does not exist (" +
                                std::to_string(available) + " visible" + (why.empty() ? "" : ": " + why) + ")");
    if (!seen.insert(d).second)
      return core::Status::fail("comm::CustomAllReduceGroup: CUDA device " + std::to_string(d) + " is listed twice");
  }
  for (int a : devices)
    for (int b : devices) {
      if (a == b) continue;
      int can = 0;
      if (cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess || !can)
        return core::Status::fail("comm::CustomAllReduceGroup: CUDA device " + std::to_string(a) +
                                  " cannot access device " + std::to_string(b) + "'s memory (no peer access)");
    }
  return core::Status::ok();
}

std::unique_ptr<CustomAllReduceGroup> CustomAllReduceGroup::create(const std::vector<int>& devices, int64_t max_bytes) {
  if (auto s = devices_status(devices); !s) throw core::Error(s.reason());
  K3_CHECK(max_bytes >= 8 && max_bytes <= (int64_t{1} << 31),
           "comm::CustomAllReduceGroup: max_bytes must be in [8, 2 GiB], got " + std::to_string(max_bytes));
  DeviceGuard guard;
  auto shared = std::make_shared<CustomShared>();
  const int n = static_cast<int>(devices.size());
  shared->devices = devices;
  shared->max_bytes = max_bytes;
  // One parity half holds the larger layout: one-shot [n][lines] or two-stage 2 x [n][ceil(lines/n)].
  const int64_t lines = ceil_div(max_bytes, 8);
  const int64_t one_shot = n * lines, two_stage = 2 * n * ceil_div(lines, n);
  shared->parity_lines = one_shot > two_stage ? one_shot : two_stage;
  const size_t buffer_bytes = static_cast<size_t>(2 * shared->parity_lines) * sizeof(uint4);
  for (int r = 0; r < n; ++r) {
    K3_CUDA_CHECK(cudaSetDevice(devices[static_cast<size_t>(r)]));
    shared->sm_counts.push_back(backends::cuda::device_info(devices[static_cast<size_t>(r)]).sm_count);
    uint4* buffer = nullptr;
    uint32_t* counter = nullptr;
    K3_CUDA_CHECK(cudaMalloc(&buffer, buffer_bytes));
    shared->buffers.push_back(buffer);
    K3_CUDA_CHECK(cudaMalloc(&counter, 2 * sizeof(uint32_t)));
    shared->counters.push_back(counter);
    K3_CUDA_CHECK(cudaMemset(buffer, 0, buffer_bytes));  // flag 0 never matches a call
    K3_CUDA_CHECK(cudaMemset(counter, 0, 2 * sizeof(uint32_t)));
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      const cudaError_t e = cudaDeviceEnablePeerAccess(devices[static_cast<size_t>(q)], 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();  // enabled earlier in this process (another group, NCCL): fine
      } else {
        K3_CUDA_CHECK(e);
      }
    }
    K3_CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::unique_ptr<CustomAllReduceGroup> group(new CustomAllReduceGroup(shared));
  return group;
}

CustomAllReduceGroup::CustomAllReduceGroup(std::shared_ptr<CustomShared> shared) : shared_(std::move(shared)) {
  DeviceGuard guard;
  for (int r = 0; r < static_cast<int>(shared_->devices.size()); ++r) {
    ranks_.push_back(std::make_unique<CustomAllReduce>(shared_, r));
    ranks_.back()->enter();
    ranks_.back()->query_fused_occupancy();
  }
}

CustomAllReduceGroup::~CustomAllReduceGroup() {
  // Kernels may still be queued on callers' streams: let every device finish before the buffers go.
  DeviceGuard guard;
  for (int d : shared_->devices)
    if (cudaSetDevice(d) == cudaSuccess) (void)cudaDeviceSynchronize();
}

CustomAllReduce& CustomAllReduceGroup::rank(int r) {
  K3_CHECK(r >= 0 && r < size(), "comm::CustomAllReduceGroup::rank: " + std::to_string(r) +
                                     " is not a rank of a group of " + std::to_string(size()));
  return *ranks_[static_cast<size_t>(r)];
}

// ---- CustomAllReduce ---------------------------------------------------------------------------

CustomAllReduce::CustomAllReduce(std::shared_ptr<CustomShared> shared, int rank)
    : shared_(std::move(shared)), rank_(rank) {
  // Where two-stage starts to pay off: about 8 rows of 7168 bf16 on 8 ranks (bench/allreduce_gpu).
  two_stage_threshold_ = 128 * 1024;
}

int CustomAllReduce::size() const { return static_cast<int>(shared_->devices.size()); }
int CustomAllReduce::device() const { return shared_->devices[static_cast<size_t>(rank_)]; }
int64_t CustomAllReduce::max_bytes() const { return shared_->max_bytes; }

void CustomAllReduce::enter() const { K3_CUDA_CHECK(cudaSetDevice(device())); }

core::Status CustomAllReduce::all_reduce_check(const core::TensorView& x) const {
  if (auto s = comm::all_reduce_check(x, core::Device::cuda); !s) return s;
  if (x.nbytes() > max_bytes())
    return core::Status::fail("comm::CustomAllReduce: x " + x.shape.str() + " " +
                              std::string(core::dtype_name(x.dtype)) + " is " + std::to_string(x.nbytes()) +
                              " bytes, more than the group's max_bytes " + std::to_string(max_bytes()) +
                              " (use NCCL for large messages)");
  if (reinterpret_cast<uintptr_t>(x.data) % 8 != 0)
    return core::Status::fail("comm::CustomAllReduce: x must be 8-byte aligned (its data pointer is not)");
  return core::Status::ok();
}

void CustomAllReduce::all_reduce_sum(const core::TensorView& x, cudaStream_t stream) {
  if (x.nbytes() <= two_stage_threshold_) all_reduce_one_shot(x, stream);
  else all_reduce_two_stage(x, stream);
}

void CustomAllReduce::all_reduce_one_shot(const core::TensorView& x, cudaStream_t stream) {
  if (auto s = all_reduce_check(x); !s) throw core::Error(s.reason());
  if (x.numel() == 0) return;
  enter();
  LineParams p{static_cast<char*>(x.data), x.nbytes(), ceil_div(x.nbytes(), 8), make_link(*shared_, rank_)};
  const unsigned blocks = line_blocks(p.lines, shared_->sm_counts[static_cast<size_t>(rank_)]);
  if (x.dtype == core::DType::bf16) {
    one_shot_kernel<true><<<blocks, kLineThreads, 0, stream>>>(p);
    K3_CUDA_CHECK_LAUNCH("one_shot_kernel<bf16>");
  } else {
    one_shot_kernel<false><<<blocks, kLineThreads, 0, stream>>>(p);
    K3_CUDA_CHECK_LAUNCH("one_shot_kernel<f32>");
  }
}

void CustomAllReduce::all_reduce_two_stage(const core::TensorView& x, cudaStream_t stream) {
  if (auto s = all_reduce_check(x); !s) throw core::Error(s.reason());
  if (x.numel() == 0) return;
  const int n = size();
  const int64_t lines = ceil_div(x.nbytes(), 8), chunk = ceil_div(lines, n);
  // Every rank must own a line (the buffer-reuse argument needs data from every peer each call).
  if ((n - 1) * chunk >= lines) return all_reduce_one_shot(x, stream);
  enter();
  LineParams p{static_cast<char*>(x.data), x.nbytes(), lines, make_link(*shared_, rank_)};
  const unsigned blocks = line_blocks(lines, shared_->sm_counts[static_cast<size_t>(rank_)]);
  if (x.dtype == core::DType::bf16) {
    two_stage_kernel<true><<<blocks, kLineThreads, 0, stream>>>(p, chunk);
    K3_CUDA_CHECK_LAUNCH("two_stage_kernel<bf16>");
  } else {
    two_stage_kernel<false><<<blocks, kLineThreads, 0, stream>>>(p, chunk);
    K3_CUDA_CHECK_LAUNCH("two_stage_kernel<f32>");
  }
}

void CustomAllReduce::set_sequence_for_testing(uint32_t value) {
  enter();
  K3_CUDA_CHECK(cudaDeviceSynchronize());
  K3_CUDA_CHECK(
      cudaMemcpy(shared_->counters[static_cast<size_t>(rank_)], &value, sizeof value, cudaMemcpyHostToDevice));
  K3_CUDA_CHECK(cudaDeviceSynchronize());
}

uint32_t CustomAllReduce::sequence() const {
  enter();
  K3_CUDA_CHECK(cudaDeviceSynchronize());
  uint32_t value = 0;
  K3_CUDA_CHECK(
      cudaMemcpy(&value, shared_->counters[static_cast<size_t>(rank_)], sizeof value, cudaMemcpyDeviceToHost));
  return value;
}

}  // namespace k3::comm
