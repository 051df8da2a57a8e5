// config/quant_config.cpp: the compressed-tensors "quantization_config" of K3 (spec §1.1, §9).
//
// The published K3 form (inside text_config):
//   {"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
//    "config_groups": {"group_0": {"format": "mxfp4-pack-quantized", "targets": ["Linear"],
//        "weights": {"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32, ...}}},
//    "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", ...], ...}
// The group size may sit at quantization_config.group_size, quantization_config.weights.group_size,
// or config_groups.<g>[.weights].group_size; every place that states it must agree. Values are
// strict: only MXFP4 (4-bit float, E8M0 group scales) is accepted; validate() requires group 32.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/json_section.h"
#include "config/k3_config.h"
#include "core/error.h"

namespace k3::config::detail {

using nlohmann::json;

namespace {

constexpr const char* kMxfp4Format = "mxfp4-pack-quantized";

struct GroupSizeSeen {
  std::string key;  // full key path, for the disagreement message
  int value;
};

// Checks a "weights" quantization-args object (num_bits 4, type float) and records its group size.
void read_weight_args(const Section& w, std::vector<GroupSizeSeen>& sizes) {
  if (w.has("num_bits") && w.req_int("num_bits") != 4)
    w.fail("num_bits", std::to_string(w.req_int("num_bits")) + " is not supported; MXFP4 weights have num_bits 4");
  if (w.has("type")) {
    const std::string type = w.opt_string("type", "float");
    if (type != "float") w.fail("type", "\"" + type + "\" is not supported; MXFP4 weights have type \"float\" (E2M1)");
  }
  if (w.has("group_size")) sizes.push_back({w.path("group_size"), w.req_int("group_size")});
}

}  // namespace

Mxfp4Config parse_quantization(const Section& q) {
  const json* method = q.find("quant_method");
  if (method == nullptr) q.fail("quant_method", "required key is missing, expected \"compressed-tensors\"");
  const std::string m = q.as_string("quant_method", *method);
  if (m != "compressed-tensors")
    q.fail("quant_method", "\"" + m +
                               "\" is not supported; k3serve reads \"compressed-tensors\" with "
                               "format \"" +
                               kMxfp4Format + "\"");

  std::vector<GroupSizeSeen> sizes;
  int mxfp4_formats = 0;
  // Top-level format: mxfp4, or "mixed-precision" when the groups name their own format.
  std::string top_format;
  if (q.has("format")) {
    top_format = q.opt_string("format", "");
    if (top_format == kMxfp4Format) ++mxfp4_formats;
    else if (top_format != "mixed-precision")
      q.fail("format", "\"" + top_format + "\" is not supported; only \"" + kMxfp4Format + "\"");
  }
  if (q.has("group_size")) sizes.push_back({q.path("group_size"), q.req_int("group_size")});
  if (q.has("weights")) read_weight_args(q.sub("weights"), sizes);

  if (q.has("config_groups")) {
    const Section groups = q.sub("config_groups");
    const json& gobj = *q.find("config_groups");
    for (auto it = gobj.begin(); it != gobj.end(); ++it) {
      const Section g = groups.sub(it.key());
      if (g.has("format")) {
        const std::string f = g.opt_string("format", "");
        if (f != kMxfp4Format) g.fail("format", "\"" + f + "\" is not supported; only \"" + kMxfp4Format + "\"");
        ++mxfp4_formats;
      } else if (top_format != kMxfp4Format) {
        g.fail("format", "required key is missing (quantization_config.format is \"" + top_format + "\"), expected \"" +
                             kMxfp4Format + "\"");
      }
      if (g.has("group_size")) sizes.push_back({g.path("group_size"), g.req_int("group_size")});
      if (g.has("weights")) read_weight_args(g.sub("weights"), sizes);
    }
  }
  if (mxfp4_formats == 0) q.fail("format", "required key is missing, expected \"" + std::string(kMxfp4Format) + "\"");

  Mxfp4Config out;
  out.enabled = true;
  out.group_size = 32;  // the MX block size when no key states it
  if (!sizes.empty()) {
    out.group_size = sizes[0].value;
    for (const GroupSizeSeen& s : sizes)
      if (s.value != out.group_size)
        throw core::Error(q.source() + ": " + s.key + ": " + std::to_string(s.value) + " disagrees with " +
                          sizes[0].key + " = " + std::to_string(out.group_size));
    if (out.group_size != 32)
      throw core::Error(q.source() + ": " + sizes[0].key + ": MXFP4 group size must be 32 (got " +
                        std::to_string(out.group_size) + ")");
  }
  return out;
}

json mxfp4_quantization_json(const Mxfp4Config& m) {
  // Same shape as the published K3 block, so files we write load in other engines too.
  const json weights = {
      {"num_bits", 4},     {"type", "float"},  {"strategy", "group"},         {"group_size", m.group_size},
      {"symmetric", true}, {"dynamic", false}, {"scale_dtype", "torch.uint8"}};
  return {
      {"quant_method", "compressed-tensors"},
      {"format", kMxfp4Format},
      {"quantization_status", "compressed"},
      {"config_groups",
       {{"group_0",
         {{"format", kMxfp4Format},
          {"targets", json::array({"Linear"})},
          {"weights", weights},
          {"input_activations", nullptr},
          {"output_activations", nullptr}}}}},
      {"ignore", json::array({"re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
                              "re:.*lm_head.*", "re:.*vision_tower.*", "re:.*mm_projector.*"})},
      {"kv_cache_scheme", nullptr},
  };
}

}  // namespace k3::config::detail
