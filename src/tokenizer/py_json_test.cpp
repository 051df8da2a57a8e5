// tokenizer/py_json_test.cpp: JSON text as Python's json.dumps(ensure_ascii=False) writes it (the
// expected strings are Python 3's output for the same values), and deep key sorting.
#include "tokenizer/py_json.h"

#include <gtest/gtest.h>

namespace k3::tokenizer {
namespace {

using json = nlohmann::ordered_json;

TEST(PyJson, FloatsLikePythonRepr) {
  const std::vector<std::pair<double, std::string>> cases = {{100.0, "100.0"},
                                                             {0.1, "0.1"},
                                                             {2.5, "2.5"},
                                                             {1e15, "1000000000000000.0"},
                                                             {1.5e15, "1500000000000000.0"},
                                                             {1e16, "1e+16"},
                                                             {0.0001, "0.0001"},
                                                             {0.00001, "1e-05"},
                                                             {1.5e-7, "1.5e-07"},
                                                             {-0.0, "-0.0"},
                                                             {1e300, "1e+300"},
                                                             {123456789012345680.0, "1.2345678901234568e+17"},
                                                             {1.0 / 3, "0.3333333333333333"},
                                                             {-42.125, "-42.125"}};
  for (const auto& [v, want] : cases) EXPECT_EQ(py_json_dumps(json(v), true), want) << want;
}

TEST(PyJson, SeparatorsOrderAndEscapes) {
  const json v = json::parse(R"({"b": [1, 2.0, true, null], "a": {"z": "é\n\"\\\u0001", "y": 10000000000000000000}})");
  EXPECT_EQ(py_json_dumps(v, false),
            R"({"b": [1, 2.0, true, null], "a": {"z": "é\n\"\\\u0001", "y": 10000000000000000000}})");
  EXPECT_EQ(py_json_dumps(v, true), R"({"b":[1,2.0,true,null],"a":{"z":"é\n\"\\\u0001","y":10000000000000000000}})");
  EXPECT_EQ(py_json_dumps(json::object(), false), "{}");
  EXPECT_EQ(py_json_dumps(json::array(), true), "[]");
}

TEST(PyJson, DeepSortedUsesCodePointOrder) {
  const json v = json::parse(R"([{"b": 1, "B": 2, "é": 3, "a": {"d": 4, "c": [{"y": 0, "x": 0}]}}])");
  EXPECT_EQ(py_json_dumps(deep_sorted(v), true), R"([{"B":2,"a":{"c":[{"x":0,"y":0}],"d":4},"b":1,"é":3}])");
}

}  // namespace
}  // namespace k3::tokenizer
