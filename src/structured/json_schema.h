// structured/json_schema.h: JSON Schema to GBNF rules (structured/ebnf.h), so `response_format`
// json_schema, strict tools and `structured_outputs.json` become grammars.
//
// Supported: type (one or a list; absent: inferred, or any value), properties / required /
// additionalProperties, enum / const, anyOf / oneOf (as alternatives: oneOf's exclusivity is not
// enforced, its outputs match at least one), allOf (object schemas merged), $ref into $defs /
// definitions / the root (recursive schemas), items / prefixItems / minItems / maxItems, string
// minLength / maxLength / pattern (structured/regex.h; with lengths only when it is one repeated
// class, ^[...]*$; allOf of a pattern and a pure length pattern ^[\s\S]{m,n}$ merges them) / format
// (date-time, date, time, duration, uuid, email, hostname, ipv4, ipv6, uri), integer and number minimum / maximum /
// exclusiveMinimum / exclusiveMaximum, and OpenAPI's nullable. Annotations (title, description,
// default, examples, $schema, $id, $comment, deprecated, readOnly, writeOnly) are ignored.
//
// Every output validates: where the grammar is narrower than the schema it says so here.
// Properties come in declared order; a property not declared is allowed only when
// additionalProperties says so (true or a schema; absent means none, as in OpenAI's strict mode
// and xgrammar); number bounds that are not integers, and exclusive number bounds, are met by
// tightening them to the next integer inside (x > 0 is written as x >= 1); numbers under a bound
// are written without an exponent; numbers have at most 16 digits before and after the point and
// 2 in an exponent (each one a finite double, and no endless digits). Any other keyword is refused, naming it and where it is, as is
// a schema whose grammar would be too large.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace k3::structured {

// Rules being written: name -> body. Shared rules (ws, string, value, ...) are written once.
class EbnfRules {
 public:
  bool has(const std::string& name) const { return rules_.count(name) > 0; }
  void add(const std::string& name, const std::string& body);
  // A name not yet used, from `base` (letters, digits and dashes only).
  std::string fresh(const std::string& base);
  std::string text() const;  // every rule, one per line
  size_t size() const { return bytes_; }

 private:
  std::map<std::string, std::string> rules_;
  std::map<std::string, int> counters_;
  size_t bytes_ = 0;
};

class JsonSchemaConverter {
 public:
  // `prefix` keeps this schema's rules apart from others in the same EbnfRules.
  JsonSchemaConverter(EbnfRules& rules, std::string prefix);
  // The rule matching values of `schema` (its name). Throws core::Error
  // "json_schema: <path>: ..." naming an unsupported keyword, a bad value or a schema too big.
  std::string convert(const nlohmann::ordered_json& schema);

 private:
  std::string visit(const nlohmann::ordered_json& schema, const std::string& path);
  std::string visit_type(const nlohmann::ordered_json& schema, const std::string& type, const std::string& path);
  std::string object_rule(const nlohmann::ordered_json& schema, const std::string& path);
  std::string array_rule(const nlohmann::ordered_json& schema, const std::string& path);
  std::string string_rule(const nlohmann::ordered_json& schema, const std::string& path);
  std::string number_rule(const nlohmann::ordered_json& schema, bool integer, const std::string& path);
  // A JSON string key (plain characters) that is none of `keys`.
  std::string key_excluding(const std::vector<std::string>& keys);
  void define_plain_char();
  std::string ref_rule(const std::string& ref, const std::string& path);
  nlohmann::ordered_json merge_all_of(const nlohmann::ordered_json& schema, const std::string& path);
  std::string name(const std::string& path);

  EbnfRules& rules_;
  std::string prefix_;
  const nlohmann::ordered_json* root_ = nullptr;
  std::map<std::string, std::string> refs_;  // $ref -> its rule
  int depth_ = 0;
};

// Shared terminal rules (json-ws, json-string, json-number, json-value, ...), written into `rules`
// on first use; each returns its rule name. Defined in json_terminals.cpp.
std::string json_ws(EbnfRules& rules);
std::string json_string(EbnfRules& rules);
std::string json_value(EbnfRules& rules);
std::string json_object(EbnfRules& rules);  // any JSON object (response_format json_object)
// A string of [min, max] characters (max < 0: unbounded).
std::string json_string_length(EbnfRules& rules, int64_t min, int64_t max);
// A string in one of the formats above; throws core::Error for an unknown one.
std::string json_string_format(EbnfRules& rules, const std::string& format);
// Integers in [lo, hi] (each optional), as an expression; numbers likewise (integer-valued
// bounds; fractions allowed, no exponent).
// "^ATOM*$" / "^ATOM+$" (one class, escape or '.'): the atom, for a pattern with length bounds.
std::optional<std::string> repeated_class(const std::string& pattern);
std::string integer_range(std::optional<int64_t> lo, std::optional<int64_t> hi);
std::string number_range(std::optional<int64_t> lo, std::optional<int64_t> hi);

}  // namespace k3::structured
