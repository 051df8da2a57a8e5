// core/dtype.h: element types of tensors, as stored in memory and in safetensors files.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace k3::core {

// u8 carries packed FP4 E2M1 codes (two per byte) and E8M0 scales; the pairing of a
// packed weight and its scale is described by model::LinearWeight, not by the dtype.
enum class DType : uint8_t { f32, bf16, f8_e4m3, u8, i32, i64 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f8_e4m3: return 1;
    case DType::u8: return 1;
    case DType::i32: return 4;
    case DType::i64: return 8;
  }
  return 0;
}

// Names as safetensors spells them ("F32", "BF16", "F8_E4M3", "U8", "I32", "I64").
std::string_view dtype_name(DType t);
// Parses a safetensors dtype name; returns false for a name k3serve does not read.
bool dtype_from_name(std::string_view name, DType* out);

enum class Device : uint8_t { cpu, cuda };
std::string_view device_name(Device d);

}  // namespace k3::core
