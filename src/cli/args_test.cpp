// cli/args_test.cpp: Args (on CLI11) as the subcommands use it: both value spellings, `multiple`
// options, --help, and every strict error with the message naming the option.
#include "cli/args.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace k3::cli {
namespace {

const std::vector<OptionSpec> kSpecs = {
    {"model", "DIR", "checkpoint folder", "/m"},
    {"max-tokens", "N", "tokens to generate", "16"},
    {"temperature", "T", "sampling temperature", "0"},
    {"token-ids", "N,N,...", "prompt", ""},
    {"out", "FILE", "where to write", "", true},
    {"served-model-name", "NAME [NAME ...]", "model ids", "", false, true},
    {"quiet", "", "print less", ""},
};

Args parse(std::vector<std::string> words, const std::vector<OptionSpec>& specs = kSpecs) {
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  return Args("test", specs, argv);
}

// The core::Error message of parsing `words` ("" when it parses).
std::string error_of(std::vector<std::string> words) {
  try {
    parse(std::move(words));
  } catch (const core::Error& e) {
    return e.what();
  }
  return "";
}

TEST(Args, BothValueSpellingsDefaultsAndFlags) {
  const Args a = parse({"--out", "o.bin", "--max-tokens=7", "--temperature", "-0.5", "--quiet"});
  EXPECT_EQ(a.get("out"), "o.bin");
  EXPECT_EQ(a.get_int("max-tokens"), 7);
  EXPECT_EQ(a.get_double("temperature"), -0.5);  // a negative number is a value, not an option
  EXPECT_TRUE(a.flag("quiet"));
  EXPECT_EQ(a.get("quiet"), "1");
  EXPECT_EQ(a.get("model"), "/m");
  EXPECT_FALSE(a.has("model"));
  EXPECT_TRUE(a.has("out"));
  EXPECT_FALSE(parse({"--out", "o"}).flag("quiet"));
  EXPECT_TRUE(parse({"--out", "o", "--quiet=true"}).flag("quiet"));  // CLI11 cannot tell it from --quiet
}

TEST(Args, AValueMayLookLikeAnOptionAndMayBeEmpty) {
  EXPECT_EQ(parse({"--out", "--quiet"}).get("out"), "--quiet");  // the first value is taken as it is
  EXPECT_EQ(parse({"--out", "o", "--model", ""}).get("model"), "");
  const Args a = parse({"--model=", "--out", "o"});
  EXPECT_TRUE(a.has("model"));
  EXPECT_EQ(a.get("model"), "");
  EXPECT_EQ(parse({"--out=a=b"}).get("out"), "a=b");
}

TEST(Args, MultipleTakesTheWordsUpToTheNextOption) {
  const Args a = parse({"--served-model-name", "a", "b", "c", "--out", "o"});
  EXPECT_EQ(a.get_list("served-model-name"), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(a.get("served-model-name"), "a\nb\nc");
  EXPECT_EQ(parse({"--out", "o", "--served-model-name", "x"}).get_list("served-model-name"),
            (std::vector<std::string>{"x"}));
  EXPECT_TRUE(parse({"--out", "o"}).get_list("served-model-name").empty());  // empty default: none
  EXPECT_EQ(parse({"--out", "o"}).get_list("model"), (std::vector<std::string>{"/m"}));
}

TEST(Args, HelpSkipsRequiredAndListsEveryOption) {
  for (const char* h : {"--help", "-h"}) {
    const Args a = parse({h});
    EXPECT_TRUE(a.help_requested());
  }
  EXPECT_TRUE(parse({"--max-tokens", "3", "--help"}).help_requested());
  const std::string u = parse({"--help"}).usage();
  EXPECT_EQ(u.rfind("usage: k3serve test [options]\n", 0), 0u) << u;
  EXPECT_NE(u.find("  --model DIR                checkpoint folder [default: /m]\n"), std::string::npos) << u;
  EXPECT_NE(u.find("  --out FILE                 where to write (required)\n"), std::string::npos) << u;
  EXPECT_NE(u.find("  --served-model-name NAME [NAME ...] model ids\n"), std::string::npos) << u;
  EXPECT_NE(u.find("  --quiet                    print less\n"), std::string::npos) << u;
  // Help does not hide a bad word.
  EXPECT_NE(error_of({"--help", "--bogus"}).find("unknown option --bogus"), std::string::npos);
}

TEST(Args, EveryProblemIsAnErrorNamingTheOption) {
  struct Case {
    std::vector<std::string> words;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {{"--out", "o", "--bogus", "3"}, "test: unknown option --bogus\nusage: k3serve test"},
      {{"--out", "o", "--bogus=3"}, "test: unknown option --bogus\n"},
      {{"--out", "o", "stray"}, "test: unexpected argument 'stray' (options start with --)"},
      {{"--out", "o", "-x"}, "test: unexpected argument '-x' (options start with --)"},
      {{"--out", "o", "--max-tokens"}, "test: --max-tokens needs a value (N)"},
      {{"--out", "o", "--served-model-name"}, "test: --served-model-name needs a value (NAME [NAME ...])"},
      {{"--out"}, "test: --out needs a value (FILE)"},
      {{"--out", "o", "--max-tokens", "1", "--max-tokens", "2"}, "test: --max-tokens given twice"},
      {{"--out", "o", "--max-tokens=1", "--max-tokens", "2"}, "test: --max-tokens given twice"},
      {{"--out", "o", "--quiet", "--quiet"}, "test: --quiet given twice"},
      {{"--out", "o", "--served-model-name", "a", "--served-model-name", "b"}, "test: --served-model-name given twice"},
      {{"--out", "o", "--quiet=1"}, "test: --quiet is a flag and takes no value"},
      {{"--out", "o", "--quiet=false"}, "test: --quiet is a flag and takes no value"},
      {{"--max-tokens", "3"}, "test: --out is required\nusage: k3serve test"},
      {{"--out", "o", "--", "--model", "x"}, "test: unknown option --\n"},
  };
  for (const auto& c : cases) {
    const std::string e = error_of(c.words);
    EXPECT_EQ(e.rfind(c.expect, 0), 0u) << "got: " << e << "\nwant: " << c.expect;
  }
}

TEST(Args, NumbersKeepTheirMessages) {
  auto message = [](auto get) {
    try {
      get();
    } catch (const core::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const Args a = parse({"--out", "o", "--max-tokens", "x", "--temperature", "inf", "--token-ids", "1,,2"});
  EXPECT_EQ(message([&] { a.get_int("max-tokens"); }), "test: --max-tokens expects an integer, got 'x'");
  EXPECT_EQ(message([&] { a.get_u64("max-tokens"); }), "test: --max-tokens expects a non-negative integer, got 'x'");
  EXPECT_EQ(message([&] { a.get_double("temperature"); }), "test: --temperature expects a number, got 'inf'");
  EXPECT_EQ(message([&] { a.get_ids("token-ids"); }), "test: --token-ids expects comma-separated token ids, got ''");
  EXPECT_EQ(message([&] { a.get("nope"); }).rfind("test: unknown option --nope", 0), 0u);
  EXPECT_EQ(parse({"--out", "o", "--token-ids", "3,14,15"}).get_ids("token-ids"), (std::vector<int32_t>{3, 14, 15}));
  EXPECT_EQ(message([&] {
              parse({"--out", "o", "--max-tokens", "-1"}).get_u64("max-tokens");
            }),
            "test: --max-tokens expects a non-negative integer, got '-1'");
}

}  // namespace
}  // namespace k3::cli
