// server/response_store_test.cpp: the bounded /v1/responses store: what is kept, what a
// lookup refreshes, and what goes first when it is full.
#include "server/response_store.h"

#include <gtest/gtest.h>

namespace k3::server {
namespace {

Json conversation(const std::string& text) { return Json::array({{{"role", "user"}, {"content", text}}}); }

TEST(ResponseStore, KeepsTheMostRecentlyUsedUpToItsCapacity) {
  ResponseStore store(2);
  store.put("a", conversation("A"));
  store.put("b", conversation("B"));
  ASSERT_TRUE(store.get("a"));        // a is now the most recently used
  store.put("c", conversation("C"));  // evicts b, the least recently used
  EXPECT_EQ(store.size(), 2u);
  EXPECT_FALSE(store.get("b"));
  EXPECT_EQ(*store.get("a"), conversation("A"));
  EXPECT_EQ(*store.get("c"), conversation("C"));
  EXPECT_FALSE(store.get("never stored"));
}

TEST(ResponseStore, PuttingAnIdAgainReplacesIt) {
  ResponseStore store(2);
  store.put("a", conversation("A"));
  store.put("a", conversation("A2"));
  EXPECT_EQ(store.size(), 1u);
  EXPECT_EQ(*store.get("a"), conversation("A2"));
}

TEST(ResponseStore, CapacityZeroKeepsNothing) {
  ResponseStore store(0);
  store.put("a", conversation("A"));
  EXPECT_EQ(store.size(), 0u);
  EXPECT_FALSE(store.get("a"));
}

}  // namespace
}  // namespace k3::server
