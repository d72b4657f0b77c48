#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/unicode_regex.h"

#include <pcre2.h>

#include <algorithm>

#include "core/check.h"
#include "io/text.h"

namespace deepinfer {

namespace {

// Oniguruma's \s (the White_Space property), as a class body.
constexpr std::string_view kWhiteSpaceClassBody =
    "\\x{09}-\\x{0D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";
constexpr std::string_view kHexClassBody = "0-9a-fA-F";

// JIT stack: PCRE2 grows it from 32 KiB up to this bound; long runs of one class need little.
constexpr size_t kJitStackMaxBytes = size_t{8} << 20;

// Rewrites the Oniguruma-only meanings (see UnicodeRegex::compile) into PCRE2 syntax.
Expected<std::string> translate(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  size_t class_start = 0;  // index in p just after '[' or '[^'
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\') {
      if (i + 1 >= p.size()) return make_error(StatusCode::kCorrupt, "pattern ends with a lone backslash");
      const char e = p[++i];
      const bool negated = e == 'S' || e == 'H';
      std::string_view body;
      if (e == 's' || e == 'S') body = kWhiteSpaceClassBody;
      if (e == 'h' || e == 'H') body = kHexClassBody;
      if (body.empty()) {
        out += '\\';
        out += e;
      } else if (!in_class) {
        out += negated ? "[^" : "[";
        out += body;
        out += ']';
      } else if (!negated) {
        out += body;
      } else {
        return make_error(StatusCode::kUnsupported, "\\{} inside a character class is not supported", e);
      }
      continue;
    }
    if (in_class) {
      if (c == ']' && i > class_start) {
        in_class = false;
      } else if (c == '[') {
        if (i + 1 < p.size() && p[i + 1] == ':') {
          // POSIX bracket [:name:] — copy through to its closing ":]".
          const size_t close = p.find(":]", i + 2);
          if (close == std::string_view::npos) return make_error(StatusCode::kCorrupt, "unterminated [: in a class");
          out.append(p.substr(i, close + 2 - i));
          i = close + 1;
          continue;
        }
        return make_error(StatusCode::kUnsupported, "nested character classes are not supported");
      }
      out += c;
      continue;
    }
    if (c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      class_start = i + 1;  // a ']' right here is a literal
      continue;
    }
    out += c;
  }
  if (in_class) return make_error(StatusCode::kCorrupt, "unterminated character class");
  return out;
}

}  // namespace

RegexScratch::RegexScratch() {
  match_data_ = pcre2_match_data_create(1, nullptr);
  match_context_ = pcre2_match_context_create(nullptr);
  jit_stack_ = pcre2_jit_stack_create(32 * 1024, kJitStackMaxBytes, nullptr);
  DI_CHECK(match_data_ != nullptr && match_context_ != nullptr);
  if (jit_stack_ != nullptr) pcre2_jit_stack_assign(match_context_, nullptr, jit_stack_);
}

RegexScratch::~RegexScratch() {
  pcre2_match_data_free(match_data_);
  pcre2_match_context_free(match_context_);
  if (jit_stack_ != nullptr) pcre2_jit_stack_free(jit_stack_);
}

void UnicodeRegex::CodeDeleter::operator()(pcre2_real_code_8* code) const { pcre2_code_free(code); }

Expected<UnicodeRegex> UnicodeRegex::compile(std::string_view pattern) {
  auto translated = translate(pattern);
  if (!translated) return translated.status().with_context(fmt::format("regex {}", quote_text(pattern)));
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated->data()), translated->size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof message);
    return make_error(StatusCode::kCorrupt, "regex {}: {} at offset {}", quote_text(pattern),
                      reinterpret_cast<const char*>(message), static_cast<size_t>(error_offset));
  }
  // JIT is an optimisation: where it is unavailable pcre2_match interprets the same pattern.
  const bool jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  UnicodeRegex regex;
  regex.jit_ = jit;
  regex.code_ = std::shared_ptr<pcre2_real_code_8>(code, CodeDeleter{});
  regex.translated_ = std::move(*translated);
  return regex;
}

Expected<bool> UnicodeRegex::find(std::string_view subject, size_t start, size_t* begin, size_t* end,
                                  RegexScratch& scratch) const {
  // The match limit bounds backtracking work per call; scaling it with the subject keeps
  // legitimate long runs (megabytes of spaces) matching while a catastrophic pattern stops.
  const uint64_t limit = std::min<uint64_t>(UINT32_MAX, 10'000'000 + 64 * static_cast<uint64_t>(subject.size()));
  pcre2_set_match_limit(scratch.match_context_, static_cast<uint32_t>(limit));
  const auto* data = reinterpret_cast<PCRE2_SPTR>(subject.data());
  int rc = jit_ ? pcre2_jit_match(code_.get(), data, subject.size(), start, 0, scratch.match_data_,
                                        scratch.match_context_)
                      : pcre2_match(code_.get(), data, subject.size(), start, PCRE2_NO_UTF_CHECK, scratch.match_data_,
                                    scratch.match_context_);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
    // Out of JIT stack: the interpreter keeps its backtracking state on the heap.
    rc = pcre2_match(code_.get(), data, subject.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, scratch.match_data_,
                     scratch.match_context_);
  }
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(rc, message, sizeof message);
    return make_error(StatusCode::kResourceExhausted, "regex {}: {}", quote_text(translated_, 80),
                      reinterpret_cast<const char*>(message));
  }
  // rc == 0 only says the ovector is too small for the groups; pair 0 is always set.
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(scratch.match_data_);
  *begin = ovector[0];
  *end = ovector[1];
  return true;
}

}  // namespace deepinfer
