// kernels/kda/kda_check.h: internal to kernels/kda: argument-check helpers whose failure messages
// name the argument, the expected shape/dtype and what was passed, the SeqBatch check, and the
// host-side reading of a SeqBatch for the CPU references.
#pragma once
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/common.h"

namespace k3::kernels::kda_detail {

inline std::string describe(const core::TensorView& v) {
  return std::string(core::dtype_name(v.dtype)) + " " + v.shape.str();
}

inline core::Status expect_f32(const core::TensorView& v, const char* name) {
  if (v.data == nullptr && v.numel() != 0) return core::Status::fail(std::string(name) + " is not set");
  if (v.dtype != core::DType::f32) return core::Status::fail(std::string(name) + " must be F32, got " + describe(v));
  return core::Status::ok();
}

// An activation [rows, cols] in f32 (or bf16 on CUDA, kernels/common.h) whose rows may be strided
// but whose columns are contiguous. `meaning` says what the dims are, e.g. " (T, num_heads*head_dim)".
inline core::Status expect_activation(const core::TensorView& v, const char* name, int64_t rows, int64_t cols,
                                      const std::string& meaning) {
  if (v.data == nullptr && v.numel() != 0) return core::Status::fail(std::string(name) + " is not set");
  if (!is_activation_dtype(v))
    return core::Status::fail(std::string(name) + " must be F32 (or BF16 on CUDA), got " + describe(v));
  if (v.rank() != 2 || v.dim(0) != rows || v.dim(1) != cols)
    return core::Status::fail(std::string(name) + " must be F32 [" + std::to_string(rows) + ", " +
                              std::to_string(cols) + "]" + meaning + ", got " + describe(v));
  if (cols > 1 && v.strides[1] != 1)
    return core::Status::fail(std::string(name) + " must have contiguous rows (inner stride 1), got stride " +
                              std::to_string(v.strides[1]));
  if (rows > 1 && v.strides[0] < cols)
    return core::Status::fail(std::string(name) + " row stride " + std::to_string(v.strides[0]) +
                              " is smaller than its row length " + std::to_string(cols));
  return core::Status::ok();
}

// A state pool [num_slots, inner...] whose every slot is contiguous (the slot stride is free, but
// slots may not overlap). `inner` are the dims after the slot dim; `meaning` names them.
inline core::Status expect_pool(const core::TensorView& v, const char* name, std::initializer_list<int64_t> inner,
                                const std::string& meaning) {
  std::string want = "[num_slots";
  for (int64_t d : inner) want += ", " + std::to_string(d);
  want += "]" + meaning;
  if (v.rank() != static_cast<int>(inner.size()) + 1)
    return core::Status::fail(std::string(name) + " must be a state pool " + want + ", got " + describe(v));
  int64_t slot_elems = 1;
  int i = 1;
  for (int64_t d : inner) {
    if (v.dim(i) != d)
      return core::Status::fail(std::string(name) + " must be a state pool " + want + ", got " + describe(v));
    slot_elems *= d;
    ++i;
  }
  // Each slot contiguous: strides of the inner dims are the row-major ones (dims of size 1 free).
  int64_t expect = 1;
  for (int j = v.rank() - 1; j >= 1; --j) {
    if (v.dim(j) > 1 && v.strides[j] != expect)
      return core::Status::fail(std::string(name) + " must have each slot contiguous " + want +
                                " (only the slot stride is free), got " + describe(v) + " with stride " +
                                std::to_string(v.strides[j]) + " in dim " + std::to_string(j));
    expect *= v.dim(j);
  }
  if (v.dim(0) > 1 && slot_elems > 0 && v.strides[0] < slot_elems)
    return core::Status::fail(std::string(name) + " slot stride " + std::to_string(v.strides[0]) +
                              " is smaller than one slot's " + std::to_string(slot_elems) + " elements: slots overlap");
  if (v.data == nullptr && v.numel() != 0) return core::Status::fail(std::string(name) + " is not set");
  return core::Status::ok();
}

// One sequence of a SeqBatch, read on the host (CPU references).
struct HostSeq {
  int64_t row_begin = 0, num_rows = 0, slot = 0, position = 0;
};

// The sequences of a CPU SeqBatch (tables checked by check_seq_batch). position is read only when
// asked (the attention ops; it stays 0 otherwise).
inline std::vector<HostSeq> host_seqs(const SeqBatch& b, bool with_position) {
  std::vector<HostSeq> out(static_cast<size_t>(std::max(b.num_seqs, 0)));
  for (int s = 0; s < b.num_seqs; ++s) {
    HostSeq& q = out[static_cast<size_t>(s)];
    q.row_begin = b.row_begin.as<const int32_t>()[s];
    q.num_rows = b.num_rows.as<const int32_t>()[s];
    q.slot = b.slot.as<const int32_t>()[s];
    if (with_position) q.position = b.position.as<const int32_t>()[s];
  }
  return out;
}

// Validates the SeqBatch of a KDA op over activations of T rows on `device` and a state pool of
// num_slots slots: the used tables are contiguous i32 [num_seqs] on `device`. On the CPU the values
// are checked too (see kda.h); on CUDA they are device memory and are not read here.
inline core::Status check_seq_batch(const SeqBatch& b, int64_t T, int64_t num_slots, core::Device device,
                                    bool need_position) {
  if (b.num_seqs < 0) return core::Status::fail("seqs.num_seqs must be >= 0, got " + std::to_string(b.num_seqs));
  if (b.num_seqs > 0 && b.max_rows < 1)
    return core::Status::fail("seqs.max_rows must be >= 1 (a bound on every num_rows), got " +
                              std::to_string(b.max_rows));
  const int64_t S = b.num_seqs;
  struct Table {
    const core::TensorView* v;
    const char* name;
  };
  std::vector<Table> tables = {
      {&b.row_begin, "seqs.row_begin"}, {&b.num_rows, "seqs.num_rows"}, {&b.slot, "seqs.slot"}};
  if (need_position) tables.push_back({&b.position, "seqs.position"});
  for (const Table& t : tables) {
    const core::TensorView& v = *t.v;
    if (S == 0 && (v.data == nullptr || v.numel() == 0)) continue;  // nothing to read
    if (v.dtype != core::DType::i32 || v.rank() != 1 || v.dim(0) != S || (S > 1 && v.strides[0] != 1))
      return core::Status::fail(std::string(t.name) + " must be a contiguous I32 [" + std::to_string(S) +
                                "] (num_seqs) table, got " + describe(v));
    if (v.data == nullptr) return core::Status::fail(std::string(t.name) + " is not set");
    if (v.device != device)
      return core::Status::fail(std::string(t.name) + " must be on the activations' device " +
                                std::string(core::device_name(device)) + ", got " +
                                std::string(core::device_name(v.device)));
  }
  if (device != core::Device::cpu || S == 0) return core::Status::ok();

  // CPU: the values.
  const std::vector<HostSeq> seqs = host_seqs(b, need_position);
  for (int64_t s = 0; s < S; ++s) {
    const HostSeq& q = seqs[static_cast<size_t>(s)];
    std::string at = "[";  // (built in steps: GCC 12 warns falsely on "[" + std::to_string(s))
    at += std::to_string(s);
    at += "] = ";
    if (q.num_rows < 1 || q.num_rows > b.max_rows)
      return core::Status::fail("seqs.num_rows" + at + std::to_string(q.num_rows) +
                                " is outside [1, max_rows = " + std::to_string(b.max_rows) + "]");
    if (q.row_begin < 0 || q.row_begin + q.num_rows > T)
      return core::Status::fail("seqs.row_begin" + at + std::to_string(q.row_begin) + " with num_rows " +
                                std::to_string(q.num_rows) + " is outside the T = " + std::to_string(T) +
                                " activation rows");
    if (q.slot < 0 || q.slot >= num_slots)
      return core::Status::fail("seqs.slot" + at + std::to_string(q.slot) + " is outside the state pool's " +
                                std::to_string(num_slots) + " slots");
    if (need_position && q.position < 0)
      return core::Status::fail("seqs.position" + at + std::to_string(q.position) + " is negative");
  }
  // Distinct slots and disjoint row ranges: sort sequence indices by slot, then by first row.
  std::vector<int64_t> order(static_cast<size_t>(S));
  for (int64_t s = 0; s < S; ++s) order[static_cast<size_t>(s)] = s;
  const auto seq = [&](int64_t s) -> const HostSeq& { return seqs[static_cast<size_t>(s)]; };
  std::sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return seq(x).slot < seq(y).slot; });
  for (size_t i = 1; i < order.size(); ++i)
    if (seq(order[i]).slot == seq(order[i - 1]).slot)
      return core::Status::fail("seqs.slot[" + std::to_string(order[i]) + "] = " + std::to_string(seq(order[i]).slot) +
                                " is also the slot of sequence " + std::to_string(order[i - 1]) +
                                ": sequences of one call never share a slot");
  std::sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return seq(x).row_begin < seq(y).row_begin; });
  for (size_t i = 1; i < order.size(); ++i) {
    const HostSeq &prev = seq(order[i - 1]), &cur = seq(order[i]);
    if (cur.row_begin < prev.row_begin + prev.num_rows)
      return core::Status::fail("seqs.row_begin[" + std::to_string(order[i]) + "] = " + std::to_string(cur.row_begin) +
                                ": its rows overlap those of sequence " + std::to_string(order[i - 1]) + " [" +
                                std::to_string(prev.row_begin) + ", " + std::to_string(prev.row_begin + prev.num_rows) +
                                ")");
  }
  return core::Status::ok();
}

}  // namespace k3::kernels::kda_detail
