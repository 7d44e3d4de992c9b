// The fuzz targets: one function per parser of outside bytes. Each feeds the bytes
// to the parser as a user's program would and accepts exactly the outcomes the
// parser documents: a parsed value that keeps the parser's promises, or the typed
// error it names. Anything else escapes as an exception (a broken promise or an
// undocumented error type), and the sanitizers catch crashes, overflows and leaks.
//
// fuzz/main.cpp wraps one of them in libFuzzer's entry point (built with clang by
// the `fuzz` preset); tests/fuzz_corpus_test.cpp replays the seed corpus and every
// regression input through the same functions in the ordinary test builds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace towerlab::fuzz {

// Thrown when a parser returns something that breaks its documented promise.
struct BrokenPromise : std::logic_error {
  using std::logic_error::logic_error;
};

// The bytes as a safetensors file: header, data, checkpoint matching. IoError is fine.
void safetensors(const std::uint8_t* data, std::size_t size);
// The bytes as an IDX file, gzip-compressed or plain. IoError is fine.
void idx(const std::uint8_t* data, std::size_t size);
// The bytes as the fashion_mnist sample's YAML --config file. The parser reports
// every problem itself (an exit code), so nothing may escape.
void config(const std::uint8_t* data, std::size_t size);
// The bytes as a device string and as a device list. DeviceError is fine.
void device(const std::uint8_t* data, std::size_t size);

// The targets by name ("safetensors", "idx", "config", "device"); nullptr if unknown.
using Target = void (*)(const std::uint8_t*, std::size_t);
Target target_by_name(std::string_view name);

}  // namespace towerlab::fuzz
