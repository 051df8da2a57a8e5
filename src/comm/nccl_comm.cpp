// comm/nccl_comm.cpp: NcclGroup and NcclComm (see nccl_comm.h): communicator set-up and teardown,
// the rank-order exact sums (point-to-point reduce-scatter + rank_sum + all-gather) and the plain
// NCCL collectives. Compiled only when CUDA and NCCL are found.
#include "comm/nccl_comm.h"

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <set>
#include <thread>

#include "backends/cuda/check.h"
#include "backends/cuda/device.h"
#include "comm/rank_sum.h"

namespace k3::comm {

namespace {

[[noreturn]] void throw_nccl_error(ncclResult_t r, const char* expr, const char* file, int line) {
  throw core::Error("NCCL error at " + std::string(file) + ":" + std::to_string(line) + ": " + expr + ": " +
                    ncclGetErrorString(r) + " (" + ncclGetLastError(nullptr) + ")");
}

#define K3_NCCL_CHECK(expr)                                                                 \
  do {                                                                                      \
    const ncclResult_t k3_nccl_r_ = (expr);                                                 \
    if (k3_nccl_r_ != ncclSuccess) throw_nccl_error(k3_nccl_r_, #expr, __FILE__, __LINE__); \
  } while (0)

ncclDataType_t nccl_sum_type(core::DType t) {
  return t == core::DType::f32 ? ncclFloat32 : ncclBfloat16;  // the checks allow only these two
}

int64_t align256(int64_t bytes) { return (bytes + 255) / 256 * 256; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int set_device(int device) {
  K3_CUDA_CHECK(cudaSetDevice(device));
  return device;
}

}  // namespace

struct NcclShared {
  std::vector<ncclComm_t> comms;  // [n], rank order
  std::vector<int> devices;       // [n]
  std::atomic<bool> aborted{false};
  std::mutex mu;
  std::string reason;

  void abort(const std::string& why) {
    std::lock_guard lk(mu);
    if (aborted.load()) return;
    reason = why;
    aborted.store(true);
    for (ncclComm_t c : comms) (void)ncclCommAbort(c);  // frees them; nothing to destroy later
  }
};

// ---- NcclComm ----------------------------------------------------------------------------------

NcclComm::NcclComm(std::shared_ptr<NcclShared> shared, int rank, int device)
    : shared_(std::move(shared)), rank_(rank), device_(set_device(device)) {
  K3_CUDA_CHECK(cudaMalloc(&barrier_word_, sizeof(float)));
  K3_CUDA_CHECK(cudaMemset(barrier_word_, 0, sizeof(float)));
}

NcclComm::~NcclComm() {
  (void)cudaSetDevice(device_);  // destructors never throw; faults were reported already
  if (scratch_) (void)cudaFree(scratch_);
  if (barrier_word_) (void)cudaFree(barrier_word_);
}

int NcclComm::size() const { return static_cast<int>(shared_->comms.size()); }

ncclComm_t NcclComm::comm() const { return shared_->comms[static_cast<size_t>(rank_)]; }

void NcclComm::enter() {
  if (shared_->aborted.load()) {
    std::lock_guard lk(shared_->mu);
    throw core::Error("comm: NCCL group aborted: " + shared_->reason);
  }
  K3_CUDA_CHECK(cudaSetDevice(device_));
}

void NcclComm::require(const core::Status& st) {
  if (st) return;
  // As in ThreadComm: the other ranks must not wait forever for this rank's half of the exchange.
  abort(st.reason());
  throw core::Error(st.reason());
}

int64_t NcclComm::scratch_bytes_for(int64_t numel, core::DType dtype, int n) {
  const int64_t es = static_cast<int64_t>(core::dtype_size(dtype));
  const int64_t gather = align256(n * numel * es);                   // all_gather(last)
  const int64_t reduce = 2 * align256(n * ceil_div(numel, n) * es);  // all_reduce
  return gather > reduce ? gather : reduce;                          // reduce_scatter needs numel * es <= both
}

void NcclComm::reserve_scratch(int64_t bytes) {
  enter();
  (void)scratch(bytes);
}

void* NcclComm::scratch(int64_t bytes) {
  if (bytes <= scratch_capacity_) return scratch_;
  const int64_t grown = align256(bytes < 2 * scratch_capacity_ ? 2 * scratch_capacity_ : bytes);
  if (scratch_) {
    K3_CUDA_CHECK(cudaStreamSynchronize(stream()));  // the old buffer may still be in use
    K3_CUDA_CHECK(cudaFree(scratch_));
    scratch_ = nullptr;
    scratch_capacity_ = 0;
  }
  K3_CUDA_CHECK(cudaMalloc(&scratch_, static_cast<size_t>(grown)));
  // Zeroed so padded tails that NCCL sends (never read back) are initialised memory.
  K3_CUDA_CHECK(cudaMemsetAsync(scratch_, 0, static_cast<size_t>(grown), stream()));
  scratch_capacity_ = grown;
  return scratch_;
}

void NcclComm::all_reduce_sum(const core::TensorView& x) {
  enter();
  require(all_reduce_check(x, core::Device::cuda));
  const int n = size();
  const int64_t numel = x.numel();
  if (numel == 0 || n == 1) return;  // one rank: the sum is x itself (bf16 already rounded)
  const ncclDataType_t dt = nccl_sum_type(x.dtype);
  const cudaStream_t s = stream();
  if (custom_ && sum_mode_ == NcclSumMode::rank_order && custom_->all_reduce_check(x)) {
    custom_->all_reduce_sum(x, s);  // small decode messages: one peer-access kernel, same bits
    return;
  }
  if (sum_mode_ == NcclSumMode::native) {
    K3_NCCL_CHECK(ncclAllReduce(x.data, x.data, static_cast<size_t>(numel), dt, ncclSum, comm(), s));
    return;
  }
  // Rank q owns elements [q*chunk, q*chunk + count(q)); the last ranks' chunks may be short/empty.
  const int64_t es = static_cast<int64_t>(core::dtype_size(x.dtype));
  const int64_t chunk = ceil_div(numel, n);
  auto count = [&](int q) {
    const int64_t left = numel - q * chunk;
    return left < 0 ? int64_t{0} : (left < chunk ? left : chunk);
  };
  const bool divisible = numel % n == 0;
  const int64_t recv_bytes = align256(n * chunk * es);
  char* recv = static_cast<char*>(scratch(divisible ? recv_bytes : 2 * recv_bytes));  // [n][chunk]
  // When chunks tile x exactly, the sum is written into x and gathered in place.
  char* gather = divisible ? static_cast<char*>(x.data) : recv + recv_bytes;  // [n][chunk]
  char* mine = static_cast<char*>(x.data);

  // 1. Reduce-scatter, transport only: rank q receives every rank's copy of chunk q.
  K3_NCCL_CHECK(ncclGroupStart());
  for (int q = 0; q < n; ++q) {
    if (q == rank_) continue;
    if (count(rank_) > 0)
      K3_NCCL_CHECK(ncclRecv(recv + q * chunk * es, static_cast<size_t>(count(rank_)), dt, q, comm(), s));
    if (count(q) > 0) K3_NCCL_CHECK(ncclSend(mine + q * chunk * es, static_cast<size_t>(count(q)), dt, q, comm(), s));
  }
  K3_NCCL_CHECK(ncclGroupEnd());
  if (count(rank_) > 0)
    K3_CUDA_CHECK(cudaMemcpyAsync(recv + rank_ * chunk * es, mine + rank_ * chunk * es,
                                  static_cast<size_t>(count(rank_) * es), cudaMemcpyDeviceToDevice, s));
  // 2. Rank-order fp32 sum of this rank's chunk (bf16 rounded once).
  rank_sum(recv, chunk, n, count(rank_), x.dtype, gather + rank_ * chunk * es, s);
  // 3. Every rank gets every reduced chunk (in place: this rank's chunk already sits in `gather`).
  K3_NCCL_CHECK(ncclAllGather(gather + rank_ * chunk * es, gather, static_cast<size_t>(chunk), dt, comm(), s));
  if (!divisible)
    K3_CUDA_CHECK(cudaMemcpyAsync(x.data, gather, static_cast<size_t>(numel * es), cudaMemcpyDeviceToDevice, s));
}

void NcclComm::reduce_scatter_sum(const core::TensorView& in, const core::TensorView& out) {
  enter();
  const int n = size();
  require(reduce_scatter_check(in, out, n, core::Device::cuda));
  const int64_t c = out.numel(), es = static_cast<int64_t>(core::dtype_size(in.dtype));
  if (c == 0) return;
  const cudaStream_t s = stream();
  const char* src = static_cast<const char*>(in.data);
  if (n == 1) {
    if (out.data != in.data)
      K3_CUDA_CHECK(cudaMemcpyAsync(out.data, src, static_cast<size_t>(c * es), cudaMemcpyDeviceToDevice, s));
    return;
  }
  const ncclDataType_t dt = nccl_sum_type(in.dtype);
  if (sum_mode_ == NcclSumMode::native) {
    K3_NCCL_CHECK(ncclReduceScatter(in.data, out.data, static_cast<size_t>(c), dt, ncclSum, comm(), s));
    return;
  }
  char* recv = static_cast<char*>(scratch(align256(n * c * es)));  // [n][c]
  K3_NCCL_CHECK(ncclGroupStart());
  for (int q = 0; q < n; ++q) {
    if (q == rank_) continue;
    K3_NCCL_CHECK(ncclSend(src + q * c * es, static_cast<size_t>(c), dt, q, comm(), s));
    K3_NCCL_CHECK(ncclRecv(recv + q * c * es, static_cast<size_t>(c), dt, q, comm(), s));
  }
  K3_NCCL_CHECK(ncclGroupEnd());
  K3_CUDA_CHECK(cudaMemcpyAsync(recv + rank_ * c * es, src + rank_ * c * es, static_cast<size_t>(c * es),
                                cudaMemcpyDeviceToDevice, s));
  rank_sum(recv, c, n, c, in.dtype, out.data, s);  // out may alias in: `in` is no longer read
}

void NcclComm::all_gather(const core::TensorView& in, const core::TensorView& out, GatherAxis axis) {
  enter();
  const int n = size();
  require(all_gather_check(in, out, axis, n, core::Device::cuda));
  const int64_t bytes = in.nbytes();
  if (bytes == 0) return;
  const cudaStream_t s = stream();
  const int64_t cols = in.shape[in.rank() - 1];
  const int64_t rows = in.numel() / cols;
  if (axis == GatherAxis::first || rows == 1) {  // rank-major concatenation is NCCL's own layout
    K3_NCCL_CHECK(ncclAllGather(in.data, out.data, static_cast<size_t>(bytes), ncclChar, comm(), s));
    return;
  }
  // Last axis: gather rank-major into scratch [n][rows][cols], then place each rank's columns.
  char* tmp = static_cast<char*>(scratch(align256(n * bytes)));
  K3_NCCL_CHECK(ncclAllGather(in.data, tmp, static_cast<size_t>(bytes), ncclChar, comm(), s));
  const size_t row_bytes = static_cast<size_t>(cols) * core::dtype_size(in.dtype);
  for (int q = 0; q < n; ++q)
    K3_CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(out.data) + q * row_bytes, n * row_bytes, tmp + q * bytes,
                                    row_bytes, row_bytes, static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, s));
}

void NcclComm::broadcast(const core::TensorView& x, int root) {
  enter();
  require(broadcast_check(x, root, size(), core::Device::cuda));
  if (x.nbytes() == 0) return;
  K3_NCCL_CHECK(ncclBroadcast(x.data, x.data, static_cast<size_t>(x.nbytes()), ncclChar, root, comm(), stream()));
}

void NcclComm::barrier() {
  enter();
  K3_NCCL_CHECK(ncclAllReduce(barrier_word_, barrier_word_, 1, ncclFloat32, ncclSum, comm(), stream()));
  K3_CUDA_CHECK(cudaStreamSynchronize(stream()));
  ncclResult_t async_error = ncclSuccess;
  K3_NCCL_CHECK(ncclCommGetAsyncError(comm(), &async_error));
  if (async_error != ncclSuccess) throw_nccl_error(async_error, "barrier (asynchronous error)", __FILE__, __LINE__);
}

void NcclComm::abort(const std::string& reason) { shared_->abort("rank " + std::to_string(rank_) + ": " + reason); }

// ---- NcclGroup ---------------------------------------------------------------------------------

NcclGroup::NcclGroup(std::vector<int> devices) : shared_(std::make_shared<NcclShared>()) {
  // Never NVLink multicast (see nccl_comm.h). NCCL reads the variable at init; the launcher sets it.
  const char* nvls = std::getenv(kNcclNvlsVariable);
  K3_CHECK(nvls != nullptr && std::string(nvls) == "0",
           std::string("comm::NcclGroup: NVLink multicast must stay off: start the process with ") + kNcclNvlsVariable +
               "=0 (k3serve and the benchmark programs set it first thing in main); it is " +
               (nvls ? "'" + std::string(nvls) + "'" : std::string("unset")));
  K3_CHECK(!devices.empty(), "comm::NcclGroup: the device list is empty");
  const int available = backends::cuda::device_count();
  std::set<int> seen;
  for (int d : devices) {
    K3_CHECK(d >= 0 && d < available, "comm::NcclGroup: CUDA device " + std::to_string(d) + " does not exist (" +
                                          std::to_string(available) + " visible)");
    // NCCL hangs when one device holds two ranks of a communicator; refuse it up front.
    K3_CHECK(seen.insert(d).second, "comm::NcclGroup: CUDA device " + std::to_string(d) + " is listed twice");
  }
  const int n = static_cast<int>(devices.size());
  shared_->devices = devices;
  shared_->comms.assign(devices.size(), nullptr);
  K3_NCCL_CHECK(ncclCommInitAll(shared_->comms.data(), n, devices.data()));
  try {
    for (int r = 0; r < n; ++r)
      ranks_.push_back(std::make_unique<NcclComm>(shared_, r, devices[static_cast<size_t>(r)]));
  } catch (...) {
    shared_->abort("set-up failed");
    throw;
  }
}

bool NcclGroup::use_custom_all_reduce(int64_t max_bytes, std::string* why) {
  const core::Status st = CustomAllReduceGroup::devices_status(shared_->devices);
  if (!st) {
    if (why) *why = st.reason();
    return false;
  }
  custom_ = CustomAllReduceGroup::create(shared_->devices, max_bytes);
  for (size_t r = 0; r < ranks_.size(); ++r) ranks_[r]->custom_ = &custom_->rank(static_cast<int>(r));
  return true;
}

NcclGroup::~NcclGroup() {
  if (!shared_->aborted.load()) {
    // Finalization waits until the whole group is quiescent, so each rank finalizes on its own
    // thread; a rank that cannot finalize is aborted instead.
    std::vector<std::thread> threads;
    for (size_t r = 0; r < shared_->comms.size(); ++r) {
      threads.emplace_back([this, r] {
        ncclComm_t c = shared_->comms[r];
        if (cudaSetDevice(shared_->devices[r]) != cudaSuccess || ncclCommFinalize(c) != ncclSuccess ||
            ncclCommDestroy(c) != ncclSuccess)
          (void)ncclCommAbort(c);
      });
    }
    for (auto& t : threads) t.join();
  }
  ranks_.clear();
}

int NcclGroup::size() const { return static_cast<int>(ranks_.size()); }

NcclComm& NcclGroup::rank(int r) {
  K3_CHECK(r >= 0 && r < size(),
           "comm::NcclGroup::rank: " + std::to_string(r) + " is not a rank of a group of " + std::to_string(size()));
  return *ranks_[static_cast<size_t>(r)];
}

void NcclGroup::abort(const std::string& reason) { shared_->abort(reason); }

bool NcclGroup::aborted() const { return shared_->aborted.load(); }

std::string nccl_runtime_version() {
  int v = 0;
  K3_NCCL_CHECK(ncclGetVersion(&v));
  return std::to_string(v / 10000) + "." + std::to_string(v % 10000 / 100) + "." + std::to_string(v % 100);
}

}  // namespace k3::comm
