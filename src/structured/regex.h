// structured/regex.h: a regular expression (vLLM's `regex` / `guided_regex`, JSON Schema's
// string `pattern`) as a GBNF expression over the characters it matches.
//
// Supported: literals and escapes (\n \t \r \f \v \0 \xHH \uHHHH \\ \. ...), classes [a-z] [^...]
// with \d \w \s inside or out (and \D \W \S), `.` (any character but newline), groups (...) and
// (?:...), named groups (?<name>...), alternation, quantifiers * + ? {m} {m,} {m,n} (lazy forms
// accepted: they match the same set), ^ at the start and $ at the end. The whole text must
// match, as vLLM's regex does; a JSON Schema pattern (which may match anywhere) is met by the same
// strings, a subset of what it allows. Backreferences, lookaround and word boundaries cannot be
// expressed by a grammar and are refused with an error naming them.
#pragma once
#include <string>
#include <string_view>

namespace k3::structured {

// Throws core::Error "regex: ..." naming the offset and the unsupported or malformed part.
// `inside_json_string`: the pattern constrains a JSON string's decoded value, so the characters
// JSON must escape (quote, backslash, controls) are matched as their escapes.
std::string regex_to_ebnf(std::string_view pattern, bool inside_json_string = false);

}  // namespace k3::structured
