// core/dtype.cpp: dtype and device names.
#include "core/dtype.h"

namespace k3::core {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f8_e4m3: return "F8_E4M3";
    case DType::u8: return "U8";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
  }
  return "?";
}

bool dtype_from_name(std::string_view name, DType* out) {
  static constexpr DType all[] = {DType::f32, DType::bf16, DType::f8_e4m3, DType::u8, DType::i32, DType::i64};
  for (DType t : all) {
    if (dtype_name(t) == name) {
      *out = t;
      return true;
    }
  }
  return false;
}

std::string_view device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

}  // namespace k3::core
