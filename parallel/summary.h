// Scalar summaries per step, what tf.summary.scalar records: one row per step with
// the step number and named scalars, written as CSV (with a header from the first
// row's names) or as JSON lines, chosen by the file's extension (.csv, else JSON
// lines).
// Each row is written to the file as it comes, so a crash loses at most the
// current step. The rows go to a temporary file beside the target that replaces it
// at the first row (AtomicFile::publish): a run that fails before writing a row
// leaves an earlier run's summaries as they were.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "../engine/atomic_file.h"

namespace towerlab {

class SummaryWriter {
 public:
  // Throws IoError when the file cannot be created (its directory is missing or
  // not writable).
  explicit SummaryWriter(const std::string& path);
  // Continues `path` after a resume: its first `keep_bytes` bytes (the rows written
  // up to a checkpoint, bytes() then) are kept and what follows is replaced, so that
  // no row is missing or written twice. IoError when the file is shorter.
  SummaryWriter(const std::string& path, std::uint64_t keep_bytes);
  // Every row must carry the names of the first one (CSV columns); InvalidArgument otherwise.
  void write(std::int64_t step, const std::map<std::string, double>& scalars);
  // Bytes in the file so far: where a resume continues it.
  std::uint64_t bytes() const { return bytes_; }

 private:
  std::string path_;
  AtomicFile file_;
  bool csv_;
  std::vector<std::string> columns_;
  std::uint64_t bytes_ = 0;
};

}  // namespace towerlab
