// Helpers shared by the io tests: per-test temp directories, crafted safetensors bytes, and an
// error matcher. Test-only; not part of di_io.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/status.h"
#include "core/tensor.h"

namespace deepinfer::test {

// This test's scratch directory under ::testing::TempDir() (unique per process and test).
inline std::filesystem::path test_dir_path() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return std::filesystem::path(::testing::TempDir()) /
         fmt::format("deepinfer_io_{}_{}_{}", ::getpid(), info->test_suite_name(), info->name());
}

// test_dir_path(), emptied and created.
inline std::string make_test_dir() {
  const std::filesystem::path dir = test_dir_path();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

// Fixture that removes the test's scratch directory afterwards.
class IoTest : public ::testing::Test {
 protected:
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(test_dir_path(), ec);
  }
};

inline void write_file(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// [u64 LE length][header, space-padded to a multiple of 8 if `pad`][n_data bytes 0, 1, 2, ...]
inline std::string safetensors_bytes(std::string_view header, size_t n_data, bool pad = true) {
  std::string h(header);
  if (pad) h.append((8 - h.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((static_cast<uint64_t>(h.size()) >> (8 * i)) & 0xFF);
  out += h;
  for (size_t i = 0; i < n_data; ++i) out += static_cast<char>(i & 0xFF);
  return out;
}

// A host tensor whose bytes are a deterministic function of `seed`.
inline Tensor patterned_tensor(DType dtype, const std::vector<int64_t>& shape, int seed) {
  Tensor t = Tensor::empty_host(dtype, shape);
  auto* bytes = static_cast<uint8_t*>(t.raw_data());
  for (size_t i = 0; i < t.n_bytes(); ++i) bytes[i] = static_cast<uint8_t>(i * 31 + static_cast<size_t>(seed) * 7 + 1);
  return t;
}

// Asserts `status` has `code` and its message contains every needle, and no address-like text.
inline void expect_error(const Status& status, StatusCode code, std::initializer_list<std::string_view> needles) {
  EXPECT_EQ(status.code(), code) << status.to_string();
  for (std::string_view needle : needles) {
    EXPECT_NE(status.message().find(needle), std::string::npos)
        << "expected \"" << needle << "\" in: " << status.message();
  }
  EXPECT_EQ(status.message().find("0x"), std::string::npos) << status.message();
}

}  // namespace deepinfer::test
