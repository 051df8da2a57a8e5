// kernels/kda/kda_ops_test.cpp: KDA short conv, recurrent (decode, verify rows) and chunked (prefill)
// attention on every device backend against the CPU reference, outputs and the whole state pool
// (used and untouched slots) both. Every call is batched (kda.h): several sequences with different
// row counts, shuffled rows and slots, positions off the chunk grid, at odd shapes and at the TP8
// shapes (12 heads of 128; conv over 3 x 1536 channels, fused and as the model's strided pool). The
// attention ops take their shapes, token counts, chunk sizes and batches from cases.h.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/kda/cases.h"
#include "kernels/testing/op_harness.h"

namespace k3::ops_test {
namespace {

// ---------------------------------------------------------------- sequence batches

struct Seq {
  int64_t row_begin, rows, slot, position;
};

// The sequences of a call: rows laid out in a shuffled order, slots drawn without repetition from
// a pool with two spare slots (which must stay untouched), the given positions.
struct Batch {
  std::vector<Seq> seqs;
  int64_t T = 0, num_slots = 0;
  Tensor h_row_begin, h_num_rows, h_position, h_slot;  // host i32 tables
  Tensor d_row_begin, d_num_rows, d_position, d_slot;  // the same on the device
  int max_rows = 0;

  Batch(Device* dev, core::Rng& rng, const std::vector<int64_t>& rows, const std::vector<int64_t>& positions) {
    const int64_t S = static_cast<int64_t>(rows.size());
    num_slots = S + 2;
    std::vector<int64_t> order(S), slots(num_slots);
    std::iota(order.begin(), order.end(), 0);
    std::iota(slots.begin(), slots.end(), 0);
    for (int64_t i = S - 1; i > 0; --i) std::swap(order[i], order[rng.next_u64() % (i + 1)]);
    for (int64_t i = num_slots - 1; i > 0; --i) std::swap(slots[i], slots[rng.next_u64() % (i + 1)]);
    seqs.resize(S);
    for (int64_t i : order) {  // rows in shuffled sequence order
      seqs[i] = {T, rows[i], slots[i], positions.empty() ? 0 : positions[i % positions.size()]};
      T += rows[i];
      max_rows = std::max(max_rows, static_cast<int>(rows[i]));
    }
    for (Tensor* t : {&h_row_begin, &h_num_rows, &h_position, &h_slot}) *t = Tensor::zeros(DType::i32, {S});
    for (int64_t s = 0; s < S; ++s) {
      h_row_begin.data<int32_t>()[s] = static_cast<int32_t>(seqs[s].row_begin);
      h_num_rows.data<int32_t>()[s] = static_cast<int32_t>(seqs[s].rows);
      h_position.data<int32_t>()[s] = static_cast<int32_t>(seqs[s].position);
      h_slot.data<int32_t>()[s] = static_cast<int32_t>(seqs[s].slot);
    }
    d_row_begin = dev->upload(h_row_begin), d_num_rows = dev->upload(h_num_rows);
    d_position = dev->upload(h_position), d_slot = dev->upload(h_slot);
  }
  kernels::SeqBatch host() const { return make(h_row_begin, h_num_rows, h_position, h_slot); }
  kernels::SeqBatch device() const { return make(d_row_begin, d_num_rows, d_position, d_slot); }
  // "rows 3x1@9 17@70": row count @ position per sequence, runs of equal ones counted.
  std::string str() const {
    std::string s = "rows";
    for (size_t i = 0; i < seqs.size();) {  // (appended piece by piece: GCC 12 warns falsely on " " + std::string)
      size_t j = i;
      while (j < seqs.size() && seqs[j].rows == seqs[i].rows && seqs[j].position == seqs[i].position) ++j;
      s += ' ';
      if (j - i > 1) s += std::to_string(j - i) + 'x';
      s += std::to_string(seqs[i].rows);
      s += '@';
      s += std::to_string(seqs[i].position);
      i = j;
    }
    return s;
  }

 private:
  kernels::SeqBatch make(const Tensor& rb, const Tensor& nr, const Tensor& pos, const Tensor& slot) const {
    kernels::SeqBatch b;
    b.row_begin = rb.view(), b.num_rows = nr.view(), b.position = pos.view(), b.slot = slot.view();
    b.num_seqs = static_cast<int>(seqs.size());
    b.max_rows = max_rows;
    for (const Seq& q : seqs) b.max_tokens = std::max(b.max_tokens, q.position + q.rows);
    return b;
  }
};

std::vector<int64_t> repeat(int64_t rows, int n) { return std::vector<int64_t>(static_cast<size_t>(n), rows); }

// The row counts and positions of a batch of cases.h.
template <size_t N>
std::vector<int64_t> rows_of(const kernels::KdaAttnSeq (&batch)[N]) {
  std::vector<int64_t> r;
  for (const kernels::KdaAttnSeq& s : batch) r.push_back(s.rows);
  return r;
}
template <size_t N>
std::vector<int64_t> positions_of(const kernels::KdaAttnSeq (&batch)[N]) {
  std::vector<int64_t> p;
  for (const kernels::KdaAttnSeq& s : batch) p.push_back(s.position);
  return p;
}

// Part i of a [N, parts, C, W] storage as a pool [N, C, W] (strides {parts*C*W, W, 1}), as the model
// passes its [num_slots, 3, P, K-1] conv storage; host or device alike.
TensorView pool_part(const Tensor& storage, int64_t i) {
  const TensorView s = storage.view();
  TensorView v = TensorView::contiguous(static_cast<char*>(s.data) +
                                            i * s.strides[1] * static_cast<int64_t>(core::dtype_size(s.dtype)),
                                        s.dtype, {s.dim(0), s.dim(2), s.dim(3)}, s.device);
  v.strides = {s.strides[0], s.strides[2], s.strides[3], 0};
  return v;
}

// ---------------------------------------------------------------- kda_conv

// x [T, C] over a pool of conv states; `parts` > 1: the pool is part 1 of a [N, parts, C, K-1]
// storage (the model's strided layout). The whole storage is compared, spare slots included.
void check_conv(Device* dev, Mode mode, const std::vector<int64_t>& rows, int64_t C, int64_t K, int parts,
                uint64_t seed) {
  core::Rng rng(seed);
  const Batch batch(dev, rng, rows, {});
  const int64_t T = batch.T, N = batch.num_slots;
  const Tensor x = random_act(rng, {T, C}, mode);
  const Tensor w = random_uniform_f32(rng, {C, K}, 0.5);
  const Tensor storage0 = random_act(rng, {N, parts, C, K - 1}, Mode::bf16);  // the state holds bf16 values
  const Precision p = precision(mode);
  const int64_t part = parts > 1 ? 1 : 0;
  Tensor want = nan_tensor({T, C}), want_storage = copy(storage0);
  cpu_registry().kda_conv.run({x.view(), w.view(), pool_part(want_storage, part), want.view(), p, batch.host()},
                              core::Device::cpu);
  // Device: the conv state is real bf16 in bf16 mode, f32 in fp32 mode.
  Tensor dx = dev->act(x, mode), dw = dev->upload(w), dstorage = dev->upload(storage0, act_dtype(mode));
  Tensor out = dev->poisoned(act_dtype(mode), {T, C});
  const kernels::KdaConvArgs args{dx.view(), dw.view(), pool_part(dstorage, part), out.view(), p, batch.device()};
  expect_device_impl(dev->registry().kda_conv, args, dev);
  dev->registry().kda_conv.run(args, dev->kind());
  const std::string shape = shape_str({T, C, K}) + (parts > 1 ? " strided pool " : " ") + batch.str();
  expect_close("kda_conv", shape, mode, "out", dev->to_host_f32(out.view()), want, tol_elementwise(mode));
  expect_close("kda_conv", shape, mode, "state", dev->to_host_f32(dstorage.view()), want_storage, Tol{0.0, 1 - 1e-12});
}

TEST(OpsOdd, KdaConv) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 7000;
  for (Mode m : kModes) {
    for (int64_t T : {1, 2, 17, 97}) check_conv(dev, m, {T}, 97, 4, 1, seed++);
    check_conv(dev, m, {1, 3, 17, 64}, 97, 4, 1, seed++);
    check_conv(dev, m, repeat(1, 5), 33, 4, 1, seed++);  // a decode step
    check_conv(dev, m, {2, 1, 54}, 19, 3, 3, seed++);    // strided pool, K = 3 (a state of 2)
  }
}
TEST(OpsTp8, KdaConv) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 7100;
  for (Mode m : kModes) {
    check_conv(dev, m, repeat(1, 64), 3 * 1536, 4, 1, seed++);  // decode of 64, q/k/v fused
    check_conv(dev, m, {1, 8, 64}, 3 * 1536, 4, 1, seed++);
    check_conv(dev, m, repeat(1, 64), 1536, 4, 3, seed++);  // one of q/k/v over the model's storage
    check_conv(dev, m, {4, 64, 1}, 1536, 4, 3, seed++);
  }
}

// ---------------------------------------------------------------- kda_recurrent / kda_chunked

struct KdaInputs {
  Tensor q, k, v, f, b, a_log, dt_bias, pool0;
  KdaInputs(core::Rng& rng, Mode mode, int64_t T, int H, int D, int64_t num_slots) {
    const int64_t P = int64_t{H} * D;
    q = random_act(rng, {T, P}, mode), k = random_act(rng, {T, P}, mode), v = random_act(rng, {T, P}, mode);
    f = random_act(rng, {T, P}, mode, -1.0, 2.0);  // decays from strong to near 1
    b = random_act(rng, {T, H}, mode, 0.0, 1.5);
    a_log = random_act(rng, {2 * int64_t{H}}, Mode::fp32, 0.0, 0.5);  // junk beyond H is never read
    dt_bias = random_act(rng, {P}, Mode::fp32);
    pool0 = random_act(rng, {num_slots, H, D, D}, Mode::fp32, 0.0, 0.5);  // non-symmetric: catches a transpose
  }
};

void check_kda(Device* dev, Mode mode, bool chunked, const std::vector<int64_t>& rows,
               const std::vector<int64_t>& positions, int H, int D, int chunk, uint64_t seed) {
  core::Rng rng(seed);
  const Batch batch(dev, rng, rows, positions);
  const int64_t T = batch.T, P = int64_t{H} * D;
  const KdaInputs in(rng, mode, T, H, D, batch.num_slots);
  const Precision p = precision(mode);
  auto& cpu_table = chunked ? cpu_registry().kda_chunked : cpu_registry().kda_recurrent;
  Tensor want = nan_tensor({T, P}), want_pool = copy(in.pool0);
  cpu_table.run({in.q.view(), in.k.view(), in.v.view(), in.f.view(), in.b.view(), in.a_log.view(), in.dt_bias.view(),
                 want_pool.view(), want.view(), H, D, -5.0f, chunk, p, batch.host()},
                core::Device::cpu);
  Tensor dq = dev->act(in.q, mode), dk = dev->act(in.k, mode), dv = dev->act(in.v, mode), df = dev->act(in.f, mode);
  Tensor db = dev->act(in.b, mode), d_alog = dev->upload(in.a_log), d_dt = dev->upload(in.dt_bias);
  Tensor dpool = dev->upload(in.pool0), out = dev->poisoned(act_dtype(mode), {T, P});
  const kernels::KdaAttentionArgs args{
      dq.view(), dk.view(), dv.view(), df.view(), db.view(), d_alog.view(), d_dt.view(), dpool.view(), out.view(),
      H,         D,         -5.0f,     chunk,     p,         batch.device()};
  auto& table = chunked ? dev->registry().kda_chunked : dev->registry().kda_recurrent;
  expect_device_impl(table, args, dev);
  table.run(args, dev->kind());
  const std::string op = chunked ? "kda_chunked" : "kda_recurrent";
  std::string shape = shape_str({T, H, D});
  if (chunked) shape += 'c' + std::to_string(chunk);
  shape += ' ' + batch.str();
  expect_close(op, shape, mode, "out", dev->to_host_f32(out.view()), want, tol_attention(mode));
  expect_close(op, shape, mode, "state", dev->to_host_f32(dpool.view()), want_pool, tol_attention(Mode::fp32));
}

TEST(OpsOdd, KdaRecurrent) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 7200;
  for (Mode m : kModes)
    for (const kernels::KdaAttnShape& sh : kernels::kKdaAttnOddShapes) {
      for (int64_t T : kernels::kKdaAttnOddTokens) check_kda(dev, m, false, {T}, {}, sh.H, sh.D, 64, seed++);
      const auto& batch = kernels::kKdaAttnOddBatch;
      check_kda(dev, m, false, rows_of(batch), positions_of(batch), sh.H, sh.D, 64, seed++);
      for (const kernels::KdaAttnStep& st : kernels::kKdaRecurrentOddSteps)  // decode and verify steps
        check_kda(dev, m, false, repeat(st.rows, st.seqs), {st.position}, sh.H, sh.D, 64, seed++);
    }
}
TEST(OpsTp8, KdaRecurrent) {
  K3_REQUIRE_CUDA(dev);
  const kernels::KdaAttnShape& k3 = kernels::kKdaAttnK3Tp8;
  uint64_t seed = 7400;
  for (Mode m : kModes) {
    for (const kernels::KdaAttnStep& st : kernels::kKdaRecurrentK3Steps)  // decode of 64, verify K = 3 and 7
      check_kda(dev, m, false, repeat(st.rows, st.seqs), {st.position}, k3.H, k3.D, 64, seed++);
    const auto& batch = kernels::kKdaRecurrentK3Batch;
    check_kda(dev, m, false, rows_of(batch), positions_of(batch), k3.H, k3.D, 64, seed++);
  }
}
TEST(OpsOdd, KdaChunked) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 7500;
  for (Mode m : kModes)
    for (const kernels::KdaAttnShape& sh : kernels::kKdaAttnOddShapes) {
      for (int chunk : kernels::kKdaChunkSizes) {
        for (int64_t T : kernels::kKdaAttnOddTokens) check_kda(dev, m, true, {T}, {}, sh.H, sh.D, chunk, seed++);
        // Positions off the chunk grid: each sequence's first chunk ends at the next multiple.
        const auto& batch = kernels::kKdaAttnOddBatch;
        check_kda(dev, m, true, rows_of(batch), positions_of(batch), sh.H, sh.D, chunk, seed++);
      }
      for (int chunk : kernels::kKdaOddChunkSizes)  // (CUDA chunks of more than 64 run as 64: equal to rounding)
        check_kda(dev, m, true, {kernels::kKdaOddChunkTokens}, {}, sh.H, sh.D, chunk, seed++);
    }
}
TEST(OpsTp8, KdaChunked) {
  K3_REQUIRE_CUDA(dev);
  const kernels::KdaAttnShape& k3 = kernels::kKdaAttnK3Tp8;
  uint64_t seed = 7700;
  for (Mode m : kModes)
    for (int chunk : kernels::kKdaChunkSizes) {
      for (int64_t T : kernels::kKdaChunkedK3Tokens) check_kda(dev, m, true, {T}, {}, k3.H, k3.D, chunk, seed++);
      const auto& batch = kernels::kKdaChunkedK3Batch;
      check_kda(dev, m, true, rows_of(batch), positions_of(batch), k3.H, k3.D, chunk, seed++);
    }
}

}  // namespace
}  // namespace k3::ops_test
