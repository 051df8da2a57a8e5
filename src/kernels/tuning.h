// kernels/tuning.h: which capable implementation of an op runs, as data.
//
// An implementation's supports() says only whether it is correct for the arguments. Which of the
// capable ones runs is decided by a tuning table: per op, rules keyed by a shape measure of the
// arguments (rows, tokens, heads x sequences; OpTable names it) that give an order of
// implementation names, first preferred. Tables are checked-in JSON files in tuning/ (embedded at
// build time): one per GPU, written by `k3bench_decode_gpu --tune` (bench/op_tuner.h), and
// tuning/default.json, the stated order every GPU and every shape the GPU's table lacks falls back
// to. A name a rule does not list comes after the listed ones, in registration order.
//
//   {"gpu": "NVIDIA H200", "ops": {"moe_tail_combine": {"measure": "rows", "rules": [
//       {"sizes": [1, 1], "order": ["cuda_tail_one_launch", "cuda_tail_mma"]},
//       {"sizes": [17, null], "order": ["cuda_tail_cublaslt", "cuda_tail_mma"]}]}}}
#pragma once
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace k3::kernels {

inline constexpr int64_t kOpenEnd = std::numeric_limits<int64_t>::max();  // "sizes": [lo, null]

struct TuningRule {
  int64_t lo = 0, hi = kOpenEnd;   // the measure's values [lo, hi] this rule covers
  std::vector<std::string> order;  // implementation names, first preferred
};

class TuningTable {
 public:
  struct OpRules {
    std::string measure;            // "rows", "tokens", ... (OpTable::measure(); checked when applied)
    std::vector<TuningRule> rules;  // ascending, not overlapping
  };
  // Throws core::Error naming `source` and the key that is wrong (not an object, overlapping or
  // unsorted sizes, an empty order, a name listed twice, ...).
  static TuningTable parse(std::string_view json, std::string source);

  const std::string& source() const { return source_; }  // "tuning/h200.json"
  const std::string& gpu() const { return gpu_; }        // "NVIDIA H200"; "*" in the default table
  const std::map<std::string, OpRules>& ops() const { return ops_; }
  // The rule of `op` whose sizes hold `size`; nullptr when there is none.
  const TuningRule* find(const std::string& op, int64_t size) const;

 private:
  std::string source_, gpu_;
  std::map<std::string, OpRules> ops_;
};

// The two tables a device's op selection reads: its GPU's (null when tuning/ has none for it)
// and the default.
struct Tuning {
  std::shared_ptr<const TuningTable> gpu, fallback;
  // The rule for (op, size) and the file it came from; nullptr when neither table has one.
  const TuningRule* find(const std::string& op, int64_t size, const std::string** source) const;
};

// The checked-in tables of tuning/ (parsed on each call; register_cuda_ops calls it once per
// registry): the one whose "gpu" equals `gpu_name` ("NVIDIA H200", as cudaGetDeviceProperties
// names it) and tuning/default.json.
Tuning builtin_tuning(const std::string& gpu_name);
// Every checked-in table (tests validate them against the registry).
std::vector<std::shared_ptr<const TuningTable>> builtin_tuning_tables();

// "rows 2..16", "rows 17+": a rule's sizes as the log and --explain print them.
std::string describe_sizes(const std::string& measure, const TuningRule& rule);

}  // namespace k3::kernels
