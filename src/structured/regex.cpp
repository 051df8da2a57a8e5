#include "structured/regex.h"

#include <cstdio>

#include "core/error.h"
#include "structured/utf8_ranges.h"

namespace k3::structured {

namespace {

// A code point as a GBNF class member, escaped so no character is special.
std::string class_char(uint32_t cp) {
  char buf[16];
  if (cp >= 0x30 && cp <= 0x39) return std::string(1, static_cast<char>(cp));
  if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return std::string(1, static_cast<char>(cp));
  if (cp <= 0xFFFF) snprintf(buf, sizeof buf, "\\u%04X", cp);
  else snprintf(buf, sizeof buf, "\\U%08X", cp);
  return buf;
}

std::string plain_class(const CodepointRanges& normalized) {
  std::string out = "[";
  for (auto [lo, hi] : normalized) {
    out += class_char(lo);
    if (hi > lo) out += "-" + class_char(hi);
  }
  return out + "]";
}

// A class of decoded characters as JSON string content: '"', '\\' and controls as their escapes.
std::string json_class(const CodepointRanges& normalized) {
  CodepointRanges plain;
  std::string escapes;
  auto escape = [&](uint32_t c) {
    static const char* kShort[] = {"b", "t", "n", nullptr, "f", "r"};  // 8..13 (11: \u000b)
    std::string e;  // GBNF literal content for the JSON escape (a backslash is written \\)
    if (c == '"') e = R"(\\\")";
    else if (c == '\\') e = R"(\\\\)";
    else if (c >= 8 && c <= 13 && kShort[c - 8]) (e = R"(\\)") += kShort[c - 8];
    else {
      char buf[16];
      snprintf(buf, sizeof buf, R"(\\u%04x)", c);
      e = buf;
    }
    escapes += " | \"" + e + "\"";
  };
  for (auto [lo, hi] : normalized) {
    uint32_t a = lo;
    for (uint32_t c = lo; c <= hi && c < 0x60; ++c) {
      if (c < 0x20 || c == '"' || c == '\\') {
        if (a < c) plain.push_back({a, c - 1});
        escape(c);
        a = c + 1;
      }
    }
    if (a <= hi) plain.push_back({a, hi});
  }
  if (plain.empty()) return "(" + escapes.substr(3) + ")";
  return escapes.empty() ? plain_class(plain) : "(" + plain_class(plain) + escapes + ")";
}

const CodepointRanges kDigit = {{'0', '9'}};
const CodepointRanges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const CodepointRanges kSpace = {{'\t', '\r'}, {' ', ' '}};  // \t \n \v \f \r and space

class RegexParser {
 public:
  RegexParser(std::string_view p, bool json) : p_(p), json_(json) {}

  std::string parse() {
    if (take('^')) {
    }
    std::string out = alternatives();
    if (pos_ < p_.size()) fail(p_[pos_] == ')' ? "unbalanced ')'" : "unexpected character");
    return "(" + out + ")";
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw core::Error("regex: at offset " + std::to_string(pos_) + ": " + what);
  }
  bool at_end() const { return pos_ >= p_.size(); }
  char peek(size_t k = 0) const { return pos_ + k < p_.size() ? p_[pos_ + k] : '\0'; }
  bool take(char c) {
    if (peek() != c || at_end()) return false;
    ++pos_;
    return true;
  }

  std::string alternatives() {
    std::string out = sequence();
    while (take('|')) out += " | " + sequence();
    return out;
  }

  std::string sequence() {
    std::string out;
    while (!at_end() && peek() != '|' && peek() != ')') {
      if (peek() == '$') {
        ++pos_;
        if (!at_end() && peek() != '|' && peek() != ')') fail("'$' is supported only at the end");
        continue;
      }
      if (peek() == '^') fail("'^' is supported only at the start");
      std::string atom = this->atom();
      atom += quantifier();
      out += out.empty() ? atom : " " + atom;
    }
    return out.empty() ? "\"\"" : out;
  }

  std::string quantifier() {
    std::string q;
    const char c = peek();
    if (c == '*' || c == '+' || c == '?') {
      ++pos_;
      q.assign(1, c);
    } else if (c == '{' && is_bound_start()) {
      const size_t start = pos_;
      while (!at_end() && peek() != '}') ++pos_;
      if (at_end()) fail("unterminated {m,n}");
      ++pos_;
      q = std::string(p_.substr(start, pos_ - start));
    } else return "";
    if (peek() == '?') ++pos_;  // lazy: the same strings
    if (peek() == '+') fail("possessive quantifiers are not supported");
    if (peek() == '*' || peek() == '+' || peek() == '?' || peek() == '{') fail("a quantifier cannot follow another");
    return q;
  }
  bool is_bound_start() const {
    size_t k = pos_ + 1;
    if (k >= p_.size() || !(p_[k] >= '0' && p_[k] <= '9')) return false;
    while (k < p_.size() && ((p_[k] >= '0' && p_[k] <= '9') || p_[k] == ',')) ++k;
    return k < p_.size() && p_[k] == '}';
  }

  std::string atom() {
    const char c = peek();
    if (c == '(') {
      ++pos_;
      if (take('?')) {
        if (take(':')) {
        } else if (peek() == '<' && peek(1) != '=' && peek(1) != '!') {
          while (!at_end() && peek() != '>') ++pos_;
          if (!take('>')) fail("unterminated group name");
        } else fail("lookaround and inline flags are not supported");
      }
      std::string inner = alternatives();
      if (!take(')')) fail("missing ')'");
      return "(" + inner + ")";
    }
    if (c == '[') return class_text(parse_class());
    if (c == '.') {
      ++pos_;
      return class_text(normalize({{'\n', '\n'}}, true));
    }
    if (c == '*' || c == '+' || c == '?') fail("nothing to repeat");
    if (c == '\\') {
      CodepointRanges set;
      if (escape_class(set)) return class_text(normalize(set, negated_));
      return class_text(normalize({{last_cp_, last_cp_}}, false));
    }
    const uint32_t cp = codepoint();
    return class_text({{cp, cp}});
  }

  uint32_t codepoint() {
    const auto b0 = static_cast<uint8_t>(peek());
    const int len = b0 < 0x80 ? 1 : (b0 >> 5) == 6 ? 2 : (b0 >> 4) == 14 ? 3 : (b0 >> 3) == 30 ? 4 : 0;
    if (!len || pos_ + len > p_.size()) fail("invalid UTF-8");
    uint32_t cp = len == 1 ? b0 : b0 & (0x7F >> len);
    for (int i = 1; i < len; ++i) cp = (cp << 6) | (static_cast<uint8_t>(p_[pos_ + i]) & 0x3F);
    pos_ += len;
    return cp;
  }

  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const char c = peek();
      const int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
      if (d < 0) fail("bad hex escape");
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    return v;
  }

  // After a backslash: a class escape (true, into set, negated_ set) or one code point (last_cp_).
  bool escape_class(CodepointRanges& set) {
    ++pos_;  // backslash
    if (at_end()) fail("trailing backslash");
    const char c = p_[pos_++];
    negated_ = c == 'D' || c == 'W' || c == 'S';
    switch (c) {
      case 'd':
      case 'D': set = kDigit; return true;
      case 'w':
      case 'W': set = kWord; return true;
      case 's':
      case 'S': set = kSpace; return true;
      case 'n': last_cp_ = '\n'; return false;
      case 't': last_cp_ = '\t'; return false;
      case 'r': last_cp_ = '\r'; return false;
      case 'f': last_cp_ = '\f'; return false;
      case 'v': last_cp_ = '\v'; return false;
      case '0': last_cp_ = 0; return false;
      case 'x': last_cp_ = hex(2); return false;
      case 'u': last_cp_ = hex(4); return false;
      case 'b':
      case 'B': fail("word boundaries (\\b, \\B) are not supported");
      default:
        if (c >= '1' && c <= '9') fail("backreferences are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) fail(std::string("unknown escape \\").append(1, c));
        last_cp_ = static_cast<uint8_t>(c);
        return false;
    }
  }

  CodepointRanges parse_class() {
    ++pos_;  // [
    const bool negate = take('^');
    CodepointRanges ranges;
    bool first = true;
    while (first || peek() != ']') {
      if (at_end()) fail("unterminated character class");
      first = false;
      uint32_t lo;
      if (peek() == '\\') {
        CodepointRanges set;
        if (escape_class(set)) {
          CodepointRanges n = normalize(set, negated_);
          ranges.insert(ranges.end(), n.begin(), n.end());
          continue;
        }
        lo = last_cp_;
      } else lo = codepoint();
      uint32_t hi = lo;
      if (peek() == '-' && peek(1) != ']' && peek(1) != '\0') {
        ++pos_;
        if (peek() == '\\') {
          CodepointRanges set;
          if (escape_class(set)) fail("a class escape cannot end a range");
          hi = last_cp_;
        } else hi = codepoint();
        if (hi < lo) fail("character range out of order");
      }
      ranges.push_back({lo, hi});
    }
    ++pos_;  // ]
    CodepointRanges out = normalize(std::move(ranges), negate);
    if (out.empty()) fail("character class matches nothing");
    return out;
  }

  std::string class_text(const CodepointRanges& normalized) const {
    return json_ ? json_class(normalized) : plain_class(normalized);
  }

  std::string_view p_;
  bool json_;
  size_t pos_ = 0;
  bool negated_ = false;
  uint32_t last_cp_ = 0;
};

}  // namespace

std::string regex_to_ebnf(std::string_view pattern, bool inside_json_string) {
  return RegexParser(pattern, inside_json_string).parse();
}

}  // namespace k3::structured
