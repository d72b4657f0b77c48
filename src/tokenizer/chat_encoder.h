// ChatEncoder: DeepSeek-V3's conversation format rendered natively — no template engine, no
// request-supplied template. Control tokens (<｜User｜>, <｜Assistant｜>, tool-call and
// tool-output markers, BOS/EOS) are inserted by id; every piece of message text is encoded as
// plain text (Tokenizer EncodeOptions::split_special_tokens = false), so content that spells a
// control token stays text. Does not parse model output (tool_call_parser.h).
//
// The layout is exactly what the chat_template in DeepSeek-V3's tokenizer_config.json renders
// (checked against HF apply_chat_template + tokenization, tests/tokenizer/chat_encoder_test.cpp):
//   BOS, then every system message's content joined by "\n\n";
//   user:      <｜User｜>content
//   assistant: <｜Assistant｜>content<｜end▁of▁sentence｜>, or after tool outputs
//              <｜tool▁outputs▁end｜>content<｜end▁of▁sentence｜>
//   assistant with null content and tool_calls: the first call of the conversation opens with
//              <｜Assistant｜><｜tool▁calls▁begin｜>; each call is
//              <｜tool▁call▁begin｜>type<｜tool▁sep｜>name\n```json\nARGS\n```<｜tool▁call▁end｜>;
//              later calls are preceded by "\n" and followed by
//              <｜tool▁calls▁end｜><｜end▁of▁sentence｜>
//   tool:      the first output of the conversation opens with <｜tool▁outputs▁begin｜>; each is
//              <｜tool▁output▁begin｜>content<｜tool▁output▁end｜>, later ones preceded by "\n";
//   end: <｜tool▁outputs▁end｜> if the last message was a tool output, else <｜Assistant｜>
//              when add_generation_prompt.
// The template's quirks are kept on purpose (parity with what the model was served with): a
// single tool call is not followed by <｜tool▁calls▁end｜><｜end▁of▁sentence｜>, and the
// "first" flags for calls and outputs are per conversation, not per message.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace deepinfer {

enum class ChatRole { kSystem, kUser, kAssistant, kTool };

struct ChatToolCall {
  std::string id;                  // not rendered (the format has no call ids)
  std::string type = "function";
  std::string name;
  std::string arguments;           // JSON text, rendered verbatim
};

struct ChatMessage {
  ChatRole role = ChatRole::kUser;
  std::optional<std::string> content;   // nullopt only for an assistant message of tool calls
  std::vector<ChatToolCall> tool_calls;  // assistant only; rendered only when content is null
};

struct ChatOptions {
  bool add_generation_prompt = true;
  // DeepSeek-R1 conventions: drop the reasoning of earlier assistant turns (keep the text after
  // the last "</think>"), and open the reply with "<think>\n" after the generation prompt.
  bool strip_reasoning = false;
  bool open_think = false;
};

class ChatEncoder {
  public:
  static constexpr size_t kMaxMessages = 100'000;
  static constexpr size_t kMaxTotalBytes = size_t{64} << 20;  // all message text together

  // Looks up the control tokens by content; kUnsupported naming the first one the vocabulary
  // lacks (a tokenizer that is not DeepSeek-V3's). `tokenizer` must outlive the encoder.
  static Expected<ChatEncoder> create(const Tokenizer& tokenizer);

  // The conversation's token ids (BOS first). kInvalidArgument for a message the format cannot
  // render (null content outside an assistant tool-call turn), kOutOfRange past the caps, and
  // the tokenizer's errors (invalid UTF-8) with the message index named. Thread-safe.
  Expected<std::vector<int32_t>> encode(std::span<const ChatMessage> messages, const ChatOptions& options = {}) const;

  // OpenAI-style messages: [{"role": "system"|"user"|"assistant"|"tool", "content": string|null,
  // "tool_calls": [{"id", "type", "function": {"name", "arguments": string|object}}]}].
  // Object arguments are serialised compactly. Errors name the field ("messages[2].role").
  static Expected<std::vector<ChatMessage>> parse_messages(const nlohmann::json& messages);

 private:
  struct ControlIds {
    int32_t bos, eos, user, assistant;
    int32_t tool_calls_begin, tool_calls_end, tool_call_begin, tool_call_end, tool_sep;
    int32_t tool_outputs_begin, tool_outputs_end, tool_output_begin, tool_output_end;
  };
  ChatEncoder(const Tokenizer& tokenizer, ControlIds ids) : tokenizer_(&tokenizer), ids_(ids) {}

  const Tokenizer* tokenizer_;
  ControlIds ids_;
};

}  // namespace deepinfer
