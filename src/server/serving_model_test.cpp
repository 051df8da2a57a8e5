// server/serving_model_test.cpp: what ServingModel::load takes from the model folder: the eos
// token comes from config.json (k3-tiny's eos_token_id is "<|end_of_msg|>", no special case in
// the server), and the load progress callback sees every weight byte read in.
#include <gtest/gtest.h>

#include "server/server_test_util.h"

namespace k3::server {
namespace {

TEST(ServingModel, EosIsTheConfigsEosTokenIdWhichIsEndOfMessage) {
  testing::ModelServer& s = testing::model_server();
  const int32_t eos = s.engine().config().eos_token_id;
  EXPECT_EQ(eos, s.model->config().eos_token_id);
  EXPECT_EQ(eos, s.tokenizer().special_id(tokenizer::k3_tokens::kEndOfMsg).value_or(-2));
  EXPECT_NE(s.model->description().find("eos id " + std::to_string(eos)), std::string::npos) << s.model->description();
}

TEST(ServingModel, LoadReportsProgressUpToEveryWeightByte) {
  ServingOptions o;
  o.model_dir = testing::tiny_model_dir();
  o.max_model_len = 128;
  o.max_num_seqs = 2;
  o.kv_cache_bytes = 8ll << 20;
  std::vector<checkpoint::LoadProgress> reports;
  o.load_progress = [&](const checkpoint::LoadProgress& p) { reports.push_back(p); };
  const auto model = ServingModel::load(o);
  ASSERT_GE(reports.size(), 3u);
  EXPECT_EQ(reports.front().bytes_done, 0);
  EXPECT_TRUE(reports.back().finished());
  EXPECT_GT(reports.back().bytes_total, 1'000'000);  // k3-tiny: about 6.5 MB of weights
  for (size_t i = 1; i < reports.size(); ++i) EXPECT_GT(reports[i].bytes_done, reports[i - 1].bytes_done) << i;
}

}  // namespace
}  // namespace k3::server
