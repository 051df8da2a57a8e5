#include "server/structured_outputs.h"

#include "server/api_error.h"

namespace k3::server {

namespace {

std::vector<std::string> read_choice(const Json& v, const std::string& field) {
  if (!v.is_array() || v.empty())
    throw bad_request("'" + field + "' must be a non-empty array of strings", field, "invalid_type");
  std::vector<std::string> out;
  for (const Json& c : v) {
    if (!c.is_string())
      throw bad_request("'" + field + "' must be a non-empty array of strings", field, "invalid_type");
    out.push_back(c.get<std::string>());
  }
  return out;
}

Json read_schema(const Json& v, const std::string& field) {
  if (v.is_string()) {  // vLLM accepts the schema as a JSON string too
    try {
      return Json::parse(v.get<std::string>());
    } catch (const std::exception&) {
      throw bad_request("'" + field + "' is a string that is not a JSON Schema document", field);
    }
  }
  if (!v.is_object() && !v.is_boolean())
    throw bad_request("'" + field + "' must be a JSON Schema object", field, "invalid_type");
  return v;
}

}  // namespace

StructuredOutputs read_structured_outputs(const JsonFields& f) {
  StructuredOutputs so;
  auto claim = [&](const std::string& field) {
    if (so.any())
      throw bad_request("'" + field + "' and '" + so.field + "' both constrain the output; give one of them", field);
    so.field = field;
  };
  if (const Json* s = f.get("structured_outputs")) {
    const JsonFields sf(*s, {"json", "regex", "choice", "grammar", "json_object"}, "structured_outputs.");
    if (const Json* j = sf.get("json")) {
      claim("structured_outputs.json");
      so.json = read_schema(*j, so.field);
    }
    if (auto r = sf.string("regex")) claim("structured_outputs.regex"), so.regex = *r;
    if (const Json* c = sf.get("choice")) claim("structured_outputs.choice"), so.choice = read_choice(*c, so.field);
    if (auto g = sf.string("grammar")) claim("structured_outputs.grammar"), so.grammar = *g;
    if (sf.boolean("json_object").value_or(false)) claim("structured_outputs.json_object"), so.json_object = true;
  }
  if (const Json* j = f.get("guided_json")) {
    claim("guided_json");
    so.json = read_schema(*j, so.field);
  }
  if (auto r = f.string("guided_regex")) claim("guided_regex"), so.regex = *r;
  if (const Json* c = f.get("guided_choice")) claim("guided_choice"), so.choice = read_choice(*c, so.field);
  if (auto g = f.string("guided_grammar")) claim("guided_grammar"), so.grammar = *g;
  return so;
}

}  // namespace k3::server
