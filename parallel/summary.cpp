#include "parallel/summary.h"

#include <cerrno>
#include <cstring>
#include <iomanip>
#include <nlohmann/json.hpp>

#include "engine/error.h"

namespace towerlab {

SummaryWriter::SummaryWriter(const std::string& path)
    : path_(path), out_(path, std::ios::trunc), csv_(path.ends_with(".csv")) {
  TL_CHECK(out_.good(), IoError,
           "summaries: cannot create " << path << ": " << std::strerror(errno));
}

void SummaryWriter::write(std::int64_t step, const std::map<std::string, double>& scalars) {
  if (csv_) {
    if (columns_.empty()) {
      out_ << "step";
      for (const auto& [name, value] : scalars) {
        columns_.push_back(name);
        out_ << "," << name;
      }
      out_ << "\n";
    }
    TL_CHECK(scalars.size() == columns_.size(), InvalidArgument,
             "summaries " << path_ << ": step " << step << " has " << scalars.size()
                          << " scalars, the CSV has " << columns_.size() << " columns");
    out_ << step;
    for (const std::string& name : columns_) {
      auto it = scalars.find(name);
      TL_CHECK(it != scalars.end(), InvalidArgument,
               "summaries " << path_ << ": step " << step << " lacks the column '" << name << "'");
      out_ << "," << std::setprecision(9) << it->second;
    }
    out_ << "\n";
  } else {
    nlohmann::json row{{"step", step}};
    for (const auto& [name, value] : scalars) row[name] = value;
    out_ << row.dump() << "\n";
  }
  out_.flush();
  TL_CHECK(out_.good(), IoError, "summaries: cannot write " << path_);
}

}  // namespace towerlab
