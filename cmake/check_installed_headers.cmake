# The ctest install.headers_self_contained (CMakeLists.txt): installs the build to a
# scratch prefix and compiles every installed towerlab header on its own, each in a
# file that includes only it, with nothing but PREFIX/include on the include path
# (not the source tree, not CUDA's, NCCL's or MPI's headers) and the target's
# public definitions, as a program using the package would, and none of them may
# reach a CUDA, NCCL or MPI header. So a public header that includes an internal one
# (engine/cuda_check.h includes <cuda_runtime.h>), a neighbour by a path that only
# works in the tree, or that misses an #include of its own fails here. The backends'
# internal headers must not be installed at all.
#
#   cmake -DBUILD_DIR=... -DPREFIX=... -DCXX=... -DDEFINES="A=1|B=0" -P check_installed_headers.cmake
cmake_minimum_required(VERSION 3.25)  # policies for -P: IN_LIST
foreach(var BUILD_DIR PREFIX CXX)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_installed_headers.cmake: -D${var}=... is required")
  endif()
endforeach()

file(REMOVE_RECURSE ${PREFIX})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${PREFIX}
  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install ${BUILD_DIR} --prefix ${PREFIX} failed (${rc}):\n${err}")
endif()

# The emulator's own headers (emulated builds) stand in for CUDA's: not towerlab's.
file(GLOB_RECURSE headers RELATIVE ${PREFIX}/include ${PREFIX}/include/towerlab/*.h)
list(FILTER headers EXCLUDE REGEX "^towerlab/emulator/")
list(LENGTH headers count)
foreach(required towerlab/towerlab.h towerlab/version.h towerlab/engine/tensor.h)
  if(NOT required IN_LIST headers)
    message(FATAL_ERROR "${required} is not installed in ${PREFIX}/include (${count} headers are)")
  endif()
endforeach()
foreach(header IN LISTS headers)
  if(header MATCHES "^towerlab/kernels/(cpu|cuda)/|/cuda_check\\.h$|/nccl_check\\.h$|^towerlab/kernels/checks\\.h$")
    message(FATAL_ERROR "${header} is installed: it is internal (a public header includes it?)")
  endif()
endforeach()

set(sources)
foreach(header IN LISTS headers)
  string(MAKE_C_IDENTIFIER "${header}" name)
  file(WRITE ${PREFIX}/check/${name}.cpp "#include <${header}>\n")
  list(APPEND sources ${PREFIX}/check/${name}.cpp)
endforeach()
set(defines)
if(DEFINES)
  string(REPLACE "|" ";" DEFINES "${DEFINES}")
  foreach(define IN LISTS DEFINES)
    list(APPEND defines -D${define})
  endforeach()
endif()
# One compiler run: each source file is its own translation unit.
execute_process(COMMAND ${CXX} -std=c++20 -fsyntax-only ${defines} -I${PREFIX}/include ${sources}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "an installed header does not compile on its own with only "
    "${PREFIX}/include on the include path:\n${out}${err}")
endif()

# A machine may have CUDA's headers on the compiler's default path (/usr/include,
# /usr/local/include), where the compile above would find them: so every file each
# header reaches is listed (-M), and none may be CUDA's, cuBLAS's, NCCL's or MPI's.
execute_process(COMMAND ${CXX} -std=c++20 -M ${defines} -I${PREFIX}/include ${sources}
  RESULT_VARIABLE rc OUTPUT_VARIABLE deps ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "listing the installed headers' includes failed:\n${err}")
endif()
string(REGEX MATCHALL "[^ \t\r\n\\]+" tokens "${deps}")
set(foreign)
set(source "")
foreach(token IN LISTS tokens)
  string(FIND "${token}" "${PREFIX}/" ours)  # towerlab's own: checked by name above
  if(token MATCHES "^(.+)\\.o:$")
    set(source "${CMAKE_MATCH_1}")
  elseif(NOT ours EQUAL 0 AND
         token MATCHES "(^|/)(cuda|cublas|cudnn|curand|nccl|mpi)[^/]*\\.h$|/cuda[^/]*/")
    list(APPEND foreign "${source}: ${token}")
  endif()
endforeach()
if(foreign)
  list(REMOVE_DUPLICATES foreign)
  string(REPLACE ";" "\n  " foreign "${foreign}")
  message(FATAL_ERROR "installed headers reach CUDA's, NCCL's or MPI's headers (the check "
    "file is named after the header):\n  ${foreign}")
endif()
message(STATUS "${count} installed headers compile on their own with only ${PREFIX}/include "
  "and reach no CUDA, NCCL or MPI header")
