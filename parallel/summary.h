// Scalar summaries per step, what tf.summary.scalar records: one row per step with
// the step number and named scalars, written as CSV (with a header from the first
// row's names) or as JSON lines, chosen by the file's extension (.csv, else JSON
// lines).
// Each row is flushed as it is written, so a crash loses at most the current step.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace towerlab {

class SummaryWriter {
 public:
  // Throws IoError when the file cannot be created.
  explicit SummaryWriter(const std::string& path);
  // Every row must carry the names of the first one (CSV columns); InvalidArgument otherwise.
  void write(std::int64_t step, const std::map<std::string, double>& scalars);

 private:
  std::string path_;
  std::ofstream out_;
  bool csv_;
  std::vector<std::string> columns_;
};

}  // namespace towerlab
