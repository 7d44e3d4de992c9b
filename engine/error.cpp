#include "engine/error.h"

#include <cstdio>

namespace towerlab::detail {

void throw_cuda_error(const char* expr, const char* what, const char* file, int line) {
  std::ostringstream os;
  os << expr << " failed with " << what << " at " << file << ":" << line;
  throw CudaError(os.str());
}

void log_cuda_error(const char* expr, const char* what, const char* file, int line) noexcept {
  std::fprintf(stderr, "towerlab: %s failed with %s at %s:%d (ignored in a destructor)\n", expr,
               what, file, line);
}

}  // namespace towerlab::detail
