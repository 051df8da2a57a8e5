// kernels/testing/op_harness.h: the all-backends op test harness: random inputs, a device adapter
// (upload, NaN-poisoned outputs, download), error metrics against the CPU reference and a report.
//
// Each op test builds CPU inputs, runs the CPU reference (the oracle) through the registry, then
// for every available device backend uploads the same inputs, checks that the registry selects
// that backend's implementation (a test that silently ran the CPU path would prove nothing), runs
// it on NaN-poisoned outputs and compares. Two modes:
//   bf16: device activations bf16, Precision::bf16; the CPU reference gets the same bf16 values as
//         f32 tensors in Precision::bf16 (bf16 tolerances: rounding flips, summation order);
//   fp32: device activations f32, Precision::fp32 against the CPU in fp32 (tight tolerances).
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "kernels/registry.h"

namespace k3::ops_test {

using core::DType;
using core::Shape;
using core::Tensor;
using core::TensorView;
using kernels::Precision;

enum class Mode { bf16, fp32 };
inline const char* mode_name(Mode m) { return m == Mode::bf16 ? "bf16" : "fp32"; }
inline Precision precision(Mode m) { return m == Mode::bf16 ? Precision::bf16 : Precision::fp32; }
inline DType act_dtype(Mode m) { return m == Mode::bf16 ? DType::bf16 : DType::f32; }
inline constexpr Mode kModes[] = {Mode::bf16, Mode::fp32};

// ---------------------------------------------------------------- host tensors

Tensor f32_tensor(Shape shape);
Tensor nan_tensor(Shape shape);  // CPU outputs start as NaN too
// N(mean, std) values (core::Rng, Box-Muller); in bf16 mode rounded to bf16 as activations are.
Tensor random_act(core::Rng& rng, Shape shape, Mode mode, double mean = 0.0, double std = 1.0);
// Uniform(-a, a) with a = sqrt(3) * std: fast bulk weights (the distribution does not matter here).
Tensor random_uniform_f32(core::Rng& rng, Shape shape, double std);
// A bf16 weight [rows, cols] with std 1/sqrt(cols) (outputs O(1) for O(1) inputs).
Tensor random_bf16_weight(core::Rng& rng, int64_t rows, int64_t cols);
// An MXFP4 weight: random values quantized per group of 32 (core::mxfp4_quantize_row).
kernels::LinearWeight random_mxfp4_weight(core::Rng& rng, int64_t rows, int64_t cols);
Tensor copy(const Tensor& t);
// A contiguous CPU copy of a CPU f32 view that may have strided rows (rank 2).
Tensor copy_rows(const TensorView& v);
// Columns [c0, c1) of a contiguous rank-2 tensor (any device) as a row-strided view.
TensorView column_block(const Tensor& t, int64_t c0, int64_t c1);
// Widens a CPU tensor (f32, bf16, fp8) to f32 values.
Tensor to_f32(const Tensor& t);

// ---------------------------------------------------------------- metrics and report

struct Metrics {
  double rel_err = 0;  // ||got - want|| / ||want||
  double cosine = 1;   // <got, want> / (|got| |want|)
  double max_abs = 0;  // max |got - want|
  bool finite = true;  // every got value finite (NaN poison left = an unwritten output)
};
Metrics compare(std::span<const float> got, std::span<const float> want);

struct Tol {
  double rel, min_cos;
};
// Tolerances per mode: `exact_ish` for ops without reductions (elementwise), else reductions.
Tol tol_elementwise(Mode m);
Tol tol_reduction(Mode m);
Tol tol_attention(Mode m);

// Records one comparison (for the JSON report and the log line) and EXPECTs it within `tol`.
void expect_close(const std::string& op, const std::string& shape, Mode mode, const std::string& what,
                  const Tensor& got_f32, const Tensor& want_f32, Tol tol);
// Writes every recorded comparison as JSON (ops_main.cpp calls it at exit when asked).
void write_report(const std::string& path);
std::string shape_str(std::initializer_list<int64_t> dims);

// ---------------------------------------------------------------- device backends

class Device {
 public:
  virtual ~Device() = default;
  // The CUDA backend when the build has it and a GPU is usable; nullptr (and why) otherwise.
  static Device* cuda(std::string* why);

  virtual core::Device kind() const = 0;
  virtual std::string impl_prefix() const = 0;  // every implementation name on it starts so
  // A registry with the reference ops and this backend's ops.
  virtual kernels::Registry& registry() = 0;
  // Host tensor to device, as `as` (f32 -> bf16 conversion allowed) or as is.
  virtual Tensor upload(const Tensor& host, DType as) = 0;
  Tensor upload(const Tensor& host) { return upload(host, host.dtype()); }
  // An activation in this mode's device dtype.
  Tensor act(const Tensor& host, Mode m) { return upload(host, act_dtype(m)); }
  // A device LinearWeight with the same bytes.
  kernels::LinearWeight upload(const kernels::LinearWeight& w);
  // Uninitialised device tensor filled with NaN (0xff bytes).
  virtual Tensor poisoned(DType dtype, Shape shape) = 0;
  // Device tensor (view) back to a CPU f32 tensor; waits for the queued work.
  virtual Tensor to_host_f32(const TensorView& v) = 0;
  // Device tensor (view) back to a CPU tensor of the same dtype (ids), waiting likewise.
  virtual Tensor to_host(const TensorView& v) = 0;
  virtual void synchronize() = 0;
  // How many kernels `op` queues: it is captured once as a CUDA graph (nothing runs; buffers it
  // allocates belong to that graph and are gone after) and the graph's kernel nodes are counted.
  // Proof of a fusion: a fused op must be fewer launches than the ops it replaces.
  virtual int64_t kernels_queued_by(const std::function<void()>& op) = 0;
};

// A registry with only the CPU reference ops (the oracle).
kernels::Registry& cpu_registry();

// Skips the current test when there is no CUDA device, with the reason; else sets `dev`.
#define K3_REQUIRE_CUDA(dev)                                            \
  std::string k3_why_;                                                  \
  ::k3::ops_test::Device* dev = ::k3::ops_test::Device::cuda(&k3_why_); \
  if (dev == nullptr) {                                                 \
    GTEST_SKIP() << "no CUDA backend to test: " << k3_why_;             \
  }

// Asserts that `table` selects an implementation of `dev`'s backend for `args` (not the CPU).
template <class Table, class Args>
void expect_device_impl(const Table& table, const Args& args, Device* dev) {
  const auto& impl = table.select(args, dev->kind());
  EXPECT_EQ(impl.device, dev->kind()) << table.op();
  EXPECT_EQ(impl.name.rfind(dev->impl_prefix(), 0), 0u)
      << table.op() << " selected '" << impl.name << "', not a " << dev->impl_prefix() << "* implementation";
}

// ---------------------------------------------------------------- the slow-producer run (PDL)
//
// Programmatic dependent launch (kernels/cuda_common.cuh) starts a kernel while the kernel before it on
// the stream still runs; only its pdl_wait() orders its reads and writes after that kernel, so a kernel
// that touches an input or an output before its wait races, silently, in a normal run. The slow-producer
// form makes every such race visible: before the op, a producer kernel triggers its dependents at its
// start (the op's first kernel launches at once, and through the converted kernels' early triggers the
// op's later kernels too), spins ~200 us (clock64), then copies the op's inputs from staging copies into
// the real buffers (NaN until then) and writes NaN over the outputs (an output stored before the wait is
// lost). The op then runs as usual on the same stream; its results must equal the plain run's BIT FOR
// BIT (same kernels, same inputs, same addresses).

// Device buffers of one op call, each a contiguous view of a whole device tensor.
struct OpBuffers {
  std::vector<TensorView> inputs;   // what the op reads that a kernel of the step writes: activations, state,
                                    // caches, step tables (weights stay out: they may be read before the wait)
  std::vector<TensorView> outputs;  // what it writes (a state updated in place belongs to inputs)
};

// One op's buffers with the inputs' current contents kept aside (device copies) when staged: every run
// starts from them, so runs repeat exactly, also for an op that updates an input in place.
class StagedOp {
 public:
  virtual ~StagedOp() = default;
  // Each returns the buffers' bytes after the run: host tensors of the same dtype and shape, outputs
  // first, then inputs (a state written in place).
  // Plain: inputs restored, outputs NaN, then op().
  virtual std::vector<Tensor> run_plain(const std::function<void()>& op) = 0;
  // Slow: inputs and outputs NaN, the slow producer, then op().
  virtual std::vector<Tensor> run_after_slow_producer(const std::function<void()>& op) = 0;
  // The slow form (NaN fills, producer, op) captured once as a CUDA graph, replayed `replays` times:
  // the bytes after each replay.
  virtual std::vector<std::vector<Tensor>> replay_after_slow_producer(const std::function<void()>& op, int replays) = 0;
};

// When the producer ended and when a dependent probe kernel started and left its pdl_wait() (globaltimer
// ns): proof that the dependent launch really happens early on this GPU and driver.
struct PdlProbe {
  int64_t producer_end_ns = 0, probe_start_ns = 0, probe_after_wait_ns = 0;
};

// The CUDA device of the slow-producer runs: its own context and registry (reference + CUDA ops), so
// the ops queued through registry() run on the stream the producer uses. nullptr (and why) without CUDA.
class PdlDevice : public Device {
 public:
  static PdlDevice* cuda(std::string* why);
  // Keeps device copies of the inputs' current contents; throws core::Error naming a buffer that is not
  // a contiguous CUDA view.
  virtual std::unique_ptr<StagedOp> stage(const OpBuffers& buffers) = 0;
  // The producer (spin_us) followed by a probe kernel launched as its programmatic dependent.
  virtual PdlProbe probe(double spin_us) = 0;
};

// EXPECTs got[i] byte-identical to want[i] for every buffer, naming the first differing element and
// counting the NaN elements of got (a read before the wait shows as NaN).
void expect_same_bytes(const std::string& what, const std::vector<Tensor>& got, const std::vector<Tensor>& want);

// Skips the current test when there is no CUDA device, with the reason; else sets `dev` (a PdlDevice*).
#define K3_REQUIRE_PDL_CUDA(dev)                                                  \
  std::string k3_pdl_why_;                                                        \
  ::k3::ops_test::PdlDevice* dev = ::k3::ops_test::PdlDevice::cuda(&k3_pdl_why_); \
  if (dev == nullptr) {                                                           \
    GTEST_SKIP() << "no CUDA backend to test: " << k3_pdl_why_;                   \
  }

}  // namespace k3::ops_test
