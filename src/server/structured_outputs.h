// server/structured_outputs.h: vLLM's structured-output fields, read the way vLLM names them so
// existing client code works unchanged: `structured_outputs: {json | regex | choice | grammar |
// json_object}` and the older `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`.
// At most one constraint per request: two are a 400 naming the second.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/json_body.h"

namespace k3::server {

struct StructuredOutputs {
  std::optional<Json> json;  // a JSON Schema
  bool json_object = false;  // any JSON object
  std::optional<std::string> regex;
  std::optional<std::vector<std::string>> choice;
  std::optional<std::string> grammar;  // GBNF / EBNF (structured/ebnf.h)
  std::string field;                   // where it came from ("structured_outputs.json", "guided_regex", ...)
  bool any() const { return json || json_object || regex || choice || grammar; }
};

// The request fields this reads (for with_common_fields).
inline constexpr std::string_view kStructuredOutputFields[] = {"structured_outputs", "guided_json", "guided_regex",
                                                               "guided_choice", "guided_grammar"};

StructuredOutputs read_structured_outputs(const JsonFields& f);

}  // namespace k3::server
