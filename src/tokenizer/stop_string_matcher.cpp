#include "tokenizer/stop_string_matcher.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace deepinfer {

Expected<StopStringMatcher> StopStringMatcher::create(std::vector<std::string> stops) {
  if (stops.size() > kMaxStopStrings)
    return make_error(StatusCode::kInvalidArgument, "stop: {} strings exceed the limit of {}", stops.size(), kMaxStopStrings);
  StopStringMatcher m;
  for (size_t i = 0; i < stops.size(); ++i) {
    std::string& s = stops[i];
    if (s.empty()) return make_error(StatusCode::kInvalidArgument, "stop[{}]: empty string", i);
    if (s.size() > kMaxStopBytes)
      return make_error(StatusCode::kInvalidArgument, "stop[{}]: {} bytes exceed the limit of {}", i, s.size(), kMaxStopBytes);
    if (!utf8::is_valid(s)) return make_error(StatusCode::kInvalidArgument, "stop[{}]: not valid UTF-8", i);
    Automaton a;
    a.failure.assign(s.size(), 0);
    for (size_t q = 1, k = 0; q < s.size(); ++q) {
      while (k > 0 && s[q] != s[k]) k = a.failure[k - 1];
      if (s[q] == s[k]) ++k;
      a.failure[q] = k;
    }
    a.pattern = std::move(s);
    m.automata_.push_back(std::move(a));
  }
  return m;
}

void StopStringMatcher::push(std::string_view text, std::string& out) {
  if (matched_) return;
  if (automata_.empty()) {
    out.append(text);
    return;
  }
  // Positions are in the buffer held_ + text; each automaton's state never exceeds held_.size()
  // on entry, so a match always starts inside this buffer.
  const size_t base = held_.size();
  for (size_t j = 0; j < text.size(); ++j) {
    const char c = text[j];
    size_t best_length = 0;
    for (size_t i = 0; i < automata_.size(); ++i) {
      Automaton& a = automata_[i];
      while (a.state > 0 && a.pattern[a.state] != c) a.state = a.failure[a.state - 1];
      if (a.pattern[a.state] == c) ++a.state;
      if (a.state == a.pattern.size() && a.pattern.size() > best_length) {
        best_length = a.pattern.size();
        matched_ = i;
      }
    }
    if (matched_) {
      const size_t start = base + j + 1 - best_length;  // index in held_ + text
      if (start <= held_.size()) {
        out.append(held_, 0, start);
      } else {
        out.append(held_);
        out.append(text.substr(0, start - held_.size()));
      }
      held_.clear();
      return;
    }
  }
  size_t keep = 0;
  for (const Automaton& a : automata_) keep = std::max(keep, a.state);
  const size_t total = held_.size() + text.size();
  const size_t n_emit = total - keep;
  if (n_emit <= held_.size()) {
    out.append(held_, 0, n_emit);
    held_.erase(0, n_emit);
    held_.append(text);
  } else {
    out.append(held_);
    out.append(text.substr(0, n_emit - held_.size()));
    held_.assign(text.substr(n_emit - held_.size()));
  }
}

void StopStringMatcher::finish(std::string& out) {
  if (matched_) return;
  out.append(held_);
  held_.clear();
}

}  // namespace deepinfer
