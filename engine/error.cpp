#include "engine/error.h"

#include <cstdio>
#include <utility>

namespace towerlab {

namespace {

template <typename E>
[[noreturn]] void rethrow_as(const E& e, const std::string& context) {
  throw E(context + e.what());
}

std::string sample_message(const std::string& head, std::int64_t row, const std::string& tail,
                           const std::string& note) {
  return head + "[" + std::to_string(row) + "]" + tail + " (" + note + ")";
}

}  // namespace

SampleError::SampleError(std::string head, std::int64_t row, std::string tail, std::string note)
    : InvalidArgument(sample_message(head, row, tail, note)),
      head_(std::move(head)),
      tail_(std::move(tail)),
      note_(std::move(note)),
      row_(row) {}

SampleError SampleError::in_batch(const std::string& context, std::int64_t first_row) const {
  const std::int64_t row = first_row + row_;
  return SampleError(context + head_, row, tail_, "row " + std::to_string(row) + " of the batch");
}

SampleError SampleError::with_context(const std::string& context) const {
  return SampleError(context + head_, row_, tail_, note_);
}

void rethrow_with_context(const std::string& context, std::int64_t first_row) {
  try {
    throw;
  } catch (const SampleError& e) {
    throw e.in_batch(context, first_row);
  } catch (...) {
    rethrow_with_context(context);
  }
}

void rethrow_with_context(const std::string& context) {
  // Most derived first: a catch clause matches base classes too.
  try {
    throw;
  } catch (const SampleError& e) {
    throw e.with_context(context);
  } catch (const CheckpointMismatch& e) {
    rethrow_as(e, context);
  } catch (const ShapeError& e) {
    rethrow_as(e, context);
  } catch (const DeviceError& e) {
    rethrow_as(e, context);
  } catch (const InvalidArgument& e) {
    rethrow_as(e, context);
  } catch (const OutOfMemory& e) {
    rethrow_as(e, context);
  } catch (const CudaError& e) {
    rethrow_as(e, context);
  } catch (const IoError& e) {
    rethrow_as(e, context);
  } catch (const NumericError& e) {
    rethrow_as(e, context);
  } catch (const NotSupported& e) {
    rethrow_as(e, context);
  } catch (const Error& e) {
    rethrow_as(e, context);
  }
}

}  // namespace towerlab

namespace towerlab::detail {

namespace {
std::string on_device(int device) {
  return device < 0 ? std::string() : " on cuda:" + std::to_string(device);
}
}  // namespace

void throw_cuda_error(const char* expr, const char* what, int device, const char* file, int line) {
  std::ostringstream os;
  os << expr << " failed" << on_device(device) << " with " << what << " at " << file << ":" << line;
  throw CudaError(os.str());
}

void log_cuda_error(const char* expr, const char* what, int device, const char* file,
                    int line) noexcept {
  std::fprintf(stderr, "towerlab: %s failed%s with %s at %s:%d (ignored in a destructor)\n", expr,
               on_device(device).c_str(), what, file, line);
}

}  // namespace towerlab::detail
