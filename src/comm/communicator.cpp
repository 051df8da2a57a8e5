// comm/communicator.cpp: argument checks shared by every Communicator implementation.
#include "comm/communicator.h"

#include <string>

namespace k3::comm {
namespace {

std::string describe(const core::TensorView& t) {
  return std::string(core::dtype_name(t.dtype)) + " " + t.shape.str() + " on " +
         std::string(core::device_name(t.device));
}

// Common to every collective: defined, contiguous, on the communicator's device.
core::Status basic_check(const char* op, const char* arg, const core::TensorView& t, core::Device device) {
  const std::string where = std::string("comm::") + op + ": " + arg + " ";
  if (!t.defined()) return core::Status::fail(where + "has no data");
  if (t.rank() < 1) return core::Status::fail(where + "must have rank >= 1, got " + describe(t));
  if (!t.is_contiguous()) return core::Status::fail(where + "must be contiguous, got " + describe(t));
  if (t.device != device)
    return core::Status::fail(where + "must be on " + std::string(core::device_name(device)) + ", got " + describe(t));
  return core::Status::ok();
}

core::Status sum_dtype_check(const char* op, const char* arg, const core::TensorView& t) {
  if (t.dtype == core::DType::f32 || t.dtype == core::DType::bf16) return core::Status::ok();
  return core::Status::fail(std::string("comm::") + op + ": " + arg + " dtype must be F32 or BF16, got " + describe(t));
}

}  // namespace

const char* gather_axis_name(GatherAxis axis) { return axis == GatherAxis::first ? "first" : "last"; }

core::Status all_reduce_check(const core::TensorView& x, core::Device device) {
  if (auto s = basic_check("all_reduce_sum", "x", x, device); !s) return s;
  return sum_dtype_check("all_reduce_sum", "x", x);
}

core::Status all_gather_check(const core::TensorView& in, const core::TensorView& out, GatherAxis axis, int n,
                              core::Device device) {
  if (auto s = basic_check("all_gather", "in", in, device); !s) return s;
  if (auto s = basic_check("all_gather", "out", out, device); !s) return s;
  if (in.dtype != out.dtype)
    return core::Status::fail("comm::all_gather: out dtype must equal in dtype: in " + describe(in) + ", out " +
                              describe(out));
  core::Shape expected = in.shape;
  const int d = axis == GatherAxis::first ? 0 : in.rank() - 1;
  expected[d] = in.shape[d] * n;
  if (!(out.shape == expected))
    return core::Status::fail(std::string("comm::all_gather(axis ") + gather_axis_name(axis) + ", " +
                              std::to_string(n) + " ranks): out shape must be " + expected.str() + ", got " +
                              out.shape.str() + " (in " + in.shape.str() + ")");
  return core::Status::ok();
}

core::Status reduce_scatter_check(const core::TensorView& in, const core::TensorView& out, int n, core::Device device) {
  if (auto s = basic_check("reduce_scatter_sum", "in", in, device); !s) return s;
  if (auto s = basic_check("reduce_scatter_sum", "out", out, device); !s) return s;
  if (auto s = sum_dtype_check("reduce_scatter_sum", "in", in); !s) return s;
  if (in.dtype != out.dtype)
    return core::Status::fail("comm::reduce_scatter_sum: out dtype must equal in dtype: in " + describe(in) + ", out " +
                              describe(out));
  if (in.shape[0] % n != 0)
    return core::Status::fail("comm::reduce_scatter_sum: in dim 0 (" + std::to_string(in.shape[0]) +
                              ") must be a multiple of the group size " + std::to_string(n));
  core::Shape expected = in.shape;
  expected[0] = in.shape[0] / n;
  if (!(out.shape == expected))
    return core::Status::fail("comm::reduce_scatter_sum(" + std::to_string(n) + " ranks): out shape must be " +
                              expected.str() + ", got " + out.shape.str() + " (in " + in.shape.str() + ")");
  return core::Status::ok();
}

core::Status broadcast_check(const core::TensorView& x, int root, int n, core::Device device) {
  if (auto s = basic_check("broadcast", "x", x, device); !s) return s;
  if (root < 0 || root >= n)
    return core::Status::fail("comm::broadcast: root " + std::to_string(root) + " is not a rank of a group of " +
                              std::to_string(n));
  return core::Status::ok();
}

}  // namespace k3::comm
