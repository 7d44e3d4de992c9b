// A Cluster started without mpirun: a group of one process that never touches MPI,
// so that a program written for several ranks runs as before. The group across
// processes is tested under mpirun (tests/mpi).
#include <cstdlib>

#include "file_test_util.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~ScopedEnv() { ::unsetenv(name_); }

 private:
  const char* name_;
};

TEST(Cluster, WithoutLauncherIsOneProcessWhoseCollectivesChangeNothing) {
  Cluster cluster;
  EXPECT_EQ(cluster.rank(), 0);
  EXPECT_EQ(cluster.size(), 1);
  EXPECT_EQ(cluster.local_rank(), 0);
  EXPECT_FALSE(cluster.uses_mpi());
  EXPECT_EQ(cluster.deadline(), std::chrono::seconds(120));
  std::vector<float> values{1.5f, -2.0f};
  cluster.allreduce_sum(std::span<float>(values), "test");
  EXPECT_EQ(values, (std::vector<float>{1.5f, -2.0f}));
  std::vector<double> doubles{3.0};
  cluster.allreduce_sum(std::span<double>(doubles), "test");
  EXPECT_EQ(doubles[0], 3.0);
  std::vector<std::byte> bytes{std::byte{7}};
  cluster.broadcast(bytes, 0, "test");
  EXPECT_EQ(bytes[0], std::byte{7});
  EXPECT_THROW_WITH(cluster.broadcast(bytes, 1, "step 3: moving statistics"), InvalidArgument,
                    "step 3: moving statistics: broadcast from rank 1 in a group of 1");
  EXPECT_EQ(cluster.allgather("mine", "test"), std::vector<std::string>{"mine"});
  cluster.barrier("test");
  EXPECT_EQ(cluster.default_device(), cuda_device_count() > 0 ? Device::cuda(0) : Device::cpu());
}

TEST(Cluster, DeadlineComesFromTheOptionOrTheEnvironment) {
  EXPECT_EQ(Cluster(ClusterOptions{std::chrono::milliseconds(1500)}).deadline(),
            std::chrono::milliseconds(1500));
  {
    ScopedEnv env("TOWERLAB_MPI_DEADLINE_S", "0.25");
    EXPECT_EQ(Cluster().deadline(), std::chrono::milliseconds(250));
  }
  for (const char* bad : {"", "abc", "0", "-1", "2s", "inf"}) {
    ScopedEnv env("TOWERLAB_MPI_DEADLINE_S", bad);
    EXPECT_THROW_WITH(Cluster(), InvalidArgument,
                      std::string("TOWERLAB_MPI_DEADLINE_S must be a positive number of seconds, "
                                  "got '") +
                          bad + "'");
  }
}

TEST(Cluster, BuildWithoutMpiRefusesALaunchOfSeveralRanks) {
#if TOWERLAB_WITH_MPI
  GTEST_SKIP() << "this build has MPI: a launch of several ranks is tested under mpirun";
#else
  {
    ScopedEnv env("OMPI_COMM_WORLD_SIZE", "4");
    EXPECT_THROW_WITH(Cluster(), NotSupported, "built without MPI (TOWERLAB_MPI=OFF)");
  }
  ScopedEnv env("OMPI_COMM_WORLD_SIZE", "1");  // a launch of one rank is one process anyway
  EXPECT_EQ(Cluster().size(), 1);
#endif
}

// Through a group of one, a collective checkpoint is the plain one.
TEST(Cluster, CollectiveCheckpointOfOneProcessIsThePlainOne) {
  ScratchDir dir;
  const Stream& cpu = default_stream(Device::cpu());
  VariableSet vars;
  Linear fc(vars, "fc", 3, 2);
  VariableStore store(vars, cpu);
  store.initialize(4, cpu);
  Cluster cluster;
  save_checkpoint(cluster, dir.file("a.safetensors"), store, nullptr, {{"epoch", "1"}});
  VariableStore loaded(vars, cpu);
  loaded.initialize(5, cpu);
  EXPECT_NE(loaded.flat_values().to_host<float>(), store.flat_values().to_host<float>());
  const CheckpointInfo info =
      load_checkpoint(cluster, dir.file("a.safetensors"), loaded, nullptr, cpu);
  EXPECT_EQ(info.metadata.at("epoch"), "1");
  EXPECT_EQ(loaded.flat_values().to_host<float>(), store.flat_values().to_host<float>());
  EXPECT_THROW_WITH(save_checkpoint(cluster, dir.file("no/dir/a.safetensors"), store), IoError,
                    "no/dir/a.safetensors");
}

}  // namespace
}  // namespace towerlab::testing
