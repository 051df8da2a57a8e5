// structured/ebnf.h: the grammar text users write (vLLM's `grammar` / `guided_grammar`), parsed
// into a Grammar. The dialect is GBNF as llama.cpp users write it, which is also xgrammar's EBNF:
//
//   root   ::= object                      # rules: name ::= alternatives; the start rule is root
//   object ::= "{" ws ( pair ( "," ws pair )* )? "}"
//   pair   ::= string ":" ws value
//   string ::= "\"" [^"\\]* "\""           # literals "..." or '...' with \n \t \\ \" \xHH \uHHHH
//   digits ::= [0-9]+ | [1-9] [0-9]{2,5}   # classes [a-z] [^...], ., groups ( ), * + ? {m} {m,} {m,n}
//   call   ::= <|open|> "call" <|sep|>     # a special token of the vocabulary, by its text
//
// Characters are Unicode code points: a class or `.` is lowered to the UTF-8 byte sequences of its
// code points, so the grammar only ever accepts valid UTF-8. Errors name the line and column.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "structured/grammar.h"

namespace k3::structured {

// Resolves a special token's text ("<|open|>") to its symbol; nullopt: the vocabulary has none.
using SpecialResolver = std::function<std::optional<Symbol>(std::string_view text)>;

// Throws core::Error "grammar: line L column C: ..." on a syntax error, an unknown special token,
// or anything GrammarBuilder::build refuses.
Grammar parse_ebnf(std::string_view text, const SpecialResolver& specials, const std::string& root = "root");

// A string as a GBNF literal ("..." with the escapes above), for generators writing grammar text.
std::string ebnf_literal(std::string_view bytes);

}  // namespace k3::structured
