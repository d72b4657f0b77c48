#include "io/json_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "io/text.h"

namespace deepinfer {

namespace {

using Json = nlohmann::json;

// nlohmann SAX handler that builds the same DOM as nlohmann::json::parse, but stops at the first
// duplicate key or over-deep container. (parse()'s callback hook cannot do this cheaply: its
// callback DOM builder rescans the parent object after every nested object closes, which is
// quadratic in the number of tensors of a safetensors header.)
class StrictDomBuilder {
 public:
  StrictDomBuilder(Json& root, std::vector<std::string>* top_level_keys)
      : root_(root), top_level_keys_(top_level_keys) {}

  bool null() { return put(Json(nullptr)) != nullptr; }
  bool boolean(bool value) { return put(Json(value)) != nullptr; }
  bool number_integer(Json::number_integer_t value) { return put(Json(value)) != nullptr; }
  bool number_unsigned(Json::number_unsigned_t value) { return put(Json(value)) != nullptr; }
  bool number_float(Json::number_float_t value, const Json::string_t& /*text*/) { return put(Json(value)) != nullptr; }
  bool string(Json::string_t& value) { return put(Json(std::move(value))) != nullptr; }
  bool binary(Json::binary_t& value) { return put(Json::binary(std::move(value))) != nullptr; }

  bool start_object(size_t /*n_elements: unknown for text input*/) { return open_container(Json::value_t::object); }
  bool key(Json::string_t& key) {
    // Precondition (guaranteed by the parser): the innermost open container is an object.
    auto& object = stack_.back()->get_ref<Json::object_t&>();
    auto [it, inserted] = object.emplace(key, nullptr);
    if (!inserted) {
      error_ = stack_.size() == 1
                   ? fmt::format("duplicate key {} at the top level", quote_text(key))
                   : fmt::format("duplicate key {} inside {}", quote_text(key), quote_text(labels_[stack_.size() - 2]));
      return false;
    }
    if (stack_.size() == 1 && top_level_keys_ != nullptr) top_level_keys_->push_back(key);
    labels_.back() = key;
    slot_ = &it->second;
    return true;
  }
  bool end_object() { return close_container(); }
  bool start_array(size_t /*n_elements*/) { return open_container(Json::value_t::array); }
  bool end_array() { return close_container(); }

  template <typename Exception>
  bool parse_error(size_t position, const std::string& /*last_token*/, const Exception& ex) {
    // what() is "[json.exception.parse_error.101] parse error at line L, column C: ...".
    std::string_view what = ex.what();
    if (const size_t close = what.find("] "); what.starts_with("[json.exception.") && close != what.npos) {
      what.remove_prefix(close + 2);
    }
    // The excerpt nlohmann quotes may end inside a multi-byte character: escape it.
    error_ = fmt::format("invalid JSON at byte {}: {}", position, escape_text(what, 400));
    return false;
  }

  const std::string& error() const { return error_; }

 private:
  // Places `value` where the grammar says the next value goes; returns its address in the DOM.
  // Addresses stay valid while the value's container is open: only the innermost container
  // grows, and it is never an ancestor's element that moves.
  Json* put(Json&& value) {
    if (stack_.empty()) {
      root_ = std::move(value);
      return &root_;
    }
    Json& top = *stack_.back();
    if (top.is_array()) {
      auto& array = top.get_ref<Json::array_t&>();
      array.push_back(std::move(value));
      return &array.back();
    }
    *slot_ = std::move(value);
    return slot_;
  }

  bool open_container(Json::value_t type) {
    if (stack_.size() >= kMaxJsonDepth) {
      error_ = fmt::format("JSON nests deeper than {} levels", kMaxJsonDepth);
      return false;
    }
    if (!stack_.empty() && stack_.back()->is_array()) labels_.back() = "[]";
    stack_.push_back(put(Json(type)));
    labels_.emplace_back();
    return true;
  }

  bool close_container() {
    stack_.pop_back();
    labels_.pop_back();
    return true;
  }

  Json& root_;
  std::vector<std::string>* top_level_keys_;
  std::vector<Json*> stack_;         // open containers, outermost first
  std::vector<std::string> labels_;  // per open container: the member being filled (for errors)
  Json* slot_ = nullptr;             // the object member created by the last key()
  std::string error_;
};

}  // namespace

Expected<nlohmann::json> parse_json_strict(std::string_view text, std::vector<std::string>* top_level_keys) {
  if (const auto bad = find_invalid_utf8(text)) {
    return make_error(StatusCode::kCorrupt, "not valid UTF-8 (byte {})", *bad);
  }
  if (top_level_keys != nullptr) top_level_keys->clear();
  Json root;
  StrictDomBuilder builder(root, top_level_keys);
  const bool ok = Json::sax_parse(text.begin(), text.end(), &builder, Json::input_format_t::json,
                                  /*strict=*/true, /*ignore_comments=*/false);
  if (!ok) {
    if (top_level_keys != nullptr) top_level_keys->clear();
    return Status(StatusCode::kCorrupt, builder.error().empty() ? std::string("invalid JSON") : builder.error());
  }
  return root;
}

Expected<nlohmann::json> read_json_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return make_error(StatusCode::kNotFound, "{} not found", quote_text(path, 4096));
    return make_error(StatusCode::kInvalidArgument, "cannot open {}: {}", quote_text(path, 4096), std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error(StatusCode::kInvalidArgument, "{} is not a regular file", quote_text(path, 4096));
  }
  // Check the size before allocating; the read loop re-checks in case the file grows meanwhile.
  const auto too_big = [&] {
    return make_error(StatusCode::kCorrupt, "{} is larger than the {} MiB limit for JSON files", quote_text(path, 4096),
                      kMaxJsonFileBytes >> 20);
  };
  if (static_cast<uint64_t>(st.st_size) > kMaxJsonFileBytes) {
    ::close(fd);
    return too_big();
  }
  std::string text;
  text.resize(static_cast<size_t>(st.st_size) + 1);
  size_t n_read = 0;
  for (;;) {
    if (n_read == text.size()) {
      if (text.size() > kMaxJsonFileBytes) {
        ::close(fd);
        return too_big();
      }
      text.resize(std::min(text.size() * 2, kMaxJsonFileBytes + 1));
    }
    const ssize_t n = ::read(fd, text.data() + n_read, text.size() - n_read);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return make_error(StatusCode::kInvalidArgument, "cannot read {}: {}", quote_text(path, 4096), std::strerror(err));
    }
    if (n == 0) break;
    n_read += static_cast<size_t>(n);
  }
  ::close(fd);
  text.resize(n_read);
  auto json = parse_json_strict(text);
  if (!json) return json.status().with_context(quote_text(path, 4096));
  return json;
}

}  // namespace deepinfer
