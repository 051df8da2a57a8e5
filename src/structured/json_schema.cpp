#include "structured/json_schema.h"

#include <cmath>
#include <cstdio>
#include <regex>
#include <set>

#include "core/error.h"
#include "structured/ebnf.h"
#include "structured/regex.h"

namespace k3::structured {

using json = nlohmann::ordered_json;

namespace {

constexpr size_t kMaxRulesBytes = 4 << 20;  // a schema whose grammar text passes this is refused
constexpr int kMaxDepth = 64;               // nesting of schemas (not of $ref recursion)
constexpr int64_t kMaxBound = int64_t{1} << 53;

const std::set<std::string>& annotations() {
  static const std::set<std::string> k = {"title", "description", "default",    "examples", "$schema",
                                          "$id",   "$comment",    "deprecated", "readOnly", "writeOnly",
                                          "$defs", "definitions", "strict"};
  return k;
}

const std::set<std::string>& supported() {
  static const std::set<std::string> k = {"type",
                                          "properties",
                                          "required",
                                          "additionalProperties",
                                          "enum",
                                          "const",
                                          "anyOf",
                                          "oneOf",
                                          "allOf",
                                          "$ref",
                                          "items",
                                          "prefixItems",
                                          "minItems",
                                          "maxItems",
                                          "minLength",
                                          "maxLength",
                                          "pattern",
                                          "format",
                                          "minimum",
                                          "maximum",
                                          "exclusiveMinimum",
                                          "exclusiveMaximum",
                                          "nullable"};
  return k;
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw core::Error("json_schema: " + (path.empty() ? std::string("(root)") : path) + ": " + what);
}

std::string literal_of(const json& value) { return ebnf_literal(value.dump()); }

// A bound as an integer, rounded inward (`up`: a lower bound, ceil; else floor), so the grammar's
// numbers always meet it.
std::optional<int64_t> bound(const json& s, const char* key, bool up, const std::string& path) {
  if (!s.contains(key)) return std::nullopt;
  const json& v = s[key];
  if (!v.is_number()) fail(path, std::string("'") + key + "' must be a number");
  const double d = v.get<double>();
  if (!std::isfinite(d) || std::fabs(d) > static_cast<double>(kMaxBound))
    fail(path, std::string("'") + key + "' is beyond +-2^53");
  return static_cast<int64_t>(up ? std::ceil(d) : std::floor(d));
}

int64_t count(const json& s, const char* key, int64_t fallback, const std::string& path) {
  if (!s.contains(key)) return fallback;
  if (!s[key].is_number_integer() || s[key].get<int64_t>() < 0)
    fail(path, std::string("'") + key + "' must be a non-negative integer");
  return s[key].get<int64_t>();
}

// "^[\s\S]{m,n}$" (or . / [^] / [\S\s] for any character): a pure length bound (n = -1: none).
std::optional<std::pair<int64_t, int64_t>> length_pattern(const std::string& p) {
  static const std::regex re(R"(^\^(\[\\s\\S\]|\[\\S\\s\]|\[\^\]|\.)\{(\d+)(,(\d*))?\}\$$)");
  std::smatch m;
  if (!std::regex_match(p, m, re)) return std::nullopt;
  const int64_t lo = std::stoll(m[2].str());
  const int64_t hi = !m[3].matched ? lo : m[4].str().empty() ? -1 : std::stoll(m[4].str());
  return std::pair{lo, hi};
}

}  // namespace

// "^ATOM*$" or "^ATOM+$" with ATOM one class, escape or '.': the atom.
std::optional<std::string> repeated_class(const std::string& p) {
  static const std::regex re(R"(^\^?(\[(?:\\.|[^\]\\])*\]|\\.|\.)[*+]\$?$)");
  std::smatch m;
  if (!std::regex_match(p, m, re)) return std::nullopt;
  return m[1].str();
}

void EbnfRules::add(const std::string& name, const std::string& body) {
  bytes_ += name.size() + body.size() + 6;
  if (bytes_ > kMaxRulesBytes) throw core::Error("json_schema: the schema's grammar is too large to compile");
  rules_[name] = body;
}

std::string EbnfRules::fresh(const std::string& base) {
  std::string clean;
  for (char c : base) clean += (std::isalnum(static_cast<unsigned char>(c)) || c == '-') ? c : '-';
  if (clean.empty()) clean = "r";
  for (;;) {
    const std::string name = clean + "-" + std::to_string(++counters_[clean]);
    if (!has(name)) return name;
  }
}

std::string EbnfRules::text() const {
  std::string out;
  for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
  return out;
}

JsonSchemaConverter::JsonSchemaConverter(EbnfRules& rules, std::string prefix)
    : rules_(rules), prefix_(std::move(prefix)) {}

std::string JsonSchemaConverter::name(const std::string& path) { return rules_.fresh(prefix_ + path); }

std::string JsonSchemaConverter::convert(const json& schema) {
  root_ = &schema;
  return visit(schema, "");
}

std::string JsonSchemaConverter::visit(const json& schema, const std::string& path) {
  if (schema.is_boolean()) {
    if (!schema.get<bool>()) fail(path, "the schema 'false' matches nothing");
    return json_value(rules_);
  }
  if (!schema.is_object()) fail(path, "a schema must be an object or a boolean");
  if (++depth_ > kMaxDepth) fail(path, "schemas nested deeper than " + std::to_string(kMaxDepth));
  struct Leave {
    int& d;
    ~Leave() { --d; }
  } leave{depth_};
  for (const auto& [key, _] : schema.items())
    if (!supported().count(key) && !annotations().count(key))
      fail(path, "unsupported JSON Schema keyword '" + key + "'");

  if (schema.contains("$ref")) {
    if (schema.size() > 1)
      for (const auto& [key, _] : schema.items())
        if (key != "$ref" && !annotations().count(key)) fail(path, "'$ref' beside '" + key + "' is not supported");
    if (!schema["$ref"].is_string()) fail(path, "'$ref' must be a string");
    return ref_rule(schema["$ref"].get<std::string>(), path);
  }
  if (schema.contains("allOf")) return visit(merge_all_of(schema, path), path);
  const std::string rule = name(path.empty() ? "root" : path);
  std::string body;
  auto alt = [&](const std::string& s) { body += body.empty() ? s : " | " + s; };
  if (schema.contains("const")) alt(literal_of(schema["const"]));
  else if (schema.contains("enum")) {
    if (!schema["enum"].is_array() || schema["enum"].empty()) fail(path, "'enum' must be a non-empty array");
    for (const json& v : schema["enum"]) alt(literal_of(v));
  } else if (schema.contains("anyOf") || schema.contains("oneOf")) {
    const char* key = schema.contains("anyOf") ? "anyOf" : "oneOf";
    const json& list = schema[key];
    if (!list.is_array() || list.empty()) fail(path, std::string("'") + key + "' must be a non-empty array");
    json base = schema;
    base.erase(key);
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string sub = path + "/" + key + "/" + std::to_string(i);
      bool constrained = false;
      for (const auto& [k, _] : base.items()) constrained = constrained || !annotations().count(k);
      if (!constrained) alt(visit(list[i], sub));
      else alt(visit(merge_all_of(json{{"allOf", json::array({base, list[i]})}}, sub), sub));
    }
  } else if (schema.contains("type")) {
    const json& t = schema["type"];
    if (t.is_string()) alt(visit_type(schema, t.get<std::string>(), path));
    else if (t.is_array() && !t.empty()) {
      for (const json& one : t) {
        if (!one.is_string()) fail(path, "'type' entries must be strings");
        alt(visit_type(schema, one.get<std::string>(), path));
      }
    } else fail(path, "'type' must be a string or a non-empty array of strings");
  } else if (schema.contains("properties") || schema.contains("additionalProperties") || schema.contains("required")) {
    alt(visit_type(schema, "object", path));
  } else if (schema.contains("items") || schema.contains("prefixItems")) {
    alt(visit_type(schema, "array", path));
  } else if (schema.contains("pattern") || schema.contains("format") || schema.contains("minLength") ||
             schema.contains("maxLength")) {
    alt(visit_type(schema, "string", path));
  } else if (schema.contains("minimum") || schema.contains("maximum") || schema.contains("exclusiveMinimum") ||
             schema.contains("exclusiveMaximum")) {
    alt(visit_type(schema, "number", path));
  } else {
    alt(json_value(rules_));
  }
  if (schema.value("nullable", false)) alt("\"null\"");
  rules_.add(rule, body);
  return rule;
}

std::string JsonSchemaConverter::visit_type(const json& schema, const std::string& type, const std::string& path) {
  if (type == "object") return object_rule(schema, path);
  if (type == "array") return array_rule(schema, path);
  if (type == "string") return string_rule(schema, path);
  if (type == "number") return number_rule(schema, false, path);
  if (type == "integer") return number_rule(schema, true, path);
  if (type == "boolean") return "(\"true\" | \"false\")";
  if (type == "null") return "\"null\"";
  fail(path, "unknown type '" + type + "'");
}

std::string JsonSchemaConverter::object_rule(const json& schema, const std::string& path) {
  const std::string ws = json_ws(rules_), key = json_string(rules_);
  std::vector<std::pair<std::string, std::string>> props;  // (key literal, value rule)
  std::vector<bool> required;
  std::set<std::string> req;
  if (schema.contains("required")) {
    if (!schema["required"].is_array()) fail(path, "'required' must be an array of strings");
    for (const json& r : schema["required"]) {
      if (!r.is_string()) fail(path, "'required' must be an array of strings");
      req.insert(r.get<std::string>());
    }
  }
  if (schema.contains("properties")) {
    if (!schema["properties"].is_object()) fail(path, "'properties' must be an object");
    for (const auto& [k, sub] : schema["properties"].items()) {
      const std::string value = visit(sub, path + "/properties/" + k);
      props.push_back({literal_of(json(k)) + " " + ws + " \":\" " + ws + " " + value, value});
      required.push_back(req.count(k) > 0);
      req.erase(k);
    }
  }
  std::string extra;  // the rule for one additional "key": value, or empty
  const json additional = schema.value("additionalProperties", json(false));
  if (!req.empty() && !(additional.is_object() || additional == json(true)))
    fail(path, "'required' names '" + *req.begin() + "', which 'properties' does not define");
  if (additional.is_object() || additional == json(true)) {
    const std::string value = additional.is_object() ? visit(additional, path + "/additionalProperties")
                                                     : json_value(rules_);
    extra = key + " " + ws + " \":\" " + ws + " " + value;
  } else if (!additional.is_boolean()) fail(path, "'additionalProperties' must be a boolean or a schema");
  if (!extra.empty()) {  // an additional key is never a declared one
    std::vector<std::string> declared;
    if (schema.contains("properties"))
      for (const auto& [k, _] : schema["properties"].items()) declared.push_back(k);
    extra = key_excluding(declared) + extra.substr(key.size());
  }
  for (const std::string& r : req) {  // required, not declared, allowed as additional: any value
    props.push_back({literal_of(json(r)) + " " + ws + " \":\" " + ws + " " + json_value(rules_), ""});
    required.push_back(true);
  }

  // after(i, first): the properties from i on, `first` when none has been written yet (no comma).
  const size_t n = props.size();
  std::vector<std::array<std::string, 2>> names(n + 1);
  auto after = [&](size_t i, bool first) -> std::string {
    std::string& nm = names[i][first];
    if (!nm.empty()) return nm;
    return nm = rules_.fresh(prefix_ + path + "-props");
  };
  const std::string sep = "\",\" " + ws + " ";
  for (size_t i = n + 1; i-- > 0;) {
    for (int first = 0; first < 2; ++first) {
      std::string body;
      if (i == n) {
        if (extra.empty()) body = "\"\"";
        else body = first ? "(" + extra + " (" + sep + extra + ")*)?" : "(" + sep + extra + ")*";
      } else {
        const std::string take = (first ? "" : sep) + props[i].first + " " + after(i + 1, false);
        body = required[i] ? take : take + " | " + after(i + 1, first);
      }
      rules_.add(after(i, first), body);
    }
  }
  return "(\"{\" " + ws + " " + after(0, true) + " " + ws + " \"}\")";
}

std::string JsonSchemaConverter::key_excluding(const std::vector<std::string>& keys) {
  if (keys.empty()) return json_string(rules_);
  // A trie of the keys over code points; ex(node) ::= the rest of a key string from node on that
  // does not spell a declared key. Plain characters only (no escapes), so a declared key cannot
  // come back spelled with escapes.
  struct Node {
    std::map<uint32_t, size_t> kids;
    bool terminal = false;
  };
  std::vector<Node> trie(1);
  for (const std::string& k : keys) {
    size_t n = 0;
    for (size_t i = 0; i < k.size();) {
      const auto b = static_cast<uint8_t>(k[i]);
      const int len = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
      uint32_t cp = len == 1 ? b : b & (0x7F >> len);
      for (int j = 1; j < len && i + j < k.size(); ++j) cp = (cp << 6) | (static_cast<uint8_t>(k[i + j]) & 0x3F);
      i += static_cast<size_t>(len);
      auto [at, fresh] = trie[n].kids.try_emplace(cp, trie.size());
      if (fresh) trie.emplace_back();
      n = at->second;
    }
    trie[n].terminal = true;
  }
  define_plain_char();
  std::vector<std::string> names(trie.size());
  for (size_t n = 0; n < trie.size(); ++n) names[n] = rules_.fresh(prefix_ + "-other-key");
  for (size_t n = 0; n < trie.size(); ++n) {
    std::string other = R"([^"\\\x00-\x1f)";
    std::string body;
    for (const auto& [cp, kid] : trie[n].kids) {
      char buf[16];
      snprintf(buf, sizeof buf, cp <= 0xFFFF ? "\\u%04X" : "\\U%08X", cp);
      other += buf;
      snprintf(buf, sizeof buf, cp <= 0xFFFF ? "[\\u%04X]" : "[\\U%08X]", cp);
      body += (body.empty() ? "" : " | ") + std::string(buf) + " " + names[kid];
    }
    body += (body.empty() ? "" : " | ") + other + "] json-plain-char*";
    if (!trie[n].terminal) body += " | \"\"";
    rules_.add(names[n], body);
  }
  return "\"\\\"\" " + names[0] + " \"\\\"\"";
}

void JsonSchemaConverter::define_plain_char() {
  if (!rules_.has("json-plain-char")) rules_.add("json-plain-char", R"([^"\\\x00-\x1f])");
}

std::string JsonSchemaConverter::array_rule(const json& schema, const std::string& path) {
  const std::string ws = json_ws(rules_);
  const int64_t min = count(schema, "minItems", 0, path), max = count(schema, "maxItems", -1, path);
  if (max >= 0 && max < min) fail(path, "'maxItems' is below 'minItems'");
  if (max > 10000 || min > 10000) fail(path, "'minItems'/'maxItems' above 10000 are not supported");
  std::vector<std::string> prefix;
  if (schema.contains("prefixItems")) {
    if (!schema["prefixItems"].is_array()) fail(path, "'prefixItems' must be an array");
    for (size_t i = 0; i < schema["prefixItems"].size(); ++i)
      prefix.push_back(visit(schema["prefixItems"][i], path + "/prefixItems/" + std::to_string(i)));
  }
  std::string item;  // the schema of items past the prefix; empty: none allowed
  const json items = schema.value("items", json(true));
  if (items.is_object() || items == json(true))
    item = items.is_object() ? visit(items, path + "/items") : json_value(rules_);
  else if (!items.is_boolean()) fail(path, "'items' must be a schema or a boolean");
  const int64_t k = static_cast<int64_t>(prefix.size());
  const int64_t cap = item.empty() ? std::min<int64_t>(max < 0 ? k : max, k) : max;  // -1: unbounded
  if (min > (cap < 0 ? min : cap)) fail(path, "'minItems' cannot be met with these items");
  // rest(i): the elements from index i on (i >= 1: each after a comma).
  const std::string sep = "\",\" " + ws + " ";
  auto elem = [&](int64_t i) { return i < k ? prefix[static_cast<size_t>(i)] : item; };
  const int64_t start = std::max(k, min);
  // The optional elements from index `from` on, all of `item`, each after a comma.
  auto tail_from = [&](int64_t from) -> std::string {
    if (cap < 0) return "(" + sep + item + " " + ws + ")*";
    if (cap > from) return "(" + sep + item + " " + ws + "){0," + std::to_string(cap - from) + "}";
    return "\"\"";
  };
  const std::string tail = tail_from(start);
  std::string rest = tail;  // rest(start)
  for (int64_t i = start; i-- > 1;) {
    const std::string r = rules_.fresh(prefix_ + path + "-items");
    const std::string take = sep + elem(i) + " " + ws + " " + rest;
    rules_.add(r, i >= min ? take + " | \"\"" : take);
    rest = r;
  }
  std::string body;
  if (start == 0) body = cap == 0 ? "\"\"" : "(" + elem(0) + " " + ws + " " + tail_from(1) + ")?";
  else body = elem(0) + " " + ws + " " + rest;
  if (start > 0 && min == 0) body = "(" + body + ")?";
  return "(\"[\" " + ws + " " + body + " \"]\")";
}

std::string JsonSchemaConverter::string_rule(const json& schema, const std::string& path) {
  const int64_t min = count(schema, "minLength", 0, path), max = count(schema, "maxLength", -1, path);
  if (max >= 0 && max < min) fail(path, "'maxLength' is below 'minLength'");
  const bool lengths = schema.contains("minLength") || schema.contains("maxLength");
  if (schema.contains("pattern")) {
    if (!schema["pattern"].is_string()) fail(path, "'pattern' must be a string");
    if (schema.contains("format")) fail(path, "'pattern' together with 'format' is not supported");
    std::string pattern = schema["pattern"].get<std::string>();
    if (lengths) {  // only a pattern that is one repeated character class takes the lengths
      const std::optional<std::string> atom = repeated_class(pattern);
      if (!atom) fail(path, "'pattern' together with lengths is supported only for one repeated class (^[...]*$)");
      const bool plus = pattern.find(*atom + "+") != std::string::npos;
      pattern = "^" + *atom + "{" + std::to_string(std::max<int64_t>(min, plus ? 1 : 0)) + "," +
                (max < 0 ? "" : std::to_string(max)) + "}$";
    }
    std::string body;
    try {
      body = regex_to_ebnf(pattern, /*inside_json_string=*/true);
    } catch (const core::Error& e) {
      fail(path, std::string("'pattern': ") + e.what());
    }
    // The pattern constrains the decoded string; its quote, backslash and control characters are
    // written as JSON escapes.
    const std::string r = name(path + "-pattern");
    rules_.add(r, body);
    const std::string s = name(path + "-pattern-string");
    rules_.add(s, "\"\\\"\" " + r + " \"\\\"\"");
    return s;
  }
  if (schema.contains("format")) {
    if (!schema["format"].is_string()) fail(path, "'format' must be a string");
    if (lengths) fail(path, "'format' together with lengths is not supported");
    try {
      return json_string_format(rules_, schema["format"].get<std::string>());
    } catch (const core::Error& e) {
      fail(path, e.what());
    }
  }
  if (max > 1000000 || min > 1000000) fail(path, "'minLength'/'maxLength' above 1000000 are not supported");
  return lengths ? json_string_length(rules_, min, max) : json_string(rules_);
}

std::string JsonSchemaConverter::number_rule(const json& schema, bool integer, const std::string& path) {
  std::optional<int64_t> lo = bound(schema, "minimum", true, path), hi = bound(schema, "maximum", false, path);
  // x > m: x >= floor(m) + 1; x < m: x <= ceil(m) - 1.
  if (auto x = bound(schema, "exclusiveMinimum", false, path)) lo = std::max(lo.value_or(*x + 1), *x + 1);
  if (auto x = bound(schema, "exclusiveMaximum", true, path)) hi = std::min(hi.value_or(*x - 1), *x - 1);
  if (!lo && !hi) {
    json_value(rules_);
    return integer ? "(\"-\"? (\"0\" | [1-9] [0-9]{0,15}))" : "json-number";
  }
  try {
    return integer ? integer_range(lo, hi) : number_range(lo, hi);
  } catch (const core::Error& e) {
    fail(path, std::string("no number meets the bounds: ") + e.what());
  }
}

std::string JsonSchemaConverter::ref_rule(const std::string& ref, const std::string& path) {
  if (auto at = refs_.find(ref); at != refs_.end()) return at->second;
  if (ref.empty() || ref[0] != '#')
    fail(path, "'$ref' '" + ref + "': only references inside the schema (#...) are supported");
  const json* target = root_;
  if (ref.size() > 1) {
    try {
      target = &root_->at(nlohmann::ordered_json::json_pointer(ref.substr(1)));
    } catch (const std::exception&) {
      fail(path, "'$ref' '" + ref + "' points at nothing");
    }
  }
  // The rule is named before the target is visited, so a recursive reference finds it.
  const std::string r = name("ref" + ref.substr(1));
  refs_[ref] = r;
  const std::string inner = visit(*target, ref.substr(1));
  rules_.add(r, inner);
  return r;
}

json JsonSchemaConverter::merge_all_of(const json& schema, const std::string& path) {
  json out = schema;
  out.erase("allOf");
  const json& list = schema["allOf"];
  if (!list.is_array() || list.empty()) fail(path, "'allOf' must be a non-empty array");
  // additionalProperties at one level sees only that level's own properties: a key is allowed in
  // the merge only where every level that restricts keys declares it.
  std::vector<std::set<std::string>> restricting;
  auto note_level = [&](const json& level) {
    if (!level.is_object() || !level.contains("additionalProperties") || level["additionalProperties"] == json(true))
      return;
    if (!level["additionalProperties"].is_boolean())
      fail(path, "'allOf' with a schema for 'additionalProperties' cannot be merged");
    std::set<std::string> keys;
    if (level.contains("properties") && level["properties"].is_object())
      for (const auto& [k, _] : level["properties"].items()) keys.insert(k);
    restricting.push_back(std::move(keys));
  };
  note_level(out);
  for (json part : list) {
    if (part.is_object() && part.contains("$ref") && part["$ref"].is_string()) {
      const std::string ref = part["$ref"].get<std::string>();
      try {
        part = ref == "#" ? *root_ : root_->at(nlohmann::ordered_json::json_pointer(ref.substr(1)));
      } catch (const std::exception&) {
        fail(path, "'$ref' '" + ref + "' points at nothing");
      }
    }
    if (part.is_object() && part.contains("allOf")) part = merge_all_of(part, path);
    if (!part.is_object()) fail(path, "'allOf' entries must be schemas");
    note_level(part);
    for (const auto& [k, v] : part.items()) {
      if (annotations().count(k)) continue;
      if (!out.contains(k)) out[k] = v;
      else if (k == "properties") {
        for (const auto& [pk, pv] : v.items()) {
          if (!out[k].contains(pk)) out[k][pk] = pv;
          else if (out[k][pk] != pv) out[k][pk] = json{{"allOf", json::array({out[k][pk], pv})}};
        }
      } else if (k == "required") {
        for (const json& r : v)
          if (std::find(out[k].begin(), out[k].end(), r) == out[k].end()) out[k].push_back(r);
      } else if (k == "pattern" && v.is_string() && out[k].is_string() && length_pattern(v.get<std::string>())) {
        const auto [lo, hi] = *length_pattern(v.get<std::string>());  // ^[\s\S]{lo,hi}$: a length bound
        out["minLength"] = std::max<int64_t>(out.value("minLength", int64_t{0}), lo);
        if (hi >= 0)
          out["maxLength"] = out.contains("maxLength") ? std::min<int64_t>(out["maxLength"].get<int64_t>(), hi) : hi;
      } else if (k == "pattern" && v.is_string() && out[k].is_string() && length_pattern(out[k].get<std::string>())) {
        const auto [lo, hi] = *length_pattern(out[k].get<std::string>());
        out[k] = v;
        out["minLength"] = std::max<int64_t>(out.value("minLength", int64_t{0}), lo);
        if (hi >= 0)
          out["maxLength"] = out.contains("maxLength") ? std::min<int64_t>(out["maxLength"].get<int64_t>(), hi) : hi;
      } else if (out[k] != v) {
        fail(path, "'allOf' with two different '" + k + "' cannot be merged");
      }
    }
  }
  if (!restricting.empty() && out.contains("properties")) {
    json kept = json::object();
    for (const auto& [k, v] : out["properties"].items()) {
      bool allowed = true;
      for (const auto& keys : restricting) allowed = allowed && keys.count(k);
      if (allowed) kept[k] = v;
      else if (out.contains("required") &&
               std::find(out["required"].begin(), out["required"].end(), json(k)) != out["required"].end())
        fail(path, "'allOf' requires '" + k + "', which another level's additionalProperties forbids: nothing matches");
    }
    out["properties"] = kept;
  }
  return out;
}

}  // namespace k3::structured
