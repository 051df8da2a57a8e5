// The matcher against its own per-token acceptance (the cached, shared-prefix mask must equal trying
// every token alone), on grammars that exercise strings spanning token ends, UTF-8 classes,
// repetition bounds, special tokens and the end of the grammar; rollback; parse errors.
#include <gtest/gtest.h>

#include <thread>

#include "core/error.h"
#include "structured/structured_test_util.h"

namespace k3::structured {
namespace {

using testing::allowed;
using testing::compile;
using testing::reference_mask;
using testing::small_vocabulary;

const char* kJson = R"(
root   ::= value
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( pair ( "," ws pair )* )? "}"
pair   ::= string ws ":" ws value ws
array  ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
string ::= "\"" ( [^"\\\x00-\x1f] | "\\" ["\\/bfnrt] | "\\u" [0-9a-fA-F]{4} )* "\""
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws     ::= [ \t\n]{0,4}
)";

// Walks `steps` tokens, each drawn among the allowed ones (preferring ends late), checking the
// mask against the reference at every step; returns the accepted text.
void walk_and_check(const std::string& ebnf, uint64_t seed, int steps) {
  auto vocab = small_vocabulary();
  auto g = compile(ebnf, vocab);
  Matcher m(g);
  core::Rng rng(seed);
  std::vector<uint32_t> mask(static_cast<size_t>(vocab->words()));
  for (int step = 0; step < steps && !m.terminated(); ++step) {
    m.fill_mask(mask);
    const std::vector<uint32_t> ref = reference_mask(m);
    ASSERT_EQ(allowed(mask), allowed(ref)) << "step " << step << " seed " << seed;
    const std::vector<int32_t> ids = allowed(mask);
    ASSERT_FALSE(ids.empty()) << "a grammar state with no way on, step " << step;
    const int32_t t = ids[rng.next_u64() % ids.size()];
    ASSERT_TRUE(m.accept(t));
  }
}

TEST(Matcher, MaskEqualsPerTokenAcceptanceOnJson) {
  for (uint64_t seed = 1; seed <= 6; ++seed) walk_and_check(kJson, seed, 60);
}

TEST(Matcher, MaskEqualsPerTokenAcceptanceOnUnicodeAndBounds) {
  walk_and_check(R"(root ::= "\"" [^"a-z\u00e9]{2,5} "\"" ( "," [α-ω日-本]+ )? [xy]{3})", 3, 40);
  walk_and_check(R"(root ::= ( "name" | "type" | [a-c]+ ) ":" [0-9]{1,3} ( " " root )?)", 5, 40);
}

// The engine fills a step's masks on several threads over one shared grammar: chains reached for
// the first time by several rows at once are computed once and every row gets the serial mask.
TEST(Matcher, MasksFilledOnManyThreadsAtOnceEqualTheSerialMasks) {
  auto vocab = small_vocabulary();
  // Each thread walks its own seeded path; the expected masks come from a second grammar
  // compiled alone (its cache filled on one thread).
  constexpr int kThreads = 8, kSteps = 40;
  auto shared = compile(kJson, vocab), alone = compile(kJson, vocab);
  std::vector<std::vector<std::vector<uint32_t>>> got(kThreads), want(kThreads);
  std::vector<std::vector<int32_t>> paths(kThreads);
  for (int t = 0; t < kThreads; ++t) {  // the paths and their serial masks
    Matcher m(alone);
    core::Rng rng(100 + static_cast<uint64_t>(t));
    std::vector<uint32_t> mask(static_cast<size_t>(vocab->words()));
    for (int step = 0; step < kSteps && !m.terminated(); ++step) {
      m.fill_mask(mask);
      want[t].push_back(mask);
      const std::vector<int32_t> ids = allowed(mask);
      ASSERT_FALSE(ids.empty());
      paths[t].push_back(ids[rng.next_u64() % ids.size()]);
      ASSERT_TRUE(m.accept(paths[t].back()));
    }
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      Matcher m(shared);
      std::vector<uint32_t> mask(static_cast<size_t>(vocab->words()));
      for (int32_t token : paths[t]) {
        m.fill_mask(mask);
        got[t].push_back(mask);
        if (!m.accept(token)) return;
      }
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(got[t], want[t]) << "thread " << t;
  EXPECT_EQ(shared->cached_groups(), alone->cached_groups()) << "each chain computed and kept once";
}

TEST(Matcher, SpecialTokensAreSingleSymbolsNeverTheirText) {
  auto vocab = small_vocabulary();
  auto g = compile(R"(root ::= <|open|> "call" <|sep|> "x"+ <|close|>)", vocab);
  Matcher m(g);
  EXPECT_FALSE(m.accept_text("<|open|>"));  // the marker's bytes are not the marker
  EXPECT_TRUE(m.accept(testing::special_token(*vocab, "<|open|>")));
  walk_and_check(R"(root ::= ( <|open|> "call" <|sep|> [a-z]* <|close|> )+)", 2, 30);
}

TEST(Matcher, EndTokenOnlyWhereTheGrammarMayEnd) {
  auto vocab = small_vocabulary();
  auto g = compile(R"(root ::= "ab" "c"?)", vocab);
  const int32_t end = vocab->end_tokens()[0];
  Matcher m(g);
  EXPECT_FALSE(m.accept(end));
  EXPECT_TRUE(m.accept_text("ab"));
  std::vector<uint32_t> mask(static_cast<size_t>(vocab->words()));
  m.fill_mask(mask);
  EXPECT_TRUE(mask[static_cast<size_t>(end) >> 5] >> (end & 31) & 1);
  EXPECT_EQ(allowed(mask), allowed(reference_mask(m)));
  EXPECT_TRUE(m.accept_text("c"));
  EXPECT_TRUE(m.accept(end));
  EXPECT_TRUE(m.terminated());
  m.fill_mask(mask);
  EXPECT_TRUE(allowed(mask).empty());
  EXPECT_FALSE(m.accept_text("c"));
}

TEST(Matcher, LargeRepetitionBoundsAreExact) {
  auto vocab = small_vocabulary();
  // 256 and 192: whole blocks of 32, no remainder (an x{0,0} tail once allowed one more).
  for (auto [lo, hi] : {std::pair{0, 1000}, std::pair{70, 200}, std::pair{129, 129}, std::pair{3, 65},
                        std::pair{0, 256}, std::pair{64, 192}}) {
    auto g = compile("root ::= \"x\"{" + std::to_string(lo) + "," + std::to_string(hi) + "} \"!\"", vocab);
    for (int n : {lo - 1, lo, lo + 1, (lo + hi) / 2, hi - 1, hi, hi + 1}) {
      if (n < 0) continue;
      Matcher m(g);
      const bool ok = m.accept_text(std::string(static_cast<size_t>(n), 'x') + "!") && m.can_end();
      EXPECT_EQ(ok, n >= lo && n <= hi) << lo << ".." << hi << " with " << n;
    }
  }
  walk_and_check(R"(root ::= [xy]{100,300} "!")", 9, 80);  // the mask across block boundaries
}

// A bounded repetition keeps its count in the stack; chains share the count's class (exact within
// one token's length of a bound). At every count of x{30,45} and x{30,} the mask equals trying every
// token, and a 100,000-bound costs a few chains, not one per count.
TEST(Matcher, CountedRepetitionMasksAreExactAtEveryCount) {
  auto vocab = small_vocabulary();
  for (const char* bounds : {"{30,45}", "{30,}", "{0,100000}"}) {
    // Most tokens fit the class: the far chain's mask is dense, and the near ones are derived.
    auto g = compile(std::string("root ::= \"<\" [^<>]") + bounds + " \">\"", vocab);
    Matcher m(g);
    ASSERT_TRUE(m.accept_text("<"));
    std::vector<uint32_t> mask(static_cast<size_t>(vocab->words()));
    size_t chains_at_60 = 0;
    for (int n = 0; n <= 120; ++n) {
      if (n == 60) chains_at_60 = g->cached_groups();
      m.fill_mask(mask);
      ASSERT_EQ(allowed(mask), allowed(reference_mask(m))) << bounds << " after " << n;
      if (!m.accept_text(n % 3 ? "x" : "y")) {
        EXPECT_EQ(n, 45) << bounds;  // only the bounded one runs out
        break;
      }
    }
    // Past the minimum and far from the maximum every count is one chain: no new ones.
    if (std::string(bounds) != "{30,45}") EXPECT_EQ(g->cached_groups(), chains_at_60) << bounds;
  }
}

// Within H of the maximum a chain's masks are the far chain's less a list of long tokens, or the far
// chain's themselves when none of its tokens is that long (and the
// masks at every count equal trying every token: CountedRepetitionMasksAreExactAtEveryCount).
TEST(Matcher, ChainsNearARepeatsMaximumAreDerivedFromTheFarChain) {
  auto vocab = small_vocabulary();
  auto g = compile(R"(root ::= "<" [^<>]{0,40} ">")", vocab);
  StackArena arena(g->grammar());
  State state = arena.initial(), next;
  arena.advance(state, '<', next);
  std::swap(state, next);
  std::vector<uint32_t> key;
  const int horizon = static_cast<int>(g->count_horizon());
  std::shared_ptr<const GroupMask> far;
  int derived = 0;
  for (int n = 0; n < 40; ++n) {  // n characters read; the next starts iteration n + 1
    int inside = 0;
    for (StackId s : state) {
      // Only the stack of the class's ASCII bytes: a multibyte character's continuation accepts
      // few tokens (an id list, computed whole).
      const Grammar& gr = g->grammar();
      if (s <= kEscaped || arena.parent(s) == kNoParent || !gr.set(gr.element(arena.pos(s)).index).contains('x'))
        continue;
      ++inside;
      g->chain_key(arena, s, key);
      const auto m = g->group_mask(key);
      if (n == 0) far = m;
      if (40 - (n + 1) < horizon) {
        EXPECT_TRUE(m->base == far || m == far) << "after " << n;
        derived += m->base == far;
      } else EXPECT_EQ(m, far) << "after " << n;  // every far count: one chain
    }
    EXPECT_EQ(inside, 1);
    arena.advance(state, 'x', next);
    std::swap(state, next);
  }
  EXPECT_GT(derived, 0) << "no chain near the maximum refused a long token";
}

// A repeated body that can match nothing is unrolled (x{m,n} = x{0,n} then), and means what it says.
TEST(Matcher, RepetitionOfABodyThatMayBeEmpty) {
  auto vocab = small_vocabulary();
  auto g = compile(R"(root ::= ( "a"? "b"? ){2,3} "!")", vocab);
  for (auto [text, ok] : {std::pair{"!", true}, std::pair{"ab!", true}, std::pair{"ababab!", true},
                          std::pair{"abababa!", false}, std::pair{"aaa!", true}, std::pair{"aaaa!", false}}) {
    Matcher m(g);
    EXPECT_EQ(m.accept_text(text) && m.can_end(), ok) << text;
  }
  walk_and_check(R"(root ::= ( [xy]* "," ){0,40} "!")", 4, 60);
}

TEST(Matcher, RollbackRestoresEveryEarlierState) {
  auto vocab = small_vocabulary();
  auto g = compile(kJson, vocab);
  Matcher m(g, 8);
  std::vector<std::vector<uint32_t>> masks;
  std::vector<uint32_t> mask(static_cast<size_t>(vocab->words()));
  for (const char* piece : {"{", "\"a", "\":", " ", "[", "1", ",", "true"}) {
    m.fill_mask(mask);
    masks.push_back(mask);
    ASSERT_TRUE(m.accept_text(piece)) << piece;
  }
  EXPECT_FALSE(m.accept_text("}"));  // inside an array
  EXPECT_THROW(m.rollback(9), core::Error);
  for (int k = 1; k <= 8; ++k) {
    m.rollback(1);
    m.fill_mask(mask);
    EXPECT_EQ(mask, masks[static_cast<size_t>(8 - k)]) << k;
  }
  EXPECT_EQ(m.rollback_depth(), 0);
}

TEST(Matcher, RecognisesJsonDocuments) {
  auto vocab = small_vocabulary();
  auto g = compile(kJson, vocab);
  for (const char* ok : {R"({"a": [1, 2.5e-3, "x\n\u00e9"], "b": {}})", "[]", R"("日本")", "-0.5", "null"}) {
    Matcher m(g);
    EXPECT_TRUE(m.accept_text(ok)) << ok;
    EXPECT_TRUE(m.can_end()) << ok;
  }
  for (const char* bad : {"{,}", "[1,]", "01", "\"\x01\"", "{\"a\" 1}", "tru e", "\"\xff\""}) {
    Matcher m(g);
    EXPECT_FALSE(m.accept_text(bad) && m.can_end()) << bad;
  }
}

TEST(Grammar, ErrorsNameWhatIsWrong) {
  auto vocab = small_vocabulary();
  auto expect_error = [&](const std::string& ebnf, const std::string& needle) {
    try {
      compile(ebnf, vocab);
      ADD_FAILURE() << "no error for: " << ebnf;
    } catch (const core::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error("root ::= a", "rule 'a' is used but never defined");
  expect_error("root ::= root \"x\" | \"y\"", "left-recursive");
  expect_error("root ::= (\"x\"*)* \"y\"", "left-recursive");
  expect_error("root ::= \"x\" root", "can never be completed");
  expect_error("root ::= \"abc", "line 1 column");
  expect_error("x ::= \"a\"", "no 'root' rule");
  expect_error("root ::= <|nope|>", "no special token '<|nope|>'");
  expect_error("root ::= [b-a]", "out of order");
  expect_error("root ::= \"a\"{3,2}", "n < m");
  expect_error("root ::= \"a\"{2000000}", "repetition bound");
  expect_error("root ::= \"a\"\nroot ::= \"b\"", "defined twice");
}

}  // namespace
}  // namespace k3::structured
