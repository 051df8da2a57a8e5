// checkpoint/safetensors.cpp: mmap reader with full header validation, deterministic writer,
// and sharded sets (model.safetensors.index.json).
#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace k3::checkpoint {

namespace fs = std::filesystem;
using nlohmann::json;

static_assert(std::endian::native == std::endian::little, "safetensors is little-endian; k3serve reads it in place");

// ---------------------------------------------------------------- the mapping

class MappedFile {
 public:
  MappedFile(const std::byte* data, size_t size) : data_(data), size_(size) {}
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() {
    if (data_ != nullptr) munmap(const_cast<std::byte*>(data_), size_);
  }
  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }

  static std::shared_ptr<const MappedFile> map(const fs::path& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw core::Error("safetensors " + path.string() + ": cannot open: " + std::strerror(errno));
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      throw core::Error("safetensors " + path.string() + ": not a regular file");
    }
    const size_t size = static_cast<size_t>(st.st_size);
    if (size == 0) {  // mmap of length 0 fails; the caller reports the short file
      ::close(fd);
      return std::make_shared<const MappedFile>(nullptr, 0);
    }
    void* p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);  // the mapping stays valid without the descriptor
    if (p == MAP_FAILED) throw core::Error("safetensors " + path.string() + ": mmap failed: " + std::strerror(err));
    return std::make_shared<const MappedFile>(static_cast<const std::byte*>(p), size);
  }

 private:
  const std::byte* data_;
  size_t size_;
};

// ---------------------------------------------------------------- header parsing

namespace {

[[noreturn]] void fail_file(const fs::path& path, const std::string& what) {
  throw core::Error("safetensors " + path.string() + ": " + what);
}
[[noreturn]] void fail_tensor(const fs::path& path, const std::string& name, const std::string& what) {
  throw core::Error("safetensors " + path.string() + ": tensor '" + name + "': " + what);
}

// Finds the first key that appears twice in one object, in a SAX pass that builds nothing.
// (nlohmann's parse callback cannot do this cheaply: with a callback its DOM builder rescans the
// parent object after every nested object, quadratic in the entries of a header or an index.)
struct DuplicateKeyFinder {
  std::vector<std::set<std::string>> keys_per_object;
  std::string duplicate;
  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const json::string_t&) { return true; }
  bool string(json::string_t&) { return true; }
  bool binary(json::binary_t&) { return true; }
  bool start_object(std::size_t) {
    keys_per_object.emplace_back();
    return true;
  }
  bool key(json::string_t& k) {
    if (!keys_per_object.back().insert(k).second && duplicate.empty()) duplicate = k;
    return true;
  }
  bool end_object() {
    keys_per_object.pop_back();
    return true;
  }
  bool start_array(std::size_t) { return true; }
  bool end_array() { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) { return false; }
};

// Parses JSON text, rejecting duplicate keys in any object (nlohmann would keep the last one
// silently, and a header with two entries for one name is corrupt).
json parse_json_strict(std::string_view text, const fs::path& path, const char* what) {
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    fail_file(path, std::string(what) + " is not valid JSON (" + e.what() + ")");
  }
  DuplicateKeyFinder keys;
  (void)json::sax_parse(text.begin(), text.end(), &keys);  // the text parsed above: it cannot fail here
  if (!keys.duplicate.empty()) fail_file(path, std::string(what) + " has the key '" + keys.duplicate + "' twice");
  return j;
}

int64_t json_nonneg_int(const json& v, const fs::path& path, const std::string& name, const char* field) {
  if (!v.is_number_integer()) fail_tensor(path, name, std::string(field) + " holds a non-integer " + v.dump());
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX))
      fail_tensor(path, name, std::string(field) + " value " + v.dump() + " is too large");
    return static_cast<int64_t>(u);
  }
  const int64_t i = v.get<int64_t>();
  if (i < 0) fail_tensor(path, name, std::string(field) + " holds a negative value " + v.dump());
  return i;
}

TensorInfo parse_entry(const std::string& name, const json& e, const fs::path& path) {
  if (name.empty()) fail_file(path, "header has a tensor with an empty name");
  if (!e.is_object()) fail_tensor(path, name, "header entry is not an object");
  for (const auto& [key, unused] : e.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      fail_tensor(path, name, "header entry has an unknown key '" + key + "'");
  }
  if (!e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
    fail_tensor(path, name, "header entry needs dtype, shape and data_offsets");
  TensorInfo t;
  t.name = name;
  const json& dt = e["dtype"];
  if (!dt.is_string()) fail_tensor(path, name, "dtype is not a string");
  // BOOL (one byte per value) is read as U8: EAGLE-3 checkpoints carry a BOOL t2d mask.
  if (dt.get<std::string>() == "BOOL") t.dtype = core::DType::u8;
  else if (!core::dtype_from_name(dt.get<std::string>(), &t.dtype))
    fail_tensor(path, name,
                "unknown dtype '" + dt.get<std::string>() +
                    "' (k3serve reads F32, BF16, F8_E4M3, U8, I32, I64, and BOOL as U8)");
  const json& sh = e["shape"];
  if (!sh.is_array()) fail_tensor(path, name, "shape is not an array");
  if (sh.size() > static_cast<size_t>(core::kMaxDims))
    fail_tensor(path, name, "shape has rank " + std::to_string(sh.size()) + ", above the supported 4");
  std::vector<int64_t> dims;
  int64_t numel = 1;
  for (const json& d : sh) {
    dims.push_back(json_nonneg_int(d, path, name, "shape"));
    if (__builtin_mul_overflow(numel, dims.back(), &numel))
      fail_tensor(path, name, "shape " + sh.dump() + " overflows");
  }
  t.shape = core::Shape::of(dims);
  const json& off = e["data_offsets"];
  if (!off.is_array() || off.size() != 2) fail_tensor(path, name, "data_offsets is not [begin, end]");
  t.begin = json_nonneg_int(off[0], path, name, "data_offsets");
  t.end = json_nonneg_int(off[1], path, name, "data_offsets");
  if (t.begin > t.end)
    fail_tensor(path, name,
                "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "] has begin > end");
  int64_t expect_bytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<int64_t>(core::dtype_size(t.dtype)), &expect_bytes))
    fail_tensor(path, name, "byte size overflows");
  if (t.end - t.begin != expect_bytes)
    fail_tensor(path, name,
                "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "] span " +
                    std::to_string(t.end - t.begin) + " bytes, but " + std::string(core::dtype_name(t.dtype)) + " " +
                    t.shape.str() + " needs " + std::to_string(expect_bytes));
  return t;
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const fs::path& path) {
  SafetensorsFile f;
  f.path_ = path;
  f.mapping_ = MappedFile::map(path);
  const size_t size = f.mapping_->size();
  if (size < 8) fail_file(path, "file is " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  uint64_t header_len = 0;
  std::memcpy(&header_len, f.mapping_->data(), 8);
  if (header_len > size - 8)
    fail_file(path, "header length " + std::to_string(header_len) + " runs past the end of the file (" +
                        std::to_string(size) + " bytes; truncated or not a safetensors file)");
  const std::string_view text(reinterpret_cast<const char*>(f.mapping_->data()) + 8, header_len);
  const json header = parse_json_strict(text, path, "header");
  if (!header.is_object()) fail_file(path, "header is not a JSON object");

  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) fail_file(path, "__metadata__ is not an object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) fail_file(path, "__metadata__ value of '" + mk + "' is not a string");
        f.metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    f.tensors_.push_back(parse_entry(key, value, path));
  }

  // The data section must be indexed exactly: in offset order each tensor starts where the
  // previous one ended, the first at 0 and the last at the end of the file (the safetensors
  // format forbids holes, which also rules out overlaps and trailing junk).
  const int64_t data_size = static_cast<int64_t>(size - 8 - header_len);
  for (const TensorInfo& t : f.tensors_) {
    if (t.end > data_size)
      fail_tensor(path, t.name,
                  "needs data bytes [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                      ") but the file holds only " + std::to_string(data_size) + " data bytes (truncated file)");
  }
  std::vector<const TensorInfo*> by_offset;
  for (const TensorInfo& t : f.tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  int64_t expected = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo* t : by_offset) {
    if (t->begin < expected)
      fail_tensor(path, t->name,
                  "data_offsets [" + std::to_string(t->begin) + ", " + std::to_string(t->end) + ") overlap tensor '" +
                      prev->name + "' ending at " + std::to_string(expected));
    if (t->begin > expected)
      fail_tensor(path, t->name,
                  "data_offsets begin at " + std::to_string(t->begin) + ", leaving a hole after byte " +
                      std::to_string(expected) + (prev ? " (end of '" + prev->name + "')" : std::string()));
    expected = t->end;
    prev = t;
  }
  if (expected != data_size)
    fail_file(path, std::to_string(data_size - expected) + " data bytes after the last tensor" +
                        (prev ? " ('" + prev->name + "')" : std::string()) + " are not indexed by the header");

  std::sort(f.tensors_.begin(), f.tensors_.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  f.data_ = f.mapping_->data() + 8 + header_len;
  return f;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  return (it != tensors_.end() && it->name == name) ? &*it : nullptr;
}

core::Tensor SafetensorsFile::tensor(std::string_view name) const {
  const TensorInfo* info = find(name);
  if (info == nullptr) fail_tensor(path_, std::string(name), "not in this file");
  return tensor(*info);
}

core::Tensor SafetensorsFile::tensor(const TensorInfo& info) const {
  // The mapping is read-only; TensorView carries a mutable pointer by design (one type for
  // inputs and outputs), and loaded weights are only ever read.
  auto* p = const_cast<std::byte*>(data_ + info.begin);
  std::shared_ptr<void> keepalive(mapping_, static_cast<void*>(p));
  return core::Tensor(core::TensorView::contiguous(p, info.dtype, info.shape), std::move(keepalive));
}

// ---------------------------------------------------------------- writing

void write_safetensors(const fs::path& path, std::vector<TensorEntry> entries, const TensorFiller& fill,
                       const std::map<std::string, std::string>& metadata) {
  std::set<std::string> names;
  for (const TensorEntry& e : entries) {
    K3_CHECK(!e.name.empty() && e.name != "__metadata__",
             "write_safetensors " + path.string() + ": invalid tensor name '" + e.name + "'");
    K3_CHECK(names.insert(e.name).second,
             "write_safetensors " + path.string() + ": tensor '" + e.name + "' given twice");
  }
  // Data order: wider elements first, then by name, so each tensor is aligned to its element
  // size given the 8-aligned data section (the reference writer sorts the same way).
  std::sort(entries.begin(), entries.end(), [](const TensorEntry& a, const TensorEntry& b) {
    const size_t sa = core::dtype_size(a.dtype), sb = core::dtype_size(b.dtype);
    return sa != sb ? sa > sb : a.name < b.name;
  });
  json header = json::object();  // std::map-backed: keys serialise sorted
  int64_t offset = 0;
  for (const TensorEntry& e : entries) {
    json dims = json::array();
    for (int i = 0; i < e.shape.rank(); ++i) dims.push_back(e.shape[i]);
    header[e.name] = {{"dtype", std::string(core::dtype_name(e.dtype))},
                      {"shape", dims},
                      {"data_offsets", {offset, offset + e.nbytes()}}};
    offset += e.nbytes();
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');

  const fs::path tmp = fs::path(path.string() + ".tmp");
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    K3_CHECK(out.good(), "write_safetensors: cannot create " + tmp.string());
    const uint64_t len = text.size();
    out.write(reinterpret_cast<const char*>(&len), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    std::vector<std::byte> buf;
    for (const TensorEntry& e : entries) {
      buf.assign(static_cast<size_t>(e.nbytes()), std::byte{0});
      fill(e, buf);
      out.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
    }
    out.flush();
    K3_CHECK(out.good(), "write_safetensors: writing " + tmp.string() + " failed");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  K3_CHECK(!ec, "write_safetensors: cannot rename " + tmp.string() + " to " + path.string() + ": " + ec.message());
}

void write_safetensors(const fs::path& path, const std::map<std::string, core::TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<TensorEntry> entries;
  for (const auto& [name, v] : tensors) {
    K3_CHECK(v.device == core::Device::cpu && v.is_contiguous(),
             "write_safetensors " + path.string() + ": tensor '" + name + "' is not a contiguous CPU tensor");
    entries.push_back({name, v.dtype, v.shape});
  }
  write_safetensors(
      path, std::move(entries),
      [&](const TensorEntry& e, std::span<std::byte> out) {
        const core::TensorView& v = tensors.at(e.name);
        if (!out.empty()) std::memcpy(out.data(), v.data, out.size());
      },
      metadata);
}

// ---------------------------------------------------------------- sets

std::string shard_file_name(int shard, int num_shards) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", shard, num_shards);
  return buf;
}

const SafetensorsSet::Entry* SafetensorsSet::find(std::string_view name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

SafetensorsSet SafetensorsSet::open_dir(const fs::path& dir) {
  SafetensorsSet set;
  set.dir_ = dir;
  const fs::path single = dir / kSingleFileName, index = dir / kIndexFileName;
  const bool has_single = fs::exists(single), has_index = fs::exists(index);
  if (has_single && has_index)
    throw core::Error("checkpoint " + dir.string() + ": both " + kSingleFileName + " and " + kIndexFileName +
                      " exist; keep one");
  if (!has_single && !has_index)
    throw core::Error("checkpoint " + dir.string() + ": neither " + kSingleFileName + " nor " + kIndexFileName +
                      " exists");
  if (has_single) {
    set.files_.push_back(std::make_unique<SafetensorsFile>(SafetensorsFile::open(single)));
    for (const TensorInfo& t : set.files_.back()->tensors()) set.entries_[t.name] = {set.files_.back().get(), &t};
    return set;
  }

  set.sharded_ = true;
  const std::string where = "index " + index.string();
  std::ifstream in(index, std::ios::binary);
  if (!in) throw core::Error(where + ": cannot open");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const json j = parse_json_strict(text, index, "index");
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw core::Error(where + ": needs an object \"weight_map\": {tensor: file}");
  std::map<std::string, std::string> weight_map;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string()) throw core::Error(where + ": weight_map entry of tensor '" + name + "' is not a string");
    const fs::path rel(file.get<std::string>());
    bool escapes = rel.empty() || rel.is_absolute();
    for (const auto& part : rel) escapes = escapes || part == "..";
    if (escapes)
      throw core::Error(where + ": tensor '" + name + "' maps to '" + rel.string() + "', which is not a file inside " +
                        dir.string());
    weight_map[name] = rel.string();
  }
  std::map<std::string, const SafetensorsFile*> opened;
  for (const auto& [name, file] : weight_map) {
    if (opened.count(file)) continue;
    const fs::path p = dir / file;
    if (!fs::exists(p))
      throw core::Error(where + ": names shard '" + file + "' (for tensor '" + name + "') but " + p.string() +
                        " does not exist");
    set.files_.push_back(std::make_unique<SafetensorsFile>(SafetensorsFile::open(p)));
    opened[file] = set.files_.back().get();
  }
  for (const auto& [name, file] : weight_map) {
    const SafetensorsFile* f = opened.at(file);
    const TensorInfo* info = f->find(name);
    if (info == nullptr)
      throw core::Error(where + ": says tensor '" + name + "' is in " + f->path().string() +
                        ", but that file does not hold it");
    set.entries_[name] = {f, info};
  }
  for (const auto& [file, f] : opened) {
    for (const TensorInfo& t : f->tensors()) {
      auto it = weight_map.find(t.name);
      if (it == weight_map.end() || it->second != file)
        throw core::Error(where + ": shard " + f->path().string() + " holds tensor '" + t.name + "', which the index " +
                          (it == weight_map.end() ? "does not list" : "places in '" + it->second + "'"));
    }
  }
  return set;
}

void write_index(const fs::path& dir, const std::map<std::string, std::string>& weight_map, int64_t total_size) {
  json j = {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
  const fs::path path = dir / kIndexFileName, tmp = dir / (std::string(kIndexFileName) + ".tmp");
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    K3_CHECK(out.good(), "write_index: cannot create " + tmp.string());
    out << j.dump(2) << "\n";
    out.flush();
    K3_CHECK(out.good(), "write_index: writing " + tmp.string() + " failed");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  K3_CHECK(!ec, "write_index: cannot rename " + tmp.string() + ": " + ec.message());
}

}  // namespace k3::checkpoint
