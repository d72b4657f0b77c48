// Checkpoint: model-directory discovery, index.json sharding rules, config.json handling.
#include "io/checkpoint.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "io/json_file.h"
#include "io_test_util.h"

namespace deepinfer {
namespace {

namespace fs = std::filesystem;
using test::expect_error;
using test::make_test_dir;
using test::patterned_tensor;
using test::write_file;
using CheckpointOpen = test::IoTest;
using CheckpointRejects = test::IoTest;
using ReadJsonFile = test::IoTest;

constexpr const char* kConfig = R"({"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 64})";

void write_shard(const std::string& path, const std::vector<std::string>& names, int seed = 0) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const std::string& name : names) tensors.emplace_back(name, patterned_tensor(DType::kBF16, {2, 3}, seed++));
  ASSERT_TRUE(write_safetensors(path, tensors).is_ok()) << path;
}

void write_index(const std::string& dir, const std::vector<std::pair<std::string, std::string>>& weight_map) {
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  for (const auto& [tensor, shard] : weight_map) index["weight_map"][tensor] = shard;
  write_file(dir + "/model.safetensors.index.json", index.dump(2));
}

// A directory with config.json and two indexed shards holding a, b (shard 1) and c (shard 2).
std::string make_sharded_dir() {
  const std::string dir = make_test_dir();
  write_file(dir + "/config.json", kConfig);
  write_shard(dir + "/model-00001-of-00002.safetensors", {"b", "a"}, 0);
  write_shard(dir + "/model-00002-of-00002.safetensors", {"c"}, 2);
  return dir;
}

TEST_F(CheckpointOpen, OpensASingleFileDirectory) {
  const std::string dir = make_test_dir();
  write_file(dir + "/config.json", kConfig);
  write_shard(dir + "/model.safetensors", {"model.norm.weight", "lm_head.weight"});
  auto checkpoint = Checkpoint::open(dir);
  ASSERT_TRUE(checkpoint.has_value()) << checkpoint.status().to_string();
  EXPECT_EQ(checkpoint->dir(), dir);
  EXPECT_EQ(checkpoint->config().at("hidden_size"), 64);
  EXPECT_EQ(checkpoint->tensor_names(), (std::vector<std::string>{"lm_head.weight", "model.norm.weight"}));
  EXPECT_EQ(checkpoint->total_bytes(), 2 * 2 * 3 * 2);
  EXPECT_TRUE(checkpoint->has("lm_head.weight"));
  EXPECT_FALSE(checkpoint->has("lm_head"));

  const SafetensorsEntry* entry = checkpoint->entry("lm_head.weight");
  ASSERT_NE(entry, nullptr);
  EXPECT_EQ(entry->dtype, DType::kBF16);
  EXPECT_EQ(entry->shape, (std::vector<int64_t>{2, 3}));

  auto tensor = checkpoint->get("lm_head.weight");
  ASSERT_TRUE(tensor.has_value()) << tensor.status().to_string();
  const Tensor expected = patterned_tensor(DType::kBF16, {2, 3}, 1);
  ASSERT_EQ(tensor->n_bytes(), expected.n_bytes());
  EXPECT_EQ(std::memcmp(tensor->raw_data(), expected.raw_data(), expected.n_bytes()), 0);
}

TEST_F(CheckpointOpen, TensorOutlivesTheCheckpoint) {
  const std::string dir = make_sharded_dir();
  write_index(dir, {{"a", "model-00001-of-00002.safetensors"},
                    {"b", "model-00001-of-00002.safetensors"},
                    {"c", "model-00002-of-00002.safetensors"}});
  Tensor c;
  {
    auto checkpoint = Checkpoint::open(dir);
    ASSERT_TRUE(checkpoint.has_value()) << checkpoint.status().to_string();
    c = checkpoint->get("c").value();
  }
  const Tensor expected = patterned_tensor(DType::kBF16, {2, 3}, 2);
  EXPECT_EQ(std::memcmp(c.raw_data(), expected.raw_data(), expected.n_bytes()), 0);
}

TEST_F(CheckpointOpen, LoadsEveryFileInNameOrderWithoutAnIndex) {
  const std::string dir = make_sharded_dir();
  write_file(dir + "/notes.txt", "not a shard");
  auto checkpoint = Checkpoint::open(dir);
  ASSERT_TRUE(checkpoint.has_value()) << checkpoint.status().to_string();
  ASSERT_EQ(checkpoint->files().size(), 2u);
  EXPECT_EQ(fs::path(checkpoint->files()[0].path()).filename(), "model-00001-of-00002.safetensors");
  EXPECT_EQ(checkpoint->tensor_names(), (std::vector<std::string>{"a", "b", "c"}));
}

TEST_F(CheckpointOpen, FollowsTheIndexAndIgnoresUnlistedFiles) {
  const std::string dir = make_sharded_dir();
  write_shard(dir + "/consolidated.safetensors", {"a", "b", "c"});  // would collide if loaded
  fs::create_directories(dir + "/sub");
  write_shard(dir + "/sub/extra.safetensors", {"d"});
  write_index(dir, {{"a", "model-00001-of-00002.safetensors"},
                    {"b", "model-00001-of-00002.safetensors"},
                    {"c", "model-00002-of-00002.safetensors"},
                    {"d", "sub/extra.safetensors"}});
  auto checkpoint = Checkpoint::open(dir);
  ASSERT_TRUE(checkpoint.has_value()) << checkpoint.status().to_string();
  EXPECT_EQ(checkpoint->files().size(), 3u);
  EXPECT_EQ(checkpoint->tensor_names(), (std::vector<std::string>{"a", "b", "c", "d"}));
  EXPECT_EQ(checkpoint->total_bytes(), 4 * 12);
}

TEST_F(CheckpointRejects, IndexPathWithDotDot) {
  const std::string dir = make_sharded_dir();
  write_index(dir, {{"a", "model-00001-of-00002.safetensors"}, {"c", "../model-00002-of-00002.safetensors"}});
  auto checkpoint = Checkpoint::open(dir);
  ASSERT_FALSE(checkpoint.has_value());
  expect_error(checkpoint.status(), StatusCode::kCorrupt,
               {"model.safetensors.index.json", "tensor 'c'", "'../model-00002-of-00002.safetensors'", "'..'"});
  write_index(dir, {{"c", "sub/../../x.safetensors"}});
  expect_error(Checkpoint::open(dir).status(), StatusCode::kCorrupt, {"tensor 'c'", "'..'"});
}

TEST_F(CheckpointRejects, IndexAbsolutePath) {
  const std::string dir = make_sharded_dir();
  write_index(dir, {{"a", dir + "/model-00001-of-00002.safetensors"}});
  auto checkpoint = Checkpoint::open(dir);
  ASSERT_FALSE(checkpoint.has_value());
  expect_error(checkpoint.status(), StatusCode::kCorrupt, {"model.safetensors.index.json", "tensor 'a'", "absolute"});
}

TEST_F(CheckpointRejects, IndexNamesAMissingShard) {
  const std::string dir = make_sharded_dir();
  write_index(dir, {{"a", "model-00001-of-00002.safetensors"}, {"z", "model-00009-of-00009.safetensors"}});
  auto checkpoint = Checkpoint::open(dir);
  ASSERT_FALSE(checkpoint.has_value());
  expect_error(checkpoint.status(), StatusCode::kNotFound, {"model-00009-of-00009.safetensors", "tensor 'z'"});
}

TEST_F(CheckpointRejects, IndexedTensorAbsentFromItsShard) {
  const std::string dir = make_sharded_dir();
  write_index(dir, {{"a", "model-00001-of-00002.safetensors"},
                    {"c", "model-00001-of-00002.safetensors"},  // c lives in shard 2
                    {"x", "model-00002-of-00002.safetensors"}});
  auto checkpoint = Checkpoint::open(dir);
  ASSERT_FALSE(checkpoint.has_value());
  expect_error(checkpoint.status(), StatusCode::kCorrupt,
               {"model.safetensors.index.json", "tensor 'c'", "model-00001-of-00002.safetensors", "does not contain"});
}

TEST_F(CheckpointRejects, TensorInTwoIndexedShards) {
  const std::string dir = make_sharded_dir();
  write_shard(dir + "/model-00002-of-00002.safetensors", {"c", "a"});
  write_index(dir, {{"a", "model-00001-of-00002.safetensors"}, {"c", "model-00002-of-00002.safetensors"}});
  auto checkpoint = Checkpoint::open(dir);
  ASSERT_FALSE(checkpoint.has_value());
  expect_error(checkpoint.status(), StatusCode::kCorrupt,
               {"tensor 'a'", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"});
}

TEST_F(CheckpointRejects, TensorInTwoFilesWithoutIndex) {
  const std::string dir = make_sharded_dir();
  write_shard(dir + "/model-00003.safetensors", {"b"});
  auto checkpoint = Checkpoint::open(dir);
  ASSERT_FALSE(checkpoint.has_value());
  expect_error(checkpoint.status(), StatusCode::kCorrupt,
               {"tensor 'b'", "model-00001-of-00002.safetensors", "model-00003.safetensors"});
}

TEST_F(CheckpointRejects, IndexWithoutWeightMap) {
  const std::string dir = make_sharded_dir();
  write_file(dir + "/model.safetensors.index.json", R"({"metadata": {}})");
  expect_error(Checkpoint::open(dir).status(), StatusCode::kCorrupt, {"model.safetensors.index.json", "weight_map"});
  write_file(dir + "/model.safetensors.index.json", R"({"weight_map": {"a": 3}})");
  expect_error(Checkpoint::open(dir).status(), StatusCode::kCorrupt, {"tensor 'a'", "not a shard file name"});
}

TEST_F(CheckpointRejects, CorruptShard) {
  const std::string dir = make_test_dir();
  write_file(dir + "/config.json", kConfig);
  write_file(dir + "/model.safetensors", "tiny");
  expect_error(Checkpoint::open(dir).status(), StatusCode::kCorrupt, {"model.safetensors", "4 bytes"});
}

TEST_F(CheckpointRejects, MissingConfig) {
  const std::string dir = make_test_dir();
  write_shard(dir + "/model.safetensors", {"a"});
  auto checkpoint = Checkpoint::open(dir);
  ASSERT_FALSE(checkpoint.has_value());
  expect_error(checkpoint.status(), StatusCode::kNotFound, {"config.json", dir});
}

TEST_F(CheckpointRejects, MalformedConfig) {
  const std::string dir = make_test_dir();
  write_shard(dir + "/model.safetensors", {"a"});
  write_file(dir + "/config.json", "{\n  \"hidden_size\": 64,\n  \"n_heads\": \n}");
  auto checkpoint = Checkpoint::open(dir);
  ASSERT_FALSE(checkpoint.has_value());
  expect_error(checkpoint.status(), StatusCode::kCorrupt, {"config.json", "line 4", "byte"});

  write_file(dir + "/config.json", R"({"hidden_size": 64, "hidden_size": 128})");
  expect_error(Checkpoint::open(dir).status(), StatusCode::kCorrupt, {"config.json", "duplicate key 'hidden_size'"});
  write_file(dir + "/config.json", "[64]");
  expect_error(Checkpoint::open(dir).status(), StatusCode::kCorrupt, {"config.json", "JSON object"});
}

TEST_F(CheckpointRejects, DirectoryWithoutSafetensors) {
  const std::string dir = make_test_dir();
  write_file(dir + "/config.json", kConfig);
  auto checkpoint = Checkpoint::open(dir);
  ASSERT_FALSE(checkpoint.has_value());
  expect_error(checkpoint.status(), StatusCode::kNotFound, {dir, "no *.safetensors"});
}

TEST_F(CheckpointRejects, MissingDirectory) {
  const std::string dir = make_test_dir() + "/nope";
  expect_error(Checkpoint::open(dir).status(), StatusCode::kNotFound, {dir, "does not exist"});
}

TEST_F(CheckpointRejects, UnknownTensor) {
  const std::string dir = make_sharded_dir();
  auto checkpoint = Checkpoint::open(dir);
  ASSERT_TRUE(checkpoint.has_value()) << checkpoint.status().to_string();
  EXPECT_EQ(checkpoint->entry("zz"), nullptr);
  expect_error(checkpoint->get("zz").status(), StatusCode::kNotFound, {"tensor 'zz'", dir});
}

TEST_F(CheckpointRejects, TensorOfRankAboveMaxDims) {
  const std::string dir = make_test_dir();
  write_file(dir + "/config.json", kConfig);
  write_file(dir + "/model.safetensors",
             test::safetensors_bytes(R"({"r5":{"dtype":"U8","shape":[1,1,1,1,2],"data_offsets":[0,2]}})", 2));
  auto checkpoint = Checkpoint::open(dir);
  ASSERT_TRUE(checkpoint.has_value()) << checkpoint.status().to_string();
  ASSERT_NE(checkpoint->entry("r5"), nullptr);
  expect_error(checkpoint->get("r5").status(), StatusCode::kUnsupported, {"tensor 'r5'", "5 dimensions"});
}

TEST_F(ReadJsonFile, RejectsOversizedFilesWithoutReadingThem) {
  const std::string path = make_test_dir() + "/huge.json";
  write_file(path, "{}");
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(kMaxJsonFileBytes) + 1), 0);  // sparse
  expect_error(read_json_file(path).status(), StatusCode::kCorrupt, {"huge.json", "64 MiB"});
}

TEST_F(ReadJsonFile, ReportsMissingFilesAndInvalidUtf8) {
  const std::string dir = make_test_dir();
  expect_error(read_json_file(dir + "/absent.json").status(), StatusCode::kNotFound, {"absent.json"});
  write_file(dir + "/latin1.json", "{\"name\": \"caf\xE9\"}");
  expect_error(read_json_file(dir + "/latin1.json").status(), StatusCode::kCorrupt,
               {"latin1.json", "UTF-8", "byte 13"});
  expect_error(read_json_file(dir).status(), StatusCode::kInvalidArgument, {"not a regular file"});
}

}  // namespace
}  // namespace deepinfer
