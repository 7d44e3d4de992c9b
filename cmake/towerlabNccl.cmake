# NCCL as the imported target towerlab::nccl, where the CUDA toolkit (or the
# system) has it: libnccl and nccl.h, looked for beside CUDAToolkit's libraries and
# headers (find_package(CUDAToolkit) first). Nothing is defined when either is
# missing. Used by CMakeLists.txt when it builds towerlab with NCCL, and installed
# beside towerlabConfig.cmake, which includes it so that a program linking that
# static library finds NCCL on its own machine instead of at the path of the
# machine that built towerlab. TOWERLAB_NCCL_LIBRARY and TOWERLAB_NCCL_INCLUDE
# (cache variables) point it elsewhere.
if(NOT TARGET towerlab::nccl)
  find_library(TOWERLAB_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
  find_path(TOWERLAB_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  if(TOWERLAB_NCCL_LIBRARY AND TOWERLAB_NCCL_INCLUDE)
    add_library(towerlab::nccl UNKNOWN IMPORTED)
    set_target_properties(towerlab::nccl PROPERTIES
      IMPORTED_LOCATION "${TOWERLAB_NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${TOWERLAB_NCCL_INCLUDE}")
  endif()
endif()
