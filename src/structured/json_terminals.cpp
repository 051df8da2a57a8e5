// The JSON terminals the schema converter builds on: whitespace, strings (by length or format),
// numbers (by range), and any value.
#include <optional>
#include <string>

#include "core/error.h"
#include "structured/json_schema.h"

namespace k3::structured {

namespace {

// One JSON string character (as its escape or itself; no raw control characters).
const char* kChar = R"([^"\\\x00-\x1f] | "\\" ["\\/bfnrt] | "\\u" [0-9a-fA-F]{4})";

std::string define(EbnfRules& rules, const std::string& name, const std::string& body) {
  if (!rules.has(name)) rules.add(name, body);
  return name;
}

std::string digits_of(int64_t v) { return std::to_string(v); }

// '"c"' and '[a-b]', built by appending (GCC 12 warns falsely on `"x" + std::string(1, c)`).
std::string lit(char c) {
  std::string s = "\"";
  s += c;
  s += '"';
  return s;
}
std::string range(char a, char b) {
  std::string s = "[";
  s += a;
  s += '-';
  s += b;
  s += ']';
  return s;
}

// Non-negative integers with the same number of digits, a <= b, as digit strings.
std::string same_length(const std::string& a, const std::string& b) {
  const size_t n = a.size();
  if (n == 0) return "";
  if (n == 1) return a == b ? lit(a[0]) : range(a[0], b[0]);
  if (a[0] == b[0]) return lit(a[0]) + " " + same_length(a.substr(1), b.substr(1));
  const std::string zeros(n - 1, '0'), nines(n - 1, '9');
  const std::string rest = "[0-9]{" + std::to_string(n - 1) + "}";
  std::string out;
  auto alt = [&](const std::string& s) { out += out.empty() ? s : " | " + s; };
  char lo = a[0], hi = b[0];
  if (a.substr(1) != zeros) {
    alt(lit(a[0]) + " (" + same_length(a.substr(1), nines) + ")");
    ++lo;
  }
  const bool hi_whole = b.substr(1) == nines;
  if (!hi_whole) --hi;
  if (lo <= hi) alt((lo == hi ? lit(lo) : range(lo, hi)) + " " + rest);
  if (!hi_whole) alt(lit(b[0]) + " (" + same_length(zeros, b.substr(1)) + ")");
  return "(" + out + ")";
}

int64_t pow10(size_t n) {
  int64_t p = 1;
  for (size_t i = 0; i < n; ++i) p *= 10;
  return p;
}

// Non-negative integers in [lo, hi] (hi nullopt: unbounded), no leading zeros.
std::string natural_range(int64_t lo, std::optional<int64_t> hi) {
  std::string out;
  auto alt = [&](const std::string& s) { out += out.empty() ? s : " | " + s; };
  const size_t lo_len = digits_of(lo).size();
  if (!hi) {  // lo's length up to all nines, then longer numbers up to 16 digits (bounds are below 2^53)
    alt(same_length(std::to_string(lo), std::string(lo_len, '9')));
    if (lo_len < 16) alt("[1-9] [0-9]{" + std::to_string(lo_len) + ",15}");
    return "(" + out + ")";
  }
  const size_t hi_len = digits_of(*hi).size();
  for (size_t len = lo_len; len <= hi_len; ++len) {
    const int64_t first = len == 1 ? 0 : pow10(len - 1);
    const int64_t a = std::max(lo, first);
    const int64_t b = len == 19 ? *hi : std::min(*hi, pow10(len) - 1);
    if (a <= b) alt(same_length(std::to_string(a), std::to_string(b)));
  }
  return "(" + out + ")";
}

}  // namespace

// Whitespace is unbounded, as xgrammar's default: a bound would make every count a grammar position
// of its own (a token-mask cache entry each) wherever whitespace may go.
std::string json_ws(EbnfRules& rules) { return define(rules, "json-ws", "[ \\t\\n]*"); }

std::string json_string(EbnfRules& rules) {
  define(rules, "json-char", kChar);
  return define(rules, "json-string", "\"\\\"\" json-char* \"\\\"\"");
}

std::string json_value(EbnfRules& rules) {
  const std::string ws = json_ws(rules), str = json_string(rules);
  // At most 16 digits before the point and after it, and 2 in the exponent: every such number is a
  // finite double, and a model cannot run on in digits.
  define(rules, "json-number", R"("-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})?)");
  define(rules, "json-array",
         "\"[\" " + ws + " (json-value " + ws + " (\",\" " + ws + " json-value " + ws + ")*)? \"]\"");
  define(rules, "json-object",
         "\"{\" " + ws + " (" + str + " " + ws + " \":\" " + ws + " json-value " + ws + " (\",\" " + ws + " " + str +
             " " + ws + " \":\" " + ws + " json-value " + ws + ")*)? \"}\"");
  return define(rules, "json-value",
                "json-object | json-array | " + str + " | json-number | \"true\" | \"false\" | \"null\"");
}

std::string json_object(EbnfRules& rules) {
  json_value(rules);
  return "json-object";
}

std::string json_string_length(EbnfRules& rules, int64_t min, int64_t max) {
  define(rules, "json-char", kChar);
  const std::string bounds = max < 0 ? "{" + std::to_string(min) + ",}"
                                     : "{" + std::to_string(min) + "," + std::to_string(max) + "}";
  return define(rules, "json-string-" + std::to_string(min) + "-" + (max < 0 ? "inf" : std::to_string(max)),
                "\"\\\"\" json-char" + bounds + " \"\\\"\"");
}

std::string json_string_format(EbnfRules& rules, const std::string& format) {
  static const std::pair<const char*, const char*> kFormats[] = {
      // RFC 3339 full-date as validators check it (ajv-formats): each month's days, February 29
      // only in leap years (divisible by 4, and by 400 when by 100).
      {"date",
       R"([0-9]{4} "-" (("0" [13578] | "1" [02]) "-" date-d31 | ("0" [469] | "11") "-" date-d30 | "02-" date-d28)
          | date-leap-year "-02-29")"},
      // Seconds 00-59: a leap second (60) is valid only at 23:59 UTC, which a grammar over the
      // local time and offset cannot tell apart, so it is left out.
      {"time",
       R"(([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,9})? ("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9]))"},
      // ISO 8601 as validators check it: at least one part, and a "T" followed by one.
      {"duration", R"("P" (dur-date ("T" dur-time)? | "T" dur-time | [0-9]+ "W"))"},
      {"uuid", R"([0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12})"},
      {"email", R"([a-zA-Z0-9_+-]+ ("." [a-zA-Z0-9_+-]+)* "@" host-label ("." host-label)+)"},
      {"hostname", R"(host-label ("." host-label){0,3})"},
      {"ipv4", R"(ipv4-octet "." ipv4-octet "." ipv4-octet "." ipv4-octet)"},
      {"ipv6", R"([0-9a-fA-F]{1,4} (":" [0-9a-fA-F]{1,4}){7})"},
      {"uri", R"([a-zA-Z] [a-zA-Z0-9+.-]* "://" host-label ("." host-label)* ("/" [a-zA-Z0-9._~!$&'()*+,;=:@-]*)*)"},
  };
  if (format == "date-time") {
    json_string_format(rules, "date");
    json_string_format(rules, "time");
    return define(rules, "json-format-date-time", R"("\"" json-format-date-body "T" json-format-time-body "\"")");
  }
  for (const auto& [name, body] : kFormats) {
    if (format != name) continue;
    if (format == "ipv4") define(rules, "ipv4-octet", R"("25" [0-5] | "2" [0-4] [0-9] | "1" [0-9]{2} | [1-9]? [0-9])");
    if (format == "duration") {
      define(rules, "dur-date", R"([0-9]+ "Y" ([0-9]+ "M")? ([0-9]+ "D")? | [0-9]+ "M" ([0-9]+ "D")? | [0-9]+ "D")");
      define(rules, "dur-time", R"([0-9]+ "H" ([0-9]+ "M")? ([0-9]+ "S")? | [0-9]+ "M" ([0-9]+ "S")? | [0-9]+ "S")");
    }
    if (format == "date") {
      define(rules, "date-d28", R"("0" [1-9] | "1" [0-9] | "2" [0-8])");
      define(rules, "date-d30", R"(date-d28 | "29" | "30")");
      define(rules, "date-d31", R"(date-d30 | "31")");
      define(rules, "date-four", R"("0" [48] | [2468] [048] | [13579] [26])");  // 04 .. 96, multiples of 4
      define(rules, "date-leap-year", R"([0-9]{2} date-four | (date-four | "00") "00")");
    }
    // A DNS label: 1 to 62 characters, no dash at either end.
    define(rules, "host-label", R"([a-zA-Z0-9] ([a-zA-Z0-9-]{0,60} [a-zA-Z0-9])?)");
    define(rules, "json-format-" + format + "-body", body);
    return define(rules, "json-format-" + format, "\"\\\"\" json-format-" + format + "-body \"\\\"\"");
  }
  throw core::Error(
      "string format '" + format +
      "' is not supported (supported: date-time, date, time, duration, uuid, email, hostname, ipv4, ipv6, uri)");
}

std::string integer_range(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  if (lo && hi && *lo > *hi) throw core::Error("the range is empty");
  std::string out;
  auto alt = [&](const std::string& s) { out += out.empty() ? s : " | " + s; };
  if (!lo || *lo < 0) {  // negatives: "-" then |x| in [max(1, -hi), -lo]
    const int64_t a = hi && *hi < 0 ? -*hi : 1;
    alt("\"-\" " + natural_range(a, lo ? std::optional<int64_t>(-*lo) : std::nullopt));
  }
  if (!hi || *hi >= 0) alt(natural_range(lo ? std::max<int64_t>(*lo, 0) : 0, hi));
  return "(" + out + ")";
}

std::string number_range(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  if (lo && hi && *lo > *hi) throw core::Error("the range is empty");
  const std::string frac = "(\".\" [0-9]{1,16})?", zero_frac = "(\".\" \"0\"{1,16})?";
  std::string out;
  auto alt = [&](const std::string& s) { out += out.empty() ? s : " | " + s; };
  // v >= 0: integer part I in [max(lo, 0), hi - 1] with any fraction, or I = hi with a zero one.
  if (!hi || *hi >= 0) {
    const int64_t a = lo ? std::max<int64_t>(*lo, 0) : 0;
    if (!hi) alt(natural_range(a, std::nullopt) + " " + frac);
    else {
      if (*hi - 1 >= a) alt(natural_range(a, *hi - 1) + " " + frac);
      if (*hi >= a) alt("\"" + std::to_string(*hi) + "\" " + zero_frac);
    }
  }
  // v < 0, v = -(I + F): I in [a, -lo - 1] with any fraction, or I = -lo with a zero one, where
  // a = -hi when hi < 0 (else 0).
  if (!lo || *lo < 0) {
    const int64_t a = hi && *hi < 0 ? -*hi : 0;
    if (!lo) alt("\"-\" " + natural_range(a, std::nullopt) + " " + frac);
    else {
      std::string neg;
      if (-*lo - 1 >= a) neg = natural_range(a, -*lo - 1) + " " + frac;
      if (-*lo >= a) neg += (neg.empty() ? "" : " | ") + ("\"" + std::to_string(-*lo) + "\" " + zero_frac);
      if (!neg.empty()) alt("\"-\" (" + neg + ")");
    }
  }
  return "(" + out + ")";
}

}  // namespace k3::structured
