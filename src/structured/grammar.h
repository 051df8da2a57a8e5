// structured/grammar.h: a context-free grammar over symbols, the form every constraint compiles to
// (EBNF text, regular expressions and JSON Schema are lowered into it; structured/ebnf.h).
//
// Symbols are bytes (0..255) of the UTF-8 output, plus one symbol per special token of the
// vocabulary (kFirstSpecial + i: structured/vocabulary.h), so K3's tool-call markers
// (<|open|>, <|sep|>, <|close|>) are single terminals and never their text spelled out in bytes.
//
// Layout: every rule is a list of alternatives; an alternative is a run of elements in `elements`
// closed by an `end` element. A `symbols` element matches one symbol from its set; a `rule`
// element expands the referenced rule; a `repeat` element matches its body rule min..max times
// (x{m,n}) with the count kept in the parse stack (structured/stacks.h), so a bound of 300 or
// 500,000 is one element, not that many positions. Grammars are validated on build: every
// referenced rule is defined, no rule is left-recursive (the matcher expands top-down), and the
// size is bounded. A repeat's body never matches the empty string (build() unrolls one that could:
// structured/stacks.h relies on every iteration reading a symbol).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace k3::structured {

using Symbol = uint16_t;
inline constexpr Symbol kFirstSpecial = 256;
inline constexpr size_t kMaxElements = 1 << 20;  // a compiled grammar past this is refused, not built

// A set of symbols: a bitmap over the bytes and a sorted list of special symbols.
struct SymbolSet {
  std::array<uint64_t, 4> bytes{};
  std::vector<Symbol> specials;  // sorted, unique

  bool contains(Symbol s) const;
  void add(Symbol s);
  void add_byte_range(uint8_t lo, uint8_t hi);
  bool empty() const;
  bool operator==(const SymbolSet&) const = default;
};

struct Element {
  enum class Kind : uint8_t { symbols, rule, repeat, end };
  Kind kind = Kind::end;
  uint32_t index = 0;  // symbols: into Grammar::sets; rule: the rule; repeat: into Grammar::repeats
};

inline constexpr uint32_t kUnbounded = UINT32_MAX;  // a repeat's max: x{m,}
inline constexpr int64_t kMaxRepeat = 1000000;      // repetition bounds past this are refused

struct Repeat {
  uint32_t body = 0;  // the rule matched each time
  uint32_t min = 0;
  uint32_t max = kUnbounded;
};

class Grammar {
 public:
  const std::vector<Element>& elements() const { return elements_; }
  const Element& element(uint32_t pos) const { return elements_[pos]; }
  const SymbolSet& set(uint32_t index) const { return sets_[index]; }
  const Repeat& repeat(uint32_t index) const { return repeats_[index]; }
  bool has_repeats() const { return !repeats_.empty(); }
  const std::vector<uint32_t>& alternatives(uint32_t rule) const { return rules_[rule]; }
  const std::string& rule_name(uint32_t rule) const { return names_[rule]; }
  uint32_t num_rules() const { return static_cast<uint32_t>(rules_.size()); }
  uint32_t root() const { return root_; }
  // A readable listing (GBNF-like, one rule per line), for errors and tests.
  std::string describe() const;

 private:
  friend class GrammarBuilder;
  std::vector<Element> elements_;
  std::vector<SymbolSet> sets_;
  std::vector<Repeat> repeats_;
  std::vector<std::vector<uint32_t>> rules_;  // rule -> first element of each alternative
  std::vector<std::string> names_;
  uint32_t root_ = 0;
};

// Builds a Grammar rule by rule. Rules are named; a name used before its definition is declared
// and must be defined before build().
class GrammarBuilder {
 public:
  struct Item {
    Element::Kind kind;                  // symbols, rule or repeat
    SymbolSet set;                       // symbols
    uint32_t rule = 0;                   // rule; repeat: the body
    uint32_t min = 0, max = kUnbounded;  // repeat
  };
  static Item symbols_item(SymbolSet set) { return Item{Element::Kind::symbols, std::move(set)}; }
  static Item rule_item(uint32_t rule) { return Item{Element::Kind::rule, {}, rule}; }
  uint32_t rule(const std::string& name);  // the rule's index, declaring it on first use
  // A fresh helper rule named after `base` (base#7: no written name holds "#").
  uint32_t fresh_rule(const std::string& base);
  bool defined(uint32_t rule) const { return defined_[rule]; }
  // Adds one alternative (possibly empty) to `rule`.
  void add_alternative(uint32_t rule, const std::vector<Item>& items);
  // x{min,max} (max = kUnbounded: x{min,}); a symbols or rule item. Throws core::Error for bounds
  // past kMaxRepeat or max < min.
  Item repeat(const Item& x, int64_t min, int64_t max);
  Item star(const Item& x);  // x*: r ::= x r | "" (the tail reference costs no stack)
  // Validates and returns the grammar with `root` as its start rule. Throws core::Error naming the
  // undefined rule, the left-recursive rule, or the size that was exceeded.
  Grammar build(const std::string& root);

 private:
  std::vector<std::string> names_;
  std::unordered_map<std::string, uint32_t> index_;
  std::vector<bool> defined_;
  // x{0,max} of a body that may match the empty string, as rules (x{0,k} nested, in blocks of
  // kBlock copies for large k); x{min,max} of such a body is the same language.
  Item unrolled_upto(const Item& x, int64_t k);
  Item unrolled_exact(const Item& x, int64_t m);
  static constexpr int64_t kBlock = 32;

  std::vector<std::vector<std::vector<Item>>> alts_;
  size_t items_ = 0;
};

}  // namespace k3::structured
