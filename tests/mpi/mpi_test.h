// What the MPI tests share (tests/mpi/mpi_test.cpp, mpi_training_test.cpp,
// mpi_failure_test.cpp: one binary, started by mpirun): the process group of the
// job, values as bytes, a small model with batch norm, and a directory every rank
// names the same.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "towerlab.h"

namespace towerlab::testing {

// main() sets it before the tests run.

inline Cluster* g_cluster = nullptr;

inline Cluster& cluster() {
  return *g_cluster;
}

template <typename T>
inline std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

inline const Stream& cpu() {
  return default_stream(Device::cpu());
}

struct Model {
  VariableSet vars;
  Sequential net;
  Tensor images, labels;
  Model() {
    net.add<Conv2d>(vars, "conv1", 1, 4, 3, Conv2dParams{.pad_h = 1, .pad_w = 1}, false);
    net.add<BatchNorm>(vars, "bn1", 4);
    net.add<ReLU>();
    net.add<Flatten>();
    net.add<Linear>(vars, "fc", 4 * 4 * 4, 3);
    images = Tensor::empty({6, 1, 4, 4}, cpu());
    random_normal(images, 9, 0, 0.0f, 1.0f, cpu());
    labels = Tensor::from_host<float>({0, 1, 2, 0, 1, 2}, {6}, cpu());
  }
  void train(VariableStore& store, Optimizer& opt, int steps) {
    for (int i = 0; i < steps; ++i) {
      Tape tape(cpu());
      Context ctx{tape, store, true};
      Var loss = ag::softmax_cross_entropy(net(ctx, tape.constant(images)), tape.constant(labels));
      store.zero_grad(cpu());
      tape.backward(loss);
      opt.step(store, store.flat_grads(), cpu());
    }
  }
};

inline std::string all_bytes(const VariableStore& store) {
  std::string s;
  for (const VariableSpec& v : store.set().specs())
    s += bytes_of(store.value(v.name).to_host<float>(cpu()));
  return s;
}

inline std::string slot_bytes(const Optimizer& opt) {
  std::string s;
  for (const auto& [name, flat] : opt.slots()) s += name + bytes_of(flat.to_host<float>(cpu()));
  return s;
}

// A directory every rank names the same: rank 0 creates it and broadcasts its name.
class SharedDir {
 public:
  SharedDir() {
    std::string name(200, '\0');
    if (cluster().rank() == 0) {
      std::string pattern =
          (std::filesystem::temp_directory_path() / "towerlab-mpi-XXXXXX").string();
      if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
      name.replace(0, pattern.size(), pattern);
    }
    cluster().broadcast(std::as_writable_bytes(std::span<char>(name)), 0, "test: directory");
    path_ = name.c_str();
  }
  ~SharedDir() {
    cluster().barrier("test: directory done");
    if (cluster().rank() == 0) std::filesystem::remove_all(path_);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace towerlab::testing
