// tokenizer/py_json.cpp: Python-compatible JSON serialization.
#include "tokenizer/py_json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <vector>

namespace k3::tokenizer {

namespace {

// Python's float repr: the shortest digits that round-trip; fixed notation when the decimal
// exponent is in [-4, 16), otherwise d.ddde+XX (at least two exponent digits).
std::string py_float(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // [-]d[.ddd]e[+-]XX
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp = std::stoi(sci.substr(e + 1));
  if (exp >= -4 && exp < 16) {
    std::string out;
    if (exp < 0) {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
      out = digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(exp) + 1) + "." + digits.substr(static_cast<size_t>(exp) + 1);
    }
    return sign + out;
  }
  std::string mantissa = digits.size() > 1 ? digits.substr(0, 1) + "." + digits.substr(1) : digits;
  const int a = exp < 0 ? -exp : exp;
  return sign + mantissa + "e" + (exp < 0 ? "-" : "+") + (a < 10 ? "0" : "") + std::to_string(a);
}

void dump(const nlohmann::ordered_json& v, bool compact, std::string& out) {
  using T = nlohmann::ordered_json::value_t;
  switch (v.type()) {
    case T::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, item] : v.items()) {
        if (!first) out += compact ? "," : ", ";
        first = false;
        out += nlohmann::ordered_json(key).dump();
        out += compact ? ":" : ": ";
        dump(item, compact, out);
      }
      out += '}';
      return;
    }
    case T::array: {
      out += '[';
      for (size_t i = 0; i < v.size(); ++i) {
        if (i) out += compact ? "," : ", ";
        dump(v[i], compact, out);
      }
      out += ']';
      return;
    }
    case T::number_float: out += py_float(v.get<double>()); return;
    default:  // strings (escapes: \" \\ \b \f \n \r \t, \u00XX for other controls), ints, bools, null
      out += v.dump();
      return;
  }
}

}  // namespace

std::string py_json_dumps(const nlohmann::ordered_json& value, bool compact) {
  std::string out;
  dump(value, compact, out);
  return out;
}

nlohmann::ordered_json deep_sorted(const nlohmann::ordered_json& value) {
  if (value.is_array()) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const auto& item : value) out.push_back(deep_sorted(item));
    return out;
  }
  if (!value.is_object()) return value;
  std::vector<std::string> keys;
  for (const auto& [key, item] : value.items()) keys.push_back(key);
  std::sort(keys.begin(), keys.end());  // UTF-8 byte order == code-point order
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const std::string& key : keys) out[key] = deep_sorted(value.at(key));
  return out;
}

}  // namespace k3::tokenizer
