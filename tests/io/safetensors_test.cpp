// safetensors reader/writer: round trips, and one crafted file per validation rule.
#include "io/safetensors.h"

#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "io/text.h"
#include "io_test_util.h"

namespace deepinfer {
namespace {

using test::expect_error;
using test::make_test_dir;
using test::patterned_tensor;
using test::safetensors_bytes;
using test::write_file;
using Safetensors = test::IoTest;
using SafetensorsRejects = test::IoTest;
using SafetensorsWrite = test::IoTest;

constexpr DType kAllDTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kF64, DType::kI64,
                                DType::kI32, DType::kI16, DType::kI8,   DType::kU8,     DType::kBool};

// Writes `bytes` as crafted.safetensors in a fresh directory and opens it; returns the status.
Status open_crafted(const std::string& bytes) {
  const std::string path = make_test_dir() + "/crafted.safetensors";
  write_file(path, bytes);
  auto file = SafetensorsFile::open(path);
  if (file) return Status::ok();
  return file.status();
}

void expect_corrupt(const std::string& header, size_t n_data, std::initializer_list<std::string_view> needles,
                    StatusCode code = StatusCode::kCorrupt) {
  const Status status = open_crafted(safetensors_bytes(header, n_data));
  expect_error(status, code, {"crafted.safetensors"});
  expect_error(status, code, needles);
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.n_bytes() == b.n_bytes() && (a.n_bytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.n_bytes()) == 0);
}

TEST_F(Safetensors, RoundTripsEveryDtype) {
  const std::string path = make_test_dir() + "/all.safetensors";
  std::vector<std::pair<std::string, Tensor>> tensors;
  int seed = 0;
  for (DType dtype : kAllDTypes) {
    const std::string name(dtype_name(dtype));
    tensors.emplace_back("t." + name, patterned_tensor(dtype, {3, 5}, seed++));
    tensors.emplace_back("scalar." + name, patterned_tensor(dtype, {}, seed++));
    tensors.emplace_back("empty." + name, patterned_tensor(dtype, {0, 7}, seed++));
  }
  tensors.emplace_back("rank4", patterned_tensor(DType::kBF16, {2, 1, 3, 2}, seed++));
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "héllo \"q\""}};
  ASSERT_TRUE(write_safetensors(path, tensors, metadata).is_ok());

  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.has_value()) << file.status().to_string();
  EXPECT_EQ(file->path(), path);
  EXPECT_EQ(file->metadata(), metadata);
  EXPECT_EQ(file->data_offset() % 8, 0u);
  ASSERT_EQ(file->entries().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, expected] = tensors[i];
    const SafetensorsEntry& entry = file->entries()[i];  // file order = write order
    EXPECT_EQ(entry.name, name);
    EXPECT_EQ(entry.dtype, expected.dtype()) << name;
    EXPECT_EQ(entry.shape, expected.shape()) << name;
    EXPECT_EQ(entry.n_bytes(), expected.n_bytes()) << name;
    ASSERT_EQ(file->find(name), &entry);
    const Tensor actual = file->tensor(entry);
    EXPECT_EQ(actual.describe(), expected.describe());
    EXPECT_EQ(actual.buffer()->n_bytes(), expected.n_bytes()) << "the view's buffer is exactly the tensor";
    EXPECT_TRUE(same_bytes(actual, expected)) << name;
  }
  EXPECT_EQ(file->find("missing"), nullptr);
}

TEST_F(Safetensors, EntriesKeepFileOrderNotKeyOrder) {
  const std::string path = make_test_dir() + "/order.safetensors";
  ASSERT_TRUE(write_safetensors(path, {{"z", patterned_tensor(DType::kF32, {2}, 1)},
                                       {"a", patterned_tensor(DType::kF32, {1}, 2)},
                                       {"m", patterned_tensor(DType::kU8, {3}, 3)}})
                  .is_ok());
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.has_value()) << file.status().to_string();
  ASSERT_EQ(file->entries().size(), 3u);
  EXPECT_EQ(file->entries()[0].name, "z");
  EXPECT_EQ(file->entries()[1].name, "a");
  EXPECT_EQ(file->entries()[2].name, "m");
  EXPECT_EQ(file->entries()[1].begin, 8u);
  EXPECT_EQ(file->entries()[2].end, 15u);
}

TEST_F(Safetensors, TensorOutlivesTheFileObject) {
  const std::string path = make_test_dir() + "/alive.safetensors";
  const Tensor expected = patterned_tensor(DType::kI32, {4, 4}, 9);
  ASSERT_TRUE(write_safetensors(path, {{"w", expected}}).is_ok());
  Tensor view;
  {
    auto file = SafetensorsFile::open(path);
    ASSERT_TRUE(file.has_value());
    view = file->tensor(*file->find("w"));
  }
  EXPECT_TRUE(same_bytes(view, expected));
}

TEST_F(Safetensors, EmptyFileListIsValid) {
  const std::string bytes = safetensors_bytes("{}", 0);
  ASSERT_EQ(bytes.size(), 16u);
  auto parsed = parse_safetensors_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  ASSERT_TRUE(parsed.has_value()) << parsed.status().to_string();
  EXPECT_TRUE(parsed->entries.empty());
  EXPECT_EQ(parsed->data_offset, 16u);
  EXPECT_EQ(parsed->data_bytes, 0u);

  const std::string path = make_test_dir() + "/none.safetensors";
  ASSERT_TRUE(write_safetensors(path, {}).is_ok());
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.has_value()) << file.status().to_string();
  EXPECT_TRUE(file->entries().empty());
}

TEST_F(Safetensors, ZeroSizeTensorsMayShareAnOffset) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
                             R"("b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("c":{"dtype":"BF16","shape":[3,0],"data_offsets":[4,4]},)"
                             R"("d":{"dtype":"BF16","shape":[0],"data_offsets":[4,4]}})";
  const std::string bytes = safetensors_bytes(header, 4);
  auto parsed = parse_safetensors_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  ASSERT_TRUE(parsed.has_value()) << parsed.status().to_string();
  EXPECT_EQ(parsed->entries.size(), 4u);
}

TEST_F(Safetensors, UnpaddedHeaderIsValid) {
  const std::string header = R"({"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}})";
  const std::string bytes = safetensors_bytes(header, 3, /*pad=*/false);
  auto parsed = parse_safetensors_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  ASSERT_TRUE(parsed.has_value()) << parsed.status().to_string();
  EXPECT_EQ(parsed->data_offset, 8 + header.size());
}

// ---- one crafted file per error class -------------------------------------------------------

TEST_F(SafetensorsRejects, FileShorterThanTheLengthField) {
  expect_error(open_crafted(std::string("\x02\0\0\0\0", 5)), StatusCode::kCorrupt, {"crafted.safetensors", "5 bytes"});
}

TEST_F(SafetensorsRejects, HeaderLengthAboveTheLimit) {
  std::string bytes = safetensors_bytes("{}", 0);
  const uint64_t n = 100'000'001;  // must be rejected before anything of that size is allocated
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  expect_error(open_crafted(bytes), StatusCode::kCorrupt, {"crafted.safetensors", "100000001", "limit"});
}

TEST_F(SafetensorsRejects, HeaderLengthPastEndOfFile) {
  std::string bytes = safetensors_bytes("{}", 0);
  bytes[0] = 64;
  expect_error(open_crafted(bytes), StatusCode::kCorrupt, {"crafted.safetensors", "header length 64", "past the end"});
}

TEST_F(SafetensorsRejects, HeaderNotUtf8) { expect_corrupt("{\"a\xC0\xAF\":{}}", 0, {"UTF-8", "byte 3"}); }

TEST_F(SafetensorsRejects, HeaderNotJson) { expect_corrupt(R"({"a":{"dtype":"F32",)", 0, {"invalid JSON", "line 1"}); }

TEST_F(SafetensorsRejects, HeaderNotAnObject) {
  expect_corrupt("[1, 2]", 0, {"must be a JSON object", "got array"});
  expect_corrupt(" {}", 0, {"must be a JSON object"});  // the format requires '{' as the first byte
}

TEST_F(SafetensorsRejects, DuplicateTensorName) {
  expect_corrupt(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                 R"("w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                 2, {"duplicate key 'w'"});
}

TEST_F(SafetensorsRejects, DuplicateFieldInsideAnEntry) {
  expect_corrupt(R"({"w":{"dtype":"U8","dtype":"F32","shape":[1],"data_offsets":[0,1]}})", 1,
                 {"duplicate key 'dtype'", "inside 'w'"});
}

TEST_F(SafetensorsRejects, EntryNotAnObject) {
  expect_corrupt(R"({"w":[0,1]})", 0, {"tensor 'w'", "must be an object"});
}

TEST_F(SafetensorsRejects, MissingField) {
  expect_corrupt(R"({"w":{"shape":[1],"data_offsets":[0,1]}})", 1, {"tensor 'w'", "missing field 'dtype'"});
  expect_corrupt(R"({"w":{"dtype":"U8","data_offsets":[0,1]}})", 1, {"tensor 'w'", "missing field 'shape'"});
  expect_corrupt(R"({"w":{"dtype":"U8","shape":[1]}})", 1, {"tensor 'w'", "missing field 'data_offsets'"});
}

TEST_F(SafetensorsRejects, WrongTypedField) {
  expect_corrupt(R"({"w":{"dtype":1,"shape":[1],"data_offsets":[0,1]}})", 1, {"tensor 'w'", "field 'dtype'"});
  expect_corrupt(R"({"w":{"dtype":"U8","shape":1,"data_offsets":[0,1]}})", 1, {"tensor 'w'", "field 'shape'"});
  expect_corrupt(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}})", 1,
                 {"tensor 'w'", "field 'data_offsets'"});
  expect_corrupt(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":["0","1"]}})", 1,
                 {"tensor 'w'", "field 'data_offsets'"});
}

TEST_F(SafetensorsRejects, UnknownDtype) {
  expect_corrupt(R"({"w":{"dtype":"F8_E5M2","shape":[1],"data_offsets":[0,1]}})", 1, {"tensor 'w'", "'F8_E5M2'"},
                 StatusCode::kUnsupported);
}

TEST_F(SafetensorsRejects, NegativeDimension) {
  expect_corrupt(R"({"w":{"dtype":"U8","shape":[2,-1],"data_offsets":[0,0]}})", 0,
                 {"tensor 'w'", "field 'shape' dimension 1", "-1"});
}

TEST_F(SafetensorsRejects, NonIntegerDimension) {
  expect_corrupt(R"({"w":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})", 1,
                 {"tensor 'w'", "field 'shape' dimension 0", "1.5"});
}

TEST_F(SafetensorsRejects, ShapeTimesDtypeSizeOverflows) {
  // 2^32 * 2^32 overflows before the trailing 0 could make the product zero.
  expect_corrupt(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}})", 0,
                 {"tensor 'w'", "overflows"});
  // 2^62 elements fit, 2^62 * 4 bytes do not.
  expect_corrupt(R"({"w":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})", 0,
                 {"tensor 'w'", "overflows"});
}

TEST_F(SafetensorsRejects, ByteRangeDisagreesWithShape) {
  expect_corrupt(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", 12,
                 {"tensor 'w'", "needs 16 bytes", "spans 12"});
}

TEST_F(SafetensorsRejects, OffsetsEndBeforeTheyBegin) {
  expect_corrupt(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[8,4]}})", 8,
                 {"tensor 'w'", "[8, 4]", "ends before"});
}

TEST_F(SafetensorsRejects, OverlappingTensors) {
  expect_corrupt(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                 12, {"tensor 'b'", "overlaps tensor 'a'"});
}

TEST_F(SafetensorsRejects, GapBetweenTensors) {
  expect_corrupt(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                 R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                 12, {"tensor 'b'", "gap", "'a' ends at byte 4"});
}

TEST_F(SafetensorsRejects, FirstTensorNotAtZero) {
  expect_corrupt(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8, {"tensor 'a'", "gap", "starts"});
}

TEST_F(SafetensorsRejects, DataStopsShortOfEndOfFile) {
  expect_corrupt(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8, {"trailing", "8 bytes"});
  expect_corrupt("{}", 4, {"no tensors", "4 bytes"});
}

TEST_F(SafetensorsRejects, DataRunsPastEndOfFile) {
  expect_corrupt(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4, {"tensor 'a'", "past the end"});
}

TEST_F(SafetensorsRejects, MetadataNotAnObjectOfStrings) {
  expect_corrupt(R"({"__metadata__":["pt"]})", 0, {"'__metadata__'", "object"});
  expect_corrupt(R"({"__metadata__":{"format":"pt","step":3}})", 0, {"'__metadata__'", "'step'", "string"});
}

TEST_F(SafetensorsRejects, NestingTooDeep) {
  const std::string deep = R"({"__metadata__":)" + std::string(200, '[') + std::string(200, ']') + "}";
  expect_corrupt(deep, 0, {"deeper than 128"});
}

TEST_F(SafetensorsRejects, HostileNamesAreEscapedAndCapped) {
  const Status status = open_crafted(safetensors_bytes(R"({")" + std::string("bad\\nname") + std::string(1000, 'x') +
                                                           R"(":{"dtype":"U8","shape":[1],"data_offsets":[0,2]}})",
                                                       2));
  expect_error(status, StatusCode::kCorrupt, {"'bad\\x0Aname", "(1008 bytes)"});
  EXPECT_EQ(status.message().find('\n'), std::string::npos);
  EXPECT_LT(status.message().size(), 600u);
}

// ---- writer ---------------------------------------------------------------------------------

TEST_F(SafetensorsWrite, RejectsBadInput) {
  const std::string path = make_test_dir() + "/w.safetensors";
  const Tensor t = patterned_tensor(DType::kU8, {2}, 0);
  expect_error(write_safetensors(path, {{"a", t}, {"a", t}}), StatusCode::kInvalidArgument, {"'a'", "twice"});
  expect_error(write_safetensors(path, {{"__metadata__", t}}), StatusCode::kInvalidArgument, {"reserved"});
  expect_error(write_safetensors(path, {{"u", Tensor()}}), StatusCode::kInvalidArgument, {"'u'", "undefined"});
  expect_error(write_safetensors(path, {{"bad\xff", t}}), StatusCode::kInvalidArgument, {"UTF-8"});
  expect_error(write_safetensors(make_test_dir() + "/no/such/dir/x.safetensors", {{"a", t}}),
               StatusCode::kInvalidArgument, {"x.safetensors"});
}

TEST_F(SafetensorsWrite, HeaderIsPaddedToEightBytes) {
  const std::string path = make_test_dir() + "/pad.safetensors";
  ASSERT_TRUE(write_safetensors(path, {{"abc", patterned_tensor(DType::kU8, {1}, 0)}}).is_ok());
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.has_value()) << file.status().to_string();
  EXPECT_EQ(file->data_offset() % 8, 0u);
}

TEST(TextHelpers, Utf8Validation) {
  EXPECT_FALSE(find_invalid_utf8("plain ascii, é, 日本, 🙂").has_value());
  EXPECT_EQ(find_invalid_utf8("ab\xC0\xAF"), 2u);        // overlong '/'
  EXPECT_EQ(find_invalid_utf8("\xED\xA0\x80"), 0u);      // UTF-16 surrogate
  EXPECT_EQ(find_invalid_utf8("\xF4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(find_invalid_utf8("ok\xE6\x97"), 2u);        // truncated sequence
  EXPECT_EQ(quote_text("a'b"), "'a\\x27b'");
  EXPECT_EQ(quote_text("日本語", 4), "'日'... (9 bytes)");
}

}  // namespace
}  // namespace deepinfer
