# The CUDA backend on emulated GPUs (TOWERLAB_CUDA=EMULATED; presets emulated,
# emulated-asan, emulated-tsan). Included once, from CMakeLists.txt, right after
# the towerlab target is made.
#
# No nvcc and no toolkit: the emulator (emulator/: the CUDA runtime, cuBLAS, CUB
# and NCCL on host memory and host threads) stands where the toolkit's libraries
# would, and towerlab's own .cu files ARE the CUDA backend, compiled as C++ after
# one mechanical rewrite (emulator/rewrite.py: launches become ::tlemu::launch
# calls, __shared__ arrays per-block storage). The rewrite runs at build time, so
# an edit of a kernel is rebuilt like any other source:
#   kernels/cuda/<family>.cu -> <build>/emulated/kernels/cuda/<family>.cpp
#   kernels/cuda/<name>.cuh  -> <build>/emulated/kernels/cuda/<name>.cuh
# and <build>/emulated comes first on the include path, so "kernels/cuda/launch.cuh"
# is the rewritten header for the library, the tests and the benches alike.
# The rewritten files start with #line: errors, __FILE__ and the sanitizers'
# reports name the original file and line.
#
# Everything above the library is the CUDA build's: TOWERLAB_WITH_CUDA=1 (with
# TOWERLAB_EMULATED_CUDA=1 beside it for what must know), NCCL on (the emulated
# nccl.h). cuDNN is absent: the benches' cuDNN comparisons compile out.
# The CMake variable TOWERLAB_WITH_CUDA stays OFF: it means the toolkit's build
# (nvcc, CUDA::cudart, cuDNN), which this is not.

find_package(Python3 REQUIRED COMPONENTS Interpreter)
include(GNUInstallDirs)

set(TOWERLAB_EMULATED_DIR ${PROJECT_BINARY_DIR}/emulated)
set(TOWERLAB_REWRITE ${PROJECT_SOURCE_DIR}/emulator/rewrite.py)

# --- the emulator ------------------------------------------------------------
file(GLOB TOWERLAB_EMULATOR_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/emulator/src/*.cpp)
add_library(towerlab_emulator STATIC ${TOWERLAB_EMULATOR_SOURCES})
add_library(towerlab::emulator ALIAS towerlab_emulator)
target_include_directories(towerlab_emulator PUBLIC
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/emulator/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/towerlab/emulator>)
target_compile_definitions(towerlab_emulator PUBLIC TOWERLAB_EMULATED_CUDA=1)
# Boost.Context switches the stacks of a block's threads (src/block.cpp).
find_package(Boost 1.74 REQUIRED COMPONENTS context)
target_link_libraries(towerlab_emulator PUBLIC Threads::Threads PRIVATE Boost::context)
target_compile_options(towerlab_emulator PRIVATE -Wall -Wextra)
set_target_properties(towerlab_emulator PROPERTIES POSITION_INDEPENDENT_CODE ON)
install(TARGETS towerlab_emulator EXPORT towerlabTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/emulator/include/
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/towerlab/emulator)

# --- the rewrite -------------------------------------------------------------
# towerlab_emulated_source(<var> <source>): for a .cu or .cuh file, the custom
# command that rewrites it at build time, and <var> set to the rewritten file
# (add it to a target of the same directory); any other file comes back as is.
# The command depends on the file, on the kernels/cuda headers it includes and on
# rewrite.py; the rewritten file changes only when its text does.
function(towerlab_emulated_source var source)
  get_filename_component(source ${source} ABSOLUTE)
  if(NOT source MATCHES "\\.cuh?$")
    set(${var} ${source} PARENT_SCOPE)
    return()
  endif()
  file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${source})
  if(rel MATCHES "^\\.\\.")
    message(FATAL_ERROR "towerlab_emulated_source: ${source} is outside ${PROJECT_SOURCE_DIR}")
  endif()
  string(REGEX REPLACE "\\.cu$" ".cpp" out ${TOWERLAB_EMULATED_DIR}/${rel})
  set(depends ${source} ${TOWERLAB_REWRITE})
  file(STRINGS ${source} includes REGEX "^[ \t]*#[ \t]*include[ \t]*\"kernels/cuda/[^\"]+\"")
  foreach(line IN LISTS includes)
    string(REGEX REPLACE ".*\"(kernels/cuda/[^\"]+)\".*" "\\1" header "${line}")
    if(EXISTS ${PROJECT_SOURCE_DIR}/${header})
      list(APPEND depends ${PROJECT_SOURCE_DIR}/${header})
    endif()
  endforeach()
  # The #line directive names the source from the build folder where Ninja runs the
  # compiler: the same text in every clone ("paths in the objects", CMakeLists.txt).
  set(line_name ${source})
  if(TOWERLAB_TREE_FROM_BUILD)
    file(RELATIVE_PATH line_name ${CMAKE_BINARY_DIR} ${source})
  endif()
  add_custom_command(OUTPUT ${out}
    COMMAND Python3::Interpreter ${TOWERLAB_REWRITE} ${source} ${out} ${line_name}
    DEPENDS ${depends}
    COMMENT "Rewriting ${rel} for the emulated GPUs"
    VERBATIM)
  set(${var} ${out} PARENT_SCOPE)
endfunction()

# The library's CUDA sources and the headers they share, rewritten.
file(GLOB TOWERLAB_CUDA_SOURCES CONFIGURE_DEPENDS
  ${PROJECT_SOURCE_DIR}/kernels/cuda/*.cu ${PROJECT_SOURCE_DIR}/kernels/cuda/*.cuh
  ${PROJECT_SOURCE_DIR}/engine/*.cu)
set(TOWERLAB_EMULATED_SOURCES)
foreach(source IN LISTS TOWERLAB_CUDA_SOURCES)
  towerlab_emulated_source(rewritten ${source})
  list(APPEND TOWERLAB_EMULATED_SOURCES ${rewritten})
endforeach()
target_sources(towerlab PRIVATE ${TOWERLAB_EMULATED_SOURCES})
target_include_directories(towerlab BEFORE PUBLIC $<BUILD_INTERFACE:${TOWERLAB_EMULATED_DIR}>)
# The kernels' #pragma unroll means nothing to the host compiler.
set_source_files_properties(${TOWERLAB_EMULATED_SOURCES} PROPERTIES
  COMPILE_OPTIONS -Wno-unknown-pragmas)

target_compile_definitions(towerlab PUBLIC TOWERLAB_WITH_CUDA=1 TOWERLAB_EMULATED_CUDA=1
  PRIVATE TOWERLAB_WITH_NCCL=1)
target_link_libraries(towerlab PUBLIC towerlab_emulator)
message(STATUS "towerlab: CUDA backend EMULATED (emulator/, no GPU needed; NCCL emulated)")
