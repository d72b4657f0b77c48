// UnicodeRegex (Oniguruma → PCRE2 translation), PreTokenizer split behaviours (HF's examples for
// Split on "the-final--countdown"), DeepSeek-V3's pre-tokenizer on hand-checked inputs, and the
// UTF-8 and byte-level helpers.
#include "tokenizer/pre_tokenizer.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "io/text.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/unicode_regex.h"
#include "tokenizer/utf8.h"

namespace deepinfer {
namespace {

std::vector<std::string> split(const PreTokenizer& pre, std::string_view text) {
  PreTokenizerScratch scratch;
  std::vector<TextPiece> pieces;
  Status s = pre.split(text, TextPiece{0, text.size()}, pieces, scratch);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  std::vector<std::string> out;
  for (const TextPiece& p : pieces) out.emplace_back(text.substr(p.begin, p.end - p.begin));
  return out;
}

PreTokenizer one_split(std::string_view pattern, SplitBehavior behavior, bool invert = false) {
  PreTokenizer pre;
  auto regex = UnicodeRegex::compile(pattern);
  EXPECT_TRUE(regex) << regex.status().to_string();
  pre.add_split(std::move(*regex), behavior, invert);
  return pre;
}

using V = std::vector<std::string>;

TEST(PreTokenizer, SplitBehavioursMatchHf) {
  const std::string s = "the-final--countdown";
  EXPECT_EQ(split(one_split("-", SplitBehavior::kRemoved), s), (V{"the", "final", "countdown"}));
  EXPECT_EQ(split(one_split("-", SplitBehavior::kIsolated), s), (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(split(one_split("-", SplitBehavior::kMergedWithPrevious), s), (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(split(one_split("-", SplitBehavior::kMergedWithNext), s), (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(split(one_split("-", SplitBehavior::kContiguous), s), (V{"the", "-", "final", "--", "countdown"}));
  // invert: the non-matching parts play the delimiter.
  EXPECT_EQ(split(one_split("-", SplitBehavior::kRemoved, true), s), (V{"-", "-", "-"}));
  EXPECT_EQ(split(one_split("-", SplitBehavior::kMergedWithPrevious, true), s), (V{"the", "-final", "-", "-countdown"}));
}

TEST(PreTokenizer, EmptyMatchesSplitNothing) {
  EXPECT_EQ(split(one_split("x*", SplitBehavior::kIsolated), "abxxc"), (V{"ab", "xx", "c"}));
  EXPECT_EQ(split(one_split("(?=b)", SplitBehavior::kIsolated), "abab"), (V{"abab"}));
  EXPECT_TRUE(split(one_split("a", SplitBehavior::kIsolated), "").empty());
}

TEST(PreTokenizer, LiteralPatternsAreEscaped) {
  const std::string p = PreTokenizer::escape_literal("a.b[c]\\s");
  EXPECT_EQ(split(one_split(p, SplitBehavior::kIsolated), "xa.b[c]\\sy a_b[c]\\sy"), (V{"x", "a.b[c]\\s", "y a_b[c]\\sy"}));
}

TEST(UnicodeRegex, WhitespaceIsOnigurumasWhiteSpaceProperty) {
  auto s = UnicodeRegex::compile("\\s+");
  auto nots = UnicodeRegex::compile("\\S+");
  auto in_class = UnicodeRegex::compile("[^\\s\\p{L}]+");
  ASSERT_TRUE(s && nots && in_class);
  RegexScratch scratch;
  const auto whole_match = [&](const UnicodeRegex& r, std::string_view text) {
    size_t b = 0, e = 0;
    auto found = r.find(text, 0, &b, &e, scratch);
    return found && *found && b == 0 && e == text.size();
  };
  for (std::string_view ws : {"\t", "\n", "\x0B", "\x0C", "\r", " ", "\xC2\x85", "\xC2\xA0", "\xE1\x9A\x80", "\xE2\x80\x80",
                              "\xE2\x80\x8A", "\xE2\x80\xA8", "\xE2\x80\xA9", "\xE2\x80\xAF", "\xE2\x81\x9F", "\xE3\x80\x80"}) {
    EXPECT_TRUE(whole_match(*s, ws)) << escape_text(ws);
    EXPECT_FALSE(whole_match(*nots, ws));
  }
  // U+180E (Mongolian vowel separator) is Cf since Unicode 6.3: PCRE2's \s has it, Oniguruma's not.
  for (std::string_view other : {"\xE1\xA0\x8E", "\xE2\x80\x8B", "\xEF\xBB\xBF", "a", "1"}) {
    EXPECT_FALSE(whole_match(*s, other)) << escape_text(other);
    EXPECT_TRUE(whole_match(*nots, other)) << escape_text(other);
  }
  EXPECT_TRUE(whole_match(*in_class, "!1\xE1\xA0\x8E"));
  EXPECT_FALSE(whole_match(*in_class, "! "));
  EXPECT_NE(s->translated().find("\\x{85}"), std::string::npos);
}

TEST(UnicodeRegex, OnigurumaHexDigitClass) {
  auto h = UnicodeRegex::compile("\\h+");
  ASSERT_TRUE(h);
  RegexScratch scratch;
  size_t b = 0, e = 0;
  ASSERT_TRUE(*h->find("zz0fA9g", 0, &b, &e, scratch));
  EXPECT_EQ(b, 2u);
  EXPECT_EQ(e, 6u);
}

TEST(UnicodeRegex, BadPatternsAreErrors) {
  auto a = UnicodeRegex::compile("(ab");
  ASSERT_FALSE(a);
  EXPECT_EQ(a.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(a.status().message().find("offset"), std::string::npos) << a.status().message();
  auto b = UnicodeRegex::compile("[a[b]]");
  ASSERT_FALSE(b);
  EXPECT_EQ(b.status().code(), StatusCode::kUnsupported);
  EXPECT_FALSE(UnicodeRegex::compile("[abc"));
  EXPECT_FALSE(UnicodeRegex::compile("abc\\"));
  EXPECT_FALSE(UnicodeRegex::compile("[\\S]"));
  EXPECT_TRUE(UnicodeRegex::compile("[]a]"));       // ']' first in a class is literal
  EXPECT_TRUE(UnicodeRegex::compile("[[:alpha:]]"));  // POSIX bracket, not a nested class
}

TEST(UnicodeRegex, CatastrophicPatternStopsWithAnError) {
  auto r = UnicodeRegex::compile("(a+)+$");
  ASSERT_TRUE(r);
  RegexScratch scratch;
  size_t b = 0, e = 0;
  const std::string subject = std::string(40, 'a') + "!";
  auto found = r->find(subject, 0, &b, &e, scratch);
  // Either PCRE2's auto-possessification defuses it (no match) or the match limit stops it.
  if (!found) {
    EXPECT_EQ(found.status().code(), StatusCode::kResourceExhausted);
  } else {
    EXPECT_FALSE(*found);
  }
}

PreTokenizer deepseek_pre() {
  PreTokenizer pre;
  for (const char* p : {"\\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
                        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
                        "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"}) {
    auto r = UnicodeRegex::compile(p);
    EXPECT_TRUE(r) << r.status().to_string();
    pre.add_split(std::move(*r), SplitBehavior::kIsolated, false);
  }
  return pre;
}

TEST(PreTokenizer, DeepSeekV3Pieces) {
  const PreTokenizer pre = deepseek_pre();
  // Pieces as HF's pre_tokenize_str reports them (tests/fixtures/tokenizer/golden_extra.json probes).
  EXPECT_EQ(split(pre, "12345"), (V{"123", "45"}));
  EXPECT_EQ(split(pre, "x\r\n\r\n y"), (V{"x", "\r\n\r\n", " y"}));
  EXPECT_EQ(split(pre, "x   "), (V{"x", "   "}));
  EXPECT_EQ(split(pre, "a\xC2\xA0 b"), (V{"a", "\xC2\xA0", " b"}));
  EXPECT_EQ(split(pre, "Hello world!"), (V{"Hello", " world", "!"}));
  EXPECT_EQ(split(pre, "中文English混合"), (V{"中文", "English", "混合"}));
  EXPECT_EQ(split(pre, "don't .NET"), (V{"don", "'t", " .", "NET"}));
  EXPECT_EQ(split(pre, "a  \n\n  b"), (V{"a", "  \n\n", " ", " b"}));
}

TEST(Utf8, LossyConversionReplacesMaximalSubparts) {
  std::string out;
  utf8::append_lossy(out, "a\xF0\x9F\x98" "b\xE4\xB8\xAD\xC0\xAF\xED\xA0\x80\xF4\x90\x80\x80z\xE2\x82");
  // F0 9F 98 (truncated) → 1; C0, AF → 2; ED A0 80 (surrogate: ED then A0 invalid) → 3;
  // F4 90 → F4 alone (90 out of range) + 90, 80, 80 → 4; trailing E2 82 → 1.
  const std::string r(utf8::kReplacement);
  EXPECT_EQ(out, "a" + r + "b\xE4\xB8\xAD" + r + r + r + r + r + r + r + r + r + "z" + r);
  EXPECT_TRUE(utf8::is_valid(out));
}

TEST(Utf8, IncompleteSuffix) {
  EXPECT_EQ(utf8::incomplete_suffix_length(""), 0u);
  EXPECT_EQ(utf8::incomplete_suffix_length("abc"), 0u);
  EXPECT_EQ(utf8::incomplete_suffix_length("a\xE4"), 1u);
  EXPECT_EQ(utf8::incomplete_suffix_length("a\xE4\xB8"), 2u);
  EXPECT_EQ(utf8::incomplete_suffix_length("a\xE4\xB8\xAD"), 0u);
  EXPECT_EQ(utf8::incomplete_suffix_length("\xF0\x9F\x98"), 3u);
  EXPECT_EQ(utf8::incomplete_suffix_length("\xF0\x9F\x98\x80"), 0u);
  EXPECT_EQ(utf8::incomplete_suffix_length("\xE0\x80"), 0u);  // overlong: never completes
  EXPECT_EQ(utf8::incomplete_suffix_length("\xC0"), 0u);
  EXPECT_EQ(utf8::incomplete_suffix_length("\x80\x80"), 0u);
}

TEST(ByteLevel, AlphabetRoundTrips) {
  for (int b = 0; b < 256; ++b) {
    const std::string s(1, static_cast<char>(b));
    const std::string enc = byte_level::encode(s);
    EXPECT_EQ(byte_level::decode(enc), s);
  }
  EXPECT_EQ(byte_level::encode(" the\n"), "ĠtheĊ");
  EXPECT_EQ(byte_level::decode("ĠtheĊ"), " the\n");
  EXPECT_FALSE(byte_level::decode("<｜User｜>").has_value());
  EXPECT_FALSE(byte_level::decode("\xFF").has_value());
}

}  // namespace
}  // namespace deepinfer
