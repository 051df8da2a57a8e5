// checkpoint/safetensors.h: safetensors files (read by mmap, written deterministically) and
// sharded sets described by model.safetensors.index.json.
//
// File layout: u64 little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value"}}   (metadata optional, string values only)
// then the data section; offsets are relative to its start. The reader checks everything
// (see SafetensorsFile::open) so a corrupt or truncated file fails with a message naming the
// file and the tensor, never with a crash or a silently wrong view.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace k3::checkpoint {

// One entry of a safetensors header.
struct TensorInfo {
  std::string name;
  core::DType dtype = core::DType::f32;
  core::Shape shape;
  int64_t begin = 0, end = 0;  // byte range within the data section
};

// A read-only POSIX mmap of a whole file; unmapped when the last owner goes away.
class MappedFile;

// An opened safetensors file. Tensors returned by tensor() are views into the mapping that
// keep it alive, so the file object itself may be dropped. The mapping is PROT_READ: the
// views must not be written to.
class SafetensorsFile {
 public:
  // Maps and validates `path`. Throws core::Error naming the file (and tensor) when: the file
  // is shorter than 8 bytes; the header length runs past the end of the file; the header is
  // not JSON, not an object, or has a duplicate key; an entry lacks dtype/shape/data_offsets,
  // has an unknown key, an unknown dtype, a shape of rank > 4 or a negative dimension;
  // data_offsets are not [begin <= end], do not match numel * dtype size, overlap, leave a
  // hole, run past the end of the file (truncated data) or leave unindexed trailing bytes;
  // __metadata__ is not an object of strings.
  static SafetensorsFile open(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // sorted by name
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* find(std::string_view name) const;  // nullptr when absent
  bool contains(std::string_view name) const { return find(name) != nullptr; }
  // A view into the mapping; throws naming the file when `name` is absent.
  core::Tensor tensor(std::string_view name) const;
  core::Tensor tensor(const TensorInfo& info) const;

 private:
  std::filesystem::path path_;
  std::shared_ptr<const MappedFile> mapping_;
  const std::byte* data_ = nullptr;  // start of the data section within the mapping
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// ---- writing ----

struct TensorEntry {
  std::string name;
  core::DType dtype = core::DType::f32;
  core::Shape shape;
  int64_t nbytes() const { return shape.numel() * static_cast<int64_t>(core::dtype_size(dtype)); }
};
// Fills the bytes of one tensor (exactly entry.nbytes() of them), little-endian.
using TensorFiller = std::function<void(const TensorEntry& entry, std::span<std::byte> out)>;

// Writes one safetensors file with deterministic bytes: header keys sorted by name (JSON
// object order), no whitespace, padded with spaces to a multiple of 8 bytes; data ordered by
// descending element size then name (as the reference safetensors writer does), so every
// tensor starts aligned to its element size. Tensors are produced one at a time by `fill`, so
// peak memory is one tensor. Writes PATH.tmp and renames it, so a failed write leaves no
// half-written PATH. Throws core::Error on a duplicate or empty name or an I/O failure.
void write_safetensors(const std::filesystem::path& path, std::vector<TensorEntry> entries, const TensorFiller& fill,
                       const std::map<std::string, std::string>& metadata = {});

// Convenience: writes contiguous CPU tensors given by name.
void write_safetensors(const std::filesystem::path& path, const std::map<std::string, core::TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// ---- sets of files (one file, or shards with an index) ----

inline constexpr const char* kSingleFileName = "model.safetensors";
inline constexpr const char* kIndexFileName = "model.safetensors.index.json";
// "model-00002-of-00005.safetensors" (1-based shard index, as Hugging Face names them).
std::string shard_file_name(int shard, int num_shards);

// The tensors of a checkpoint folder, each resolved to the file that holds it.
class SafetensorsSet {
 public:
  // DIR/model.safetensors, or the shards named by DIR/model.safetensors.index.json
  // ({"weight_map": {tensor: file}, "metadata": {...}}). Throws core::Error when neither or
  // both exist, the index is malformed, names a file that does not exist (or escapes DIR),
  // names a tensor that its file does not hold, or a shard holds a tensor the index omits.
  static SafetensorsSet open_dir(const std::filesystem::path& dir);

  struct Entry {
    const SafetensorsFile* file = nullptr;
    const TensorInfo* info = nullptr;
  };
  const std::filesystem::path& dir() const { return dir_; }
  using EntryMap = std::map<std::string, Entry, std::less<>>;
  // Every tensor name of the set, sorted, each with its file.
  const EntryMap& entries() const { return entries_; }
  const Entry* find(std::string_view name) const;
  core::Tensor tensor(const Entry& e) const { return e.file->tensor(*e.info); }
  // Whether the set came from an index (for messages).
  bool sharded() const { return sharded_; }

 private:
  std::filesystem::path dir_;
  bool sharded_ = false;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;  // stable addresses for Entry
  EntryMap entries_;
};

// Writes DIR/model.safetensors.index.json for shards already written: weight_map sorted by
// tensor name, metadata.total_size = the sum of the tensors' byte sizes.
void write_index(const std::filesystem::path& dir, const std::map<std::string, std::string>& weight_map,
                 int64_t total_size);

}  // namespace k3::checkpoint
