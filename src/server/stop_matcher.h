// server/stop_matcher.h: OpenAI "stop" strings over streamed text. A stop string may span any
// number of tokens, so text that could be the start of one is held back until the next piece
// shows whether it completes; on a match the stop string and everything after it are dropped
// (OpenAI: "the returned text will not contain the stop sequence").
//
// The held tail is a proper prefix of some stop string, so it is at most (longest stop - 1)
// bytes; a stop string is valid UTF-8 and so is the text fed (the detokenizer emits whole
// characters), so a held tail never splits a character. Cost per feed: O(|held + piece| *
// total stop bytes) in the worst case, tiny for the at most 16 strings of at most 1 KB allowed.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace k3::server {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  // Appends `piece` and returns the text that is now safe to release. After a match, returns
  // the text before the earliest match (earliest start; the longest stop string at that start)
  // and stopped() is true; later feeds return nothing.
  std::string feed(std::string_view piece);
  // End of the text: releases whatever is held (no stop string completed).
  std::string finish();

  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }  // the stop string that matched
  size_t held_bytes() const { return held_.size(); }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace k3::server
