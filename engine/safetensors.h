// Checkpoints in the safetensors format (https://github.com/huggingface/safetensors),
// so that a towerlab model can be read by numpy, PyTorch or the safetensors library,
// and the other way round.
//
// The format:
//   bytes [0, 8)        N, the header length: an unsigned 64-bit little-endian integer
//   bytes [8, 8 + N)    a JSON object: for each tensor, "name": {"dtype": "F32" | "F64" |
//                       "BF16" | "F16", "shape": [d0, ...], "data_offsets": [begin, end]}, plus an
//                       optional "__metadata__": {string: string}. towerlab pads the
//                       header with spaces so that the data starts on an 8-byte boundary.
//   bytes [8 + N, end)  the data section: each tensor's values, row-major, little-endian,
//                       at [begin, end) relative to the section's start. The tensors tile
//                       the section exactly: no overlaps, no holes, nothing after the last.
//
// Saving is atomic: the bytes go to a uniquely named temporary file in the target's
// directory (".<name>.tmp-<pid>-<n>-<random>", hidden and without the target's suffix,
// so that no glob for "*.safetensors" picks one up), which is fsync'ed and renamed over
// the target, and then the directory is fsync'ed. A crash, a kill or a full disk leaves
// either the old file or the complete new one at the path, never a mix; a killed process
// may leave its temporary file behind.
//
// Loading checks everything the format promises before it trusts a number from the
// file, so a truncated or hostile file gives an IoError naming the path and the problem,
// never a crash or a huge allocation.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tensor.h"

namespace towerlab {

// Writes `tensors` to `path`. The tensors may live on any device (device tensors are
// copied to the host on default_stream(device), so the work that produced them on
// other streams must have finished); stored as "F32", "F64", "BF16" or "F16", bits as they are.
// The header lists the tensors in the given order and the data section holds them in
// the same order; read_safetensors_header() gives them back in that order.
// Throws InvalidArgument for an empty, repeated or reserved ("__metadata__") name or an
// undefined tensor, and IoError naming the path and the OS error (strerror) when the
// file cannot be written; the file that was at `path` before is then untouched and the
// temporary file removed.
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// One tensor of a file: where its bytes are, relative to the data section.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::Float32;
  Shape shape;
  std::uint64_t data_begin = 0;
  std::uint64_t data_end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;  // in data-section order
  std::map<std::string, std::string> metadata;
  std::uint64_t data_offset = 0;  // where the data section starts in the file (8 + N)
  std::uint64_t data_size = 0;    // bytes in the data section
};

// Reads and validates the header (and the file size) without reading any tensor data.
// Throws IoError for a missing or malformed file.
SafetensorsHeader read_safetensors_header(const std::string& path);

// A whole file: its tensors by name and its "__metadata__" (empty when the file has none).
struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

// Reads every tensor onto `device` (through the host for a CUDA device), and the
// metadata. float64 tensors load on the CPU only (NotSupported elsewhere). Throws
// IoError as above.
SafetensorsFile load_safetensors(const std::string& path, Device device);

// What a model expects to find in a checkpoint.
struct TensorSpec {
  std::string name;
  Shape shape;
  DType dtype = DType::Float32;
};

// "" when the file's entries are exactly `expected` (same names, shapes and dtypes, in
// any order); otherwise one message listing everything that differs:
//   "checkpoint model.safetensors does not match the model: missing conv2/weight
//    [64,32,3,3]; unexpected fc3/bias; mis-shaped fc1/weight: file [128,3136], model
//    [128,784]; wrong dtype fc2/bias: file float64, model float32"
std::string checkpoint_mismatch(const std::string& path, const std::vector<TensorSpec>& expected,
                                const std::vector<SafetensorsEntry>& entries);
// Throws CheckpointMismatch with the message above when they differ.
void check_checkpoint(const std::string& path, const std::vector<TensorSpec>& expected,
                      const std::vector<SafetensorsEntry>& entries);

}  // namespace towerlab
