// CPU slice copy (contract in kernels/slice_copy.h): each of the plan's runs is
// contiguous in both tensors, so a run is one memcpy when assigned and one loop of
// additions when accumulated; the runs are spread over the thread pool
// (kernels/cpu/parallel.h), each written by one thread. The reference
// (kernels/reference/slice_copy.h) is the specification.
// The files an op takes, in order: the top of kernels/relu.h.
#include "kernels/cpu/slice_copy.h"

#include <cstring>

#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/parallel.h"
#include "kernels/move_element.h"

namespace towerlab::cpu {

void slice_copy(const Tensor& dst, const Tensor& src, const SliceCopyPlan& plan, GradWrite write) {
  with_any_dtype(dst.dtype(), [&]<typename T>() {
    T* out = dst.data<T>();       // [O, m, I]
    const T* in = src.data<T>();  // [O, n, I]
    parallel_rows(plan.outer, plan.run, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t o = lo; o < hi; ++o) {
        T* to = out + o * plan.dst_pitch + plan.dst_offset;
        const T* from = in + o * plan.src_pitch + plan.src_offset;
        if (write == GradWrite::Assign) {
          std::memcpy(to, from, static_cast<std::size_t>(plan.run) * sizeof(T));
        } else {
          for (std::int64_t j = 0; j < plan.run; ++j) move_element(to[j], from[j], true);
        }
      }
    });
  });
}

}  // namespace towerlab::cpu
