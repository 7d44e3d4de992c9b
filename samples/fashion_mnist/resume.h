// Resumable training for the fashion_mnist sample: the checkpoint directory
// (--checkpoint-dir, --checkpoint-every, --keep) and SIGTERM as a request to stop.
//
// A checkpoint is DIR/step-NNNNNN.safetensors (the global step, counted from 1): the
// trainer's whole state (Trainer::save_state: variables, moving statistics,
// optimizer slots and step, numeric guard counter, fingerprint) plus the run's
// Position below. The data order is a pure function of (seed, epoch), so the epoch
// and the steps done in it place the batcher exactly. Rank 0 writes the files
// (atomically: a kill leaves the previous ones intact, and a stale temporary file is
// removed at the next start) and removes all but the newest --keep.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "towerlab.h"

namespace sample {

// Exit code of a run stopped by SIGTERM after writing a checkpoint.
constexpr int kPreempted = 4;

// Where a run stands, beyond the trainer's state.
struct Position {
  std::int64_t epoch = 0;       // the epoch in progress, from 0; the run's epochs: finished
  std::int64_t epoch_step = 0;  // steps of it already taken
  double epoch_loss_sum = 0.0;  // sum of loss * samples over those steps (the epoch's mean)
  std::int64_t epoch_images = 0;
  std::uint64_t summaries_bytes = 0;             // the --summaries file's rows up to here
  double train_loss = 0.0, test_accuracy = 0.0;  // of the last finished epoch
  std::int64_t global_step = 0;                  // steps taken in the run

  std::map<std::string, std::string> metadata() const;
  // Throws towerlab::IoError naming the key that is missing or malformed.
  static Position from(const std::map<std::string, std::string>& metadata);
};

class CheckpointDir {
 public:
  // Collective. Rank 0 creates `dir` when missing and removes temporary files that a
  // killed save left.
  CheckpointDir(std::string dir, int keep, towerlab::ProcessGroup& group);

  struct Restored {
    std::string path;
    Position position;
  };
  // Collective. Restores the newest usable checkpoint into `trainer`, or returns
  // nothing when DIR holds none. A truncated or malformed one is skipped with a
  // warning on stderr naming it; when every one is, throws IoError naming them all.
  // A checkpoint of another run (model, options, `expected`) is refused
  // (InvalidArgument from Trainer::restore_state), not skipped.
  std::optional<Restored> restore_newest(towerlab::Trainer& trainer,
                                         const std::map<std::string, std::string>& expected);
  // Collective. Writes the checkpoint of `at` and removes the oldest beyond --keep.
  // Returns its path.
  std::string save(towerlab::Trainer& trainer, const Position& at,
                   const std::map<std::string, std::string>& expected);
  std::string path_of(std::int64_t global_step) const;

 private:
  std::string dir_;
  int keep_;
  towerlab::ProcessGroup& group_;
};

// SIGTERM: the first asks the run to stop at the next step boundary (and arms a
// deadline of kStopDeadlineSeconds, after which SIGALRM ends the process); a second
// ends the process at once. Installed before the Cluster, which then leaves SIGTERM
// to it. The previous checkpoint is never lost either way: saves are atomic.
constexpr unsigned kStopDeadlineSeconds = 60;
void stop_on_sigterm();
// Collective: true on every rank when any rank has been asked to stop, so that all
// stop after the same step.
bool stop_requested(towerlab::ProcessGroup& group);
// After the checkpoint of a stop: the exit may take kExitSeconds at most. MPI_Finalize
// waits for mpirun, and an mpirun that got the SIGTERM itself is ending the job and
// never answers (Open MPI 4.1); SIGALRM then ends the rank, its checkpoint written.
constexpr unsigned kExitSeconds = 10;
void bound_the_exit();

// Test hooks, read from the environment (the resume tests use them; see the README):
//   TOWERLAB_TEST_KILL_AFTER_STEP=N (and TOWERLAB_TEST_KILL_RANK=R, default 0): rank R
//     kills itself with SIGKILL right after step N, before its checkpoint;
//   TOWERLAB_TEST_PAUSE_AFTER_STEP=N: rank 0 waits after step N until a SIGTERM
//     comes (the others wait for it in the next collective call), so that a test
//     knows where the request lands;
//   TOWERLAB_TEST_PAUSE_IN_SAVE=N: the save of step N stops once its data is written
//     and synced, before it is published, says so on stderr and waits to be killed;
//   TOWERLAB_TEST_RESUME_WITHOUT=data_position|optimizer_step: a resume forgets that
//     part of the state (the controls, whose result must differ);
//   TOWERLAB_TEST_STOP_DEADLINE_S=N: the deadline after a SIGTERM is N seconds, not
//     kStopDeadlineSeconds (a test waits for it to end a run stuck in a save).
void kill_if_asked(std::int64_t global_step, int rank);
void pause_if_asked(std::int64_t global_step, int rank);
void pause_saves_if_asked(const CheckpointDir& dir);
std::string resume_without();

}  // namespace sample
