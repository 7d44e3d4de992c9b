// Checkpoints of a model that several processes train together
// (parallel/process_group.h). After every step all ranks hold the same variables
// and optimizer state, so one file is the checkpoint of the job, and it is an
// ordinary checkpoint (autograd/checkpoint.h): a file saved by 8 ranks loads in one
// process, on the CPU or a GPU, and the other way round.
//
// Both calls are collective: every rank calls them, in the same order as its other
// collectives, and every rank returns or throws alike.
//   save: rank 0 writes the file (atomically, as every checkpoint) and then tells
//         every rank how that went; a failure (a full disk, a bad path) throws the
//         same error type with the same message on every rank, instead of leaving
//         the others waiting in their next step.
//   load: rank 0 reads and checks the file; its error, if any, is thrown on every
//         rank; otherwise the variables, moving statistics and optimizer state go to
//         every rank in two broadcasts, so one read serves the job and every rank
//         starts from the same bits.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "../autograd/checkpoint.h"
#include "process_group.h"

namespace towerlab {

void save_checkpoint(ProcessGroup& group, const std::string& path, const VariableStore& store,
                     const Optimizer* optimizer = nullptr,
                     const std::map<std::string, std::string>& metadata = {});

CheckpointInfo load_checkpoint(ProcessGroup& group, const std::string& path, VariableStore& store,
                               Optimizer* optimizer, const Stream& stream,
                               CheckpointMatch match = CheckpointMatch::Exact);

// Runs `work` on rank 0 alone and gives every rank its outcome (one allgather
// named `what`): rank 0 rethrows its own exception, the others an error of the same
// type with the same message; on success every rank returns the text `work`
// returned. The checkpoint calls above, and Trace::write across processes, use it.
std::string on_rank0(ProcessGroup& group, const std::string& what,
                     const std::function<std::string()>& work);

}  // namespace towerlab
