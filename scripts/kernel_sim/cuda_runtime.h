// Stands in for the CUDA runtime header when scripts/sim_kernels.sh compiles the
// kernel files as C++: the device vocabulary and runtime API on the host.
#pragma once
#include "sim_cuda.h"
