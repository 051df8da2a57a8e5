// loadgen/bundle.cpp: bundle files and hashes.
#include "loadgen/bundle.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace k3::loadgen {

using Json = nlohmann::json;

std::string text_hash(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

std::string file_hash(const std::filesystem::path& file) {
  std::ifstream f(file, std::ios::binary);
  K3_CHECK(f.good(), "cannot read '" + file.string() + "' to hash it");
  std::stringstream s;
  s << f.rdbuf();
  return text_hash(s.str());
}

void write_bundle(const Json& bundle, const std::filesystem::path& path) {
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  std::ofstream f(path);
  K3_CHECK(f.good(), "cannot write the bundle '" + path.string() + "'");
  f << bundle.dump(1) << "\n";
  K3_CHECK(f.good(), "writing the bundle '" + path.string() + "' failed");
}

Json read_bundle(const std::filesystem::path& path) {
  std::ifstream f(path);
  K3_CHECK(f.good(), "cannot read the bundle '" + path.string() + "'");
  Json j = Json::parse(f, nullptr, false);
  K3_CHECK(!j.is_discarded() && j.is_object(), "bundle '" + path.string() + "' is not a JSON object");
  K3_CHECK(j.value("schema", "") == kBundleSchema, "bundle '" + path.string() + "' has schema '" +
                                                       j.value("schema", std::string("(none)")) + "', expected '" +
                                                       kBundleSchema + "'");
  for (const char* key : {"environment", "workload", "run", "samples", "summary"})
    K3_CHECK(j.contains(key), "bundle '" + path.string() + "' lacks the field '" + key + "'");
  K3_CHECK(j["samples"].is_array(), "bundle '" + path.string() + "': 'samples' must be an array");
  try {
    (void)bundle_samples(j);
  } catch (const Json::exception& e) {
    throw core::Error("bundle '" + path.string() + "': a sample is malformed (" + e.what() + ")");
  }
  return j;
}

std::vector<RequestSample> bundle_samples(const Json& bundle) {
  std::vector<RequestSample> out;
  for (const Json& s : bundle.at("samples")) out.push_back(RequestSample::from_json(s));
  return out;
}

std::string bundle_name(const Json& bundle, const std::filesystem::path& path) {
  const std::string label = bundle.value("label", "");
  return label.empty() ? path.stem().string() : label;
}

}  // namespace k3::loadgen
