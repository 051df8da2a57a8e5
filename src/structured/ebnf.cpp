#include "structured/ebnf.h"

#include <cstdio>
#include <map>

#include "core/error.h"
#include "structured/utf8_ranges.h"

namespace k3::structured {

namespace {

using Item = GrammarBuilder::Item;
using Seq = std::vector<Item>;
constexpr auto symbols_item = GrammarBuilder::symbols_item;
constexpr auto rule_item = GrammarBuilder::rule_item;
Item byte_item(uint8_t b) {
  SymbolSet s;
  s.add(b);
  return symbols_item(std::move(s));
}

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

class Parser {
 public:
  Parser(std::string_view text, const SpecialResolver& specials) : text_(text), specials_(specials) {}

  Grammar parse(const std::string& root) {
    skip_space();
    if (at_end()) fail("the grammar is empty");
    while (!at_end()) {
      const std::string name = read_name();
      if (name.empty()) fail("expected a rule name");
      skip_space();
      if (!take("::=")) fail("expected '::=' after rule name '" + name + "'");
      const uint32_t r = b_.rule(name);
      if (b_.defined(r)) fail("rule '" + name + "' is defined twice");
      parse_alternatives(r, /*in_group=*/false);
    }
    return b_.build(root);
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    int line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        col = 1;
      } else ++col;
    }
    throw core::Error("grammar: line " + std::to_string(line) + " column " + std::to_string(col) + ": " + what);
  }
  bool at_end() const { return pos_ >= text_.size(); }
  char peek(size_t ahead = 0) const { return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0'; }
  bool take(std::string_view s) {
    if (text_.substr(pos_, s.size()) != s) return false;
    pos_ += s.size();
    return true;
  }
  void skip_space() {
    while (!at_end()) {
      const char c = peek();
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') ++pos_;
      else if (c == '#') {
        while (!at_end() && peek() != '\n') ++pos_;
      } else break;
    }
  }
  std::string read_name() {
    const size_t start = pos_;
    while (!at_end() && is_name_char(peek())) ++pos_;
    return std::string(text_.substr(start, pos_ - start));
  }
  // True when the text at pos_ starts the next rule ("name ::=").
  bool at_rule_start() const {
    size_t p = pos_;
    while (p < text_.size() && is_name_char(text_[p])) ++p;
    if (p == pos_) return false;
    while (p < text_.size() && (text_[p] == ' ' || text_[p] == '\t' || text_[p] == '\r' || text_[p] == '\n')) ++p;
    return text_.substr(p, 3) == "::=";
  }

  // One code point of the source text (UTF-8).
  uint32_t read_codepoint() {
    const auto b0 = static_cast<uint8_t>(peek());
    const int len = b0 < 0x80 ? 1 : (b0 >> 5) == 6 ? 2 : (b0 >> 4) == 14 ? 3 : (b0 >> 3) == 30 ? 4 : 0;
    if (!len || pos_ + len > text_.size()) fail("invalid UTF-8 in the grammar text");
    uint32_t cp = len == 1 ? b0 : b0 & (0x7F >> len);
    for (int i = 1; i < len; ++i) {
      const auto b = static_cast<uint8_t>(text_[pos_ + i]);
      if ((b & 0xC0) != 0x80) fail("invalid UTF-8 in the grammar text");
      cp = (cp << 6) | (b & 0x3F);
    }
    pos_ += len;
    return cp;
  }
  uint32_t read_hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const char c = peek();
      int d = c >= '0' && c <= '9'   ? c - '0'
              : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                     : -1;
      if (d < 0) fail("expected " + std::to_string(digits) + " hex digits");
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    return v;
  }
  // A character inside a literal or class, escapes decoded; `raw_byte` is set for \xHH.
  uint32_t read_char(bool& raw_byte) {
    raw_byte = false;
    if (peek() != '\\') return read_codepoint();
    ++pos_;
    const char c = peek();
    ++pos_;
    switch (c) {
      case 'n': return '\n';
      case 'r': return '\r';
      case 't': return '\t';
      case '0': return 0;
      case 'x': raw_byte = true; return read_hex(2);
      case 'u': return read_hex(4);
      case 'U': return read_hex(8);
      case '\\':
      case '"':
      case '\'':
      case '[':
      case ']':
      case '-':
      case '^':
      case '/':
      case '.': return static_cast<uint32_t>(c);
      default: fail(std::string("unknown escape '\\") + c + "'");
    }
  }

  void parse_alternatives(uint32_t rule, bool in_group) {
    for (;;) {
      b_.add_alternative(rule, parse_sequence(in_group));
      skip_space();
      if (!take("|")) break;
    }
  }

  Seq parse_sequence(bool in_group) {
    Seq seq;
    for (;;) {
      skip_space();
      if (at_end() || peek() == '|' || peek() == ')') break;
      if (!in_group && at_rule_start()) break;
      Seq atom = parse_atom();
      parse_postfix(atom);
      for (Item& it : atom) seq.push_back(std::move(it));
    }
    if (in_group && peek() != ')' && peek() != '|') fail("expected ')'");
    return seq;
  }

  Seq parse_atom() {
    const char c = peek();
    if (c == '"' || c == '\'') return parse_literal(c);
    if (c == '[') return {class_item(parse_class())};
    if (c == '.') {
      ++pos_;
      return {class_item(normalize({{0, kMaxCodepoint}}, false))};
    }
    if (c == '(') {
      ++pos_;
      const uint32_t g = b_.fresh_rule("group");
      parse_alternatives(g, true);
      if (!take(")")) fail("expected ')'");
      return {rule_item(g)};
    }
    if (c == '<' && peek(1) == '|') {
      const size_t end = text_.find("|>", pos_ + 2);
      if (end == std::string_view::npos) fail("unterminated special token '<|...|>'");
      const std::string_view name = text_.substr(pos_, end + 2 - pos_);
      const std::optional<Symbol> s = specials_ ? specials_(name) : std::nullopt;
      if (!s) fail("the vocabulary has no special token '" + std::string(name) + "'");
      pos_ = end + 2;
      SymbolSet set;
      set.add(*s);
      return {symbols_item(std::move(set))};
    }
    if (is_name_char(c)) return {rule_item(b_.rule(read_name()))};
    fail(std::string("unexpected '") + c + "'");
  }

  Seq parse_literal(char quote) {
    ++pos_;
    Seq seq;
    while (peek() != quote) {
      if (at_end() || peek() == '\n') fail("unterminated string literal");
      bool raw = false;
      const uint32_t cp = read_char(raw);
      if (raw) seq.push_back(byte_item(static_cast<uint8_t>(cp)));
      else {
        if (cp > kMaxCodepoint || (cp >= 0xD800 && cp <= 0xDFFF)) fail("not a Unicode scalar value in a literal");
        std::string bytes;
        append_utf8(cp, bytes);
        for (char ch : bytes) seq.push_back(byte_item(static_cast<uint8_t>(ch)));
      }
    }
    ++pos_;
    return seq;
  }

  CodepointRanges parse_class() {
    ++pos_;  // [
    const bool negate = take("^");
    CodepointRanges ranges;
    while (peek() != ']') {
      if (at_end()) fail("unterminated character class");
      bool raw = false;
      const uint32_t lo = read_char(raw);
      uint32_t hi = lo;
      if (peek() == '-' && peek(1) != ']') {
        ++pos_;
        hi = read_char(raw);
        if (hi < lo) fail("character range out of order");
      }
      ranges.push_back({lo, hi});
    }
    ++pos_;
    CodepointRanges out = normalize(std::move(ranges), negate);
    if (out.empty()) fail("character class matches nothing");
    return out;
  }

  // A class as one byte set (ASCII only) or a helper rule over its UTF-8 sequences (memoized).
  Item class_item(const CodepointRanges& ranges) {
    if (ranges.back().second < 0x80) {
      SymbolSet s;
      for (auto [lo, hi] : ranges) s.add_byte_range(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi));
      return symbols_item(std::move(s));
    }
    if (auto at = classes_.find(ranges); at != classes_.end()) return rule_item(at->second);
    const uint32_t r = b_.fresh_rule("char");
    SymbolSet single;
    std::map<std::vector<uint8_t>, std::vector<SymbolSet>> by_lead;  // sequences merged on their lead range
    for (const ByteRangeSeq& seq : utf8_sequences(ranges)) {
      if (seq.size() == 1) {
        single.add_byte_range(seq[0].first, seq[0].second);
        continue;
      }
      Seq items;
      for (auto [lo, hi] : seq) {
        SymbolSet s;
        s.add_byte_range(lo, hi);
        items.push_back(symbols_item(std::move(s)));
      }
      b_.add_alternative(r, items);
    }
    if (!single.empty()) b_.add_alternative(r, {symbols_item(std::move(single))});
    classes_.emplace(ranges, r);
    return rule_item(r);
  }

  // Wraps `atom` (a sequence) as one item: itself, or a helper rule holding it.
  Item as_one(Seq atom) {
    if (atom.size() == 1) return std::move(atom[0]);
    const uint32_t r = b_.fresh_rule("seq");
    b_.add_alternative(r, atom);
    return rule_item(r);
  }
  Item optional(const Seq& x) {
    const uint32_t r = b_.fresh_rule("opt");
    b_.add_alternative(r, x);
    b_.add_alternative(r, {});
    return rule_item(r);
  }
  int64_t read_int() {
    skip_space();
    if (!(peek() >= '0' && peek() <= '9')) fail("expected a number in {m,n}");
    int64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      v = v * 10 + (peek() - '0');
      if (v > kMaxRepeat) fail("repetition bound above " + std::to_string(kMaxRepeat));
      ++pos_;
    }
    skip_space();
    return v;
  }

  void parse_postfix(Seq& atom) {
    for (;;) {
      const char c = peek();
      if (c == '*') {
        ++pos_;
        atom = {b_.star(as_one(std::move(atom)))};
      } else if (c == '+') {
        ++pos_;
        Item x = as_one(std::move(atom));
        atom = {x, b_.star(x)};
        atom = {as_one(std::move(atom))};
      } else if (c == '?') {
        ++pos_;
        atom = {optional(atom)};
      } else if (c == '{') {
        ++pos_;
        const int64_t m = read_int();
        int64_t n = m;
        bool unbounded = false;
        if (take(",")) {
          skip_space();
          if (peek() == '}') unbounded = true;
          else n = read_int();
        }
        if (!take("}")) fail("expected '}' closing a repetition");
        if (!unbounded && n < m) fail("repetition {m,n} with n < m");
        atom = {b_.repeat(as_one(std::move(atom)), m, unbounded ? -1 : n)};
      } else return;
    }
  }

  std::string_view text_;
  const SpecialResolver& specials_;
  size_t pos_ = 0;
  GrammarBuilder b_;
  std::map<CodepointRanges, uint32_t> classes_;
};

}  // namespace

Grammar parse_ebnf(std::string_view text, const SpecialResolver& specials, const std::string& root) {
  return Parser(text, specials).parse(root);
}

std::string ebnf_literal(std::string_view bytes) {
  std::string out = "\"";
  for (char ch : bytes) {
    const auto c = static_cast<uint8_t>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c >= 0x7f) {  // raw bytes: valid UTF-8 or not, \xHH matches exactly them
      char buf[8];
      snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else out += ch;
  }
  return out + "\"";
}

}  // namespace k3::structured
