// The IDX reader: plain and gzip files written by the test, and every malformed
// header, size and stream rejected with the path and the problem.
#include "engine/idx.h"

#include <random>

#include "file_test_util.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

// An IDX file: the magic (type code, rank), big-endian dims, then `data`.
std::string idx_bytes(const std::vector<std::uint32_t>& dims, const std::string& data,
                      unsigned char type = 0x08) {
  std::string out = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  for (std::uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(d >> shift));
  }
  return out + data;
}

std::string counting_bytes(std::size_t n) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i * 7 % 256);
  return s;
}

class IdxTest : public ::testing::Test {
 protected:
  std::string write(const std::string& bytes, const std::string& name = "data.idx") {
    const std::string path = dir_.file(name);
    write_file(path, bytes);
    return path;
  }
  void expect_rejected(const std::string& bytes, const std::string& message) {
    const std::string path = write(bytes);
    EXPECT_THROW_WITH(read_idx(path), IoError, "IDX file " + path + ": " + message);
    // The same problem inside a gzip stream reads the same.
    const std::string gz = write(gzip_stored(bytes), "data.idx.gz");
    EXPECT_THROW_WITH(read_idx(gz), IoError, "IDX file " + gz + ": " + message);
  }
  ScratchDir dir_;
};

TEST_F(IdxTest, ReadsPlainAndGzipFiles) {
  const std::string data = counting_bytes(3 * 5 * 7);
  const std::vector<std::uint8_t> expected(data.begin(), data.end());
  for (const std::string& path : {write(idx_bytes({3, 5, 7}, data), "a.idx"),
                                  write(gzip_stored(idx_bytes({3, 5, 7}, data)), "a.idx.gz")}) {
    const IdxArray array = read_idx(path);
    EXPECT_EQ(array.dims, (std::vector<std::int64_t>{3, 5, 7})) << path;
    EXPECT_EQ(array.data, expected) << path;
  }
}

TEST_F(IdxTest, ReadsLargeMultiBlockGzipAndEmptyArrays) {
  // 200000 bytes: several stored blocks, and more than one read chunk of zlib's buffer.
  const std::string data = counting_bytes(200000);
  IdxArray array = read_idx(write(gzip_stored(idx_bytes({200000}, data)), "big.gz"));
  ASSERT_EQ(array.data.size(), 200000u);
  EXPECT_EQ(array.data[199999], static_cast<std::uint8_t>(199999 * 7 % 256));
  array = read_idx(write(idx_bytes({0, 28, 28}, ""), "empty.idx"));
  EXPECT_EQ(array.dims, (std::vector<std::int64_t>{0, 28, 28}));
  EXPECT_TRUE(array.data.empty());
}

TEST_F(IdxTest, RejectsMissingAndShortFiles) {
  const std::string missing = dir_.file("missing.idx");
  EXPECT_THROW_WITH(read_idx(missing), IoError,
                    "IDX file " + missing + ": cannot open: No such file or directory");
  expect_rejected("", "is 0 bytes long, too short for the magic number");
  expect_rejected(std::string("\0\0", 2), "is 2 bytes long");
}

TEST_F(IdxTest, RejectsBadMagicAndTypeCodes) {
  expect_rejected("\x01\x02\x08\x01rest", "bad magic number 0x01020801");
  expect_rejected(idx_bytes({2}, std::string(8, 'x'), 0x0D),
                  "type code 0x0D (float32) is not supported: towerlab reads unsigned bytes");
  expect_rejected(idx_bytes({2}, "xx", 0x09), "type code 0x09 (signed byte) is not supported");
  expect_rejected(idx_bytes({2}, "xx", 0x42), "unknown type code 0x42");
  expect_rejected(idx_bytes({}, ""), "has 0 dimensions");
}

TEST_F(IdxTest, RejectsDataThatDoesNotMatchTheDims) {
  std::string header_cut = idx_bytes({2, 3, 4}, "");
  header_cut.resize(10);
  expect_rejected(header_cut, "truncated: the header ends inside dimension 1 of 3");
  expect_rejected(idx_bytes({2, 3}, "abcde"),
                  "truncated: the data ends after 5 of the 6 bytes that dims [2,3] describe");
  expect_rejected(idx_bytes({2, 3}, "abcdefgh"), "2 bytes after the 6 that dims [2,3] describe");
}

TEST_F(IdxTest, RejectsHugeDimsWithoutAllocatingThem) {
  expect_rejected(idx_bytes({4294967295u, 4294967295u, 4294967295u}, "x"),
                  "dims [4294967295,4294967295,4294967295] overflow 64 bits");
  expect_rejected(
      idx_bytes({100000, 100000, 100}, "x"),
      "dims [100000,100000,100] describe 1000000000000 bytes, more than the 16 GiB this "
      "reader accepts");
  // 10 GB is allowed by the limit, but the file holds 6 bytes: reading stops there
  // (this would need a 10 GB buffer if the header were trusted).
  expect_rejected(idx_bytes({100000, 100000}, "abcdef"),
                  "truncated: the data ends after 6 of the 10000000000 bytes");
}

TEST_F(IdxTest, RejectsCorruptAndTruncatedGzip) {
  const std::string good = gzip_stored(idx_bytes({4}, "abcd"));
  std::string truncated = good.substr(0, good.size() - 12);
  const std::string t = write(truncated, "truncated.gz");
  EXPECT_THROW_WITH(read_idx(t), IoError, "IDX file " + t + ": ");
  EXPECT_THROW_WITH(read_idx(t), IoError, "truncated");

  std::string bad_crc = good;
  bad_crc[bad_crc.size() - 8] ^= 0x55;
  const std::string c = write(bad_crc, "crc.gz");
  EXPECT_THROW_WITH(read_idx(c), IoError, "IDX file " + c + ": corrupt gzip data");

  std::string bad_block = good;
  bad_block[10] = '\x07';  // BTYPE 11: a reserved block type
  const std::string b = write(bad_block, "block.gz");
  EXPECT_THROW_WITH(read_idx(b), IoError, "corrupt gzip data (invalid block type)");
}

// A seeded mini-fuzz over gzip'ed and plain IDX files: a clean read or an IoError.
TEST_F(IdxTest, SurvivesRandomCorruption) {
  const std::string plain = idx_bytes({3, 4, 5}, counting_bytes(60));
  const std::string gz = gzip_stored(plain);
  std::mt19937 gen(7);
  for (int trial = 0; trial < 1000; ++trial) {
    std::string bytes = trial % 2 ? gz : plain;
    if (trial % 7 == 0) {
      bytes.resize(gen() % bytes.size());
    } else {
      for (int f = 0; f < 2; ++f) bytes[gen() % bytes.size()] = static_cast<char>(gen() % 256);
    }
    const std::string path = write(bytes, "fuzz.idx");
    try {
      const IdxArray array = read_idx(path);
      std::uint64_t total = 1;
      for (auto d : array.dims) total *= static_cast<std::uint64_t>(d);
      EXPECT_EQ(array.data.size(), total) << "trial " << trial;
    } catch (const IoError&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << "trial " << trial << ": not an IoError: " << e.what();
    }
  }
}

}  // namespace
}  // namespace towerlab::testing
