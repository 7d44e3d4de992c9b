#include "engine/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <limits>

#include "engine/atomic_file.h"
#include "engine/error.h"
#include "engine/tensor.h"

namespace towerlab {
namespace {

// Large enough for any dataset of this family (ImageNet at 64x64 is ~15 GB), small
// enough that a corrupt header is caught before it is believed.
constexpr std::uint64_t kMaxIdxBytes = std::uint64_t{16} << 30;
constexpr std::size_t kChunkBytes = std::size_t{16} << 20;

#define TL_BAD_IDX(msg) TL_THROW(IoError, "IDX file " << path << ": " << msg)

const char* type_code_name(int code) {
  switch (code) {
    case 0x09:
      return "signed byte";
    case 0x0B:
      return "int16";
    case 0x0C:
      return "int32";
    case 0x0D:
      return "float32";
    case 0x0E:
      return "float64";
    default:
      return nullptr;
  }
}

// gzFile with RAII; zlib reads plain files through the same calls.
class GzReader {
 public:
  explicit GzReader(const std::string& path) : path_(path) {
    errno = 0;
    file_ = gzopen(path.c_str(), "rb");
    if (file_ == nullptr) {
      TL_BAD_IDX("cannot open: " << (errno ? os_error_text(errno) : "out of memory"));
    }
    gzbuffer(file_, 1 << 20);
  }
  ~GzReader() { gzclose(file_); }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  // Reads up to `bytes`; fewer only at the end of the data. Throws on corrupt or
  // truncated gzip data and on read errors.
  std::size_t read(void* data, std::size_t bytes) {
    char* p = static_cast<char*>(data);
    std::size_t got = 0;
    while (got < bytes) {
      const auto want = static_cast<unsigned>(std::min<std::size_t>(bytes - got, 1u << 30));
      const int n = gzread(file_, p + got, want);
      check_error();
      if (n <= 0) break;
      got += static_cast<std::size_t>(n);
    }
    return got;
  }

 private:
  void check_error() {
    const std::string& path = path_;  // for TL_BAD_IDX
    int code = Z_OK;
    std::string message = gzerror(file_, &code);
    if (code == Z_OK) return;
    // zlib prefixes its messages with the path, which ours already names.
    if (message.rfind(path + ": ", 0) == 0) message.erase(0, path.size() + 2);
    if (code == Z_ERRNO) TL_BAD_IDX("read failed: " << os_error_text(errno));
    // Z_BUF_ERROR is zlib's "unexpected end of file" inside a gzip stream.
    if (code == Z_BUF_ERROR) TL_BAD_IDX("the gzip stream is truncated (" << message << ")");
    TL_BAD_IDX("corrupt gzip data (" << message << ")");
  }

  const std::string& path_;
  gzFile file_ = nullptr;
};

}  // namespace

IdxArray read_idx(const std::string& path) {
  GzReader in(path);
  unsigned char magic[4] = {};
  const std::size_t got_magic = in.read(magic, 4);
  if (got_magic < 4)
    TL_BAD_IDX("is " << got_magic << " bytes long, too short for the magic number");
  if (magic[0] != 0 || magic[1] != 0) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "0x%02X%02X%02X%02X", magic[0], magic[1], magic[2], magic[3]);
    TL_BAD_IDX("bad magic number " << hex << " (an IDX file starts with 0x0000)");
  }
  if (magic[2] != 0x08) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02X", magic[2]);
    if (const char* name = type_code_name(magic[2])) {
      TL_BAD_IDX("type code " << hex << " (" << name
                              << ") is not supported: towerlab reads unsigned bytes (0x08)");
    }
    TL_BAD_IDX("unknown type code " << hex << " (unsigned bytes are 0x08)");
  }
  const int rank = magic[3];
  if (rank == 0) TL_BAD_IDX("has 0 dimensions");

  IdxArray out;
  std::uint64_t total = 1;
  bool overflow = false;
  for (int i = 0; i < rank; ++i) {
    unsigned char be[4];
    if (in.read(be, 4) < 4) {
      TL_BAD_IDX("truncated: the header ends inside dimension " << i << " of " << rank);
    }
    const std::uint64_t d = (std::uint64_t{be[0]} << 24) | (std::uint64_t{be[1]} << 16) |
                            (std::uint64_t{be[2]} << 8) | std::uint64_t{be[3]};
    out.dims.push_back(static_cast<std::int64_t>(d));
    if (d != 0 && total > std::numeric_limits<std::uint64_t>::max() / d) overflow = true;
    total *= d;
  }
  if (overflow && std::find(out.dims.begin(), out.dims.end(), 0) == out.dims.end()) {
    TL_BAD_IDX("dims " << to_string(out.dims) << " overflow 64 bits");
  }
  if (overflow) total = 0;
  if (total > kMaxIdxBytes) {
    TL_BAD_IDX("dims " << to_string(out.dims) << " describe " << total
                       << " bytes, more than the 16 GiB this reader accepts");
  }

  // Grow with the data that arrives rather than trusting the header with one allocation.
  while (out.data.size() < total) {
    const std::size_t old = out.data.size();
    const std::size_t chunk = std::min<std::uint64_t>(total - old, kChunkBytes);
    out.data.resize(old + chunk);
    const std::size_t got = in.read(out.data.data() + old, chunk);
    if (got < chunk) {
      TL_BAD_IDX("truncated: the data ends after " << old + got << " of the " << total
                                                   << " bytes that dims " << to_string(out.dims)
                                                   << " describe");
    }
  }
  std::uint64_t extra = 0;
  char scratch[1 << 16];
  for (std::size_t n; (n = in.read(scratch, sizeof scratch)) > 0;) extra += n;
  if (extra > 0) {
    TL_BAD_IDX(extra << " bytes after the " << total << " that dims " << to_string(out.dims)
                     << " describe");
  }
  return out;
}

#undef TL_BAD_IDX

}  // namespace towerlab
