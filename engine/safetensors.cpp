#include "engine/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "engine/atomic_file.h"
#include "engine/error.h"

namespace towerlab {

// The format is little-endian and towerlab writes its memory as is.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

namespace {

// A header this large is not a checkpoint header (a ResNet-50 header is ~20 KB):
// refuse it before allocating, so that a corrupt length cannot ask for terabytes.
constexpr std::uint64_t kMaxHeaderBytes = 100u * 1000u * 1000u;

// The format's names of towerlab's dtypes, both ways.
constexpr std::pair<DType, const char*> kDTypeNames[] = {{DType::Float32, "F32"},
                                                         {DType::Float64, "F64"},
                                                         {DType::BFloat16, "BF16"},
                                                         {DType::Float16, "F16"}};

const char* safetensors_dtype(DType dtype) {
  for (const auto& [d, name] : kDTypeNames) {
    if (d == dtype) return name;
  }
  TL_THROW(InvalidArgument, "save_safetensors: no safetensors name for " << dtype_name(dtype));
}

// A tensor's bytes on the host: CPU tensors are written from their own memory,
// device tensors from a host copy (kept alive in `copy`).
struct HostBytes {
  const void* data = nullptr;
  std::size_t bytes = 0;
  Tensor copy;
};

HostBytes host_bytes(const Tensor& t) {
  HostBytes out;
  out.bytes = t.nbytes();
  const Stream& stream = default_stream(t.device());
  if (t.device().is_cpu()) {
    stream.synchronize();
    out.data = t.raw_data();
  } else {
    out.copy = t.to(Device::cpu(), stream);  // waits: a host copy ends with a synchronize
    out.data = out.copy.raw_data();
  }
  return out;
}

}  // namespace

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::set<std::string> seen;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    TL_CHECK(!name.empty(), InvalidArgument,
             "save_safetensors " << path << ": tensor " << i << " has an empty name");
    TL_CHECK(
        name != "__metadata__", InvalidArgument,
        "save_safetensors " << path << ": '__metadata__' is reserved and cannot name a tensor");
    TL_CHECK(seen.insert(name).second, InvalidArgument,
             "save_safetensors " << path << ": the name '" << name << "' appears twice");
    TL_CHECK(t.defined(), InvalidArgument,
             "save_safetensors " << path << ": tensor '" << name << "' is undefined");
  }

  // ordered_json keeps the given order in the header, so the header reads like the
  // data section.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    header[name] = {{"dtype", safetensors_dtype(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    TL_THROW(InvalidArgument, "save_safetensors " << path << ": names and metadata must be UTF-8 ("
                                                  << e.what() << ")");
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  const std::uint64_t length = text.size();

  AtomicFile file(path);
  file.write(&length, sizeof length);
  file.write(text.data(), text.size());
  for (const auto& [name, t] : tensors) {
    const HostBytes bytes = host_bytes(t);
    if (bytes.bytes > 0) file.write(bytes.data, bytes.bytes);
  }
  file.commit();
}

namespace {

// Every rejection names the file and says what is wrong with it.
#define TL_BAD_FILE(msg) TL_THROW(IoError, "safetensors file " << path << ": " << msg)

// A JSON value for an error message, cut short: a hostile header may hold a
// million-element "shape".
std::string brief(const nlohmann::json& value) {
  std::string text = value.dump();
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

DType parse_dtype(const std::string& path, const std::string& name, const nlohmann::json& value) {
  if (!value.is_string()) TL_BAD_FILE("tensor '" << name << "': dtype is not a string");
  const auto& text = value.get_ref<const std::string&>();
  for (const auto& [dtype, known] : kDTypeNames) {
    if (text == known) return dtype;
  }
  TL_BAD_FILE("tensor '" << name << "' has unsupported dtype " << text
                         << " (towerlab reads F32, F64, BF16 and F16)");
}

Shape parse_shape(const std::string& path, const std::string& name, const nlohmann::json& value) {
  if (!value.is_array()) TL_BAD_FILE("tensor '" << name << "': shape is not an array");
  Shape shape;
  for (const auto& d : value) {
    if (d.is_number_integer() && !d.is_number_unsigned() && d.get<std::int64_t>() < 0) {
      TL_BAD_FILE("tensor '" << name << "': shape " << brief(value) << " has a negative dimension");
    }
    if (!d.is_number_unsigned()) {
      TL_BAD_FILE("tensor '" << name << "': shape " << brief(value)
                             << " holds something other than integers");
    }
    const auto n = d.get<std::uint64_t>();
    if (n > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      TL_BAD_FILE("tensor '" << name << "': shape " << brief(value) << " overflows 64 bits");
    }
    shape.push_back(static_cast<std::int64_t>(n));
  }
  return shape;
}

// numel * element size. Like numel_of(), the product is checked left to right, so a
// shape whose running product overflows is refused even if a later dimension is 0.
std::uint64_t byte_size(const std::string& path, const std::string& name, const Shape& shape,
                        DType dtype) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  std::int64_t numel = 1;
  for (std::int64_t d : shape) {
    if (d != 0 && numel > kMax / d) {
      TL_BAD_FILE("tensor '" << name << "': shape " << to_string(shape) << " overflows 64 bits");
    }
    numel *= d;
  }
  const auto n = static_cast<std::uint64_t>(numel);
  if (n > std::numeric_limits<std::uint64_t>::max() / dtype_size(dtype)) {
    TL_BAD_FILE("tensor '" << name << "': shape " << to_string(shape) << " overflows 64 bits");
  }
  return n * dtype_size(dtype);
}

SafetensorsEntry parse_entry(const std::string& path, const std::string& name,
                             const nlohmann::json& value, std::uint64_t data_size) {
  if (!value.is_object()) TL_BAD_FILE("tensor '" << name << "' is not a JSON object");
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!value.contains(key)) TL_BAD_FILE("tensor '" << name << "' has no '" << key << "'");
  }
  SafetensorsEntry e;
  e.name = name;
  e.dtype = parse_dtype(path, name, value["dtype"]);
  e.shape = parse_shape(path, name, value["shape"]);
  const std::uint64_t bytes = byte_size(path, name, e.shape, e.dtype);
  const auto& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    TL_BAD_FILE("tensor '" << name << "': data_offsets " << brief(offsets)
                           << " is not a pair of non-negative integers");
  }
  e.data_begin = offsets[0].get<std::uint64_t>();
  e.data_end = offsets[1].get<std::uint64_t>();
  if (e.data_begin > e.data_end || e.data_end - e.data_begin != bytes) {
    TL_BAD_FILE("tensor '" << name << "': data_offsets " << brief(offsets) << " do not match "
                           << dtype_name(e.dtype) << to_string(e.shape) << " (" << bytes
                           << " bytes)");
  }
  if (e.data_end > data_size) {
    TL_BAD_FILE("tensor '" << name << "': data_offsets " << brief(offsets)
                           << " go beyond the data section (" << data_size << " bytes)");
  }
  return e;
}

SafetensorsHeader parse_header(const std::string& path, const ReadOnlyFile& file) {
  if (file.size() < 8) {
    TL_BAD_FILE("is " << file.size() << " bytes, too short for the 8-byte header length");
  }
  std::uint64_t length = 0;
  file.read_at(0, &length, sizeof length);
  if (length > kMaxHeaderBytes) {
    TL_BAD_FILE("header length " << length << " is absurd (the limit is " << kMaxHeaderBytes
                                 << " bytes); the file is corrupt or not safetensors");
  }
  if (length > file.size() - 8) {
    TL_BAD_FILE("header length " << length << " runs past the end of the file (" << file.size()
                                 << " bytes); is it truncated?");
  }
  std::string text(length, '\0');
  file.read_at(8, text.data(), text.size());

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    TL_BAD_FILE("the header is not valid JSON (" << e.what() << ")");
  }
  if (!header.is_object()) TL_BAD_FILE("the header is not a JSON object");

  SafetensorsHeader out;
  out.data_offset = 8 + length;
  out.data_size = file.size() - out.data_offset;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) TL_BAD_FILE("__metadata__ is not a JSON object");
      for (const auto& [key, item] : value.items()) {
        if (!item.is_string()) TL_BAD_FILE("__metadata__ '" << key << "' is not a string");
        out.metadata[key] = item.get<std::string>();
      }
      continue;
    }
    out.entries.push_back(parse_entry(path, name, value, out.data_size));
  }

  // The spec: the tensors tile the data section, in any order, without overlap or holes.
  std::stable_sort(out.entries.begin(), out.entries.end(), [](const auto& a, const auto& b) {
    return std::pair(a.data_begin, a.data_end) < std::pair(b.data_begin, b.data_end);
  });
  std::uint64_t position = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const auto& e : out.entries) {
    if (e.data_begin < position) {
      TL_BAD_FILE("tensor '" << e.name << "' (bytes " << e.data_begin << " to " << e.data_end
                             << ") overlaps tensor '" << previous->name << "' (bytes "
                             << previous->data_begin << " to " << previous->data_end << ")");
    }
    if (e.data_begin > position) {
      TL_BAD_FILE("the data is not contiguous: "
                  << e.data_begin - position << " unused bytes before tensor '" << e.name << "'");
    }
    position = e.data_end;
    previous = &e;
  }
  if (position != out.data_size) {
    TL_BAD_FILE(out.data_size - position << " bytes of trailing garbage after the last tensor");
  }
  return out;
}

#undef TL_BAD_FILE

}  // namespace

SafetensorsHeader read_safetensors_header(const std::string& path) {
  ReadOnlyFile file(path, "safetensors file " + path);
  return parse_header(path, file);
}

SafetensorsFile load_safetensors(const std::string& path, Device device) {
  ReadOnlyFile file(path, "safetensors file " + path);
  const SafetensorsHeader header = parse_header(path, file);
  SafetensorsFile out;
  out.metadata = header.metadata;
  std::map<std::string, Tensor>& tensors = out.tensors;
  for (const SafetensorsEntry& e : header.entries) {
    const std::uint64_t offset = header.data_offset + e.data_begin;
    const std::size_t bytes = e.data_end - e.data_begin;
    // float64 is refused on a GPU before the read (Tensor::empty's message).
    if (!device.is_cpu()) (void)Tensor::empty({0}, device, e.dtype);
    Tensor t = Tensor::empty(e.shape, Device::cpu(), e.dtype);
    if (bytes > 0) file.read_at(offset, t.raw_data(), bytes);
    tensors.emplace(e.name, device.is_cpu() ? t : t.to(device, default_stream(device)));
  }
  return out;
}

std::string checkpoint_mismatch(const std::string& path, const std::vector<TensorSpec>& expected,
                                const std::vector<SafetensorsEntry>& entries) {
  std::map<std::string, const SafetensorsEntry*> in_file;
  for (const auto& e : entries) in_file.emplace(e.name, &e);
  std::set<std::string> wanted;
  std::vector<std::string> problems;
  for (const TensorSpec& spec : expected) {
    wanted.insert(spec.name);
    auto it = in_file.find(spec.name);
    if (it == in_file.end()) {
      problems.push_back("missing " + spec.name + " " + to_string(spec.shape));
      continue;
    }
    const SafetensorsEntry& e = *it->second;
    if (e.shape != spec.shape) {
      problems.push_back("mis-shaped " + spec.name + ": file " + to_string(e.shape) + ", model " +
                         to_string(spec.shape));
    }
    if (e.dtype != spec.dtype) {
      problems.push_back("wrong dtype " + spec.name + ": file " + dtype_name(e.dtype) + ", model " +
                         dtype_name(spec.dtype));
    }
  }
  for (const auto& e : entries) {
    if (!wanted.count(e.name)) problems.push_back("unexpected " + e.name);
  }
  if (problems.empty()) return "";
  std::ostringstream os;
  os << "checkpoint " << path << " does not match the model: ";
  for (std::size_t i = 0; i < problems.size(); ++i) os << (i ? "; " : "") << problems[i];
  return os.str();
}

void check_checkpoint(const std::string& path, const std::vector<TensorSpec>& expected,
                      const std::vector<SafetensorsEntry>& entries) {
  const std::string message = checkpoint_mismatch(path, expected, entries);
  if (!message.empty()) throw CheckpointMismatch(message);
}

}  // namespace towerlab
