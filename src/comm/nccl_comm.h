// comm/nccl_comm.h: NCCL communicators for tensor parallelism across the GPUs of one host, one
// thread per GPU in one process. Built only when CUDA and NCCL are found (src/comm/CMakeLists.txt).
//
// Why one thread per GPU rather than one process per GPU:
//   * the engine keeps a single scheduler, cache manager and request state; rank threads only run
//     the model step the scheduler planned, so there is no cross-process control plane to build;
//   * each rank reads its weight slices straight from the one mmap'd checkpoint (no second copy of
//     the file in another process's page cache, no weight broadcast at start-up);
//   * every GPU's memory is addressable from the process, so the custom small-message all-reduce
//     can read peers' buffers through cudaDeviceEnablePeerAccess, with no cudaIpc handle exchange.
//   The price: one process's fault takes all ranks down (acceptable: TP ranks are useless alone).
//
// NVLink multicast (NVLS) is never used. NCCL has no config field for it, only the environment
// variable NCCL_NVLS_ENABLE, read at init; library code never writes the environment, so each
// launcher (k3serve's main, the benchmark programs, the tests that build groups) sets
// NCCL_NVLS_ENABLE=0 before any thread starts, and NcclGroup refuses to start without it. On the
// shared H200 hosts a program using multicast objects can put the host's GPUs out of service for
// a long time, and at decode message sizes (<= 64 rows x 7168 bf16) NVLS buys little anyway.
//
// Semantics (see comm/communicator.h for the numeric contract):
//   * tensors are Device::cuda views on this rank's GPU; collectives are enqueued on stream() and
//     return without waiting (barrier() excepted: it waits for the stream);
//   * NcclSumMode::rank_order (default) is bit-identical to ThreadComm: a reduce-scatter by
//     point-to-point sends, a rank-order fp32 sum of each rank's chunk (comm/rank_sum.cu), then an
//     NCCL all-gather. It moves the same bytes as NCCL's ring all-reduce;
//   * NcclSumMode::native calls ncclAllReduce / ncclReduceScatter: NCCL's own summation order
//     (ring/tree), bf16 rounded at every hop; for comparison and large messages only.
//   * scratch memory grows on demand with cudaMalloc (which waits for the stream first); call
//     reserve_scratch() before CUDA graph capture so a captured collective never allocates.
#pragma once
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/stream.h"
#include "comm/communicator.h"
#include "comm/custom_allreduce.h"

namespace k3::comm {

enum class NcclSumMode : uint8_t { rank_order, native };

struct NcclShared;  // the group's communicators and abort state, defined in nccl_comm.cpp

class NcclComm final : public Communicator {
 public:
  NcclComm(std::shared_ptr<NcclShared> shared, int rank, int device);
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override;
  core::Device device() const override { return core::Device::cuda; }
  int device_index() const { return device_; }

  // The stream collectives are enqueued on: this rank's own non-blocking stream unless set.
  cudaStream_t stream() const { return stream_ ? stream_ : own_stream_.get(); }
  void set_stream(cudaStream_t stream) { stream_ = stream; }
  void set_sum_mode(NcclSumMode mode) { sum_mode_ = mode; }
  // The group's custom peer-access all-reduce (NcclGroup::use_custom_all_reduce), or nullptr.
  CustomAllReduce* custom_all_reduce() const { return custom_; }
  NcclSumMode sum_mode() const { return sum_mode_; }
  // Makes sure the scratch holds `bytes` (see scratch_bytes_for) so later calls never allocate.
  void reserve_scratch(int64_t bytes);
  // Scratch a collective on `numel` elements of `dtype` needs at most on a group of `n` ranks.
  static int64_t scratch_bytes_for(int64_t numel, core::DType dtype, int n);

  void all_reduce_sum(const core::TensorView& x) override;
  void all_gather(const core::TensorView& in, const core::TensorView& out, GatherAxis axis) override;
  void reduce_scatter_sum(const core::TensorView& in, const core::TensorView& out) override;
  void broadcast(const core::TensorView& x, int root) override;
  void barrier() override;
  // ncclCommAbort on every rank of the group: kernels stuck waiting for a missing peer end, and
  // every later collective on the group throws core::Error naming the reason.
  void abort(const std::string& reason) override;

 private:
  friend class NcclGroup;  // attaches the custom all-reduce
  ncclComm_t comm() const;
  void enter();  // current device = this rank's GPU; throws if the group was aborted
  void* scratch(int64_t bytes);
  void require(const core::Status& st);

  std::shared_ptr<NcclShared> shared_;
  int rank_ = 0;
  int device_ = 0;
  backends::cuda::Stream own_stream_;
  cudaStream_t stream_ = nullptr;
  NcclSumMode sum_mode_ = NcclSumMode::rank_order;
  CustomAllReduce* custom_ = nullptr;  // owned by the group; all_reduce_sum uses it when it fits
  void* scratch_ = nullptr;
  int64_t scratch_capacity_ = 0;
  float* barrier_word_ = nullptr;  // one float all-reduced by barrier()
};

// The environment variable every launcher sets to "0" before NCCL starts (see the file comment).
inline constexpr const char* kNcclNvlsVariable = "NCCL_NVLS_ENABLE";

class NcclGroup {
 public:
  // One rank per entry of `devices` (rank r on CUDA device devices[r]; all distinct), created
  // together with ncclCommInitAll from the calling thread; throws core::Error unless the
  // environment has NCCL_NVLS_ENABLE=0 (kNcclNvlsVariable).
  explicit NcclGroup(std::vector<int> devices);
  // Finalizes and destroys the communicators (one thread per rank, as NCCL finalization is
  // collective). Every rank must be idle; after abort() only local resources are freed.
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  int size() const;
  // Rank r's communicator; use it from one thread at a time (normally the thread that owns GPU r).
  NcclComm& rank(int r);
  void abort(const std::string& reason);
  bool aborted() const;

  // From now on, rank-order all_reduce_sum calls of at most `max_bytes` go through the custom
  // peer-access all-reduce (comm/custom_allreduce.h: one kernel, payloads that signal their own
  // arrival, no NCCL launch; the same bits as the NCCL rank-order path), larger ones through NCCL.
  // Returns false and changes nothing when the devices cannot form such a group (no peer access),
  // with the reason in *why. Call while the group is idle, before any graph capture.
  bool use_custom_all_reduce(int64_t max_bytes, std::string* why = nullptr);

 private:
  std::shared_ptr<NcclShared> shared_;
  std::vector<std::unique_ptr<NcclComm>> ranks_;
  std::unique_ptr<CustomAllReduceGroup> custom_;
};

// "2.28.9" for the NCCL library linked at run time.
std::string nccl_runtime_version();

}  // namespace k3::comm
