// runner/tp_runner.cpp: TpRunner: rank models in lock step, on CPU threads or one thread per GPU.
#include "runner/tp_runner.h"

#include <exception>
#include <mutex>
#include <thread>

#include "backends/cpu/thread_pool.h"
#include "comm/thread_comm.h"
#include "core/log.h"
#include "fastpath/fused_decode.h"
#include "model/local_cache.h"

#ifdef K3_HAVE_CUDA
#include <cuda_runtime.h>

#include "backends/cuda/check.h"
#include "backends/cuda/context.h"
#include "backends/cuda/cuda_memory.h"
#include "backends/cuda/device.h"
#include "kernels/registry.h"
#endif
#ifdef K3_HAVE_NCCL
#include "comm/nccl_comm.h"
#endif

namespace k3::runner {

struct TpRunner::Rank {
  int device = -1;             // CUDA device index; -1 on the CPU
  model::Weights weights;      // this rank's slices, on its device
  kernels::Registry registry;  // per rank: each GPU has its own context the ops capture
  std::shared_ptr<core::DeviceMemory> memory;
#ifdef K3_HAVE_CUDA
  std::shared_ptr<backends::cuda::Context> cuda;
#endif
  std::unique_ptr<model::Model> model;
};

// The ranks' communicators: CPU threads or NCCL on the GPUs.
struct TpRunner::Group {
  std::unique_ptr<comm::ThreadGroup> threads;
#ifdef K3_HAVE_NCCL
  std::unique_ptr<comm::NcclGroup> nccl;
#endif
  comm::Communicator& rank(int r) {
#ifdef K3_HAVE_NCCL
    if (nccl) return nccl->rank(r);
#endif
    return threads->rank(r);
  }
  void abort(const std::string& reason) {
#ifdef K3_HAVE_NCCL
    if (nccl) return nccl->abort(reason);
#endif
    threads->abort(reason);
  }
  bool aborted() const {
#ifdef K3_HAVE_NCCL
    if (nccl) return nccl->aborted();
#endif
    return threads->aborted();
  }
};

namespace {
void make_current(int device) {
#ifdef K3_HAVE_CUDA
  if (device >= 0) K3_CUDA_CHECK(cudaSetDevice(device));
#else
  (void)device;
#endif
}

// Why `--tp` cannot run on cuda in this build or on this machine ("" when it can).
std::string cuda_tp_unavailable(int tp) {
#if defined(K3_HAVE_CUDA) && defined(K3_HAVE_NCCL)
  std::string why;
  const int gpus = backends::cuda::device_count(&why);
  if (gpus >= tp) return "";
  return "--tp " + std::to_string(tp) + " on cuda needs " + std::to_string(tp) + " GPUs, " + std::to_string(gpus) +
         " usable" + (why.empty() ? "" : " (" + why + ")");
#elif defined(K3_HAVE_CUDA)
  (void)tp;
  return "--tp on cuda: this build has no NCCL (set K3_NCCL_ROOT at configure time)";
#else
  (void)tp;
  return "--tp on cuda: this build has no CUDA backend (configure with nvcc present)";
#endif
}
}  // namespace

std::unique_ptr<TpRunner> TpRunner::open(const std::filesystem::path& dir, int tp, const model::ModelOptions& options,
                                         model::KvCacheDtype kv_cache, const checkpoint::LoadProgressFn& progress) {
  return std::make_unique<TpRunner>(dir, tp, options, kv_cache, progress);
}

TpRunner::TpRunner(const std::filesystem::path& dir, int tp, const model::ModelOptions& options,
                   model::KvCacheDtype kv_cache, const checkpoint::LoadProgressFn& progress)
    : full_(config::load_config(dir / "config.json")), options_(options), kv_cache_(kv_cache) {
  const bool cuda = options.device == core::Device::cuda;
  K3_CHECK(options.device == core::Device::cpu || cuda,
           "tensor parallelism: no runner for device " + std::string(core::device_name(options.device)));
  // Throws naming the field tp does not divide (or expert parallelism with tp 1).
  rank_config_ = config::shard_config(full_, tp, {options.expert_parallel});
  model::check_dcp_size(options.dcp, tp);  // before loading anything
  if (cuda)
    if (const std::string why = cuda_tp_unavailable(tp); !why.empty()) throw core::Error(why);
#ifdef K3_HAVE_CUDA
  int caller_device = 0;
  if (cuda) K3_CUDA_CHECK(cudaGetDevice(&caller_device));
#endif
  // The ranks' CPU references share one pool, sized to the machine: rank threads run their ops
  // one parallel_for at a time on it instead of each spreading over every core.
  const auto cpu_pool = std::make_shared<backends::cpu::ThreadPool>(backends::cpu::ThreadPool::machine_threads());
  for (int r = 0; r < tp; ++r) {
    auto rank = std::make_unique<Rank>();
    kernels::register_reference_ops(rank->registry, cpu_pool);
    rank->memory = core::make_host_memory();
    model::Weights host = checkpoint::load_weights(dir, full_, config::TpShard{r, tp, options.expert_parallel},
                                                   r == 0 ? progress : nullptr);
#ifdef K3_HAVE_CUDA
    if (cuda) {
      rank->device = r;
      rank->cuda = backends::cuda::Context::create(r);  // makes GPU r current for the upload
      kernels::register_cuda_ops(rank->registry, rank->cuda);
      rank->memory = backends::cuda::make_device_memory(rank->cuda);
      rank->weights = model::to_device(host, *rank->memory);
      rank->memory->synchronize();  // the host slices are freed at the end of this iteration
    }
#endif
    if (!cuda) rank->weights = std::move(host);
    ranks_.push_back(std::move(rank));
  }
  build_models();
#ifdef K3_HAVE_CUDA
  if (cuda) K3_CUDA_CHECK(cudaSetDevice(caller_device));  // leave the calling thread as it was
#endif
}

TpRunner::~TpRunner() {
  // Models hold the communicators: drop them first, then the group (NCCL finalizes per rank).
  for (const auto& r : ranks_) r->model.reset();
  group_.reset();
}

void TpRunner::build_models() const {
  // The models hold the group's communicators: both are replaced together.
  for (const auto& r : ranks_) r->model.reset();
  group_.reset();
  group_ = std::make_unique<Group>();
  if (options_.device == core::Device::cpu) {
    group_->threads = std::make_unique<comm::ThreadGroup>(tp());
  } else {
#if defined(K3_HAVE_CUDA) && defined(K3_HAVE_NCCL)
    std::vector<int> devices;
    for (const auto& r : ranks_) devices.push_back(r->device);
    group_->nccl = std::make_unique<comm::NcclGroup>(devices);
    // Decode-sized all-reduces (up to 64 rows of the packed [latent | hidden] f32 MoE partial and
    // then some) through the custom peer-access kernel; prefill-sized ones through NCCL.
    (void)group_->nccl->use_custom_all_reduce(int64_t{16} << 20);
    // Collectives go on each rank's op stream: stream order replaces cross-stream events.
    for (int r = 0; r < tp(); ++r) group_->nccl->rank(r).set_stream(ranks_[static_cast<size_t>(r)]->cuda->stream());
#endif
  }
  for (int r = 0; r < tp(); ++r) {
    Rank& rank = *ranks_[static_cast<size_t>(r)];
    if (r == 0) rank.registry.set_log([](const std::string& line) { log::debug(line); });  // rank 0 speaks for all
    rank.model = std::make_unique<model::Model>(rank_config_, rank.weights, rank.registry, options_, rank.memory,
                                                &group_->rank(r));
    fastpath::attach(*rank.model, r);
  }
}

const model::Model& TpRunner::model(int rank) const {
  K3_CHECK(rank >= 0 && rank < tp(), "TpRunner: rank " + std::to_string(rank) + " of " + std::to_string(tp()));
  return *ranks_[static_cast<size_t>(rank)]->model;
}

void TpRunner::set_op_recorder(kernels::OpRecorder* recorder, std::optional<int> only_rank) {
  if (only_rank) {
    K3_CHECK(*only_rank >= 0 && *only_rank < tp(),
             "TpRunner::set_op_recorder: rank " + std::to_string(*only_rank) + " of " + std::to_string(tp()));
    ranks_[static_cast<size_t>(*only_rank)]->registry.set_recorder(recorder);
    return;
  }
  for (auto& rank : ranks_) rank->registry.set_recorder(recorder);
}

const std::shared_ptr<core::DeviceMemory>& TpRunner::memory(int rank) const {
  K3_CHECK(rank >= 0 && rank < tp(), "TpRunner: rank " + std::to_string(rank) + " of " + std::to_string(tp()));
  return ranks_[static_cast<size_t>(rank)]->memory;
}

void TpRunner::run(const RankFn& fn) const {
  if (group_->aborted()) build_models();  // a failed call left the old group unusable
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int r = 0; r < tp(); ++r)
    threads.emplace_back([&, r] {
      try {
        const Rank& rank = *ranks_[static_cast<size_t>(r)];
        make_current(rank.device);
        fn(r, *rank.model, group_->rank(r));
        rank.memory->synchronize();  // the call's device work is done when run() returns
      } catch (const std::exception& e) {
        {
          std::lock_guard<std::mutex> lock(mu);
          if (!first) first = std::current_exception();
        }
        group_->abort("rank " + std::to_string(r) + " failed: " + e.what());  // release the others
      }
    });
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

model::LocalCache TpRunner::new_cache(int rank, int64_t max_tokens) const {
  // Under decode context parallelism a rank stores ceil(max_tokens / dcp) of the sequence's tokens.
  const int64_t local = (max_tokens + options_.dcp - 1) / options_.dcp;
  return model::LocalCache(rank_config_, 1, local, kv_cache_, 16, memory(rank), options_.precision);
}

}  // namespace k3::runner
