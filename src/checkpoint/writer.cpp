// checkpoint/writer.cpp: write_random_checkpoint — config.json plus safetensors file(s) holding
// exactly the inventory of the config, with deterministic random values (random_init.h).
//
// The values are computed on worker threads ahead of the (sequential) safetensors writer, so a
// full-width checkpoint (k3-proxy-tp8, ~52 GB) is limited by the disk rather than by one core.
// Every tensor's bytes depend only on (seed, init, name, shape), so the files are the same for
// any thread count.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/param_inventory.h"
#include "checkpoint/random_init.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"

namespace k3::checkpoint {

namespace fs = std::filesystem;

namespace {

// Removes the checkpoint files a previous write may have left in `out`, so the folder never
// mixes a single file with an index, or shards of two different splits. Touches nothing else.
void remove_stale_checkpoint_files(const fs::path& out) {
  static const std::regex shard_re(R"(model-\d{5}-of-\d{5}\.safetensors)");
  for (const auto& e : fs::directory_iterator(out)) {
    const std::string name = e.path().filename().string();
    if (name == kSingleFileName || name == kIndexFileName || std::regex_match(name, shard_re)) fs::remove(e.path());
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

bool is_mxfp4_half(const ParamSpec& s) {
  return s.role == ParamRole::expert_packed || s.role == ParamRole::expert_scale;
}

// One unit of work: the bytes of one tensor, or of both halves of an MXFP4 pair (one draw).
struct Job {
  std::vector<const ParamSpec*> parts;
  int64_t bytes = 0;
};

// Computes jobs ahead of the writer on `threads` workers, in the order the writer will ask for
// them, keeping at most `max_ahead` bytes computed but not yet taken (a job larger than that still
// runs when nothing else is ahead). take() waits for a job a worker holds and computes a job no
// one has started itself, so any request order is served; only the expected order is fast.
class Prefetcher {
 public:
  Prefetcher(const config::K3Config& config, const WriteOptions& options, std::vector<Job> jobs, int threads,
             int64_t max_ahead)
      : config_(config), options_(options), jobs_(std::move(jobs)), slots_(jobs_.size()), max_ahead_(max_ahead) {
    for (size_t j = 0; j < jobs_.size(); ++j) {
      slots_[j].parts_left = static_cast<int>(jobs_[j].parts.size());
      for (size_t p = 0; p < jobs_[j].parts.size(); ++p) where_[jobs_[j].parts[p]->name] = {j, p};
    }
    for (int t = 0; t < threads; ++t) workers_.emplace_back([this] { work(); });
  }
  ~Prefetcher() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // Copies the bytes of tensor `name` into `out` (exactly its size) and drops them.
  void take(const std::string& name, std::span<std::byte> out) {
    const auto it = where_.find(name);
    K3_CHECK(it != where_.end(), "write_random_checkpoint: no job makes tensor '" + name + "'");
    const auto [j, part] = it->second;
    Slot& s = slots_[j];
    std::unique_lock lock(mu_);
    if (!s.claimed) {  // not started: compute it here rather than wait behind the budget
      s.claimed = true;
      ahead_ += jobs_[j].bytes;
      lock.unlock();
      run(j);
      lock.lock();
    }
    cv_.wait(lock, [&] { return s.done; });
    if (s.error) std::rethrow_exception(s.error);
    std::vector<std::byte>& bytes = s.out[part];
    K3_CHECK(bytes.size() == out.size(), "write_random_checkpoint: size mismatch for '" + name + "'");
    std::memcpy(out.data(), bytes.data(), bytes.size());
    std::vector<std::byte>().swap(bytes);
    if (--s.parts_left == 0) {
      ahead_ -= jobs_[j].bytes;
      cv_.notify_all();
    }
  }

 private:
  struct Slot {
    bool claimed = false, done = false;
    int parts_left = 0;
    std::vector<std::vector<std::byte>> out;
    std::exception_ptr error;
  };

  // Index of the first job nobody has claimed (jobs_.size() when none); caller holds mu_.
  size_t next_unclaimed() {
    while (cursor_ < jobs_.size() && slots_[cursor_].claimed) ++cursor_;
    return cursor_;
  }
  void work() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] {
        if (stop_) return true;
        const size_t j = next_unclaimed();
        return j < jobs_.size() && (ahead_ == 0 || ahead_ + jobs_[j].bytes <= max_ahead_);
      });
      if (stop_) return;
      const size_t j = next_unclaimed();
      slots_[j].claimed = true;
      ahead_ += jobs_[j].bytes;
      lock.unlock();
      run(j);
      lock.lock();
    }
  }
  // Computes job j (no lock held) and publishes it.
  void run(size_t j) {
    std::vector<std::vector<std::byte>> out;
    std::exception_ptr error;
    try {
      const Job& job = jobs_[j];
      for (const ParamSpec* p : job.parts)
        out.emplace_back(static_cast<size_t>(TensorEntry{p->name, p->dtypes[0], p->shapes[0]}.nbytes()));
      if (is_mxfp4_half(*job.parts[0])) {
        const bool packed_first = job.parts[0]->role == ParamRole::expert_packed;
        K3_CHECK(job.parts.size() == 2,
                 "write_random_checkpoint: MXFP4 '" + job.parts[0]->name + "' has no other half");
        fill_random_mxfp4(*job.parts[0], options_.init, options_.seed, out[packed_first ? 0 : 1],
                          out[packed_first ? 1 : 0]);
      } else {
        fill_random_param(*job.parts[0], config_, options_.init, options_.seed, out[0]);
      }
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard lock(mu_);
      slots_[j].out = std::move(out);
      slots_[j].error = error;
      slots_[j].done = true;
    }
    cv_.notify_all();
  }

  const config::K3Config& config_;
  const WriteOptions& options_;
  const std::vector<Job> jobs_;
  std::vector<Slot> slots_;
  std::map<std::string, std::pair<size_t, size_t>> where_;  // tensor name -> (job, part)
  const int64_t max_ahead_;
  std::mutex mu_;
  std::condition_variable cv_;
  size_t cursor_ = 0;
  int64_t ahead_ = 0;  // bytes of claimed jobs not yet fully taken
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

// Jobs in the order the writer asks for the tensors: file by file, and within a file by
// write_safetensors' data order (wider dtypes first, then by name). An MXFP4 pair is one job, at
// the place of whichever half comes first.
std::vector<Job> plan_jobs(const std::vector<std::vector<TensorEntry>>& files,
                           const std::map<std::string, const ParamSpec*>& by_name) {
  std::vector<Job> jobs;
  std::map<std::string, size_t> pair_job;  // value_name -> job
  for (std::vector<TensorEntry> entries : files) {
    std::sort(entries.begin(), entries.end(), [](const TensorEntry& a, const TensorEntry& b) {
      const size_t sa = core::dtype_size(a.dtype), sb = core::dtype_size(b.dtype);
      return sa != sb ? sa > sb : a.name < b.name;
    });
    for (const TensorEntry& e : entries) {
      const ParamSpec* spec = by_name.at(e.name);
      if (is_mxfp4_half(*spec)) {
        const auto [it, fresh] = pair_job.emplace(spec->value_name, jobs.size());
        if (!fresh) {
          jobs[it->second].parts.push_back(spec);
          jobs[it->second].bytes += e.nbytes();
          continue;
        }
      }
      jobs.push_back({{spec}, e.nbytes()});
    }
  }
  return jobs;
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
  // The files: one, or shards in inventory order.
  std::vector<std::vector<TensorEntry>> files;
  if (options.max_shard_bytes <= 0) {
    files.push_back(entries);
  } else {
    for (const std::vector<size_t>& shard : split_into_shards(entries, options.max_shard_bytes)) {
      files.emplace_back();
      for (size_t i : shard) files.back().push_back(entries[i]);
    }
  }
  const int threads = options.threads > 0 ? options.threads
                                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // 1 GiB ahead keeps every worker busy (an expert pair is ~1 MB at K3 widths) in bounded memory.
  Prefetcher prefetch(c, options, plan_jobs(files, by_name), threads > 1 ? threads : 0, int64_t{1} << 30);
  const TensorFiller fill = [&](const TensorEntry& e, std::span<std::byte> bytes) { prefetch.take(e.name, bytes); };

  fs::create_directories(out);
  remove_stale_checkpoint_files(out);
  write_text(out / "config.json", config::to_json(c).dump(2) + "\n");
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};

  if (options.max_shard_bytes <= 0) {
    write_safetensors(out / kSingleFileName, files[0], fill, metadata);
    return;
  }
  std::map<std::string, std::string> weight_map;
  int64_t total = 0;
  for (size_t s = 0; s < files.size(); ++s) {
    const std::string file = shard_file_name(static_cast<int>(s + 1), static_cast<int>(files.size()));
    for (const TensorEntry& e : files[s]) {
      weight_map[e.name] = file;
      total += e.nbytes();
    }
    write_safetensors(out / file, files[s], fill, metadata);
  }
  write_index(out, weight_map, total);
}

}  // namespace k3::checkpoint
