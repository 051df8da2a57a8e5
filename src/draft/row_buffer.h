// draft/row_buffer.h: growable f32 row storage on one device, for the drafts' per-request caches
// (the EAGLE-3 draft's keys, values and pending taps; the DSpark draft's latent rows).
#pragma once
#include <cstdint>

#include "core/device_memory.h"
#include "core/tensor.h"

namespace k3::draft {

// Rows of f32 values with room to grow: [rows, cols] of a [capacity, cols] tensor.
struct RowBuffer {
  core::Tensor data;  // f32 [capacity, cols] (undefined until the first row)
  int64_t rows = 0;
  core::TensorView view() const;  // the [rows, cols] in use
  int64_t bytes() const { return data.defined() ? data.nbytes() : 0; }
};

// Capacity for `rows` rows of `cols` (grows by doubling, keeping the rows in use).
void reserve_rows(core::DeviceMemory& memory, RowBuffer& buf, int64_t rows, int64_t cols);
// Appends f32 [n, cols] rows on the buffer's device.
void append_rows(core::DeviceMemory& memory, RowBuffer& buf, const core::TensorView& rows);
// Keeps the first n rows.
void keep_rows(RowBuffer& buf, int64_t n);

// A drafter's tap rows [n, cols] on its model's device `to`: as they are when already there; from a
// GPU target to a CPU draft downloaded through `from` (the target's memory: `who` names the drafter
// in the error when there is none); host rows (the executors gather taps on the host) uploaded.
// `holder` keeps a moved copy alive.
core::TensorView rows_on(core::DeviceMemory& to, const core::TensorView& rows, core::DeviceMemory* from,
                         core::Tensor& holder, const char* who);

// Rows [r0, r0 + n) of a rank-2 view (any device) as a view.
core::TensorView rows_of(const core::TensorView& v, int64_t r0, int64_t n);
// Columns [c0, c1) of a rank-2 view as a row-strided view.
core::TensorView cols_of(const core::TensorView& v, int64_t c0, int64_t c1);

}  // namespace k3::draft
