// The IDX format of the MNIST family (http://yann.lecun.com/exdb/mnist/): a 4-byte
// magic number, then one big-endian uint32 per dimension, then the values.
//
//   byte 0, 1   0x00 0x00
//   byte 2      the type code: 0x08 unsigned byte (the only one towerlab reads; 0x09
//               signed byte, 0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64 exist)
//   byte 3      D, the number of dimensions
//   4 * D bytes the dimensions d0 .. d(D-1), big-endian uint32
//   then        d0 * ... * d(D-1) values, row-major, and nothing after them
//
// Files may be gzip-compressed (".gz", as distributed) or plain: zlib reads both.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace towerlab {

struct IdxArray {
  std::vector<std::int64_t> dims;  // e.g. {60000, 28, 28}
  std::vector<std::uint8_t> data;  // product(dims) values, row-major
};

// Reads an unsigned-byte IDX file, gzip-compressed or not. Throws IoError naming the
// path and the problem: a missing file, a bad magic number or type code, a size that
// overflows or is absurd (more than 16 GiB), a truncated file or gzip stream, or data
// after the last value. Memory grows with the data actually read, so a corrupt
// header cannot ask for a huge allocation.
IdxArray read_idx(const std::string& path);

}  // namespace towerlab
