#include "tokenizer/chat_encoder.h"

#include "io/text.h"

namespace deepinfer {

namespace {

// Accumulates the rendered conversation: text runs are encoded as plain text when a control
// token (or the end) closes them, so pre-tokenization sees each run whole, as it would in the
// rendered string.
class Builder {
 public:
  explicit Builder(const Tokenizer& t) : t_(t) {}

  void text(std::string_view s) { pending_.append(s); }
  Status control(int32_t id) {
    DI_RETURN_IF_ERROR(flush());
    ids_.push_back(id);
    return Status::ok();
  }
  // Text the encoder itself writes and that may name added tokens (R1's "<think>").
  Status trusted_text(std::string_view s) {
    DI_RETURN_IF_ERROR(flush());
    return t_.encode_append(s, /*split_special_tokens=*/true, ids_);
  }
  Status flush() {
    if (pending_.empty()) return Status::ok();
    Status s = t_.encode_append(pending_, /*split_special_tokens=*/false, ids_, ChatEncoder::kMaxTotalBytes);
    pending_.clear();
    return s;
  }
  std::vector<int32_t> take() { return std::move(ids_); }

 private:
  const Tokenizer& t_;
  std::string pending_;
  std::vector<int32_t> ids_;
};

const char* role_name(ChatRole role) {
  switch (role) {
    case ChatRole::kSystem: return "system";
    case ChatRole::kUser: return "user";
    case ChatRole::kAssistant: return "assistant";
    case ChatRole::kTool: return "tool";
  }
  return "?";
}

}  // namespace

Expected<ChatEncoder> ChatEncoder::create(const Tokenizer& tokenizer) {
  ControlIds ids{};
  const auto find = [&](std::string_view content, int32_t* slot) -> Status {
    auto id = tokenizer.token_to_id(content);
    if (!id || !tokenizer.is_added(*id)) {
      return make_error(StatusCode::kUnsupported,
                        "the tokenizer has no {} token: the DeepSeek-V3 chat format needs DeepSeek's vocabulary",
                        quote_text(content));
    }
    *slot = *id;
    return Status::ok();
  };
  if (!tokenizer.bos_id() || !tokenizer.eos_id())
    return make_error(StatusCode::kUnsupported, "the tokenizer has no bos_token/eos_token (tokenizer_config.json)");
  ids.bos = *tokenizer.bos_id();
  ids.eos = *tokenizer.eos_id();
  DI_RETURN_IF_ERROR(find("<｜User｜>", &ids.user));
  DI_RETURN_IF_ERROR(find("<｜Assistant｜>", &ids.assistant));
  DI_RETURN_IF_ERROR(find("<｜tool▁calls▁begin｜>", &ids.tool_calls_begin));
  DI_RETURN_IF_ERROR(find("<｜tool▁calls▁end｜>", &ids.tool_calls_end));
  DI_RETURN_IF_ERROR(find("<｜tool▁call▁begin｜>", &ids.tool_call_begin));
  DI_RETURN_IF_ERROR(find("<｜tool▁call▁end｜>", &ids.tool_call_end));
  DI_RETURN_IF_ERROR(find("<｜tool▁sep｜>", &ids.tool_sep));
  DI_RETURN_IF_ERROR(find("<｜tool▁outputs▁begin｜>", &ids.tool_outputs_begin));
  DI_RETURN_IF_ERROR(find("<｜tool▁outputs▁end｜>", &ids.tool_outputs_end));
  DI_RETURN_IF_ERROR(find("<｜tool▁output▁begin｜>", &ids.tool_output_begin));
  DI_RETURN_IF_ERROR(find("<｜tool▁output▁end｜>", &ids.tool_output_end));
  return ChatEncoder(tokenizer, ids);
}

Expected<std::vector<int32_t>> ChatEncoder::encode(std::span<const ChatMessage> messages, const ChatOptions& options) const {
  if (messages.size() > kMaxMessages)
    return make_error(StatusCode::kOutOfRange, "{} messages exceed the limit of {}", messages.size(), kMaxMessages);
  size_t total = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (!m.content && !(m.role == ChatRole::kAssistant))
      return make_error(StatusCode::kInvalidArgument, "messages[{}].content: a {} message needs text", i, role_name(m.role));
    total += m.content ? m.content->size() : 0;
    for (const ChatToolCall& c : m.tool_calls) total += c.type.size() + c.name.size() + c.arguments.size();
  }
  if (total > kMaxTotalBytes)
    return make_error(StatusCode::kOutOfRange, "the conversation's {} bytes exceed the limit of {}", total, kMaxTotalBytes);

  Builder b(*tokenizer_);
  const auto with_index = [](Status s, size_t i) { return s.is_ok() ? s : s.with_context(fmt::format("messages[{}]", i)); };
  DI_RETURN_IF_ERROR(b.control(ids_.bos));
  bool first_system = true;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role != ChatRole::kSystem) continue;
    if (!first_system) b.text("\n\n");
    b.text(*messages[i].content);
    first_system = false;
  }
  bool is_tool = false;          // the last message was a tool output
  bool is_first_call = false;    // a tool call has been rendered in this conversation
  bool is_output_first = true;   // no tool output has been rendered yet
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    switch (m.role) {
      case ChatRole::kSystem:
        break;
      case ChatRole::kUser:
        is_tool = false;
        DI_RETURN_IF_ERROR(with_index(b.control(ids_.user), i));
        b.text(*m.content);
        break;
      case ChatRole::kAssistant:
        if (!m.content) {
          is_tool = false;
          for (const ChatToolCall& call : m.tool_calls) {
            if (!is_first_call) {
              DI_RETURN_IF_ERROR(with_index(b.control(ids_.assistant), i));
              DI_RETURN_IF_ERROR(with_index(b.control(ids_.tool_calls_begin), i));
            } else {
              b.text("\n");
            }
            DI_RETURN_IF_ERROR(with_index(b.control(ids_.tool_call_begin), i));
            b.text(call.type);
            DI_RETURN_IF_ERROR(with_index(b.control(ids_.tool_sep), i));
            b.text(call.name);
            b.text("\n```json\n");
            b.text(call.arguments);
            b.text("\n```");
            DI_RETURN_IF_ERROR(with_index(b.control(ids_.tool_call_end), i));
            if (is_first_call) {
              DI_RETURN_IF_ERROR(with_index(b.control(ids_.tool_calls_end), i));
              DI_RETURN_IF_ERROR(with_index(b.control(ids_.eos), i));
            }
            is_first_call = true;
          }
        } else {
          std::string_view content = *m.content;
          if (options.strip_reasoning) {
            if (size_t p = content.rfind("</think>"); p != std::string_view::npos) content = content.substr(p + 8);
          }
          DI_RETURN_IF_ERROR(with_index(b.control(is_tool ? ids_.tool_outputs_end : ids_.assistant), i));
          is_tool = false;
          b.text(content);
          DI_RETURN_IF_ERROR(with_index(b.control(ids_.eos), i));
        }
        break;
      case ChatRole::kTool:
        is_tool = true;
        if (is_output_first) {
          DI_RETURN_IF_ERROR(with_index(b.control(ids_.tool_outputs_begin), i));
          is_output_first = false;
        } else {
          b.text("\n");
        }
        DI_RETURN_IF_ERROR(with_index(b.control(ids_.tool_output_begin), i));
        b.text(*m.content);
        DI_RETURN_IF_ERROR(with_index(b.control(ids_.tool_output_end), i));
        break;
    }
  }
  if (is_tool) {
    DI_RETURN_IF_ERROR(b.control(ids_.tool_outputs_end));
  } else if (options.add_generation_prompt) {
    DI_RETURN_IF_ERROR(b.control(ids_.assistant));
    if (options.open_think) DI_RETURN_IF_ERROR(b.trusted_text("<think>\n"));
  }
  DI_RETURN_IF_ERROR(b.flush());
  return b.take();
}

Expected<std::vector<ChatMessage>> ChatEncoder::parse_messages(const nlohmann::json& messages) {
  if (!messages.is_array()) return make_error(StatusCode::kInvalidArgument, "messages: expected an array");
  if (messages.size() > kMaxMessages)
    return make_error(StatusCode::kOutOfRange, "messages: {} exceed the limit of {}", messages.size(), kMaxMessages);
  std::vector<ChatMessage> out;
  out.reserve(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    const nlohmann::json& m = messages[i];
    const std::string field = fmt::format("messages[{}]", i);
    if (!m.is_object()) return make_error(StatusCode::kInvalidArgument, "{}: expected an object", field);
    ChatMessage msg;
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return make_error(StatusCode::kInvalidArgument, "{}.role: expected a string", field);
    const std::string r = role->get<std::string>();
    if (r == "system") msg.role = ChatRole::kSystem;
    else if (r == "user") msg.role = ChatRole::kUser;
    else if (r == "assistant") msg.role = ChatRole::kAssistant;
    else if (r == "tool") msg.role = ChatRole::kTool;
    else return make_error(StatusCode::kInvalidArgument, "{}.role: unknown role {}", field, quote_text(r));
    auto content = m.find("content");
    if (content != m.end() && content->is_string()) {
      msg.content = content->get<std::string>();
    } else if (content != m.end() && !content->is_null()) {
      return make_error(StatusCode::kInvalidArgument, "{}.content: expected a string or null", field);
    }
    if (auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null()) {
      if (msg.role != ChatRole::kAssistant)
        return make_error(StatusCode::kInvalidArgument, "{}.tool_calls: only assistant messages have tool calls", field);
      if (!calls->is_array()) return make_error(StatusCode::kInvalidArgument, "{}.tool_calls: expected an array", field);
      for (size_t k = 0; k < calls->size(); ++k) {
        const nlohmann::json& c = (*calls)[k];
        const std::string cfield = fmt::format("{}.tool_calls[{}]", field, k);
        if (!c.is_object()) return make_error(StatusCode::kInvalidArgument, "{}: expected an object", cfield);
        ChatToolCall call;
        if (auto id = c.find("id"); id != c.end() && id->is_string()) call.id = id->get<std::string>();
        if (auto type = c.find("type"); type != c.end()) {
          if (!type->is_string()) return make_error(StatusCode::kInvalidArgument, "{}.type: expected a string", cfield);
          call.type = type->get<std::string>();
        }
        auto fn = c.find("function");
        if (fn == c.end() || !fn->is_object())
          return make_error(StatusCode::kInvalidArgument, "{}.function: expected an object", cfield);
        auto name = fn->find("name");
        if (name == fn->end() || !name->is_string())
          return make_error(StatusCode::kInvalidArgument, "{}.function.name: expected a string", cfield);
        call.name = name->get<std::string>();
        auto args = fn->find("arguments");
        if (args == fn->end() || args->is_null()) {
          call.arguments = "{}";
        } else if (args->is_string()) {
          call.arguments = args->get<std::string>();
        } else if (args->is_object()) {
          call.arguments = args->dump();
        } else {
          return make_error(StatusCode::kInvalidArgument, "{}.function.arguments: expected a string or an object", cfield);
        }
        msg.tool_calls.push_back(std::move(call));
      }
    }
    if (!msg.content && msg.role != ChatRole::kAssistant)
      return make_error(StatusCode::kInvalidArgument, "{}.content: a {} message needs a string", field, r);
    out.push_back(std::move(msg));
  }
  return out;
}

}  // namespace deepinfer
