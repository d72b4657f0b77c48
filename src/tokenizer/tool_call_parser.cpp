#include "tokenizer/tool_call_parser.h"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/text.h"

namespace deepinfer {

namespace {

constexpr std::string_view kCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kSep = "<｜tool▁sep｜>";
constexpr std::string_view kFence = "```json\n";
constexpr std::string_view kCloseFence = "\n```";
constexpr std::string_view kMarkerStart = "<｜";

// Length of the longest suffix of `s` that is a proper prefix of `marker`.
size_t partial_suffix(std::string_view s, std::string_view marker) {
  for (size_t k = std::min(s.size(), marker.size() - 1); k > 0; --k) {
    if (s.substr(s.size() - k) == marker.substr(0, k)) return k;
  }
  return 0;
}

bool is_prefix_of(std::string_view s, std::string_view marker) {
  return s.size() < marker.size() && marker.substr(0, s.size()) == s;
}

size_t skip_whitespace(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) ++i;
  return i;
}

bool has_control_byte(std::string_view s) {
  return std::any_of(s.begin(), s.end(), [](char c) { return static_cast<uint8_t>(c) < 0x20 || c == 0x7F; });
}

}  // namespace

void ToolCallParser::fail(ToolCallParseResult& r, std::string message) {
  r.errors.push_back(std::move(message));
  state_ = State::kFailed;
}

ToolCallParseResult ToolCallParser::push(std::string_view text) {
  ToolCallParseResult r;
  buffer_.append(text);
  while (step(r, /*at_end=*/false)) {
  }
  return r;
}

ToolCallParseResult ToolCallParser::finish() {
  ToolCallParseResult r;
  while (step(r, /*at_end=*/true)) {
  }
  switch (state_) {
    case State::kContent:
    case State::kAfterCalls:
    case State::kFailed:
      break;
    case State::kCallsOpen:
      if (calls_.empty()) r.errors.push_back("tool calls opened but none was written");
      break;
    default:
      r.errors.push_back(fmt::format("output ended inside tool call {}", n_started_ - 1));
      break;
  }
  // Whatever is still held (a partial marker, an unfinished call's text) is plain text now.
  r.content.append(buffer_);
  buffer_.clear();
  return r;
}

bool ToolCallParser::step(ToolCallParseResult& r, bool at_end) {
  std::string_view buf = buffer_;
  const auto consume = [this](size_t n) { buffer_.erase(0, n); };
  switch (state_) {
    case State::kContent: {
      const size_t calls = buf.find(kCallsBegin);
      const size_t call = buf.find(kCallBegin);
      const size_t at = std::min(calls, call);
      if (at != std::string_view::npos) {
        r.content.append(buf.substr(0, at));
        // A bare <｜tool▁call▁begin｜> opens the calls implicitly.
        const bool bare = call < calls;
        consume(at + (bare ? kCallBegin.size() : kCallsBegin.size()));
        state_ = bare ? State::kCallType : State::kCallsOpen;
        if (bare) ++n_started_;
        return true;
      }
      const size_t hold = at_end ? 0 : std::max(partial_suffix(buf, kCallsBegin), partial_suffix(buf, kCallBegin));
      r.content.append(buf.substr(0, buf.size() - hold));
      consume(buf.size() - hold);
      return false;
    }
    case State::kCallsOpen: {
      const size_t ws = skip_whitespace(buf);
      const std::string_view rest = buf.substr(ws);
      if (rest.starts_with(kCallBegin)) {
        consume(ws + kCallBegin.size());
        state_ = State::kCallType;
        ++n_started_;
        return true;
      }
      if (rest.starts_with(kCallsEnd)) {
        consume(ws + kCallsEnd.size());
        state_ = State::kAfterCalls;
        return true;
      }
      if (!at_end && (rest.empty() || is_prefix_of(rest, kCallBegin) || is_prefix_of(rest, kCallsEnd))) return false;
      if (rest.empty()) return false;
      fail(r, fmt::format("expected {} or {} after tool call {}", kCallBegin, kCallsEnd, n_started_ - 1));
      return true;
    }
    case State::kCallType: {
      // The type ends at the first separator, which must start within kMaxTypeBytes. Deciding
      // only on that (not on what else the buffer holds) keeps the outcome independent of
      // where chunks split.
      const size_t sep = buf.find(kSep);
      if (sep == std::string_view::npos || sep > kMaxTypeBytes) {
        if (!at_end && buf.size() < kMaxTypeBytes + kSep.size()) return false;
        if (buf.empty()) return false;
        fail(r, fmt::format("tool call {}: no {} within {} bytes after {}", n_started_ - 1, kSep, kMaxTypeBytes, kCallBegin));
        return true;
      }
      const std::string_view type = buf.substr(0, sep);
      if (type.empty() || has_control_byte(type) || type.find(kMarkerStart) != std::string_view::npos) {
        fail(r, fmt::format("tool call {}: bad call type {}", n_started_ - 1, quote_text(type, 40)));
        return true;
      }
      current_ = ParsedToolCall{};
      current_.type = std::string(type);
      consume(sep + kSep.size());
      state_ = State::kCallName;
      return true;
    }
    case State::kCallName: {
      const size_t nl = buf.find('\n');
      if (nl == std::string_view::npos || nl > kMaxNameBytes) {
        if (!at_end && buf.size() <= kMaxNameBytes) return false;
        if (buf.empty()) return false;
        fail(r, fmt::format("tool call {}: the function name does not end with a newline within {} bytes", n_started_ - 1,
                            kMaxNameBytes));
        return true;
      }
      const std::string_view name = buf.substr(0, nl);
      if (name.empty() || has_control_byte(name) || name.find(kMarkerStart) != std::string_view::npos) {
        fail(r, fmt::format("tool call {}: bad function name {}", n_started_ - 1, quote_text(name, 40)));
        return true;
      }
      current_.name = std::string(name);
      current_.id = id_prefix_ + std::to_string(n_started_ - 1);
      ToolCallDelta d;
      d.index = n_started_ - 1;
      d.id = current_.id;
      d.type = current_.type;
      d.name = current_.name;
      r.tool_calls.push_back(std::move(d));
      consume(nl + 1);
      state_ = State::kCallFence;
      return true;
    }
    case State::kCallFence: {
      if (buf.starts_with(kFence)) {
        consume(kFence.size());
        state_ = State::kCallArgs;
        return true;
      }
      if (!at_end && is_prefix_of(buf, kFence)) return false;
      if (buf.empty()) return false;
      fail(r, fmt::format("tool call {}: expected ```json after the function name", n_started_ - 1));
      return true;
    }
    case State::kCallArgs: {
      const auto emit_args = [&](std::string_view args) {
        if (args.empty()) return;
        current_.arguments.append(args);
        if (!r.tool_calls.empty() && r.tool_calls.back().index == n_started_ - 1) {
          r.tool_calls.back().arguments.append(args);
        } else {
          ToolCallDelta d;
          d.index = n_started_ - 1;
          d.arguments = std::string(args);
          r.tool_calls.push_back(std::move(d));
        }
      };
      const size_t end = buf.find(kCallEnd);
      if (end == std::string_view::npos) {
        // Hold back what may be the closing "\n```<｜tool▁call▁end｜>" (or a part of it).
        size_t hold = partial_suffix(buf, kCallEnd);
        for (std::string_view closing : {std::string_view("\n```<｜tool▁call▁end｜>"), std::string_view("```<｜tool▁call▁end｜>")}) {
          hold = std::max(hold, partial_suffix(buf, closing));
        }
        if (at_end) hold = 0;
        emit_args(buf.substr(0, buf.size() - hold));
        consume(buf.size() - hold);
        return false;
      }
      std::string_view args = buf.substr(0, end);
      bool fenced = true;
      if (args.ends_with(kCloseFence)) {
        args.remove_suffix(kCloseFence.size());
      } else if (args.ends_with("```")) {
        args.remove_suffix(3);
      } else {
        fenced = false;
      }
      emit_args(args);
      const int32_t index = n_started_ - 1;
      if (!fenced) r.errors.push_back(fmt::format("tool call {}: arguments not closed by ```", index));
      if (!nlohmann::json::accept(current_.arguments))
        r.errors.push_back(fmt::format("tool call {}: arguments are not valid JSON", index));
      calls_.push_back(std::move(current_));
      current_ = ParsedToolCall{};
      consume(end + kCallEnd.size());
      state_ = State::kCallsOpen;
      return true;
    }
    case State::kAfterCalls:
    case State::kFailed:
      r.content.append(buf);
      buffer_.clear();
      return false;
  }
  return false;
}

}  // namespace deepinfer
