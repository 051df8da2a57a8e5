// kernels/testing/ops_main.cpp: main of k3_ops_tests: GoogleTest plus --k3_report=FILE, which writes every
// comparison (op, shape, mode, relative error, cosine, max-abs, tolerance, pass) as JSON.
#include <gtest/gtest.h>

#include <string>

#include "kernels/testing/op_harness.h"

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  std::string report;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--k3_report=", 0) == 0) report = arg.substr(12);
  }
  const int rc = RUN_ALL_TESTS();
  if (!report.empty()) k3::ops_test::write_report(report);
  return rc;
}
