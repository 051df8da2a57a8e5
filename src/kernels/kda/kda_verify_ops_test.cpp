// kernels/kda/kda_verify_ops_test.cpp: the speculative-verify (no_commit) mode of the CUDA KDA conv
// and recurrent kernels (spec §5.9 (b)) against the CPU reference: outputs as a committing call
// gives them, and the state pool left BIT-identical (every slot). Verify batches: K+1 rows per
// sequence (K = 1, 3, 7) at odd shapes and the TP8 shapes; the chunked form refuses the flag.
#include <vector>

#include "core/error.h"
#include "kernels/testing/op_harness.h"

namespace k3::ops_test {
namespace {

// Sequence s owns rows [s*rows, (s+1)*rows), slot num_seqs-1-s of a pool with one spare slot.
struct VerifyBatch {
  Tensor h_row_begin, h_num_rows, h_position, h_slot, d_row_begin, d_num_rows, d_position, d_slot;
  int num_seqs, rows;
  VerifyBatch(Device* dev, int n, int r, int position) : num_seqs(n), rows(r) {
    for (Tensor* t : {&h_row_begin, &h_num_rows, &h_position, &h_slot}) *t = Tensor::zeros(DType::i32, {n});
    for (int s = 0; s < n; ++s) {
      h_row_begin.data<int32_t>()[s] = s * r;
      h_num_rows.data<int32_t>()[s] = r;
      h_position.data<int32_t>()[s] = position + 13 * s;
      h_slot.data<int32_t>()[s] = n - 1 - s;
    }
    d_row_begin = dev->upload(h_row_begin), d_num_rows = dev->upload(h_num_rows);
    d_position = dev->upload(h_position), d_slot = dev->upload(h_slot);
  }
  kernels::SeqBatch make(bool device) const {
    kernels::SeqBatch b;
    b.row_begin = (device ? d_row_begin : h_row_begin).view();
    b.num_rows = (device ? d_num_rows : h_num_rows).view();
    b.position = (device ? d_position : h_position).view();
    b.slot = (device ? d_slot : h_slot).view();
    b.num_seqs = num_seqs;
    b.max_rows = rows;
    b.max_tokens = h_position.data<int32_t>()[num_seqs - 1] + rows;
    return b;
  }
  int64_t T() const { return int64_t{num_seqs} * rows; }
};

void check_conv_verify(Device* dev, Mode mode, int seqs, int rows, int64_t C, uint64_t seed) {
  core::Rng rng(seed);
  const VerifyBatch batch(dev, seqs, rows, 40);
  const int64_t T = batch.T(), K = 4, N = seqs + 1;
  const Tensor x = random_act(rng, {T, C}, mode), w = random_uniform_f32(rng, {C, K}, 0.5);
  const Tensor pool0 = random_act(rng, {N, C, K - 1}, Mode::bf16);
  const Precision p = precision(mode);
  Tensor want = nan_tensor({T, C}), want_pool = copy(pool0);
  kernels::KdaConvArgs ref{x.view(), w.view(), want_pool.view(), want.view(), p, batch.make(false)};
  ref.no_commit = true;
  cpu_registry().kda_conv.run(ref, core::Device::cpu);
  Tensor dx = dev->act(x, mode), dw = dev->upload(w), dpool = dev->upload(pool0, act_dtype(mode));
  Tensor out = dev->poisoned(act_dtype(mode), {T, C});
  kernels::KdaConvArgs args{dx.view(), dw.view(), dpool.view(), out.view(), p, batch.make(true)};
  args.no_commit = true;
  expect_device_impl(dev->registry().kda_conv, args, dev);
  dev->registry().kda_conv.run(args, dev->kind());
  const std::string shape = shape_str({T, C, K}) + " verify " + std::to_string(seqs) + "x" + std::to_string(rows);
  expect_close("kda_conv", shape, mode, "out", dev->to_host_f32(out.view()), want, tol_elementwise(mode));
  // The pool is exactly what it was (the CPU reference left it so too).
  expect_close("kda_conv", shape, mode, "state untouched", dev->to_host_f32(dpool.view()), to_f32(pool0),
               Tol{0.0, 1 - 1e-12});
  expect_close("kda_conv", shape, mode, "cpu state untouched", want_pool, to_f32(pool0), Tol{0.0, 1 - 1e-12});
}

void check_recurrent_verify(Device* dev, Mode mode, int seqs, int rows, int H, int D, uint64_t seed) {
  core::Rng rng(seed);
  const VerifyBatch batch(dev, seqs, rows, 100);
  const int64_t T = batch.T(), P = int64_t{H} * D, N = seqs + 1;
  const Tensor q = random_act(rng, {T, P}, mode), k = random_act(rng, {T, P}, mode), v = random_act(rng, {T, P}, mode);
  const Tensor f = random_act(rng, {T, P}, mode, -1.0, 2.0), b = random_act(rng, {T, H}, mode, 0.0, 1.5);
  const Tensor a_log = random_act(rng, {H}, Mode::fp32, 0.0, 0.5), dt = random_act(rng, {P}, Mode::fp32);
  const Tensor pool0 = random_act(rng, {N, H, D, D}, Mode::fp32, 0.0, 0.5);
  const Precision p = precision(mode);
  Tensor want = nan_tensor({T, P}), want_pool = copy(pool0);
  kernels::KdaAttentionArgs ref{q.view(),         k.view(),    v.view(), f.view(), b.view(), a_log.view(), dt.view(),
                                want_pool.view(), want.view(), H,        D,        -5.0f,    64,           p,
                                batch.make(false)};
  ref.no_commit = true;
  cpu_registry().kda_recurrent.run(ref, core::Device::cpu);
  Tensor dq = dev->act(q, mode), dk = dev->act(k, mode), dv = dev->act(v, mode), df = dev->act(f, mode);
  Tensor db = dev->act(b, mode), d_alog = dev->upload(a_log), d_dt = dev->upload(dt), dpool = dev->upload(pool0);
  Tensor out = dev->poisoned(act_dtype(mode), {T, P});
  kernels::KdaAttentionArgs args{
      dq.view(), dk.view(), dv.view(), df.view(), db.view(), d_alog.view(),   d_dt.view(), dpool.view(), out.view(),
      H,         D,         -5.0f,     64,        p,         batch.make(true)};
  args.no_commit = true;
  expect_device_impl(dev->registry().kda_recurrent, args, dev);
  dev->registry().kda_recurrent.run(args, dev->kind());
  const std::string shape = shape_str({T, H, D}) + " verify " + std::to_string(seqs) + "x" + std::to_string(rows);
  expect_close("kda_recurrent", shape, mode, "out", dev->to_host_f32(out.view()), want, tol_attention(mode));
  expect_close("kda_recurrent", shape, mode, "state untouched", dev->to_host_f32(dpool.view()), pool0,
               Tol{0.0, 1 - 1e-12});
  // The chunked form refuses no_commit on the device as on the CPU.
  EXPECT_THROW(dev->registry().kda_chunked.select(args, dev->kind()), core::Error);
}

TEST(OpsOdd, KdaVerifyNoCommit) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 7900;
  for (Mode m : kModes) {
    check_conv_verify(dev, m, 1, 2, 97, seed++);
    check_conv_verify(dev, m, 5, 4, 33, seed++);
    check_recurrent_verify(dev, m, 1, 2, 3, 17, seed++);
    check_recurrent_verify(dev, m, 5, 4, 2, 32, seed++);
  }
}
TEST(OpsTp8, KdaVerifyNoCommit) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 7950;
  for (Mode m : kModes) {
    check_conv_verify(dev, m, 64, 4, 1536, seed++);  // 64 requests x (K = 3) + 1 rows
    check_recurrent_verify(dev, m, 64, 4, 12, 128, seed++);
    check_recurrent_verify(dev, m, 8, 8, 12, 128, seed++);  // K = 7
  }
}

}  // namespace
}  // namespace k3::ops_test
