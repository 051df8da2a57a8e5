// spec/spec_config.cpp: SpeculativeConfig validation, method names and make_drafter.
#include "spec/spec_config.h"

#include "core/error.h"
#include "spec/ngram_drafter.h"
#include "spec/synthetic_drafter.h"

namespace k3::spec {

const char* to_string(SpecMethod m) {
  switch (m) {
    case SpecMethod::none: return "none";
    case SpecMethod::ngram: return "ngram";
    case SpecMethod::synthetic: return "synthetic";
    case SpecMethod::dspark: return "dspark";
    case SpecMethod::eagle3: return "eagle3";
  }
  return "?";
}

SpecMethod parse_spec_method(std::string_view name) {
  for (SpecMethod m :
       {SpecMethod::none, SpecMethod::ngram, SpecMethod::synthetic, SpecMethod::dspark, SpecMethod::eagle3})
    if (name == to_string(m)) return m;
  throw core::Error("speculative method must be one of none, ngram, synthetic, dspark, eagle3; got '" +
                    std::string(name) + "'");
}

void SpeculativeConfig::validate() const {
  if (method == SpecMethod::none) return;
  K3_CHECK(num_speculative_tokens >= 1 && num_speculative_tokens <= 32,
           "num_speculative_tokens must be in [1, 32] with speculative method " + std::string(to_string(method)) +
               ", got " + std::to_string(num_speculative_tokens));
  if (method == SpecMethod::synthetic)
    K3_CHECK(synthetic_acceptance_length >= 0 && synthetic_acceptance_length <= num_speculative_tokens + 1,
             "synthetic_acceptance_length must be in [1, num_speculative_tokens + 1 = " +
                 std::to_string(num_speculative_tokens + 1) + "] (0: K+1), got " +
                 std::to_string(synthetic_acceptance_length));
  if (method == SpecMethod::ngram)
    K3_CHECK(ngram_min >= 1 && ngram_max >= ngram_min && ngram_max <= 64,
             "ngram sizes must satisfy 1 <= ngram_min <= ngram_max <= 64, got " + std::to_string(ngram_min) + ".." +
                 std::to_string(ngram_max));
}

std::string describe(const SpeculativeConfig& c) {
  if (!c.enabled()) return "speculative decoding off";
  std::string s = std::string("speculative method ") + to_string(c.method) +
                  ", K = " + std::to_string(c.num_speculative_tokens) + (c.adaptive ? " (adaptive)" : "");
  if (c.method == SpecMethod::ngram)
    s += ", n-grams " + std::to_string(c.ngram_max) + ".." + std::to_string(c.ngram_min);
  if (c.method == SpecMethod::synthetic)
    s += ", SYNTHETIC acceptance length " +
         std::to_string(c.synthetic_acceptance_length > 0 ? c.synthetic_acceptance_length
                                                          : c.num_speculative_tokens + 1) +
         " (outputs are not the model's distribution)";
  return s;
}

std::unique_ptr<Drafter> make_drafter(const SpeculativeConfig& c) {
  c.validate();
  switch (c.method) {
    case SpecMethod::ngram: return std::make_unique<NgramDrafter>(c.ngram_min, c.ngram_max);
    case SpecMethod::synthetic:
      return std::make_unique<SyntheticDrafter>(c.synthetic_acceptance_length > 0 ? c.synthetic_acceptance_length
                                                                                  : c.num_speculative_tokens + 1);
    case SpecMethod::none: throw core::Error("make_drafter: speculative method is none");
    case SpecMethod::dspark:
    case SpecMethod::eagle3:
      throw core::Error(std::string("make_drafter: the ") + to_string(c.method) +
                        " drafter needs the target model; build it with src/draft/ and pass it to the Engine");
  }
  return nullptr;
}

}  // namespace k3::spec
