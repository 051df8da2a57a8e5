// JSON Schema and regex lowering: instances the schema allows are accepted whole, instances it
// forbids are not, every keyword the converter claims is exercised, and the refused ones are named.
#include "structured/json_schema.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "structured/regex.h"
#include "structured/structured_test_util.h"

namespace k3::structured {
namespace {

using json = nlohmann::ordered_json;

std::shared_ptr<const CompiledGrammar> schema_grammar(const json& schema) {
  EbnfRules rules;
  JsonSchemaConverter c(rules, "s");
  rules.add("root", c.convert(schema));
  return testing::compile(rules.text(), testing::small_vocabulary());
}

bool matches(const std::shared_ptr<const CompiledGrammar>& g, const std::string& text) {
  Matcher m(g);
  return m.accept_text(text) && m.can_end();
}

void expect_schema(const json& schema, std::initializer_list<const char*> good,
                   std::initializer_list<const char*> bad) {
  auto g = schema_grammar(schema);
  for (const char* t : good) EXPECT_TRUE(matches(g, t)) << schema.dump() << " should accept " << t;
  for (const char* t : bad) EXPECT_FALSE(matches(g, t)) << schema.dump() << " should refuse " << t;
}

TEST(JsonSchema, ObjectsRequiredOptionalAndAdditional) {
  const json s = {{"type", "object"},
                  {"properties",
                   {{"a", {{"type", "integer"}}}, {"b", {{"type", "string"}}}, {"c", {{"type", "boolean"}}}}},
                  {"required", {"b"}}};
  expect_schema(s,
                {R"({"b": "x"})", R"({"a": 1, "b": "x"})", R"({"a": -2,"b":"","c": true})",
                 "{\n  \"b\": \"y\",\n  \"c\": false\n}"},
                {"{}", R"({"a": 1})", R"({"b": 1})", R"({"b": "x", "d": 1})", R"({"b": "x",})", R"({,"b": "x"})"});
  expect_schema(
      {{"type", "object"}, {"properties", {{"a", {{"type", "null"}}}}}, {"additionalProperties", {{"type", "number"}}}},
      {"{}", R"({"a": null, "z": 1.5})", R"({"z": 2, "y": -0.5e3})"}, {R"({"z": "s"})", R"({"a": 1})"});
  expect_schema({{"type", "object"}, {"additionalProperties", true}}, {"{}", R"({"k": [1, {"x": null}]})"}, {"[]"});
}

TEST(JsonSchema, EnumsConstsAndCombinations) {
  expect_schema({{"enum", {"red", 1, nullptr, json::array({1, 2})}}}, {R"("red")", "1", "null", "[1,2]"},
                {R"("blue")", "2", "[1, 2]"});
  expect_schema({{"const", "日本"}}, {R"("日本")"}, {R"("日")"});
  expect_schema({{"anyOf", {{{"type", "integer"}}, {{"type", "string"}, {"maxLength", 2}}}}}, {"5", R"("ab")"},
                {R"("abc")", "1.5"});
  expect_schema({{"oneOf", {{{"type", "boolean"}}, {{"type", "null"}}}}}, {"true", "null"}, {"0"});
  expect_schema({{"allOf",
                  {{{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}, {"required", {"a"}}},
                   {{"properties", {{"b", {{"type", "integer"}}}}}, {"required", {"b"}}}}}},
                {R"({"a": 1, "b": 2})"}, {R"({"a": 1})", R"({"b": 2})"});
  // additionalProperties at one allOf level sees only that level's properties.
  expect_schema({{"allOf",
                  {{{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}},
                   {{"properties", {{"b", {{"type", "integer"}}}}}, {"additionalProperties", false}}}}},
                {"{}", R"({"b": 1})"}, {R"({"a": 1})", R"({"a": 1, "b": 2})"});
  expect_schema({{"type", {"string", "null"}}}, {R"("x")", "null"}, {"1"});
  expect_schema({{"type", "integer"}, {"nullable", true}}, {"3", "null"}, {"\"3\""});
}

TEST(JsonSchema, RecursiveRefs) {
  const json s = {
      {"$defs",
       {{"node",
         {{"type", "object"},
          {"properties",
           {{"v", {{"type", "integer"}}}, {"kids", {{"type", "array"}, {"items", {{"$ref", "#/$defs/node"}}}}}}},
          {"required", {"v"}}}}}},
      {"$ref", "#/$defs/node"}};
  expect_schema(s, {R"({"v": 1})", R"({"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}, {"v": 4}]})"},
                {R"({"v": 1, "kids": [{}]})"});
  expect_schema({{"type", "object"},
                 {"properties", {{"next", {{"anyOf", {{{"$ref", "#"}}, {{"type", "null"}}}}}}}},
                 {"required", {"next"}}},
                {R"({"next": null})", R"({"next": {"next": null}})"}, {R"({"next": {}})"});
}

TEST(JsonSchema, ArraysWithBoundsAndPrefixItems) {
  expect_schema({{"type", "array"}, {"items", {{"type", "integer"}}}, {"minItems", 1}, {"maxItems", 3}},
                {"[1]", "[1, 2, 3]", "[ 1,2 ]"}, {"[]", "[1, 2, 3, 4]", "[1,]"});
  expect_schema({{"type", "array"}, {"items", {{"type", "integer"}}}, {"maxItems", 2}}, {"[]", "[1]", "[1, 2]"},
                {"[1, 2, 3]"});
  expect_schema({{"type", "array"}, {"prefixItems", {{{"type", "string"}}, {{"type", "integer"}}}}, {"items", false}},
                {"[]", R"(["a"])", R"(["a", 1])"}, {R"(["a", 1, 2])", "[1]"});
  expect_schema(
      {{"type", "array"}, {"prefixItems", {{{"type", "string"}}}}, {"items", {{"type", "boolean"}}}, {"minItems", 2}},
      {R"(["a", true])", R"(["a", true, false])"}, {R"(["a"])", R"(["a", 1])"});
}

TEST(JsonSchema, StringsLengthsPatternsAndFormats) {
  expect_schema({{"type", "string"}, {"minLength", 2}, {"maxLength", 3}}, {R"("ab")", R"("a\nb")", R"("日本語")"},
                {R"("a")", R"("abcd")"});
  expect_schema({{"type", "string"}, {"pattern", "^[a-z]+-[0-9]{2}$"}}, {R"("ab-12")"}, {R"("ab-1")", R"("Ab-12")"});
  expect_schema({{"type", "string"}, {"pattern", "a.b"}}, {R"("axb")", R"("a\"b")", R"("a\\b")"},
                {R"("a"b")", R"("a\nb")"});
  // Claude Code's SendMessage.to: a one-line string of at most 300 characters, as two allOf patterns.
  expect_schema({{"type", "string"}, {"allOf", {{{"pattern", "^[^\\n\\r]*$"}}, {{"pattern", "^[\\s\\S]{0,3}$"}}}}},
                {R"("")", R"("abc")", R"("a\"b")"}, {R"("a\nb")", R"("abcd")"});
  expect_schema({{"type", "string"}, {"pattern", "^[a-z]+$"}, {"maxLength", 2}}, {R"("a")", R"("ab")"},
                {R"("")", R"("abc")"});
  expect_schema({{"type", "string"}, {"format", "date-time"}},
                {R"("2026-12-02T13:47:17Z")", R"("2026-01-31T00:00:00.5+01:00")"},
                {R"("2026-13-02T13:47:17Z")", R"("2026-12-02")"});
  // Days per month and leap years as ajv-formats checks them (CI found "0299-11-31" let through).
  expect_schema({{"type", "string"}, {"format", "date"}},
                {R"("2024-02-29")", R"("2000-02-29")", R"("0000-02-29")", R"("0299-12-31")", R"("2021-04-30")",
                 R"("1999-02-28")"},
                {R"("0299-11-31")", R"("2023-02-29")", R"("1900-02-29")", R"("2021-04-31")", R"("2021-02-30")",
                 R"("2021-00-10")", R"("2021-05-00")"});
  expect_schema({{"type", "string"}, {"format", "time"}}, {R"("23:59:59Z")", R"("00:00:00.123-05:30")"},
                {R"("12:30:60Z")", R"("24:00:00Z")", R"("12:30:00")"});
  expect_schema({{"type", "string"}, {"format", "duration"}},
                {R"("P1Y2M3DT4H5M6S")", R"("P3D")", R"("PT1H")", R"("P2W")", R"("P1MT30S")"},
                {R"("P")", R"("PT")", R"("P1DT")", R"("P1H")", R"("1D")"});
  expect_schema({{"type", "string"}, {"format", "uuid"}}, {R"("123e4567-e89b-12d3-a456-426614174000")"},
                {R"("123e4567")"});
  expect_schema({{"type", "string"}, {"format", "email"}}, {R"("a.b+c@example.com")"},
                {R"("a..b@example.com")", R"("a@b")"});
  expect_schema({{"type", "string"}, {"format", "ipv4"}}, {R"("192.168.0.255")"}, {R"("256.1.1.1")"});
}

TEST(JsonSchema, NumberAndIntegerBounds) {
  expect_schema({{"type", "integer"}, {"minimum", -12}, {"maximum", 105}}, {"-12", "-1", "0", "9", "10", "99", "105"},
                {"-13", "106", "1000", "-0.5", "01"});
  expect_schema({{"type", "integer"}, {"exclusiveMinimum", 0}}, {"1", "12345678901234"}, {"0", "-1"});
  expect_schema({{"type", "integer"}, {"maximum", -3}}, {"-3", "-100"}, {"-2", "0"});
  expect_schema({{"type", "number"}, {"minimum", 0}, {"maximum", 1}}, {"0", "0.25", "1", "1.000"},
                {"1.5", "-0.1", "2", "1e0"});
  expect_schema({{"type", "number"}, {"minimum", -1}, {"maximum", 0}}, {"-1", "-0.5", "0", "-1.0"}, {"-1.5", "0.5"});
  expect_schema({{"type", "number"}}, {"1e10", "-0.5E-3"}, {"1.", ".5"});
}

TEST(JsonSchema, RefusesWhatItCannotEnforceNamingIt) {
  auto expect_error = [](const json& schema, const std::string& needle) {
    try {
      schema_grammar(schema);
      ADD_FAILURE() << "no error for " << schema.dump();
    } catch (const core::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error({{"type", "array"}, {"uniqueItems", true}}, "unsupported JSON Schema keyword 'uniqueItems'");
  expect_error({{"properties", {{"a", {{"not", {{"type", "string"}}}}}}}},
               "/properties/a: unsupported JSON Schema keyword 'not'");
  expect_error({{"$ref", "https://example.com/s.json"}}, "only references inside the schema");
  expect_error({{"$ref", "#/$defs/missing"}}, "points at nothing");
  expect_error({{"type", "string"}, {"format", "color"}}, "string format 'color' is not supported");
  expect_error({{"type", "string"}, {"pattern", "(a)\\1"}}, "backreferences are not supported");
  expect_error({{"type", "integer"}, {"minimum", 5}, {"maximum", 1}}, "no number meets the bounds");
  expect_error({{"type", "widget"}}, "unknown type 'widget'");
  expect_error({{"type", "object"}, {"required", {"x"}}}, "'required' names 'x'");
  expect_error(
      {{"allOf",
        {{{"properties", {{"a", {{"type", "integer"}}}}}, {"required", {"a"}}}, {{"additionalProperties", false}}}}},
      "which another level's additionalProperties forbids");
}

TEST(Regex, Lowering) {
  auto g = [](const std::string& re) {
    return testing::compile("root ::= " + regex_to_ebnf(re), testing::small_vocabulary());
  };
  EXPECT_TRUE(matches(g("(ab|cd)+x?"), "abcdab"));
  EXPECT_FALSE(matches(g("(ab|cd)+x?"), "abx x"));
  EXPECT_TRUE(matches(g("\\d{3}-\\w+\\s\\S"), "123-a_b x"));
  EXPECT_TRUE(matches(g("[^a-c]{2}"), "日z"));
  EXPECT_FALSE(matches(g("[^a-c]{2}"), "za"));
  EXPECT_TRUE(matches(g("^(?:yes|no)$"), "yes"));
  EXPECT_TRUE(matches(g("a.*?b"), "a日\"b"));
  EXPECT_FALSE(matches(g("a.b"), "a\nb"));
  for (const char* bad : {"a(?=b)", "\\bx", "(a", "a)", "*a", "a**", "[z-a]"}) {
    EXPECT_THROW(regex_to_ebnf(bad), core::Error) << bad;
  }
}

}  // namespace
}  // namespace k3::structured
