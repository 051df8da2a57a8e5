// checkpoint/writer.cpp: write_random_checkpoint — config.json plus safetensors file(s) holding
// exactly the inventory of the config, with deterministic random values (random_init.h).
#include <cstring>
#include <fstream>
#include <map>
#include <regex>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/param_inventory.h"
#include "checkpoint/random_init.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "tokenizer/tiny_tokenizer.h"

namespace k3::checkpoint {

namespace fs = std::filesystem;

namespace {

// Removes the checkpoint files a previous write may have left in `out`, so the folder never
// mixes a single file with an index, or shards of two different splits. Touches nothing else.
void remove_stale_checkpoint_files(const fs::path& out) {
  static const std::regex shard_re(R"(model-\d{5}-of-\d{5}\.safetensors)");
  for (const auto& e : fs::directory_iterator(out)) {
    const std::string name = e.path().filename().string();
    if (name == kSingleFileName || name == kIndexFileName || std::regex_match(name, shard_re))
      fs::remove(e.path());
  }
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  K3_CHECK(f.good(), "write_random_checkpoint: cannot create " + path.string());
  f << text;
  f.flush();
  K3_CHECK(f.good(), "write_random_checkpoint: writing " + path.string() + " failed");
}

// Shards in inventory (model) order: a shard is closed when the next tensor would push it
// past max_bytes; a tensor larger than max_bytes gets a shard of its own.
std::vector<std::vector<size_t>> split_into_shards(const std::vector<TensorEntry>& entries, int64_t max_bytes) {
  std::vector<std::vector<size_t>> shards(1);
  int64_t bytes = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!shards.back().empty() && bytes + entries[i].nbytes() > max_bytes) {
      shards.emplace_back();
      bytes = 0;
    }
    shards.back().push_back(i);
    bytes += entries[i].nbytes();
  }
  return shards;
}

}  // namespace

void write_random_checkpoint(const config::K3Config& config, const WriteOptions& options, const fs::path& out) {
  // The written config states the expert form actually written: options.mxfp4 decides.
  config::K3Config c = config;
  c.mxfp4.enabled = options.mxfp4;
  if (options.mxfp4) c.mxfp4.group_size = 32;
  const std::vector<ParamSpec> specs = expected_params(c);

  std::map<std::string, const ParamSpec*> by_name;
  std::vector<TensorEntry> entries;
  for (const ParamSpec& s : specs) {
    by_name[s.name] = &s;
    entries.push_back({s.name, s.dtypes[0], s.shapes[0]});
  }
  // The two halves of an MXFP4 pair come from one quantization; their names sort next to
  // each other (weight_packed, weight_scale), so a one-entry cache halves the work.
  std::string cached_name;
  Mxfp4Values cached;
  const TensorFiller fill = [&](const TensorEntry& e, std::span<std::byte> bytes) {
    const ParamSpec& spec = *by_name.at(e.name);
    if (spec.role != ParamRole::expert_packed && spec.role != ParamRole::expert_scale)
      return fill_random_param(spec, c, options.init, options.seed, bytes);
    if (cached_name != spec.value_name) {
      cached = random_mxfp4_values(spec, options.init, options.seed);
      cached_name = spec.value_name;
    }
    const std::vector<uint8_t>& src = spec.role == ParamRole::expert_packed ? cached.packed : cached.scales;
    K3_CHECK(src.size() == bytes.size(), "write_random_checkpoint: MXFP4 size mismatch for '" + e.name + "'");
    std::memcpy(bytes.data(), src.data(), src.size());
  };

  fs::create_directories(out);
  remove_stale_checkpoint_files(out);
  write_text(out / "config.json", config::to_json(c).dump(2) + "\n");
  // A small K3-format tokenizer beside the weights (none when vocab_size < 512), so the model
  // serves text end to end.
  tokenizer::write_tiny_tokenizer(c.vocab_size, out);
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};

  if (options.max_shard_bytes <= 0) {
    write_safetensors(out / kSingleFileName, entries, fill, metadata);
    return;
  }
  const auto shards = split_into_shards(entries, options.max_shard_bytes);
  std::map<std::string, std::string> weight_map;
  int64_t total = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file = shard_file_name(static_cast<int>(s + 1), static_cast<int>(shards.size()));
    std::vector<TensorEntry> part;
    for (size_t i : shards[s]) {
      part.push_back(entries[i]);
      weight_map[entries[i].name] = file;
      total += entries[i].nbytes();
    }
    write_safetensors(out / file, std::move(part), fill, metadata);
  }
  write_index(out, weight_map, total);
}

}  // namespace k3::checkpoint
