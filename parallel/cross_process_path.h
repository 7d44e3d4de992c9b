// How a Trainer moves the gradient and the moving statistics between processes
// (TrainerOptions::cross_process, parallel/trainer.h; the choice itself is
// choose_cross_process_path in parallel/nccl_communicator.h).
#pragma once

namespace towerlab {

// How phase 5 moves the gradient and moving statistics between processes.
//   Auto: NCCL when it can (see choose_cross_process_path), else host staging.
//   HostStaged: always through the host and the ProcessGroup (for comparison).
//   Nccl: NCCL, or NotSupported saying why it cannot be used.
enum class CrossProcessPath { Auto, HostStaged, Nccl };

}  // namespace towerlab
