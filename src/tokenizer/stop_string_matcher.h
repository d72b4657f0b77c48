// StopStringMatcher: finds stop strings in streamed text, across delta boundaries, and releases
// only text that cannot be the start of one. One Knuth-Morris-Pratt automaton per stop string:
// O(1) amortised per byte per stop string, memory bounded by the stop strings. Does not know
// about tokens (feed it IncrementalDetokenizer's deltas).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace deepinfer {

class StopStringMatcher {
 public:
  static constexpr size_t kMaxStopStrings = 16;
  static constexpr size_t kMaxStopBytes = 1024;

  // Rejects (kInvalidArgument) more than kMaxStopStrings strings, empty ones, ones longer than
  // kMaxStopBytes, and ones that are not valid UTF-8.
  static Expected<StopStringMatcher> create(std::vector<std::string> stops);

  // Feeds valid UTF-8 text; appends to `out` the text that is now safe to emit. When a stop
  // string completes, appends the text before it, sets stopped() and ignores later input. If
  // several complete at the same byte, the longest (earliest-starting) one counts.
  void push(std::string_view text, std::string& out);
  // End of stream without a stop: releases the held-back text.
  void finish(std::string& out);

  bool stopped() const { return matched_.has_value(); }
  // Index of the stop string that matched.
  std::optional<size_t> matched() const { return matched_; }
  size_t n_held_bytes() const { return held_.size(); }

 private:
  struct Automaton {
    std::string pattern;
    std::vector<size_t> failure;  // [pattern.size()] KMP failure function
    size_t state = 0;             // length of the longest prefix that is a suffix of the stream
  };

  std::vector<Automaton> automata_;
  std::string held_;  // the stream's last bytes that may begin a stop string
  std::optional<size_t> matched_;
};

}  // namespace deepinfer
