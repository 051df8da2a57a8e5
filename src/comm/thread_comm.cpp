// comm/thread_comm.cpp: ThreadGroup, its per-rank Communicator and run_ranks (see thread_comm.h).
#include "comm/thread_comm.h"

#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "core/bf16.h"

namespace k3::comm {

namespace {

enum class Op : uint8_t { all_reduce_sum, all_gather, reduce_scatter_sum, broadcast, barrier };

const char* op_name(Op op) {
  switch (op) {
    case Op::all_reduce_sum: return "all_reduce_sum";
    case Op::all_gather: return "all_gather";
    case Op::reduce_scatter_sum: return "reduce_scatter_sum";
    case Op::broadcast: return "broadcast";
    case Op::barrier: return "barrier";
  }
  return "?";
}

// What one rank published for the current collective; peers read `in` between barriers A and B.
struct Slot {
  Op op = Op::barrier;
  const void* in = nullptr;
  core::DType dtype = core::DType::f32;
  core::Shape in_shape;
  GatherAxis axis = GatherAxis::first;
  int root = 0;
};

}  // namespace

struct ThreadShared {
  explicit ThreadShared(int n_ranks) : n(n_ranks), slots(static_cast<size_t>(n_ranks)) {}

  const int n;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;          // ranks waiting at the current barrier
  uint64_t generation = 0;  // completed barriers; a waiter leaves when it changes
  bool aborted = false;
  std::string abort_reason;
  std::vector<Slot> slots;     // [n], slot r written only by rank r, before barrier A
  std::vector<float> scratch;  // fp32 sums: all_reduce [numel], reduce_scatter [n*R*...]

  void abort(const std::string& reason) {
    {
      std::lock_guard lk(mu);
      if (!aborted) {
        aborted = true;
        abort_reason = reason;
      }
    }
    cv.notify_all();
  }

  [[noreturn]] void throw_aborted() const { throw core::Error("comm: thread group aborted: " + abort_reason); }

  // Waits until all n ranks arrived. The last one runs on_last() under the lock first; if that
  // throws (ranks out of step), the group is aborted and every rank throws its message.
  template <class F>
  void arrive_and_wait(F&& on_last) {
    std::unique_lock lk(mu);
    if (aborted) throw_aborted();
    const uint64_t gen = generation;
    if (++arrived == n) {
      arrived = 0;
      try {
        on_last();
      } catch (const std::exception& e) {
        aborted = true;
        abort_reason = e.what();
        lk.unlock();
        cv.notify_all();
        throw_aborted();
      }
      ++generation;
      lk.unlock();
      cv.notify_all();
      return;
    }
    cv.wait(lk, [&] { return generation != gen || aborted; });
    if (generation == gen) throw_aborted();  // aborted before every rank arrived
  }
  void arrive_and_wait() {
    arrive_and_wait([] {});
  }

  // Run by the last arriver at barrier A: all ranks must be in the same collective with matching
  // arguments, else the ranks are out of step and nothing sensible can follow.
  void check_in_step() const {
    const Slot& s0 = slots[0];
    for (int q = 1; q < n; ++q) {
      const Slot& s = slots[static_cast<size_t>(q)];
      const std::string who = "comm: rank " + std::to_string(q) + " ";
      if (s.op != s0.op)
        throw core::Error(who + "called " + op_name(s.op) + " while rank 0 called " + op_name(s0.op) +
                          " (every rank must call the same collectives in order)");
      if (s.op == Op::barrier) continue;
      if (s.dtype != s0.dtype || !(s.in_shape == s0.in_shape))
        throw core::Error(who + op_name(s.op) + " got " + std::string(core::dtype_name(s.dtype)) + " " +
                          s.in_shape.str() + " but rank 0 got " + std::string(core::dtype_name(s0.dtype)) + " " +
                          s0.in_shape.str());
      if (s.op == Op::all_gather && s.axis != s0.axis)
        throw core::Error(who + "all_gather axis " + gather_axis_name(s.axis) + " but rank 0 axis " +
                          gather_axis_name(s0.axis));
      if (s.op == Op::broadcast && s.root != s0.root)
        throw core::Error(who + "broadcast root " + std::to_string(s.root) + " but rank 0 root " +
                          std::to_string(s0.root));
    }
  }
};

namespace {

// acc[i] (+)= value of p[i] as f32, for i in [0, count); `first` stores instead of adding.
void accumulate(float* acc, const void* p, core::DType dtype, int64_t begin, int64_t count, bool first) {
  if (dtype == core::DType::f32) {
    const float* src = static_cast<const float*>(p) + begin;
    if (first) {
      std::memcpy(acc, src, static_cast<size_t>(count) * sizeof(float));
    } else {
      for (int64_t i = 0; i < count; ++i) acc[i] = acc[i] + src[i];
    }
  } else {  // bf16
    const uint16_t* src = static_cast<const uint16_t*>(p) + begin;
    if (first) {
      for (int64_t i = 0; i < count; ++i) acc[i] = core::bf16_bits_to_f32(src[i]);
    } else {
      for (int64_t i = 0; i < count; ++i) acc[i] = acc[i] + core::bf16_bits_to_f32(src[i]);
    }
  }
}

// dst[i] <- acc[i] in `dtype` (bf16: the one rounding of the rank sum).
void store(void* dst, const float* acc, core::DType dtype, int64_t count) {
  if (dtype == core::DType::f32) {
    std::memcpy(dst, acc, static_cast<size_t>(count) * sizeof(float));
  } else {
    uint16_t* out = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < count; ++i) out[i] = core::f32_to_bf16_bits(acc[i]);
  }
}

class ThreadComm final : public Communicator {
 public:
  ThreadComm(std::shared_ptr<ThreadShared> shared, int rank) : shared_(std::move(shared)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return shared_->n; }
  core::Device device() const override { return core::Device::cpu; }

  void all_reduce_sum(const core::TensorView& x) override {
    require(all_reduce_check(x, core::Device::cpu));
    const int64_t numel = x.numel();
    publish(Op::all_reduce_sum, x.data, x.dtype, x.shape);
    ThreadShared& s = *shared_;
    s.arrive_and_wait([&] {
      s.check_in_step();
      if (s.scratch.size() < static_cast<size_t>(numel)) s.scratch.resize(static_cast<size_t>(numel));
    });
    // Each rank sums an even slice of the elements over all ranks, in rank order, into scratch.
    const int n = s.n;
    const int64_t lo = numel * rank_ / n, hi = numel * (rank_ + 1) / n;
    for (int q = 0; q < n; ++q)
      accumulate(s.scratch.data() + lo, s.slots[static_cast<size_t>(q)].in, x.dtype, lo, hi - lo, q == 0);
    s.arrive_and_wait();
    // Scratch now holds the full fp32 sum; the next collective's barrier A protects it until every
    // rank has copied it out.
    store(x.data, s.scratch.data(), x.dtype, numel);
  }

  void all_gather(const core::TensorView& in, const core::TensorView& out, GatherAxis axis) override {
    ThreadShared& s = *shared_;
    require(all_gather_check(in, out, axis, s.n, core::Device::cpu));
    publish(Op::all_gather, in.data, in.dtype, in.shape, axis);
    s.arrive_and_wait([&] { s.check_in_step(); });
    const size_t es = core::dtype_size(in.dtype);
    char* dst = static_cast<char*>(out.data);
    if (axis == GatherAxis::first) {
      const size_t chunk = static_cast<size_t>(in.numel()) * es;
      for (int q = 0; q < s.n; ++q) copy(dst + q * chunk, s.slots[static_cast<size_t>(q)].in, chunk);
    } else {
      const int64_t cols = in.shape[in.rank() - 1];
      const int64_t rows = cols == 0 ? 0 : in.numel() / cols;
      const size_t row_bytes = static_cast<size_t>(cols) * es;
      for (int q = 0; q < s.n; ++q) {
        const char* src = static_cast<const char*>(s.slots[static_cast<size_t>(q)].in);
        for (int64_t r = 0; r < rows; ++r)
          copy(dst + (static_cast<size_t>(r) * s.n + q) * row_bytes, src + r * row_bytes, row_bytes);
      }
    }
    s.arrive_and_wait();  // peers are done reading our `in`
  }

  void reduce_scatter_sum(const core::TensorView& in, const core::TensorView& out) override {
    ThreadShared& s = *shared_;
    require(reduce_scatter_check(in, out, s.n, core::Device::cpu));
    const int64_t numel = in.numel(), chunk = out.numel();
    publish(Op::reduce_scatter_sum, in.data, in.dtype, in.shape);
    s.arrive_and_wait([&] {
      s.check_in_step();
      if (s.scratch.size() < static_cast<size_t>(numel)) s.scratch.resize(static_cast<size_t>(numel));
    });
    const int64_t lo = chunk * rank_;
    for (int q = 0; q < s.n; ++q)
      accumulate(s.scratch.data() + lo, s.slots[static_cast<size_t>(q)].in, in.dtype, lo, chunk, q == 0);
    s.arrive_and_wait();  // only now may `out` be written: it may alias this rank's `in`
    store(out.data, s.scratch.data() + lo, in.dtype, chunk);
  }

  void broadcast(const core::TensorView& x, int root) override {
    ThreadShared& s = *shared_;
    require(broadcast_check(x, root, s.n, core::Device::cpu));
    publish(Op::broadcast, x.data, x.dtype, x.shape, GatherAxis::first, root);
    s.arrive_and_wait([&] { s.check_in_step(); });
    if (rank_ != root) copy(x.data, s.slots[static_cast<size_t>(root)].in, static_cast<size_t>(x.nbytes()));
    s.arrive_and_wait();  // the root's x may change after this
  }

  void barrier() override {
    publish(Op::barrier, nullptr, core::DType::f32, core::Shape{});
    shared_->arrive_and_wait([&] { shared_->check_in_step(); });
  }

  void abort(const std::string& reason) override { shared_->abort("rank " + std::to_string(rank_) + ": " + reason); }

 private:
  // A bad argument on one rank aborts the group first, so the other ranks throw instead of waiting.
  void require(const core::Status& st) {
    if (st) return;
    shared_->abort("rank " + std::to_string(rank_) + ": " + st.reason());
    throw core::Error(st.reason());
  }

  void publish(Op op, const void* in, core::DType dtype, core::Shape shape, GatherAxis axis = GatherAxis::first,
               int root = 0) {
    Slot& slot = shared_->slots[static_cast<size_t>(rank_)];
    slot.op = op;
    slot.in = in;
    slot.dtype = dtype;
    slot.in_shape = shape;
    slot.axis = axis;
    slot.root = root;
  }

  // memcpy that allows the in-place case (a rank's `in` already being its chunk of `out`).
  static void copy(void* dst, const void* src, size_t bytes) {
    if (dst != src && bytes) std::memcpy(dst, src, bytes);
  }

  std::shared_ptr<ThreadShared> shared_;
  int rank_;
};

}  // namespace

ThreadGroup::ThreadGroup(int n_ranks) {
  K3_CHECK(n_ranks >= 1 && n_ranks <= 4096,
           "comm::ThreadGroup: rank count must be in [1, 4096], got " + std::to_string(n_ranks));
  shared_ = std::make_shared<ThreadShared>(n_ranks);
  ranks_ = std::make_unique<std::unique_ptr<Communicator>[]>(static_cast<size_t>(n_ranks));
  for (int r = 0; r < n_ranks; ++r) ranks_[static_cast<size_t>(r)] = std::make_unique<ThreadComm>(shared_, r);
}

ThreadGroup::~ThreadGroup() = default;

int ThreadGroup::size() const { return shared_->n; }

Communicator& ThreadGroup::rank(int r) {
  K3_CHECK(r >= 0 && r < shared_->n, "comm::ThreadGroup::rank: " + std::to_string(r) + " is not a rank of a group of " +
                                         std::to_string(shared_->n));
  return *ranks_[static_cast<size_t>(r)];
}

void ThreadGroup::abort(const std::string& reason) { shared_->abort(reason); }

bool ThreadGroup::aborted() const {
  std::lock_guard lk(shared_->mu);
  return shared_->aborted;
}

void run_ranks(ThreadGroup& group, const std::function<void(Communicator&)>& fn) {
  std::mutex mu;
  std::exception_ptr first;
  auto record = [&](int r, std::exception_ptr e) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      what = ex.what();
    } catch (...) {
    }
    {
      std::lock_guard lk(mu);
      if (!first) first = e;
    }
    group.abort("rank " + std::to_string(r) + " threw: " + what);
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(group.size()));
  try {
    for (int r = 0; r < group.size(); ++r) {
      threads.emplace_back([&, r] {
        try {
          fn(group.rank(r));
        } catch (...) {
          record(r, std::current_exception());
        }
      });
    }
  } catch (...) {  // could not start a thread: release the ones already waiting
    record(-1, std::current_exception());
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

void run_ranks(int n_ranks, const std::function<void(Communicator&)>& fn) {
  ThreadGroup group(n_ranks);
  run_ranks(group, fn);
}

}  // namespace k3::comm
