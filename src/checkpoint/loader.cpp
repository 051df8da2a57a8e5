// checkpoint/loader.cpp: checkpoint folder -> model::Weights (spec §4), checked against the
// parameter inventory. Tensors stay views into the mmap'd safetensors files; with a progress
// callback the loader also reads every weight page in, reporting bytes as it goes. A tensor-parallel
// load (spec §11) checks the whole checkpoint the same way, then cuts every tensor to the rank's
// block (checkpoint/shard_slice.h) and reads in only those bytes. Under expert parallelism a rank
// takes only its own routed experts, whole (views into the mapping; the others are never touched).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>

#include "checkpoint/checkpoint.h"
#include "checkpoint/param_inventory.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/shard_slice.h"
#include "core/error.h"

namespace k3::checkpoint {

namespace fs = std::filesystem;

namespace {

// Problems are collected, not thrown one by one, so a user fixing a converter sees all of
// them at once. They are grouped by kind, and each kind lists its first kMaxListedPerKind,
// so one flood (say every expert in the wrong form) cannot hide the other kinds.
constexpr size_t kMaxListedPerKind = 8;
enum ProblemKind { kDuplicate, kUnexpected, kMissing, kWrongForm, kNumKinds };
constexpr const char* kKindTitle[kNumKinds] = {"present twice", "unexpected", "missing", "wrong dtype or shape"};

struct Found {
  std::string stored_name;  // the name as the file spells it (maybe with the prefix)
  const SafetensorsSet::Entry* entry = nullptr;
};

std::string file_of(const SafetensorsSet::Entry& e) { return e.file->path().string(); }

// The checkpoint tensors that the inventory names, keyed by canonical (unprefixed) name.
class CheckedTensors {
 public:
  CheckedTensors(const SafetensorsSet& set, const std::vector<ParamSpec>& specs) : set_(set) {
    std::map<std::string, const ParamSpec*> by_name;
    for (const ParamSpec& s : specs) by_name[s.name] = &s;

    for (const auto& [stored, entry] : set.entries()) {
      if (is_skipped_tensor(stored)) continue;
      std::string canonical = stored;
      if (canonical.starts_with(kLanguageModelPrefix)) canonical.erase(0, kLanguageModelPrefix.size());
      auto [it, inserted] = found_.try_emplace(canonical, Found{stored, &entry});
      if (!inserted) {
        problem(kDuplicate, "tensor '" + canonical + "' is present twice: as '" + it->second.stored_name + "' in " +
                                file_of(*it->second.entry) + " and as '" + stored + "' in " + file_of(entry));
        continue;
      }
      if (!by_name.count(canonical))
        problem(kUnexpected,
                "unexpected tensor '" + stored + "' in " + file_of(entry) +
                    " (not a parameter of this config; only vision_tower.* and mm_projector.* are skipped)");
    }
    for (const ParamSpec& s : specs) {
      auto it = found_.find(s.name);
      if (it == found_.end()) {
        problem(kMissing, "missing tensor '" + s.name + "' (expected " + s.describe() + ") in " + where());
        continue;
      }
      const TensorInfo& info = *it->second.entry->info;
      const bool dtype_ok = s.accepts_dtype(info.dtype), shape_ok = s.accepts_shape(info.shape);
      if (!dtype_ok || !shape_ok)
        problem(kWrongForm, std::string(!dtype_ok && !shape_ok ? "wrong dtype and shape"
                                        : !dtype_ok            ? "wrong dtype"
                                                               : "wrong shape") +
                                " for tensor '" + it->second.stored_name + "' in " + file_of(*it->second.entry) +
                                ": expected " + s.describe() + ", found " + std::string(core::dtype_name(info.dtype)) +
                                " " + info.shape.str());
    }
    size_t total = 0;
    for (const auto& list : problems_) total += list.size();
    if (total == 0) return;
    std::string msg = "checkpoint " + set.dir().string() + ": " + std::to_string(total) +
                      " problem(s) with the tensors:";
    for (int k = 0; k < kNumKinds; ++k) {
      const auto& list = problems_[k];
      if (list.empty()) continue;
      msg += "\n " + std::to_string(list.size()) + " " + kKindTitle[k] + ":";
      for (size_t i = 0; i < list.size() && i < kMaxListedPerKind; ++i) msg += "\n  " + list[i];
      if (list.size() > kMaxListedPerKind)
        msg += "\n  ... and " + std::to_string(list.size() - kMaxListedPerKind) + " more " + kKindTitle[k];
    }
    throw core::Error(msg);
  }

  // From now on get() returns rank `shard.rank`'s block of each tensor, whose per-rank shape is
  // the first shape `local` (the inventory of the rank's config) gives for its name.
  void shard_to(config::TpShard shard, const std::vector<ParamSpec>& local) {
    shard_ = shard;
    for (const ParamSpec& s : local) local_shape_[s.name] = s.shapes.at(0);
  }

  // The tensor for canonical `name`, already checked. A view into the mapping unless the
  // file placed it misaligned for its dtype (a writer that does not sort by dtype), in which
  // case it is copied so the kernels may read it as typed data. Sharded: the rank's block.
  core::Tensor get(const std::string& name) const {
    const core::Tensor mapped = set_.tensor(entry(name));
    if (shard_.size > 1) {
      auto it = local_shape_.find(name);
      K3_CHECK(it != local_shape_.end(), "checkpoint loader: internal: '" + name + "' not in the rank's inventory");
      return note(shard_block(mapped, it->second, shard_, name));
    }
    const auto addr = reinterpret_cast<uintptr_t>(mapped.data<void>());
    if (addr % core::dtype_size(mapped.dtype()) != 0) return core::Tensor::copy_of(mapped.view());
    return mapped;
  }
  // KDA A_log: whole as stored, or the rank's heads of its first `num_heads` entries (spec §4).
  core::Tensor get_a_log(const std::string& name, int64_t num_heads) const {
    if (shard_.size == 1) return get(name);
    return note(shard_a_log(set_.tensor(entry(name)), num_heads, shard_, name));
  }
  model::LinearWeight linear(const std::string& name) const { return {get(name), {}}; }
  bool has(const std::string& name) const { return found_.count(name) != 0; }

  // The bytes of every sharded tensor get() returned, in address order (file order within a
  // mapping): what a tensor-parallel rank reads in.
  std::vector<std::pair<const std::byte*, int64_t>> rank_byte_ranges() const {
    std::vector<std::pair<const std::byte*, int64_t>> ranges = rank_ranges_;
    std::sort(ranges.begin(), ranges.end());
    return ranges;
  }

  // Every checked tensor's bytes, ordered by file then offset, so reading them in is one
  // sequential pass over each file (the kernel's readahead then does the rest).
  std::vector<std::pair<const std::byte*, int64_t>> byte_ranges_in_file_order() const {
    std::vector<const SafetensorsSet::Entry*> entries;
    for (const auto& [name, found] : found_) entries.push_back(found.entry);
    std::sort(entries.begin(), entries.end(), [](const SafetensorsSet::Entry* a, const SafetensorsSet::Entry* b) {
      if (a->file != b->file) return a->file->path() < b->file->path();
      return a->info->begin < b->info->begin;
    });
    std::vector<std::pair<const std::byte*, int64_t>> ranges;
    for (const SafetensorsSet::Entry* e : entries) {
      const core::Tensor t = set_.tensor(*e);  // the mapped view (never the aligned copy)
      ranges.emplace_back(static_cast<const std::byte*>(t.data<void>()), e->info->end - e->info->begin);
    }
    return ranges;
  }

 private:
  void problem(ProblemKind kind, std::string p) { problems_[kind].push_back(std::move(p)); }
  const SafetensorsSet::Entry& entry(const std::string& name) const {
    auto it = found_.find(name);
    K3_CHECK(it != found_.end(), "checkpoint loader: internal: '" + name + "' not in the inventory");
    return *it->second.entry;
  }
  core::Tensor note(core::Tensor t) const {
    rank_ranges_.emplace_back(static_cast<const std::byte*>(t.data<void>()), t.nbytes());
    return t;
  }
  std::string where() const { return (set_.dir() / (set_.sharded() ? kIndexFileName : kSingleFileName)).string(); }

  const SafetensorsSet& set_;
  std::map<std::string, Found> found_;
  std::vector<std::string> problems_[kNumKinds];
  config::TpShard shard_;
  std::map<std::string, core::Shape> local_shape_;
  mutable std::vector<std::pair<const std::byte*, int64_t>> rank_ranges_;
};

model::AttnResWeights attn_res(const CheckedTensors& t, const std::string& proj, const std::string& norm) {
  return {t.get(proj), t.get(norm)};
}

model::KdaWeights kda_weights(const CheckedTensors& t, const std::string& a, const config::K3Config& full) {
  model::KdaWeights w;
  w.q_proj = t.linear(a + "q_proj.weight");
  w.k_proj = t.linear(a + "k_proj.weight");
  w.v_proj = t.linear(a + "v_proj.weight");
  w.g_proj = t.linear(a + "g_proj.weight");
  w.o_proj = t.linear(a + "o_proj.weight");
  w.f_a_proj = t.linear(a + "f_a_proj.weight");
  w.f_b_proj = t.linear(a + "f_b_proj.weight");
  w.b_proj = t.linear(a + "b_proj.weight");
  w.q_conv = t.get(a + "q_conv1d.weight");
  w.k_conv = t.get(a + "k_conv1d.weight");
  w.v_conv = t.get(a + "v_conv1d.weight");
  w.a_log = t.get_a_log(a + "A_log", full.kda.num_heads);
  w.dt_bias = t.get(a + "dt_bias");
  w.o_norm = t.get(a + "o_norm.weight");
  return w;
}

model::MlaWeights mla_weights(const CheckedTensors& t, const std::string& a) {
  model::MlaWeights w;
  w.q_a_proj = t.linear(a + "q_a_proj.weight");
  w.q_a_norm = t.get(a + "q_a_layernorm.weight");
  w.q_b_proj = t.linear(a + "q_b_proj.weight");
  w.kv_a_proj = t.linear(a + "kv_a_proj_with_mqa.weight");
  w.kv_a_norm = t.get(a + "kv_a_layernorm.weight");
  w.kv_b_proj = t.linear(a + "kv_b_proj.weight");
  if (t.has(a + "g_proj.weight")) w.g_proj = t.linear(a + "g_proj.weight");  // absent without output gate
  w.o_proj = t.linear(a + "o_proj.weight");
  return w;
}

// `c` is the full config; under expert parallelism (shard.expert_parallel) the rank takes the whole
// experts [rank * E / tp, (rank + 1) * E / tp) only (the rank's inventory gives them their full
// shape, so get() returns the checkpoint tensor itself).
model::MoeWeights moe_weights(const CheckedTensors& t, const std::string& m, const config::K3Config& c,
                              config::TpShard shard) {
  model::MoeWeights w;
  w.router = t.linear(m + "gate.weight");
  w.router_bias = t.get(m + "gate.e_score_correction_bias");
  w.latent_down = t.linear(m + "routed_expert_down_proj.weight");
  if (c.moe.latent_moe_use_norm) w.latent_norm = t.get(m + "routed_expert_norm.weight");
  w.latent_up = t.linear(m + "routed_expert_up_proj.weight");
  auto expert = [&](const std::string& base) -> model::LinearWeight {
    if (c.mxfp4.enabled) return {t.get(base + ".weight_packed"), t.get(base + ".weight_scale")};
    return t.linear(base + ".weight");
  };
  int first = 0, count = c.moe.num_experts;
  if (shard.expert_parallel && shard.size > 1) {
    count = c.moe.num_experts / shard.size;  // shard_config checked that size divides num_experts
    first = shard.rank * count;
    w.expert_begin = first;
    w.num_experts = c.moe.num_experts;
  }
  for (int e = first; e < first + count; ++e) {
    const std::string x = m + "experts." + std::to_string(e) + ".";
    w.w1.push_back(expert(x + "w1"));
    w.w2.push_back(expert(x + "w2"));
    w.w3.push_back(expert(x + "w3"));
  }
  if (c.moe.shared_intermediate() > 0) {
    w.shared_gate = t.linear(m + "shared_experts.gate_proj.weight");
    w.shared_up = t.linear(m + "shared_experts.up_proj.weight");
    w.shared_down = t.linear(m + "shared_experts.down_proj.weight");
  }
  return w;
}

// Reads one byte of every page of `ranges` (which faults the page in from disk or the page
// cache) and reports progress: 0 first, then every load_progress_step(total) bytes, total last.
void read_in(const std::vector<std::pair<const std::byte*, int64_t>>& ranges, const LoadProgressFn& progress) {
  int64_t total = 0;
  for (const auto& r : ranges) total += r.second;
  const auto start = std::chrono::steady_clock::now();
  auto report = [&](int64_t done) {
    LoadProgress p;
    p.bytes_done = done;
    p.bytes_total = total;
    p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    progress(p);
  };
  report(0);
  if (total == 0) return;
  const int64_t step = load_progress_step(total);
  const int64_t page = std::max<int64_t>(::sysconf(_SC_PAGESIZE), 512);
  unsigned sum = 0;  // the bytes read feed a sum the compiler cannot drop
  int64_t done = 0, reported = 0;
  for (const auto& [data, size] : ranges) {
    for (int64_t off = 0; off < size;) {
      const int64_t n = std::min(size - off, step - (done - reported));
      const auto* bytes = reinterpret_cast<const volatile unsigned char*>(data + off);
      // First byte, then one per page boundary inside the piece, then the last byte.
      sum += bytes[0];
      const auto addr = reinterpret_cast<uintptr_t>(data + off);
      for (int64_t i = page - static_cast<int64_t>(addr % static_cast<uintptr_t>(page)); i < n; i += page)
        sum += bytes[i];
      sum += bytes[n - 1];
      off += n;
      done += n;
      if (done - reported >= step && done < total) {
        reported = done;
        report(done);
      }
    }
  }
  static volatile unsigned sink;
  sink = sum;
  report(total);
}

}  // namespace

std::string LoadProgressLog::line(const LoadProgress& p) {
  const bool gb = p.bytes_total >= int64_t{10} * 1000 * 1000 * 1000;
  const double unit = gb ? 1e9 : 1e6;
  const char* unit_name = gb ? "GB" : "MB";
  const double rate = p.seconds > 0 ? static_cast<double>(p.bytes_done) / p.seconds / 1e6 : 0;  // MB/s
  char rate_text[32];
  if (p.seconds <= 0) std::snprintf(rate_text, sizeof rate_text, "- MB/s");
  else if (rate >= 1000) std::snprintf(rate_text, sizeof rate_text, "%.2f GB/s", rate / 1000);
  else std::snprintf(rate_text, sizeof rate_text, "%.*f MB/s", rate >= 10 ? 0 : 1, rate);
  char buf[512];
  if (p.finished()) {
    std::snprintf(buf, sizeof buf, "loaded %s: %.1f %s in %.*f s (%s)", what_.c_str(),
                  static_cast<double>(p.bytes_total) / unit, unit_name, p.seconds >= 10 ? 1 : 2, p.seconds, rate_text);
    return buf;
  }
  if (p.seconds - last_ < interval_) return {};
  last_ = p.seconds;
  const int percent = p.bytes_total > 0 ? static_cast<int>(100 * p.bytes_done / p.bytes_total) : 100;
  std::snprintf(buf, sizeof buf, "loading %s: %d%% %.1f/%.1f %s %s", what_.c_str(), percent,
                static_cast<double>(p.bytes_done) / unit, static_cast<double>(p.bytes_total) / unit, unit_name,
                rate_text);
  return buf;
}

model::Weights load_weights(const fs::path& dir, const config::K3Config& config, const LoadProgressFn& progress) {
  return load_weights(dir, config, config::TpShard{}, progress);
}

model::Weights load_weights(const fs::path& dir, const config::K3Config& config, config::TpShard shard,
                            const LoadProgressFn& progress) {
  config::check_shard(shard);
  const std::vector<ParamSpec> specs = expected_params(config);
  const SafetensorsSet set = SafetensorsSet::open_dir(dir);
  CheckedTensors t(set, specs);  // throws listing every problem
  if (shard.size > 1)
    t.shard_to(shard, expected_params(config::shard_config(config, shard.size, {shard.expert_parallel})));
  else config::check_expert_parallel(shard.expert_parallel, shard.size);
  if (progress && shard.size == 1) read_in(t.byte_ranges_in_file_order(), progress);

  model::Weights w;
  w.embed = t.get("model.embed_tokens.weight");
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    model::LayerWeights lw;
    lw.input_norm = t.get(p + "input_layernorm.weight");
    lw.post_attn_norm = t.get(p + "post_attention_layernorm.weight");
    lw.attn_res = attn_res(t, p + "self_attention_res_proj.weight", p + "self_attention_res_norm.weight");
    lw.mlp_res = attn_res(t, p + "mlp_res_proj.weight", p + "mlp_res_norm.weight");
    if (config.attn_kind(l) == config::AttnKind::kda) lw.attn = kda_weights(t, p + "self_attn.", config);
    else lw.attn = mla_weights(t, p + "self_attn.");
    if (config.ffn_kind(l) == config::FfnKind::dense)
      lw.ffn = model::DenseFfnWeights{t.linear(p + "mlp.gate_proj.weight"), t.linear(p + "mlp.up_proj.weight"),
                                      t.linear(p + "mlp.down_proj.weight")};
    else lw.ffn = moe_weights(t, p + "block_sparse_moe.", config, shard);
    w.layers.push_back(std::move(lw));
  }
  w.output_res = attn_res(t, "model.output_attn_res_proj.weight", "model.output_attn_res_norm.weight");
  w.final_norm = t.get("model.norm.weight");
  // Tied embeddings: the inventory has no lm_head and the head reads the embedding table.
  w.lm_head = config.tie_word_embeddings ? model::LinearWeight{w.embed, {}} : t.linear("lm_head.weight");
  if (progress && shard.size > 1) read_in(t.rank_byte_ranges(), progress);
  return w;
}

LoadedModel load_checkpoint(const fs::path& dir, const LoadProgressFn& progress) {
  LoadedModel m;
  m.config = config::load_config(dir / "config.json");
  m.weights = load_weights(dir, m.config, progress);
  return m;
}

}  // namespace k3::checkpoint
