// loadgen/bundle.h: the result bundle of one bench-serve run, one JSON file holding everything
// needed to compare runs later: environment (evidence/environment.h: git sha, build, GPU name /
// driver / clocks from nvidia-smi or "none", CPU), the served model (its /v1/models reply and a
// config hash), the engine config, the workload spec with its seed, the run options, the raw
// per-request samples, the server's /metrics deltas and the summary.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadgen/request_metrics.h"

namespace k3::loadgen {

inline constexpr const char* kBundleSchema = "k3serve-bench-serve/1";

// FNV-1a 64 of a file's bytes as 16 hex digits; throws core::Error naming an unreadable file.
std::string file_hash(const std::filesystem::path& file);
std::string text_hash(const std::string& text);

// Writes `bundle` (pretty-printed) to `path`, creating its folder.
void write_bundle(const nlohmann::json& bundle, const std::filesystem::path& path);
// Reads and checks a bundle: the schema and the fields compare needs; errors name the file.
nlohmann::json read_bundle(const std::filesystem::path& path);
std::vector<RequestSample> bundle_samples(const nlohmann::json& bundle);
// A short name for tables and plot legends: the bundle's label, else its file stem.
std::string bundle_name(const nlohmann::json& bundle, const std::filesystem::path& path);

}  // namespace k3::loadgen
