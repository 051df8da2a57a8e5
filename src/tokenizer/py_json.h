// tokenizer/py_json.h: JSON text exactly as Python's json.dumps(value, ensure_ascii=False)
// writes it, which is what K3's chat renderer (encoding_k3.py / the Jinja template's tojson)
// puts into prompts: key order kept, floats in Python repr form, UTF-8 left unescaped.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace k3::tokenizer {

// compact: separators (",", ":"); otherwise Python's default (", ", ": "). No indentation.
std::string py_json_dumps(const nlohmann::ordered_json& value, bool compact);

// `value` with the keys of every object sorted in code-point order (Python's sorted(dict.items())
// on str keys), arrays kept in order.
nlohmann::ordered_json deep_sorted(const nlohmann::ordered_json& value);

}  // namespace k3::tokenizer
