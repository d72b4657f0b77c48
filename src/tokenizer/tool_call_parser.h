// ToolCallParser: DeepSeek-V3 tool-call syntax in streamed model text → OpenAI-style tool_calls
// (index, id, type, name, argument deltas) plus ordinary content. The syntax:
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>TYPE<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>
//   [\n<｜tool▁call▁begin｜>...<｜tool▁call▁end｜>]...<｜tool▁calls▁end｜>
// Feed it the detokenizer's deltas (control tokens appear as their text). The aggregate result
// does not depend on where chunks split: text that may be the start of a marker is held back
// until it is decided. Malformed output is reported in `errors` and from that point on passed
// through as content; nothing the model writes can crash it or make it hold more than a marker's
// length (plus a bounded type/name) of text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer {

// One streamed piece of a tool call. The first delta of a call carries id, type and name;
// later ones only argument text.
struct ToolCallDelta {
  int32_t index = 0;
  std::string id;
  std::string type;
  std::string name;
  std::string arguments;
};

struct ToolCallParseResult {
  std::string content;                    // text outside tool calls
  std::vector<ToolCallDelta> tool_calls;  // in order
  std::vector<std::string> errors;        // malformed output, one message each
};

struct ParsedToolCall {
  std::string id;
  std::string type;
  std::string name;
  std::string arguments;  // the complete argument text (JSON as the model wrote it)
};

class ToolCallParser {
 public:
  static constexpr size_t kMaxTypeBytes = 64;
  static constexpr size_t kMaxNameBytes = 256;

  // Call ids are id_prefix + the call's index; give each request its own prefix.
  explicit ToolCallParser(std::string id_prefix = "call_") : id_prefix_(std::move(id_prefix)) {}

  ToolCallParseResult push(std::string_view text);
  // End of output: releases held-back text; a call left open is reported as an error.
  ToolCallParseResult finish();

  // Calls whose <｜tool▁call▁end｜> has been seen.
  const std::vector<ParsedToolCall>& tool_calls() const { return calls_; }
  bool failed() const { return state_ == State::kFailed; }

 private:
  enum class State { kContent, kCallsOpen, kCallType, kCallName, kCallFence, kCallArgs, kAfterCalls, kFailed };

  // Consumes what it can from buffer_; returns false when it needs more input.
  bool step(ToolCallParseResult& r, bool at_end);
  void fail(ToolCallParseResult& r, std::string message);

  std::string id_prefix_;
  State state_ = State::kContent;
  std::string buffer_;  // text received but not yet consumed
  std::vector<ParsedToolCall> calls_;
  ParsedToolCall current_;
  int32_t n_started_ = 0;
};

}  // namespace deepinfer
