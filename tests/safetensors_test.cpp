// safetensors checkpoints: bit-exact round trips on every backend, interchange with
// numpy in both directions, every malformed file rejected with its message, and the
// model/checkpoint comparison. Atomicity is in safetensors_atomic_test.cpp.
#include "engine/safetensors.h"

#include <bit>
#include <cstring>
#include <limits>
#include <random>

#include "file_test_util.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Values that a lossy path would change: signed zero, infinities, a NaN with a
// payload, subnormals, extremes.
std::vector<float> awkward_floats() {
  return {0.0f,
          -0.0f,
          std::numeric_limits<float>::infinity(),
          -std::numeric_limits<float>::infinity(),
          std::bit_cast<float>(0x7FC12345u),
          std::numeric_limits<float>::denorm_min(),
          std::numeric_limits<float>::max(),
          std::numeric_limits<float>::lowest(),
          1.0f / 3.0f,
          -2.5f,
          1e-30f,
          7.0f};
}

class SafetensorsTest : public BackendTest {};
TL_INSTANTIATE_BACKENDS(SafetensorsTest);

TEST_P(SafetensorsTest, RoundTripsFloat32BitExact) {
  ScratchDir dir;
  const std::string path = dir.file("model.safetensors");
  const std::vector<float> awkward = awkward_floats();
  const std::vector<float> large = random_values(3'000'017, 7);  // ~12 MB, a prime count
  save_safetensors(path, {{"conv1/weight", make(awkward, {2, 2, 3})},
                          {"empty", make({}, {0, 5})},
                          {"scalar", make({42.5f}, {})},
                          {"large", make(large, {3'000'017})}});
  const auto tensors = load_safetensors(path, device()).tensors;
  ASSERT_EQ(tensors.size(), 4u);
  const Tensor& w = tensors.at("conv1/weight");
  EXPECT_EQ(w.shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(w.device(), device());
  EXPECT_TRUE(same_bits(host(w), awkward));
  EXPECT_EQ(tensors.at("empty").shape(), (Shape{0, 5}));
  EXPECT_EQ(tensors.at("empty").numel(), 0);
  EXPECT_EQ(tensors.at("scalar").shape(), Shape{});
  EXPECT_EQ(host(tensors.at("scalar")), std::vector<float>{42.5f});
  EXPECT_TRUE(same_bits(host(tensors.at("large")), large));
}

// Every bfloat16 and float16 pattern (NaNs with payloads, infinities, subnormals)
// comes back bit for bit, under the format's names BF16 and F16.
TEST_P(SafetensorsTest, RoundTripsBFloat16AndFloat16BitExact) {
  ScratchDir dir;
  const std::string path = dir.file("half.safetensors");
  std::vector<bfloat16> b(0x10000);
  std::vector<float16> h(0x10000);
  for (std::uint32_t p = 0; p < 0x10000; ++p) {
    b[p] = bfloat16::from_bits(static_cast<std::uint16_t>(p));
    h[p] = float16::from_bits(static_cast<std::uint16_t>(0xffff - p));
  }
  save_safetensors(path, {{"b", Tensor::from_host<bfloat16>(b, {256, 256}, stream())},
                          {"h", Tensor::from_host<float16>(h, {0x10000}, stream())},
                          {"after", make({1.5f}, {1})}});
  const SafetensorsHeader header = read_safetensors_header(path);
  ASSERT_EQ(header.entries.size(), 3u);
  EXPECT_EQ(header.entries[0].dtype, DType::BFloat16);
  EXPECT_EQ(header.entries[1].dtype, DType::Float16);
  const auto tensors = load_safetensors(path, device()).tensors;
  const Tensor& tb = tensors.at("b");
  EXPECT_EQ(tb.describe(), "bfloat16[256,256] on " + device().str());
  EXPECT_TRUE(same_bits(tb.to_host<bfloat16>(stream()), b));
  EXPECT_TRUE(same_bits(tensors.at("h").to_host<float16>(stream()), h));
  EXPECT_EQ(host(tensors.at("after")), std::vector<float>{1.5f});
  // The header names them as numpy and PyTorch do.
  const std::string bytes = read_file(path);
  EXPECT_NE(bytes.find(R"("b":{"dtype":"BF16","shape":[256,256])"), std::string::npos);
  EXPECT_NE(bytes.find(R"("h":{"dtype":"F16")"), std::string::npos);
}

TEST_P(SafetensorsTest, SavesDeviceTensorsThatLoadOnTheCpu) {
  ScratchDir dir;
  const std::string path = dir.file("m.safetensors");
  const auto values = random_values(1031, 3);
  save_safetensors(path, {{"w", make(values, {1031})}});
  const auto tensors = load_safetensors(path, Device::cpu()).tensors;
  EXPECT_TRUE(same_bits(tensors.at("w").to_host<float>(), values));
}

TEST(Safetensors, RoundTripsFloat64BitExactOnTheCpu) {
  ScratchDir dir;
  const std::string path = dir.file("f64.safetensors");
  std::vector<double> values = {0.0,
                                -0.0,
                                1.0 / 3.0,
                                std::numeric_limits<double>::denorm_min(),
                                std::bit_cast<double>(0x7FF8000000000123ull),
                                -1e300};
  const Stream& cpu = default_stream(Device::cpu());
  save_safetensors(path, {{"d", Tensor::from_host<double>(values, {3, 2}, cpu)},
                          {"f", Tensor::from_host<float>(std::vector<float>{1.5f}, {1}, cpu)}});
  const auto tensors = load_safetensors(path, Device::cpu()).tensors;
  EXPECT_EQ(tensors.at("d").dtype(), DType::Float64);
  EXPECT_EQ(tensors.at("d").shape(), (Shape{3, 2}));
  EXPECT_TRUE(same_bits(tensors.at("d").to_host<double>(), values));
  EXPECT_EQ(tensors.at("f").dtype(), DType::Float32);
}

TEST(Safetensors, KeepsMetadataOrderAndAlignment) {
  ScratchDir dir;
  const std::string path = dir.file("m.safetensors");
  const Stream& cpu = default_stream(Device::cpu());
  const std::map<std::string, std::string> metadata = {
      {"epoch", "3"}, {"model", "fashionnet"}, {"note", "ünïcode \"quoted\""}};
  save_safetensors(path,
                   {{"z", Tensor::zeros({3}, cpu)},
                    {"a", Tensor::zeros({2, 2}, cpu, DType::Float64)},
                    {"m", Tensor::zeros({1}, cpu)}},
                   metadata);
  const SafetensorsHeader header = read_safetensors_header(path);
  EXPECT_EQ(header.metadata, metadata);
  EXPECT_EQ(load_safetensors(path, Device::cpu()).metadata, metadata);
  ASSERT_EQ(header.entries.size(), 3u);
  // The given order, back to back: z [0,12), a [12,44), m [44,48).
  EXPECT_EQ(header.entries[0].name, "z");
  EXPECT_EQ(header.entries[1].name, "a");
  EXPECT_EQ(header.entries[1].dtype, DType::Float64);
  EXPECT_EQ(header.entries[1].data_begin, 12u);
  EXPECT_EQ(header.entries[1].data_end, 44u);
  EXPECT_EQ(header.entries[2].name, "m");
  EXPECT_EQ(header.data_size, 48u);
  EXPECT_EQ(header.data_offset % 8, 0u) << "the header is padded so that the data is aligned";
  EXPECT_EQ(read_file(path).size(), header.data_offset + 48);
}

TEST(Safetensors, RejectsBadNames) {
  ScratchDir dir;
  const std::string path = dir.file("m.safetensors");
  Tensor t = Tensor::zeros({1}, Device::cpu());
  EXPECT_THROW_WITH(save_safetensors(path, {{"", t}}), InvalidArgument,
                    "tensor 0 has an empty name");
  EXPECT_THROW_WITH(save_safetensors(path, {{"a", t}, {"b", t}, {"a", t}}), InvalidArgument,
                    "the name 'a' appears twice");
  EXPECT_THROW_WITH(save_safetensors(path, {{"__metadata__", t}}), InvalidArgument,
                    "'__metadata__' is reserved");
  EXPECT_THROW_WITH(save_safetensors(path, {{"u", Tensor()}}), InvalidArgument,
                    "tensor 'u' is undefined");
  EXPECT_THROW_WITH(save_safetensors(path, {{"bad\xff", t}}), InvalidArgument, "UTF-8");
  EXPECT_TRUE(dir.list().empty()) << "a rejected save leaves no file behind";
}

// numpy reads what we write, and we read what numpy writes (unpadded header, tensors
// listed in another order than their data).
TEST(Safetensors, InterchangesWithNumpy) {
  if (!have_python_numpy()) GTEST_SKIP() << "/usr/bin/python3 with numpy not available";
  ScratchDir dir;
  const std::string ours = dir.file("ours.safetensors");
  const Stream& cpu = default_stream(Device::cpu());
  save_safetensors(
      ours,
      {{"w",
        Tensor::from_host<float>(std::vector<float>{-1, -0.5f, 0, 0.5f, 1, 1.5f}, {2, 3}, cpu)},
       {"d", Tensor::from_host<double>(std::vector<double>{0, 1 / 3.0, 2 / 3.0, 1}, {4}, cpu)},
       {"e", Tensor::zeros({0, 5}, cpu)},
       {"s", Tensor::from_host<float>(std::vector<float>{42.5f}, {}, cpu)}},
      {{"epoch", "3"}, {"model", "fashionnet"}});
  const std::string script = dir.file("check.py");
  write_file(script, R"PY(
import json, struct, sys
import numpy as np
raw = open(sys.argv[1], 'rb').read()
n, = struct.unpack('<Q', raw[:8])
assert (8 + n) % 8 == 0, 'data not 8-byte aligned'
header = json.loads(raw[8:8 + n])
data = raw[8 + n:]
assert header.pop('__metadata__') == {'epoch': '3', 'model': 'fashionnet'}
def get(name, dtype):
    e = header[name]
    begin, end = e['data_offsets']
    return np.frombuffer(data[begin:end], dtype=dtype).reshape(e['shape'])
assert header['w']['dtype'] == 'F32' and header['d']['dtype'] == 'F64'
assert np.array_equal(get('w', '<f4'), (np.arange(6, dtype=np.float32) * 0.5 - 1).reshape(2, 3))
assert np.array_equal(get('d', '<f8'), np.arange(4) / 3.0)
assert get('e', '<f4').shape == (0, 5)
assert get('s', '<f4').shape == () and get('s', '<f4') == 42.5
assert max(e['data_offsets'][1] for e in header.values()) == len(data)
# Now write one the way another library might: no padding, keys not in data order.
b = np.arange(6, dtype='<f4').reshape(3, 2) / 7
a = np.array([1e-300, -2.0], dtype='<f8')
head = json.dumps({'b': {'dtype': 'F32', 'shape': [3, 2], 'data_offsets': [16, 40]},
                   'a': {'dtype': 'F64', 'shape': [2], 'data_offsets': [0, 16]}}).encode()
open(sys.argv[2], 'wb').write(struct.pack('<Q', len(head)) + head + a.tobytes() + b.tobytes())
)PY");
  const std::string theirs = dir.file("theirs.safetensors");
  ASSERT_EQ(run_command("/usr/bin/python3 " + script + " " + ours + " " + theirs), 0)
      << "numpy disagrees with the file we wrote (see the assertion above)";
  const auto tensors = load_safetensors(theirs, Device::cpu()).tensors;
  EXPECT_EQ(tensors.at("a").to_host<double>(), (std::vector<double>{1e-300, -2.0}));
  std::vector<float> b(6);
  for (int i = 0; i < 6; ++i) b[static_cast<std::size_t>(i)] = static_cast<float>(i) / 7.0f;
  EXPECT_EQ(tensors.at("b").shape(), (Shape{3, 2}));
  EXPECT_EQ(tensors.at("b").to_host<float>(), b);
}

// A file: the 8-byte little-endian length (of `header` unless given), the header, the data.
std::string craft(const std::string& header, const std::string& data,
                  std::uint64_t length = std::numeric_limits<std::uint64_t>::max() - 1) {
  if (length == std::numeric_limits<std::uint64_t>::max() - 1) length = header.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &length, 8);
  return out + header + data;
}

class MalformedSafetensors : public ::testing::Test {
 protected:
  // Writes `bytes` and expects both the header reader and the loader to reject them.
  void expect_rejected(const std::string& bytes, const std::string& message) {
    const std::string path = dir_.file("bad.safetensors");
    write_file(path, bytes);
    EXPECT_THROW_WITH(read_safetensors_header(path), IoError, message);
    EXPECT_THROW_WITH(load_safetensors(path, Device::cpu()), IoError, message);
    EXPECT_THROW_WITH(read_safetensors_header(path), IoError, "safetensors file " + path + ": ");
  }
  ScratchDir dir_;
};

TEST_F(MalformedSafetensors, RejectsMissingAndShortFiles) {
  const std::string missing = dir_.file("nope.safetensors");
  EXPECT_THROW_WITH(load_safetensors(missing, Device::cpu()), IoError,
                    "safetensors file " + missing + ": cannot open: No such file or directory");
  EXPECT_THROW_WITH(load_safetensors(dir_.path().string(), Device::cpu()), IoError,
                    "not a regular file");
  expect_rejected("", "is 0 bytes, too short for the 8-byte header length");
  expect_rejected(std::string("\x02\0\0\0\0", 5), "is 5 bytes, too short");
}

TEST_F(MalformedSafetensors, RejectsBadHeaderLengths) {
  const std::string ok = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  expect_rejected(craft(ok, "abcd", ~std::uint64_t{0}),
                  "header length 18446744073709551615 is absurd");
  expect_rejected(craft(ok, "abcd", ~std::uint64_t{0} - 7), "is absurd");  // 8 + it wraps to 0
  expect_rejected(craft(ok, "abcd", 200'000'000), "header length 200000000 is absurd");
  expect_rejected(craft(ok, "abcd", ok.size() + 5), "runs past the end of the file");
}

TEST_F(MalformedSafetensors, RejectsHeadersThatAreNotJsonObjects) {
  expect_rejected(craft("{\"a\": ", ""), "the header is not valid JSON");
  expect_rejected(craft("not json at all", ""), "the header is not valid JSON");
  expect_rejected(craft("[1, 2]", ""), "the header is not a JSON object");
  expect_rejected(craft(R"({"a": 5})", ""), "tensor 'a' is not a JSON object");
  expect_rejected(craft(R"({"__metadata__": [1]})", ""), "__metadata__ is not a JSON object");
  expect_rejected(craft(R"({"__metadata__": {"k": 1}})", ""), "__metadata__ 'k' is not a string");
  expect_rejected(craft(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", "abcd"),
                  "tensor 'a' has no 'shape'");
}

TEST_F(MalformedSafetensors, RejectsUnsupportedDtypes) {
  for (const char* dtype : {"I64", "U8", "BOOL", "F8_E4M3", "float32", "bf16"}) {
    expect_rejected(
        craft(std::string(R"({"a":{"dtype":")") + dtype + R"(","shape":[2],"data_offsets":[0,4]}})",
              "abcd"),
        std::string("tensor 'a' has unsupported dtype ") + dtype +
            " (towerlab reads F32, F64, BF16 and F16)");
  }
  expect_rejected(craft(R"({"a":{"dtype":32,"shape":[1],"data_offsets":[0,4]}})", "abcd"),
                  "tensor 'a': dtype is not a string");
}

TEST_F(MalformedSafetensors, RejectsBadShapes) {
  const auto with_shape = [](const std::string& shape) {
    return craft(R"({"a":{"dtype":"F32","shape":)" + shape + R"(,"data_offsets":[0,4]}})", "abcd");
  };
  expect_rejected(with_shape("[-1, 4]"), "tensor 'a': shape [-1,4] has a negative dimension");
  expect_rejected(with_shape("[2.5]"), "holds something other than integers");
  expect_rejected(with_shape("[\"1\"]"), "holds something other than integers");
  expect_rejected(with_shape("7"), "shape is not an array");
  expect_rejected(with_shape("[18446744073709551615]"), "overflows 64 bits");
  expect_rejected(with_shape("[4294967296, 4294967296, 0]"), "overflows 64 bits");
  expect_rejected(with_shape("[1152921504606846976, 8]"), "overflows 64 bits");
  expect_rejected(with_shape("[4611686018427387904]"), "overflows 64 bits");  // * 4 bytes
  // A hostile shape is quoted, not copied whole, into the message.
  std::string long_shape = "[";
  for (int i = 0; i < 1000; ++i) long_shape += "1,";
  long_shape += "-1]";
  write_file(dir_.file("long.safetensors"), with_shape(long_shape));
  try {
    read_safetensors_header(dir_.file("long.safetensors"));
    ADD_FAILURE() << "a negative dimension was accepted";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(",1,... has a negative dimension"), std::string::npos)
        << e.what();
    EXPECT_LT(std::string(e.what()).size(), 200u);
  }
}

TEST_F(MalformedSafetensors, RejectsOffsetsThatDoNotFit) {
  expect_rejected(
      craft(R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", std::string(12, 'x')),
      "tensor 'a': data_offsets [0,12] do not match float32[2,2] (16 bytes)");
  expect_rejected(
      craft(R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[8,0]}})", std::string(8, 'x')),
      "do not match float64[1] (8 bytes)");
  expect_rejected(craft(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,-4]}})", "abcd"),
                  "data_offsets [0,-4] is not a pair of non-negative integers");
  expect_rejected(craft(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", "abcd"),
                  "is not a pair");
  expect_rejected(
      craft(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", std::string(8, 'x')),
      "data_offsets [0,16] go beyond the data section (8 bytes)");
  // A huge tensor whose offsets agree with its shape must still fit in the file.
  expect_rejected(craft(R"({"a":{"dtype":"F32","shape":[1000000000000],)"
                        R"("data_offsets":[0,4000000000000]}})",
                        "abcd"),
                  "go beyond the data section (4 bytes)");
}

TEST_F(MalformedSafetensors, RejectsOverlapsHolesAndTrailingGarbage) {
  expect_rejected(craft(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                        R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                        std::string(24, 'x')),
                  "tensor 'b' (bytes 8 to 24) overlaps tensor 'a' (bytes 0 to 16)");
  expect_rejected(craft(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}})",
                        std::string(24, 'x')),
                  "the data is not contiguous: 8 unused bytes before tensor 'b'");
  expect_rejected(
      craft(R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", std::string(12, 'x')),
      "4 unused bytes before tensor 'b'");
  expect_rejected(
      craft(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", std::string(12, 'x')),
      "4 bytes of trailing garbage after the last tensor");
  expect_rejected(craft("{}", "junk"), "4 bytes of trailing garbage");
}

TEST_F(MalformedSafetensors, AcceptsAnyTensorOrderAndHeaderPadding) {
  const std::string header = R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
                             R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                             R"("a":{"dtype":"F32","shape":[],"data_offsets":[0,4]}}     )";
  const float values[2] = {1.25f, -3.0f};
  std::string data(8, '\0');
  std::memcpy(data.data(), values, 8);
  const std::string path = dir_.file("ok.safetensors");
  write_file(path, craft(header, data));
  const auto tensors = load_safetensors(path, Device::cpu()).tensors;
  EXPECT_EQ(tensors.at("a").to_host<float>(), std::vector<float>{1.25f});
  EXPECT_EQ(tensors.at("b").to_host<float>(), std::vector<float>{-3.0f});
  EXPECT_EQ(tensors.at("e").numel(), 0);
  EXPECT_EQ(read_safetensors_header(path).entries[0].name, "a");  // data order
}

// A seeded mini-fuzz: corrupt a good file at random (flip bytes, truncate) and load it.
// Every outcome must be a clean load or an IoError (the sanitizer build checks the rest).
TEST_F(MalformedSafetensors, SurvivesRandomCorruption) {
  const std::string good_path = dir_.file("good.safetensors");
  const Stream& cpu = default_stream(Device::cpu());
  save_safetensors(good_path,
                   {{"a", Tensor::zeros({3, 4}, cpu)},
                    {"b", Tensor::zeros({5}, cpu, DType::Float64)},
                    {"c", Tensor::zeros({0, 2}, cpu)}},
                   {{"k", "v"}});
  const std::string good = read_file(good_path);
  std::mt19937 gen(2024);
  int rejected = 0;
  for (int trial = 0; trial < 1500; ++trial) {
    std::string bytes = good;
    if (trial % 5 == 0) {
      bytes.resize(gen() % bytes.size());
    } else {
      const int flips = 1 + static_cast<int>(gen() % 4);
      for (int f = 0; f < flips; ++f) {
        // Mostly in the length field and the header, where the structure is.
        const std::size_t at = gen() % std::min<std::size_t>(bytes.size(), 8 + 220);
        bytes[at] = static_cast<char>(gen() % 256);
      }
    }
    const std::string path = dir_.file("fuzz.safetensors");
    write_file(path, bytes);
    try {
      load_safetensors(path, Device::cpu());
    } catch (const IoError&) {
      ++rejected;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "trial " << trial << ": not an IoError: " << e.what();
    }
  }
  EXPECT_GT(rejected, 1000) << "most corruptions must be caught";
}

TEST(CheckpointMismatch, ListsMissingUnexpectedAndMisShaped) {
  const std::vector<TensorSpec> model = {{"conv1/weight", {32, 1, 3, 3}},
                                         {"conv2/weight", {64, 32, 3, 3}},
                                         {"fc1/weight", {128, 784}},
                                         {"fc1/bias", {128}}};
  std::vector<SafetensorsEntry> file = {{"conv1/weight", DType::Float32, {32, 1, 3, 3}},
                                        {"fc1/weight", DType::Float32, {128, 3136}},
                                        {"fc1/bias", DType::Float64, {128}},
                                        {"fc3/bias", DType::Float32, {10}}};
  const std::string expected =
      "checkpoint model.safetensors does not match the model: missing conv2/weight "
      "[64,32,3,3]; mis-shaped fc1/weight: file [128,3136], model [128,784]; wrong dtype "
      "fc1/bias: file float64, model float32; unexpected fc3/bias";
  EXPECT_EQ(checkpoint_mismatch("model.safetensors", model, file), expected);
  EXPECT_THROW_WITH(check_checkpoint("model.safetensors", model, file), CheckpointMismatch,
                    expected);
  EXPECT_THROW_WITH(check_checkpoint("model.safetensors", model, file), InvalidArgument,
                    "missing conv2/weight");

  // A matching file in another order passes.
  file = {{"fc1/bias", DType::Float32, {128}},
          {"conv2/weight", DType::Float32, {64, 32, 3, 3}},
          {"fc1/weight", DType::Float32, {128, 784}},
          {"conv1/weight", DType::Float32, {32, 1, 3, 3}}};
  EXPECT_EQ(checkpoint_mismatch("model.safetensors", model, file), "");
  EXPECT_NO_THROW(check_checkpoint("model.safetensors", model, file));
}

TEST(CheckpointMismatch, ChecksARealFile) {
  ScratchDir dir;
  const std::string path = dir.file("model.safetensors");
  save_safetensors(path, {{"w", Tensor::zeros({2, 3}, Device::cpu())}});
  const auto entries = read_safetensors_header(path).entries;
  EXPECT_NO_THROW(check_checkpoint(path, {{"w", {2, 3}}}, entries));
  EXPECT_THROW_WITH(
      check_checkpoint(path, {{"w", {3, 2}}}, entries), CheckpointMismatch,
      "checkpoint " + path + " does not match the model: mis-shaped w: file [2,3], model [3,2]");
}

}  // namespace
}  // namespace towerlab::testing
