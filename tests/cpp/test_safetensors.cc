// Safetensors loading and header validation. Files are written by a tiny independent writer in
// this test (u64 LE header length + JSON header + data), including deliberately broken ones.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "core/status.h"

namespace dsv41rt {
namespace {
namespace fs = std::filesystem;

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good());
}

// Raw writer: header text exactly as given.
void write_raw(const std::string& path, const std::string& header, const std::string& data) {
  write_bytes(path, le64(header.size()) + header + data);
}

struct T {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

// Valid writer: consecutive offsets in the given order.
void write_valid(const std::string& path, const std::vector<T>& tensors,
                 const std::string& metadata_json = "") {
  std::string header = "{";
  std::string data;
  bool first = true;
  if (!metadata_json.empty()) {
    header += "\"__metadata__\":" + metadata_json;
    first = false;
  }
  for (const T& t : tensors) {
    if (!first) header += ",";
    first = false;
    header += "\"" + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) {
      if (i) header += ",";
      header += std::to_string(t.shape[i]);
    }
    header += "],\"data_offsets\":[" + std::to_string(data.size()) + "," +
              std::to_string(data.size() + t.bytes.size()) + "]}";
    data += t.bytes;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');  // alignment padding as real writers do
  write_raw(path, header, data);
}

std::string pattern(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 31 + seed) & 0xFF);
  return s;
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "dsv41rt_st_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

  // Expects Checkpoint(p) to throw Error whose message contains every needle.
  void expect_error(const std::string& p, const std::vector<std::string>& needles) {
    try {
      Checkpoint ck(p);
      ADD_FAILURE() << "no error for " << p;
    } catch (const Error& e) {
      const std::string what = e.what();
      for (const std::string& n : needles) {
        EXPECT_NE(what.find(n), std::string::npos) << "missing '" << n << "' in: " << what;
      }
    }
  }

  std::string dir_;
};

TEST_F(SafetensorsTest, ValidSingleFileRoundTrip) {
  const std::string w = pattern(2 * 3 * 2, 1), s = pattern(4, 2), idx = pattern(3 * 8, 3);
  write_valid(path("m.safetensors"),
              {{"w", "BF16", {2, 3}, w},
               {"scale", "F8_E8M0", {4}, s},
               {"idx", "I64", {3}, idx},
               {"empty", "F32", {0, 5}, ""},
               {"packed", "I8", {2, 2}, pattern(4, 9)}},
              R"({"format":"pt","producer":"test"})");
  Checkpoint ck(path("m.safetensors"));
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"empty", "idx", "packed", "scale", "w"}));
  EXPECT_EQ(ck.size(), 5u);
  EXPECT_TRUE(ck.contains("w"));
  EXPECT_FALSE(ck.contains("__metadata__"));
  const TensorInfo& wi = ck.info("w");
  EXPECT_EQ(wi.dtype, DType::kBF16);
  EXPECT_EQ(wi.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(wi.nbytes, 12u);
  EXPECT_EQ(wi.file, path("m.safetensors"));
  const TensorView v = ck.view("w");
  EXPECT_EQ(v.dtype, DType::kBF16);
  EXPECT_EQ(std::memcmp(v.data, w.data(), w.size()), 0);
  EXPECT_EQ(std::memcmp(ck.tensor_data("idx"), idx.data(), idx.size()), 0);
  EXPECT_EQ(std::memcmp(ck.tensor_data("scale"), s.data(), s.size()), 0);
  EXPECT_EQ(ck.info("empty").nbytes, 0u);
  EXPECT_EQ(ck.info("packed").dtype, DType::kI8);
  EXPECT_EQ(ck.metadata().at("producer"), "test");
  EXPECT_EQ(ck.files(), (std::vector<std::string>{path("m.safetensors")}));
  try {
    ck.info("nope");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), StatusCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find("'nope'"), std::string::npos);
  }
}

TEST_F(SafetensorsTest, OwnedTensorsJoinTheMappedOnes) {
  // Synthetic weights (runtime/model/synthetic_weights.h) add generated tensors this way.
  write_valid(path("m.safetensors"), {{"b", "F32", {1}, pattern(4, 0)}});
  Checkpoint ck(path("m.safetensors"));
  const std::vector<uint8_t> codes = {1, 2, 3, 4, 5, 6};
  ck.add_owned("c", DType::kFP8E4M3, {2, 3}, codes);
  ck.add_owned("a", DType::kI8, {1, 2}, {7, 8});
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_TRUE(ck.contains("c"));
  EXPECT_EQ(ck.info("c").file, "<memory>");
  EXPECT_EQ(ck.info("c").nbytes, 6u);
  EXPECT_EQ(ck.view("c").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::memcmp(ck.tensor_data("c"), codes.data(), codes.size()), 0);
  EXPECT_EQ(ck.files(), (std::vector<std::string>{path("m.safetensors")}));
  try {
    ck.add_owned("b", DType::kF32, {1}, {0, 0, 0, 0});
    FAIL() << "a name taken by a file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'b' is already present"), std::string::npos) << e.what();
  }
  try {
    ck.add_owned("d", DType::kF32, {2}, {0, 0, 0, 0});
    FAIL() << "4 bytes for two F32";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has 4 bytes, its dtype and shape need 8"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(SafetensorsTest, DirectoryResolution) {
  fs::create_directory(path("a"));
  write_valid(path("a/model.safetensors"), {{"x", "F32", {1}, pattern(4, 0)}});
  EXPECT_EQ(Checkpoint(path("a")).names(), std::vector<std::string>{"x"});
  fs::create_directory(path("b"));
  write_valid(path("b/weights-anything.safetensors"), {{"y", "U8", {2}, "ab"}});
  EXPECT_EQ(Checkpoint(path("b")).names(), std::vector<std::string>{"y"});
  fs::create_directory(path("c"));
  write_valid(path("c/one.safetensors"), {});
  write_valid(path("c/two.safetensors"), {});
  expect_error(path("c"), {"2 .safetensors files", "index"});
  fs::create_directory(path("d"));
  expect_error(path("d"), {"no .safetensors files"});
  expect_error(path("does_not_exist"), {"does_not_exist", "does not exist"});
  // A header-only file with no tensors is a valid, empty checkpoint.
  write_raw(path("empty.safetensors"), "{}", "");
  EXPECT_EQ(Checkpoint(path("empty.safetensors")).size(), 0u);
}

TEST_F(SafetensorsTest, FileLevelErrors) {
  write_bytes(path("short.safetensors"), "abc");
  expect_error(path("short.safetensors"), {"short.safetensors", "too short"});
  write_bytes(path("hugelen.safetensors"), le64(uint64_t{1} << 40) + "{}");
  expect_error(path("hugelen.safetensors"), {"hugelen.safetensors", "absurd"});
  write_bytes(path("pastend.safetensors"), le64(100) + "{}");
  expect_error(path("pastend.safetensors"), {"pastend.safetensors", "exceeds the file size"});
  write_raw(path("badjson.safetensors"), "{\"a\": ", "");
  expect_error(path("badjson.safetensors"), {"badjson.safetensors", "not valid JSON", "at byte"});
  write_raw(path("array.safetensors"), "[]", "");
  expect_error(path("array.safetensors"), {"array.safetensors", "must be a JSON object"});
  write_raw(path("meta1.safetensors"), R"({"__metadata__": [1]})", "");
  expect_error(path("meta1.safetensors"), {"meta1.safetensors", "__metadata__ must be an object"});
  write_raw(path("meta2.safetensors"), R"({"__metadata__": {"k": 1}})", "");
  expect_error(path("meta2.safetensors"), {"meta2.safetensors", "'k'", "must be a string"});
}

TEST_F(SafetensorsTest, TensorEntryErrorsNameFileAndTensor) {
  struct Case {
    std::string header;
    std::string data;
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {R"({"t1":5})", "", {"'t1'", "must be an object"}},
      {R"({"t2":{"shape":[1],"data_offsets":[0,4]}})", "abcd", {"'t2'", "missing 'dtype'"}},
      {R"({"t3":{"dtype":"F32","data_offsets":[0,4]}})", "abcd", {"'t3'", "missing 'shape'"}},
      {R"({"t4":{"dtype":"F32","shape":[1]}})", "abcd", {"'t4'", "missing 'data_offsets'"}},
      {R"({"t5":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})",
       "abcd",
       {"'t5'", "'dtype' must be a string"}},
      {R"({"t6":{"dtype":"F32","shape":"1","data_offsets":[0,4]}})",
       "abcd",
       {"'t6'", "'shape' must be an array"}},
      {R"({"t7":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})",
       "abcd",
       {"'t7'", "shape entries must be integers"}},
      {R"({"t8":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})",
       "abcd",
       {"'t8'", "negative shape dimension -1"}},
      {R"({"t9":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", "abcdefgh", {"'t9'", "'F64'"}},
      {R"({"t10":{"dtype":"F32","shape":[1],"data_offsets":{}}})",
       "abcd",
       {"'t10'", "'data_offsets' must be an array"}},
      {R"({"t11":{"dtype":"F32","shape":[1],"data_offsets":[0]}})",
       "abcd",
       {"'t11'", "[begin, end]"}},
      {R"({"t12":{"dtype":"F32","shape":[1],"data_offsets":[0,"4"]}})",
       "abcd",
       {"'t12'", "[begin, end]"}},
      {R"({"t13":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})",
       "abcd",
       {"'t13'", "invalid data_offsets [4, 0]"}},
      {R"({"t14":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
       "abcd",
       {"'t14'", "truncated"}},
      {R"({"t15":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})",
       "abcd",
       {"'t15'", "needs 8 bytes"}},
      {R"({"t16":{"dtype":"BOOL","shape":[4],"data_offsets":[0,4]}})", "abcd", {"'t16'", "'BOOL'"}},
      {R"({"t17":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,4]}})",
       "abcd",
       {"'t17'", "overflows"}},
      {R"({"ta":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"tb":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})",
       "0123456789ab",
       {"'ta'", "'tb'", "overlapping"}},
      // A large tensor spanning two others: caught although its neighbours do not overlap.
      {R"({"big":{"dtype":"U8","shape":[12],"data_offsets":[0,12]},"s1":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},"s2":{"dtype":"U8","shape":[2],"data_offsets":[6,8]}})",
       "0123456789ab",
       {"'big'", "overlapping"}},
  };
  int i = 0;
  for (const Case& c : cases) {
    const std::string name = "bad" + std::to_string(i++) + ".safetensors";
    write_raw(path(name), c.header, c.data);
    std::vector<std::string> needles = c.needles;
    needles.push_back(name);
    SCOPED_TRACE(c.header);
    expect_error(path(name), needles);
  }
}

TEST_F(SafetensorsTest, TruncationNamesTheTensorReachingFurthest) {
  // "a" sorts first but ends earlier; the cut-off tail belongs to "z".
  write_valid(path("cut.safetensors"), {{"z_first", "U8", {8}, pattern(8, 1)},
                                        {"a_mid", "U8", {8}, pattern(8, 2)},
                                        {"m_last", "U8", {8}, pattern(8, 3)}});
  const std::string full = [&] {
    std::ifstream in(path("cut.safetensors"), std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  write_bytes(path("cut.safetensors"), full.substr(0, full.size() - 10));
  expect_error(path("cut.safetensors"),
               {"cut.safetensors", "'m_last'", "truncated", "2 tensors extend past the end"});
}

TEST_F(SafetensorsTest, ZeroSizeTensorsDoNotOverlap) {
  write_raw(
      path("z.safetensors"),
      R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[2,2]},"b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
      "wxyz");
  Checkpoint ck(path("z.safetensors"));
  EXPECT_EQ(ck.size(), 2u);
  EXPECT_EQ(std::memcmp(ck.tensor_data("b"), "wxyz", 4), 0);
}

// ---- sharded ----

void write_index(const std::string& p, const std::string& weight_map) {
  write_bytes(p, R"({"metadata":{"total_size":123},"weight_map":)" + weight_map + "}");
}

TEST_F(SafetensorsTest, ValidTwoShardCheckpoint) {
  const std::string a = pattern(8, 5), b = pattern(6, 6), c = pattern(2, 7);
  write_valid(path("model-00001-of-00002.safetensors"),
              {{"layers.0.w", "F32", {2}, a}, {"layers.0.s", "U8", {2}, c}}, R"({"format":"pt"})");
  write_valid(path("model-00002-of-00002.safetensors"), {{"layers.1.w", "BF16", {3}, b}},
              R"({"format":"pt","extra":"2"})");
  write_index(path("model.safetensors.index.json"),
              R"({"layers.0.w":"model-00001-of-00002.safetensors",
                  "layers.0.s":"model-00001-of-00002.safetensors",
                  "layers.1.w":"model-00002-of-00002.safetensors"})");
  for (const std::string& p : {dir_, path("model.safetensors.index.json")}) {
    Checkpoint ck(p);
    EXPECT_EQ(ck.names(), (std::vector<std::string>{"layers.0.s", "layers.0.w", "layers.1.w"}));
    EXPECT_EQ(ck.files().size(), 2u);
    EXPECT_EQ(ck.info("layers.1.w").file, path("model-00002-of-00002.safetensors"));
    EXPECT_EQ(std::memcmp(ck.tensor_data("layers.0.w"), a.data(), a.size()), 0);
    EXPECT_EQ(std::memcmp(ck.tensor_data("layers.1.w"), b.data(), b.size()), 0);
    EXPECT_EQ(std::memcmp(ck.tensor_data("layers.0.s"), c.data(), c.size()), 0);
    EXPECT_EQ(ck.metadata().at("format"), "pt");
    EXPECT_EQ(ck.metadata().at("extra"), "2");
  }
}

TEST_F(SafetensorsTest, ShardedErrors) {
  write_valid(path("s1.safetensors"), {{"a", "U8", {1}, "x"}, {"b", "U8", {1}, "y"}});
  write_valid(path("s2.safetensors"), {{"c", "U8", {1}, "z"}});
  write_valid(path("s3.safetensors"), {{"a", "U8", {1}, "q"}});

  write_bytes(path("bad.safetensors.index.json"), "{not json");
  expect_error(path("bad.safetensors.index.json"),
               {"bad.safetensors.index.json", "not valid JSON"});
  write_bytes(path("nowm.safetensors.index.json"), R"({"metadata":{}})");
  expect_error(path("nowm.safetensors.index.json"), {"nowm.safetensors.index.json", "weight_map"});

  write_index(path("missing.index.json"),
              R"({"a":"s1.safetensors","b":"s1.safetensors","q":"gone.safetensors"})");
  expect_error(path("missing.index.json"), {"gone.safetensors", "'q'", "does not exist"});

  write_index(
      path("absent.index.json"),
      R"({"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors","d":"s2.safetensors"})");
  expect_error(path("absent.index.json"), {"'d'", "s2.safetensors", "does not contain"});

  write_index(path("unlisted.index.json"), R"({"a":"s1.safetensors","c":"s2.safetensors"})");
  expect_error(path("unlisted.index.json"),
               {"'b'", "s1.safetensors", "not listed in the weight_map"});

  write_index(
      path("dup.index.json"),
      R"({"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors","x":"s3.safetensors"})");
  expect_error(path("dup.index.json"), {"'a'", "s1.safetensors", "s3.safetensors", "two shards"});

  write_index(path("escape.index.json"), R"({"a":"../s1.safetensors"})");
  expect_error(path("escape.index.json"), {"../s1.safetensors", "relative path"});

  write_index(path("nonstring.index.json"), R"({"a":1})");
  expect_error(path("nonstring.index.json"), {"'a'", "must be a string"});

  // A broken shard is reported with its own file name.
  write_raw(path("broken.safetensors"),
            R"({"k":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", "abcd");
  write_index(path("broken.index.json"), R"({"k":"broken.safetensors"})");
  expect_error(path("broken.index.json"), {"broken.safetensors", "'k'", "truncated"});
}

TEST_F(SafetensorsTest, SafetensorsFileDirectlyAndMove) {
  write_valid(path("f.safetensors"), {{"w", "F16", {2}, pattern(4, 1)}});
  SafetensorsFile f(path("f.safetensors"));
  EXPECT_EQ(f.names(), std::vector<std::string>{"w"});
  SafetensorsFile g(std::move(f));
  EXPECT_EQ(g.info("w").dtype, DType::kF16);
  EXPECT_EQ(std::memcmp(g.tensor_data("w"), pattern(4, 1).data(), 4), 0);
  try {
    SafetensorsFile missing(path("nope.safetensors"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), StatusCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find("nope.safetensors"), std::string::npos);
  }
}

}  // namespace
}  // namespace dsv41rt
