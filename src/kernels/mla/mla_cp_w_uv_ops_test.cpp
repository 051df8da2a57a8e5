// kernels/mla/mla_cp_w_uv_ops_test.cpp: mla_w_uv (kernels/mla/mla_cp.h), the last step of MLA under decode
// context parallelism, with and without the layer's output gate, on every device backend against the CPU
// reference, each case asserting that "cuda_w_uv_rowdot" ran (ONE launch: W_UV rows in registers, a warp per
// row against the o_lat of 8 query slots, then the gate), on the case tables of kernels/mla/cases.h:
//   odd shapes (kMlaCpWUvOddCases): kv_lora 8 / 37 / 54 / 60 / 511 (scalar path where kv_lora is not a
//     multiple of the 16-byte chunk: 8 bf16 or 4 f32 values) and 60 / 64 / 512 (16-byte loads of f32 and bf16
//     kv_b), v 7 / 9 / 11 / 13 / 17, H 1-5, sequences of 1-5 rows (kMlaCpWUvOddRows) with rows of no sequence
//     between them, unused slots (max_rows above every sequence's rows) and slot chunks of 8 that span
//     sequences; gate absent, separate, or out == gate;
//   one TP8 rank of K3 (kMlaK3Tp8: H 12, nope 128, v 128, kv_lora 512, bf16 kv_b) at the decode rows of
//     kMlaCpK3DecodeRows and a verify step of kMlaCpK3VerifySeqs sequences of kMlaCpK3VerifyRows rows, both
//     modes;
//   the gated op equals the device pair mla_w_uv + sigmoid_gate BIT FOR BIT (model/layers/mla.cpp runs that
//     pair instead when tracing, so traces keep the ungated "mla.o");
//   PDL (kernels/cuda_common.cuh): behind the slow producer and as a replayed CUDA graph, the bytes of the plain
//     run.
// NaN-poisoned outputs; rows of no sequence must stay untouched. One case runs without a GPU: the gated CPU
// reference equals mla_w_uv_reference + sigmoid_gate_reference bit for bit in both precisions.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/mla/cases.h"
#include "kernels/testing/op_harness.h"

namespace k3::ops_test {
namespace {

constexpr const char* kWUv = "cuda_w_uv_rowdot";

using Dims = kernels::MlaShape;  // heads: this rank's H; rope unused
constexpr const Dims& kTp8 = kernels::kMlaK3Tp8;
DType kv_b_dtype(const kernels::MlaCpWUvCase& c) { return c.kv_b_f32 ? DType::f32 : DType::bf16; }

enum class Gate { none, separate, in_place };  // in_place: out is the gate view
const char* gate_name(Gate g) { return g == Gate::none ? "no_gate" : g == Gate::separate ? "gate" : "gate_in_place"; }

Tensor i32_host(const std::vector<int32_t>& v) {
  Tensor t = Tensor::zeros(DType::i32, {static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

// Activation rows of a batch: row 0 belongs to no sequence; then the sequences in reverse order, each
// followed by `gap` rows of no sequence. max_rows = the longest sequence + spare_slots (unused slots).
struct Rows {
  std::vector<int32_t> begins, counts;
  std::vector<bool> owned;
  int64_t total = 1;
  int max_rows = 0;
  Rows(const std::vector<int64_t>& rows, int gap, int spare_slots) : begins(rows.size()) {
    for (size_t k = rows.size(); k-- > 0;) {
      begins[k] = static_cast<int32_t>(total);
      total += rows[k] + gap;
    }
    for (int64_t n : rows) {
      counts.push_back(static_cast<int32_t>(n));
      max_rows = std::max(max_rows, static_cast<int>(n) + spare_slots);
    }
    owned.assign(static_cast<size_t>(total), false);
    for (size_t k = 0; k < rows.size(); ++k)
      for (int64_t i = 0; i < rows[k]; ++i) owned[static_cast<size_t>(begins[k] + i)] = true;
  }
  // Only row_begin / num_rows: all mla_w_uv reads.
  kernels::SeqBatch seqs(const Tensor& row_begin, const Tensor& num_rows) const {
    kernels::SeqBatch b;
    b.row_begin = row_begin.view();
    b.num_rows = num_rows.view();
    b.num_seqs = static_cast<int>(counts.size());
    b.max_rows = max_rows;
    return b;
  }
  // The owned rows of a CPU f32 [total, W] tensor, stacked.
  Tensor owned_of(const Tensor& t) const {
    const int64_t W = t.dim(1);
    std::vector<float> v;
    for (int64_t r = 0; r < total; ++r)
      if (owned[static_cast<size_t>(r)])
        v.insert(v.end(), t.data<const float>() + r * W, t.data<const float>() + (r + 1) * W);
    Tensor out = f32_tensor({static_cast<int64_t>(v.size())});
    std::copy(v.begin(), v.end(), out.data<float>());
    return out;
  }
};
std::vector<int64_t> ones(int64_t n) { return std::vector<int64_t>(static_cast<size_t>(n), 1); }

// One call's host inputs: o_lat [R, H, L] unrounded f32 (the reduce-scatter's sum), kv_b, the gate
// logits [R, H * v] (rounded in bf16 mode, as the model's g_proj output) and the row tables.
struct WUvInputs {
  Rows rows;
  Tensor o_lat, gate, row_begin, num_rows;
  kernels::LinearWeight kv_b;
  WUvInputs(const Dims& d, const Rows& r, DType w_dtype, Mode mode, uint64_t seed) : rows(r) {
    core::Rng rng(seed);
    const int64_t R = rows.total, H = d.heads, kv_rows = H * (d.nope + d.v);
    o_lat = random_act(rng, {R, H, d.kv_lora}, Mode::fp32);
    kv_b.weight = w_dtype == DType::bf16 ? random_bf16_weight(rng, kv_rows, d.kv_lora)
                                         : random_uniform_f32(rng, {kv_rows, d.kv_lora}, 1.0 / std::sqrt(d.kv_lora));
    gate = random_act(rng, {R, H * d.v}, mode, 0.0, 2.0);
    row_begin = i32_host(rows.begins);
    num_rows = i32_host(rows.counts);
  }
};

kernels::MlaWUvArgs w_uv_args(const Dims& d, const TensorView& o_lat, const kernels::SeqBatch& seqs,
                              const kernels::LinearWeight* kv_b, const TensorView& gate, const TensorView& out,
                              Mode mode) {
  return {o_lat, seqs, kv_b, gate, out, d.heads, d.nope, d.v, d.kv_lora, precision(mode)};
}

// The CPU reference of a call: out [R, H * v] (NaN, or the gate's values when in place).
Tensor reference(const Dims& d, const WUvInputs& in, Gate g, Mode mode) {
  Tensor out = g == Gate::in_place ? copy(in.gate) : nan_tensor({in.rows.total, int64_t{d.heads} * d.v});
  const TensorView gate = g == Gate::none ? TensorView{} : g == Gate::in_place ? out.view() : in.gate.view();
  cpu_registry().mla_w_uv.run(w_uv_args(d, in.o_lat.view(), in.rows.seqs(in.row_begin, in.num_rows), &in.kv_b, gate,
                                        out.view(), mode),
                              core::Device::cpu);
  return out;
}

// The inputs on a device, and a NaN-poisoned out (or a copy of the gate when in place).
struct DeviceCall {
  Tensor o_lat, gate, row_begin, num_rows, out;
  kernels::LinearWeight kv_b;
  kernels::MlaWUvArgs args;
  DeviceCall(Device* dev, const Dims& d, const WUvInputs& in, Gate g, Mode mode)
      : o_lat(dev->upload(in.o_lat)),
        gate(dev->act(in.gate, mode)),
        row_begin(dev->upload(in.row_begin)),
        num_rows(dev->upload(in.num_rows)),
        out(g == Gate::in_place ? dev->act(in.gate, mode) : dev->poisoned(act_dtype(mode), in.gate.shape())),
        kv_b(dev->upload(in.kv_b)) {
    const TensorView gv = g == Gate::none ? TensorView{} : g == Gate::in_place ? out.view() : gate.view();
    args = w_uv_args(d, o_lat.view(), in.rows.seqs(row_begin, num_rows), &kv_b, gv, out.view(), mode);
  }
};

// ---------------------------------------------------------------- against the CPU reference

void check_w_uv(Device* dev, Mode mode, const Dims& d, const Rows& rows, DType w_dtype, Gate g, uint64_t seed) {
  const WUvInputs in(d, rows, w_dtype, mode, seed);
  const Tensor want = reference(d, in, g, mode);
  DeviceCall call(dev, d, in, g, mode);
  auto& table = dev->registry().mla_w_uv;
  expect_device_impl(table, call.args, dev);
  ASSERT_EQ(table.select(call.args, dev->kind()).name, kWUv);
  table.run(call.args, dev->kind());
  const Tensor got = dev->to_host_f32(call.out.view());
  const int64_t W = got.dim(1);
  for (int64_t r = 0; r < rows.total; ++r) {  // rows of no sequence: untouched
    if (rows.owned[static_cast<size_t>(r)]) continue;
    for (int64_t c = 0; c < W; ++c) {
      const float x = got.data<const float>()[r * W + c];
      if (g == Gate::in_place) {
        ASSERT_EQ(x, in.gate.data<const float>()[r * W + c]) << "row " << r << " (no sequence) changed";
      } else {
        ASSERT_TRUE(std::isnan(x)) << "row " << r << " (no sequence) written";
      }
    }
  }
  const std::string what = std::string("out_") + gate_name(g) + "_kv_b_" + std::string(core::dtype_name(w_dtype));
  expect_close("mla_w_uv", shape_str({rows.total, d.heads, d.v, d.kv_lora}), mode, what, rows.owned_of(got),
               rows.owned_of(want), tol_reduction(mode));
}

// Sequences of kMlaCpWUvOddRows rows, a row of no sequence after each, two unused slots per sequence.
Rows odd_rows() {
  return Rows(std::vector<int64_t>(std::begin(kernels::kMlaCpWUvOddRows), std::end(kernels::kMlaCpWUvOddRows)), 1, 2);
}

TEST(OpsOdd, MlaCpWUv) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 9500;
  for (Mode m : kModes)
    for (const kernels::MlaCpWUvCase& c : kernels::kMlaCpWUvOddCases)
      for (Gate g : {Gate::none, Gate::separate, Gate::in_place})
        check_w_uv(dev, m, c.shape, odd_rows(), kv_b_dtype(c), g, ++seed);
}

// The decode rows of kMlaCpK3DecodeRows and the verify step at one TP8 rank of K3.
TEST(OpsTp8, MlaCpWUv) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 9550;
  const Rows verify(std::vector<int64_t>(kernels::kMlaCpK3VerifySeqs, kernels::kMlaCpK3VerifyRows), 0, 1);
  for (Mode m : kModes) {
    for (int64_t T : kernels::kMlaCpK3DecodeRows)
      for (Gate g : {Gate::none, Gate::separate, Gate::in_place})
        check_w_uv(dev, m, kTp8, Rows(ones(T), 0, 1), DType::bf16, g, ++seed);
    check_w_uv(dev, m, kTp8, verify, DType::bf16, Gate::separate, ++seed);
  }
}

// ---------------------------------------------------------------- the gated op is the device pair

// mla_w_uv with the gate against mla_w_uv without it followed by sigmoid_gate, on the device: the same
// bytes in every owned row (the kernel's epilogue is sigmoid_gate_kernel's expression on the value the
// ungated op stores).
void check_gate_is_the_pair(Device* dev, Mode mode, const Dims& d, const Rows& rows, DType w_dtype, uint64_t seed) {
  const WUvInputs in(d, rows, w_dtype, mode, seed);
  DeviceCall fused(dev, d, in, Gate::separate, mode), plain(dev, d, in, Gate::none, mode);
  kernels::Registry& reg = dev->registry();
  ASSERT_EQ(reg.mla_w_uv.select(fused.args, dev->kind()).name, kWUv);
  ASSERT_EQ(reg.mla_w_uv.select(plain.args, dev->kind()).name, kWUv);
  reg.mla_w_uv.run(fused.args, dev->kind());
  reg.mla_w_uv.run(plain.args, dev->kind());
  const Tensor paired = dev->poisoned(act_dtype(mode), in.gate.shape());
  const kernels::SigmoidGateArgs gate_args{plain.out.view(), plain.gate.view(), paired.view(), precision(mode)};
  expect_device_impl(reg.sigmoid_gate, gate_args, dev);
  reg.sigmoid_gate.run(gate_args, dev->kind());
  const Tensor a = dev->to_host(fused.out.view()), b = dev->to_host(paired.view());
  const int64_t row_bytes = a.nbytes() / rows.total;
  for (int64_t r = 0; r < rows.total; ++r) {
    if (!rows.owned[static_cast<size_t>(r)]) continue;
    ASSERT_EQ(std::memcmp(a.data<const uint8_t>() + r * row_bytes, b.data<const uint8_t>() + r * row_bytes,
                          static_cast<size_t>(row_bytes)),
              0)
        << "row " << r << ": the gated op differs from mla_w_uv + sigmoid_gate (" << mode_name(mode) << ", kv_lora "
        << d.kv_lora << ")";
  }
}

TEST(OpsOdd, MlaCpWUvGateIsTheDevicePairBitwise) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 9580;
  for (Mode m : kModes)
    for (const kernels::MlaCpWUvCase& c : kernels::kMlaCpWUvOddCases)
      check_gate_is_the_pair(dev, m, c.shape, odd_rows(), kv_b_dtype(c), ++seed);
}
TEST(OpsTp8, MlaCpWUvGateIsTheDevicePairBitwise) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 9590;
  for (Mode m : kModes)
    for (int64_t T : kernels::kMlaCpK3DecodeRows)
      check_gate_is_the_pair(dev, m, kTp8, Rows(ones(T), 0, 1), DType::bf16, ++seed);
}

// ---------------------------------------------------------------- PDL

// The op behind the slow producer and (graph) as two replays of the captured slow form: the plain run's
// bytes every time; the plain run wrote something finite.
void check_pdl(PdlDevice* dev, Mode mode, const Dims& d, const Rows& rows, DType w_dtype, bool graph, uint64_t seed) {
  const WUvInputs in(d, rows, w_dtype, mode, seed);
  DeviceCall call(dev, d, in, Gate::separate, mode);
  ASSERT_EQ(dev->registry().mla_w_uv.select(call.args, dev->kind()).name, kWUv);
  const std::string what = std::string("mla_w_uv ") + mode_name(mode) + " kv_lora " + std::to_string(d.kv_lora) +
                           " rows " + std::to_string(rows.total);
  SCOPED_TRACE(what);
  const OpBuffers buffers{{call.o_lat.view(), call.gate.view(), call.row_begin.view(), call.num_rows.view()},
                          {call.out.view()}};
  const std::unique_ptr<StagedOp> staged = dev->stage(buffers);
  const std::function<void()> op = [&] { dev->registry().mla_w_uv.run(call.args, dev->kind()); };
  const std::vector<Tensor> plain = staged->run_plain(op);
  const Tensor f = to_f32(plain[0]);
  EXPECT_GT(std::count_if(f.span<const float>().begin(), f.span<const float>().end(),
                          [](float x) { return std::isfinite(x); }),
            0)
      << "the plain run wrote nothing";
  expect_same_bytes(what + " slow", staged->run_after_slow_producer(op), plain);
  if (graph) {
    const std::vector<std::vector<Tensor>> replays = staged->replay_after_slow_producer(op, 2);
    for (size_t r = 0; r < replays.size(); ++r)
      expect_same_bytes(what + " graph " + std::to_string(r), replays[r], plain);
  }
}

// The K3 decode rows (a graph replay at the middle one) and kMlaOdd with an f32 kv_b.
TEST(OpsPdl, MlaCpWUv) {
  K3_REQUIRE_PDL_CUDA(dev);
  uint64_t seed = 9600;
  for (int64_t T : kernels::kMlaCpK3DecodeRows)
    check_pdl(dev, Mode::bf16, kTp8, Rows(ones(T), 0, 1), DType::bf16, /*graph=*/T == 8, ++seed);
  check_pdl(dev, Mode::fp32, kernels::kMlaOdd, odd_rows(), DType::f32, /*graph=*/true, ++seed);
}

// ---------------------------------------------------------------- the CPU contract (no GPU needed)

// The gated reference is mla_w_uv_reference then sigmoid_gate_reference, bit for bit, in both precisions
// (bf16 and f32 kv_b, odd and K3 head dims), and rows of no sequence stay NaN.
TEST(OpsReference, MlaCpWUvGateIsWUvThenSigmoidGate) {
  uint64_t seed = 9650;
  std::vector<Dims> shapes;
  for (const kernels::MlaCpWUvCase& c : kernels::kMlaCpWUvOddCases) shapes.push_back(c.shape);
  shapes.push_back(kTp8);
  for (Mode m : kModes)
    for (const Dims& d : shapes)
      for (DType w : {DType::bf16, DType::f32}) {
        const Rows rows = odd_rows();
        const WUvInputs in(d, rows, w, m, ++seed);
        const Tensor got = reference(d, in, Gate::separate, m);
        const Tensor o = reference(d, in, Gate::none, m);
        Tensor want = nan_tensor(o.shape());
        const int64_t W = o.dim(1);
        const auto row = [&](const Tensor& t, int64_t r) {
          return TensorView::contiguous(t.data<float>() + r * W, DType::f32, {1, W});
        };
        for (int64_t r = 0; r < rows.total; ++r) {
          if (!rows.owned[static_cast<size_t>(r)]) continue;
          const kernels::SigmoidGateArgs gate_args{row(o, r), row(in.gate, r), row(want, r), precision(m)};
          cpu_registry().sigmoid_gate.run(gate_args, core::Device::cpu);
        }
        ASSERT_EQ(got.nbytes(), want.nbytes());
        EXPECT_EQ(std::memcmp(got.data<const float>(), want.data<const float>(), static_cast<size_t>(got.nbytes())), 0)
            << mode_name(m) << " kv_lora " << d.kv_lora << " kv_b " << core::dtype_name(w);
      }
}

}  // namespace
}  // namespace k3::ops_test
