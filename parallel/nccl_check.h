// towerlab's one check for NCCL calls, shared by the in-process comparison
// (parallel/nccl_allreduce.h) and the communicator between processes
// (parallel/nccl_communicator.h). A failure throws CommunicationError with the
// call, NCCL's name for the result and, when NCCL has one, its last message (the
// text that says which peer or transport failed). Include only from code built
// with NCCL (TOWERLAB_WITH_NCCL); not installed.
#pragma once

#include <nccl.h>

#include <sstream>
#include <string>
#include <string_view>

#include "../engine/error.h"

namespace towerlab::detail {

// "<what>: <expr> failed: <error string> (<last error>) at <file>:<line>".
inline std::string nccl_error_text(std::string_view what, const char* expr, ncclResult_t result,
                                   ncclComm_t comm, const char* file, int line) {
  std::ostringstream os;
  os << what << ": " << expr << " failed: " << ncclGetErrorString(result);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') os << " (" << last << ")";
  os << " at " << file << ":" << line;
  return os.str();
}

}  // namespace towerlab::detail

// TL_NCCL_CHECK(expr, comm, what): throws CommunicationError unless expr returns
// ncclSuccess; `comm` (may be null) is asked for NCCL's last message.
#define TL_NCCL_CHECK(expr, comm, what)                                         \
  do {                                                                          \
    const ncclResult_t tl_nccl_ = (expr);                                       \
    if (tl_nccl_ != ncclSuccess) {                                              \
      throw ::towerlab::CommunicationError(::towerlab::detail::nccl_error_text( \
          (what), #expr, tl_nccl_, (comm), __FILE__, __LINE__));                \
    }                                                                           \
  } while (0)
