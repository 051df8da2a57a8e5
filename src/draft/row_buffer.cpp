// draft/row_buffer.cpp: RowBuffer (see row_buffer.h).
#include "draft/row_buffer.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace k3::draft {

core::TensorView rows_of(const core::TensorView& v, int64_t r0, int64_t n) {
  core::TensorView out = v;
  out.data = static_cast<char*>(v.data) + r0 * v.strides[0] * static_cast<int64_t>(core::dtype_size(v.dtype));
  out.shape = {n, v.dim(1)};
  return out;
}

core::TensorView cols_of(const core::TensorView& v, int64_t c0, int64_t c1) {
  core::TensorView out = v;
  out.data = static_cast<char*>(v.data) + c0 * v.strides[1] * static_cast<int64_t>(core::dtype_size(v.dtype));
  out.shape = {v.dim(0), c1 - c0};
  return out;
}

core::TensorView rows_on(core::DeviceMemory& to, const core::TensorView& rows, core::DeviceMemory* from,
                         core::Tensor& holder, const char* who) {
  if (rows.device == to.device()) return rows;
  if (to.device() == core::Device::cpu) {  // a CPU draft of a GPU target
    K3_CHECK(from != nullptr,
             std::string(who) + ": tap rows on the device but no target_memory to download them to the CPU draft");
    holder = from->download_f32(rows);
  } else {
    holder = to.upload(rows);
  }
  return holder.view();
}

core::TensorView RowBuffer::view() const {
  return data.defined() ? rows_of(data.view(), 0, rows)
                        : core::TensorView::contiguous(nullptr, core::DType::f32, {0, 0});
}

void reserve_rows(core::DeviceMemory& memory, RowBuffer& buf, int64_t rows, int64_t cols) {
  const int64_t cap = buf.data.defined() ? buf.data.dim(0) : 0;
  if (rows <= cap) return;
  core::Tensor grown = memory.empty(core::DType::f32, {std::max({rows, 2 * cap, int64_t{64}}), cols});
  if (buf.rows > 0) memory.copy(rows_of(grown.view(), 0, buf.rows), buf.view());
  buf.data = grown;
}

void append_rows(core::DeviceMemory& memory, RowBuffer& buf, const core::TensorView& rows) {
  K3_CHECK(rows.rank() == 2 && rows.dtype == core::DType::f32 && rows.device == memory.device(),
           "RowBuffer: appended rows must be f32 [n, cols] on the buffer's device");
  K3_CHECK(!buf.data.defined() || buf.data.dim(1) == rows.dim(1), "RowBuffer: column count changed");
  if (rows.dim(0) == 0) return;
  reserve_rows(memory, buf, buf.rows + rows.dim(0), rows.dim(1));
  memory.copy(rows_of(buf.data.view(), buf.rows, rows.dim(0)), rows);
  buf.rows += rows.dim(0);
}

void keep_rows(RowBuffer& buf, int64_t n) {
  K3_CHECK(n >= 0 && n <= buf.rows,
           "RowBuffer: keep " + std::to_string(n) + " of " + std::to_string(buf.rows) + " rows");
  buf.rows = n;
}

}  // namespace k3::draft
