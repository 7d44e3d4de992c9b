// Differentiable ops: each runs its kernel on the tape's stream and records a
// backward that accumulates into the inputs' gradients. Inputs must belong to one
// tape; shape errors name the op and the Vars ("add: conv1/out float32[8,32,28,28]
// and skip float32[8,32,14,14] do not broadcast (dimension -1: 28 against 14)").
#pragma once

#include "../kernels/activation.h"
#include "../kernels/add_relu.h"
#include "../kernels/broadcast.h"
#include "../kernels/dropout.h"
#include "../kernels/embedding.h"
#include "../kernels/layer_norm.h"
#include "../kernels/permute.h"
#include "../kernels/slice_copy.h"
#include "../kernels/softmax.h"
#include "tape.h"

namespace towerlab::ag {

// a + b, a - b and a * b with NumPy broadcasting (kernels/broadcast.h): the output
// has the broadcast shape, and the gradient of an operand that was repeated is summed
// over the repeated dimensions. Equal shapes take the elementwise kernels.
Var add(const Var& a, const Var& b);
Var mul(const Var& a, const Var& b);
Var sub(const Var& a, const Var& b);
Var scale(const Var& x, double alpha);  // alpha * x
Var relu(const Var& x);
// relu(a + b) in one op each way (kernels/add_relu.h), a residual block's end: the
// values of relu(add(a, b)) bit for bit on the CPU, without the sum's gradient. a and
// b have one shape (no broadcasting); the backward reads the output.
Var add_relu(const Var& a, const Var& b);
// The activations of kernels/activation.h (formulas and the NaN rule there); each
// backward takes the forward's input.
Var sigmoid(const Var& x);
Var tanh(const Var& x);
Var gelu(const Var& x, GeluApproximate approximate = GeluApproximate::None);
Var silu(const Var& x);
Var leaky_relu(const Var& x, double negative_slope = 0.01);
// Dropout with drop probability p (kernels/dropout.h): the mask of each element comes
// from `key` and the element's sample in the whole batch, and the backward draws it
// again. With `training` false (evaluation) x itself is returned.
Var dropout(const Var& x, double p, const DropoutKey& key, bool training = true);
Var sum(const Var& x);   // [1]: the sum of every element
Var mean(const Var& x);  // [1]: the mean of every element
// A view with another shape (flatten is reshape({N, -1})); the gradient flows back unchanged.
Var reshape(const Var& x, const Shape& shape);
Var flatten(const Var& x);  // [N, ...] -> [N, rest]

// Softmax, log-softmax and layer normalization over the last dimension
// (kernels/softmax.h, kernels/layer_norm.h: formulas, the NaN rule, stability).
// x is [..., D]; with SoftmaxMask::Causal, [..., T, T] (attention scores, queries by
// keys), keys after the query get probability 0 (log-softmax: -inf) and gradient 0.
// The softmax backwards read the forward's output.
Var softmax(const Var& x, SoftmaxMask mask = SoftmaxMask::None);
Var log_softmax(const Var& x, SoftmaxMask mask = SoftmaxMask::None);
// weight and bias are [D] and optional (an undefined Var: 1 and 0); the row means and
// reciprocal standard deviations are kept by the record for the backward.
Var layer_norm(const Var& x, const Var& weight = {}, const Var& bias = {}, double eps = 1e-5);

// The rows of table [V, D] named by ids [...] (integral values in table's dtype):
// [..., D] (kernels/embedding.h: the ids, the deterministic backward). The gradient
// flows to the table only; ids get none.
Var embedding(const Var& ids, const Var& table);
// Shape ops (kernels/permute.h, kernels/slice_copy.h): each output is a new
// contiguous tensor, and the gradient moves back the same way. A dimension may count
// from the end (-1 is the last); an out-of-range one is InvalidArgument, shapes that
// do not fit are ShapeError, each naming the op and the Vars.
// y.shape[k] = x.shape[dims[k]]; the backward permutes by the inverse.
Var permute(const Var& x, const std::vector<std::int64_t>& dims);
// The permutation that swaps d0 and d1 (the last two: attention's K^T, a head split).
Var transpose(const Var& x, std::int64_t d0, std::int64_t d1);
// The inputs one after another along dim (every other size equal, one dtype); each
// input's gradient is its piece of the output's. A Var may appear more than once.
Var concat(const std::vector<Var>& xs, std::int64_t dim);
// Pieces of x along dim of the given sizes (they sum to x's size there), in order;
// the gradients of the pieces that get one add into x's.
std::vector<Var> split(const Var& x, const std::vector<std::int64_t>& sizes, std::int64_t dim);
// Entries [begin, end) of x along dim (0 <= begin <= end <= the size there); x's
// gradient is the output's inside and 0 outside.
Var slice(const Var& x, std::int64_t dim, std::int64_t begin, std::int64_t end);

}  // namespace towerlab::ag
