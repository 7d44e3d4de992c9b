// Failure cases (Failure.*) break the group on purpose; each runs in an mpirun of
// its own (tests/mpi/CMakeLists.txt), and TOWERLAB_MPI_DEADLINE_S sets a short
// deadline for them.
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "mpi_test.h"
#include "towerlab.h"

namespace towerlab::testing {
namespace {

std::int64_t seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - start)
      .count();
}

// The last rank stalls for 3 deadlines before the all-reduce of step 7. The others
// fail after one deadline, naming it and the call; the stalled rank, when it
// comes, fails at once with their reason.
TEST(Failure, StalledRankMakesTheOthersFailAfterTheDeadline) {
  Cluster& group = cluster();
  ASSERT_GE(group.size(), 2);
  const int late = group.size() - 1;
  const auto deadline = group.deadline();
  std::vector<float> grads(1000, 1.0f);
  group.allreduce_sum(std::span<float>(grads), "step 6: gradients");  // all healthy
  if (group.rank() == late) std::this_thread::sleep_for(3 * deadline);
  const auto start = std::chrono::steady_clock::now();
  std::string message;
  try {
    group.allreduce_sum(std::span<float>(grads), "step 7: gradients");
    ADD_FAILURE() << "expected CommunicationError";
  } catch (const CommunicationError& e) {
    message = e.what();
  }
  std::fprintf(stderr, "rank %d: %s\n", group.rank(), message.c_str());
  EXPECT_NE(message.find("step 7: gradients"), std::string::npos) << message;
  EXPECT_NE(message.find("rank " + std::to_string(late) + " did not arrive within"),
            std::string::npos)
      << message;
  if (group.rank() == late) {
    EXPECT_LE(seconds_since(start), 1);  // told by the others, not by its own deadline
  } else {
    EXPECT_LE(seconds_since(start), 2 * deadline.count() / 1000 + 2);
  }
  // Broken for good: the next call repeats the cause.
  EXPECT_THROW(group.barrier("step 8: after"), CommunicationError);
  // Stay until the late rank has seen the notice: over TCP, Open MPI ends a
  // process whose peer has exited at its next call, before it could report.
  if (group.rank() != late) std::this_thread::sleep_for(3 * deadline);
}

// Rank 1 calls an all-reduce of another size: every rank stops with one message
// naming it, instead of a wrong sum or a hang.
TEST(Failure, MismatchedCallIsNamedOnEveryRank) {
  Cluster& group = cluster();
  ASSERT_GE(group.size(), 2);
  std::vector<float> grads(group.rank() == 1 ? 999 : 1000, 1.0f);
  try {
    group.allreduce_sum(std::span<float>(grads), "step 3: gradients");
    ADD_FAILURE() << "expected CommunicationError";
  } catch (const CommunicationError& e) {
    std::fprintf(stderr, "rank %d: %s\n", group.rank(), e.what());
    EXPECT_NE(std::string(e.what()).find("step 3: gradients"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("999 floats"), std::string::npos) << e.what();
  }
}

// Rank 1 dies before step 5. Under `mpirun --enable-recovery` the others live on
// and stop with a message naming rank 1 and the call (the ctest case checks the
// output; without the option mpirun ends the job itself and names the rank).
TEST(Failure, KilledRankMakesTheOthersStop) {
  Cluster& group = cluster();
  ASSERT_GE(group.size(), 2);
  std::vector<float> grads(1000, 1.0f);
  group.allreduce_sum(std::span<float>(grads), "step 4: gradients");
  if (group.rank() == 1) std::raise(SIGKILL);
  try {
    group.allreduce_sum(std::span<float>(grads), "step 5: gradients");
    ADD_FAILURE() << "expected CommunicationError";
  } catch (const CommunicationError& e) {
    std::fprintf(stderr, "rank %d: %s\n", group.rank(), e.what());
    const std::string message = e.what();
    EXPECT_NE(message.find("step 5: gradients"), std::string::npos) << message;
    EXPECT_NE(message.find("rank 1"), std::string::npos) << message;
  }
}

// Rank 1 is stopped by SIGTERM between two calls (as mpirun stops a rank when
// another dies). It says which call it finished last and ends by SIGTERM; mpirun
// then stops rank 0, which says which call it was waiting in (the ctest case
// checks both lines).
TEST(Failure, TerminatedRankSaysWhereItWas) {
  Cluster& group = cluster();
  ASSERT_GE(group.size(), 2);
  std::vector<float> grads(1000, 1.0f);
  group.allreduce_sum(std::span<float>(grads), "step 4: gradients");
  if (group.rank() == 1) std::raise(SIGTERM);
  try {
    group.allreduce_sum(std::span<float>(grads), "step 5: gradients");
    ADD_FAILURE() << "expected CommunicationError or SIGTERM";
  } catch (const CommunicationError& e) {
    std::fprintf(stderr, "rank %d: %s\n", group.rank(), e.what());
  }
}

}  // namespace
}  // namespace towerlab::testing
