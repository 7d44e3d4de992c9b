// The startup check of a Trainer that spans processes: every process must train
// the same model with the same optimizer and the same step-changing options, or
// their "same" update would silently differ. Each process describes what it holds
// as text, one "key<TAB>value" line per item, and the trainer's constructor
// compares every process's text with rank 0's (parallel/trainer.h).
//
// The fingerprint covers: every variable in declaration order (name, shape,
// dtype, trainable or state, initializer); the optimizer (kind, learning-rate
// schedule, the hyper-parameters of its family, steps taken); and the options that
// change the step's numbers (towers per process and their device kind, the
// master's device kind, reduction, batch-norm mode and statistics, numeric guard,
// seed, precision and under fp16 its loss-scale interval, a reduce dtype other than float32).
// Device indices, placement and logging options are left out: processes may use different GPUs of
// their hosts.
#pragma once

#include <string>
#include <vector>

#include "../autograd/optimizer.h"
#include "../autograd/variables.h"
#include "trainer.h"

namespace towerlab {

std::string trainer_fingerprint(const VariableSet& variables, DType dtype,
                                const Optimizer& optimizer, const TrainerOptions& options);

// The first difference between a rank's fingerprint and rank 0's, lowest rank
// first, as "rank 2: variable conv1/kernel [5,5,1,32] ... vs rank 0: [5,5,1,16] ...";
// "" when every rank's equals rank 0's.
std::string first_fingerprint_difference(const std::vector<std::string>& by_rank);

}  // namespace towerlab
