// Embedding: rows of a table gathered by integer ids, forward and backward.
//
// Dimensions: V rows of the table (num_embeddings) of D values each; ids of any
// shape [...] with M elements (the product of its dimensions), seen flat as [M];
// y and grad_y are ids' shape with D appended, [..., D], seen as [M, D].
//
//   embedding_forward(y, ids, table)              y[m,:] = table[ids[m],:]
//   embedding_backward(grad_table, grad_y, ids)   for m = 0, 1, ..., M-1, in that order:
//                                                   grad_table[ids[m],:] += grad_y[m,:]
// The backward accumulates into grad_table [V, D], as every backward in towerlab
// does, or assigns it when asked (kernels/grad_write.h): grad_table is then zeroed
// first, so a row no id names is 0. A row named k times gets its k rows of grad_y
// added in index order (m ascending), each addition rounded in the table's dtype:
// that order is the specification (kernels/reference/embedding.h), and both
// backends keep it, so their bits are the reference's, whatever the thread count
// or the grid, run after run. No atomics: on the CPU each thread owns a range of
// table rows and walks their ids in index order (a stable counting sort of the
// ids, made once, lists them); on CUDA each block owns a range of table rows,
// thread t the columns t, t + 256, ... of them, and the block walks all ids in
// index order, adding those in its range.
//
// Ids. A Tensor holds floating point only (there is no integer dtype), so an id is
// an integral value in [0, V) stored in the table's dtype, as cross-entropy's
// labels are (kernels/loss.h). float32 holds every integer up to 2^24 exactly, so
// float32 ids address tables of up to 2^24 rows (a larger table is refused:
// NotSupported); float64 ids (the CPU's gradient checks) up to 2^53.
// A bad id (negative, V or more, not integral, NaN, infinite):
//   CPU:  the forward and the backward throw SampleError naming the op, the
//         position and the value before anything is written:
//         "embedding_forward: ids[1][3] = 7.5 is not a row id in [0, 6) (ids
//         float32[2,4])" (the trainer names the row of the whole batch).
//   CUDA: checking would need a host sync on every call, so the kernels never
//         read out of bounds and poison instead: a bad id's row of y is NaN (so the
//         loss is NaN), and its row of grad_y is added nowhere. validate_embedding_ids
//         gives the CPU's message on any device at the cost of one sync; a data
//         loader calls it once when ids are loaded.
//
// Aliasing: y must not alias ids or table; grad_table must not alias grad_y or ids.
// Errors: ShapeError naming the op and the shapes (table not [V, D], y not ids'
// shape + [D], grad_table not [V, D] of grad_y's D, dtypes that differ);
// bfloat16 / float16 give check_dtype_supported's NotSupported.
#pragma once

#include <cstdint>

#include "../engine/stream.h"
#include "../engine/tensor.h"
#include "grad_write.h"

namespace towerlab {

void embedding_forward(const Tensor& y, const Tensor& ids, const Tensor& table,
                       const Stream& stream);
void embedding_backward(const Tensor& grad_table, const Tensor& grad_y, const Tensor& ids,
                        const Stream& stream, GradWrite write = GradWrite::Accumulate);

// Throws SampleError naming the first id (in index order) that is not an integral
// value in [0, num_embeddings). Waits for `stream` (on CUDA: one small copy back).
void validate_embedding_ids(const Tensor& ids, std::int64_t num_embeddings, const Stream& stream);

}  // namespace towerlab
