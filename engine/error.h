// towerlab's one error family. Everything the library reports is a subclass of
// towerlab::Error, so an embedding program can catch one type; the subclasses say
// what went wrong so that a caller can react (retry after OutOfMemory, fix the
// input after InvalidArgument). The library never exits and never aborts.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>

namespace towerlab {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The caller passed something that cannot work: a bad argument or option.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A bad value in one row (sample) of an op's input, e.g. a label that is not a
// class. The op sees only the rows it was given and names the row among them; code
// that gave it rows of a larger batch (the trainer gives each tower its slice)
// rethrows it naming the row of the whole batch (rethrow_with_context's
// `first_row`), so the user can find the sample in what they passed.
class SampleError : public InvalidArgument {
 public:
  // what(): head + "[" + row + "]" + tail + " (" + note + ")", e.g.
  // "softmax_cross_entropy_forward: labels[1] = 12 is not a class id in [0, 4) (labels
  // float32[3])".
  SampleError(std::string head, std::int64_t row, std::string tail, std::string note);
  // The row among those the op saw (after in_batch: the batch's row).
  std::int64_t row() const { return row_; }
  // The same error with `context` before it, for rows that start at row `first_row`
  // of the batch: it names row first_row + row() ("labels[4] ... (row 4 of the batch)").
  SampleError in_batch(const std::string& context, std::int64_t first_row) const;
  // The same error with `context` before it.
  SampleError with_context(const std::string& context) const;

 private:
  std::string head_, tail_, note_;
  std::int64_t row_;
};

// Shapes, dtypes or devices of tensors that do not fit the op.
class ShapeError : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

// A device that does not exist, or a device string that does not parse.
class DeviceError : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

// An allocation that did not fit. The allocator stays usable after it.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

// A CUDA, cuBLAS or kernel-launch failure, with the call, file and line.
class CudaError : public Error {
 public:
  using Error::Error;
};

// A file could not be read or written, or its contents are malformed.
class IoError : public Error {
 public:
  using Error::Error;
};

// A well-formed checkpoint whose tensors are not those of the model it is loaded
// into (missing, unexpected or mis-shaped variables). The file is fine; the pairing
// is wrong, so this is an InvalidArgument rather than an IoError.
class CheckpointMismatch : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

// A NaN or an infinity where training needs finite numbers: the loss or the
// averaged gradient of a step (the trainer's numerical guard, parallel/trainer.h).
class NumericError : public Error {
 public:
  using Error::Error;
};

// The request is valid but this build or backend cannot do it (float64 on CUDA,
// a CUDA device in a build without the CUDA backend).
class NotSupported : public Error {
 public:
  using Error::Error;
};

// A collective between processes could not complete: a peer died, stalled past
// the deadline, or disagreed (parallel/process_group.h). The message names the
// peer and the call.
class CommunicationError : public Error {
 public:
  using Error::Error;
};

// Rethrows the exception being handled with `context` put before its message and
// its type kept (a towerlab error stays the same subclass; anything else is
// rethrown unchanged). Call it only inside a catch block. The trainer uses it to
// say which tower and which samples an error inside a tower came from.
[[noreturn]] void rethrow_with_context(const std::string& context);
// The same, for an op that was given rows of a larger batch starting at row
// `first_row`: a SampleError names the batch's row (SampleError::in_batch).
[[noreturn]] void rethrow_with_context(const std::string& context, std::int64_t first_row);

namespace detail {
// `device`: the current CUDA device when the call failed (-1: unknown).
[[noreturn]] void throw_cuda_error(const char* expr, const char* what, int device, const char* file,
                                   int line);
void log_cuda_error(const char* expr, const char* what, int device, const char* file,
                    int line) noexcept;
}  // namespace detail

}  // namespace towerlab

// TL_CHECK(condition, ErrorType, message-stream): throws ErrorType with the message
// when the condition is false. The message is built only on failure:
//   TL_CHECK(a.numel() == b.numel(), ShapeError, "add: " << a.shape_str() << " vs " << ...);
#define TL_CHECK(cond, ErrorType, msg)                 \
  do {                                                 \
    if (!(cond)) {                                     \
      std::ostringstream tl_check_os_;                 \
      tl_check_os_ << msg;                             \
      throw ::towerlab::ErrorType(tl_check_os_.str()); \
    }                                                  \
  } while (0)

// TL_THROW(ErrorType, message-stream): unconditional form of TL_CHECK.
#define TL_THROW(ErrorType, msg) TL_CHECK(false, ErrorType, msg)
