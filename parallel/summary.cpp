#include "parallel/summary.h"

#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/error.h"

namespace towerlab {

SummaryWriter::SummaryWriter(const std::string& path)
    : path_(path), file_(path), csv_(path.ends_with(".csv")) {}

SummaryWriter::SummaryWriter(const std::string& path, std::uint64_t keep_bytes)
    : SummaryWriter(path) {
  if (keep_bytes == 0) return;
  std::string kept(keep_bytes, '\0');
  {
    const ReadOnlyFile old(path, "summaries " + path);
    TL_CHECK(old.size() >= keep_bytes, IoError,
             "summaries " << path << ": has " << old.size() << " bytes, the checkpoint wrote "
                          << keep_bytes << " (it was replaced since)");
    old.read_at(0, kept.data(), kept.size());
  }
  if (csv_) {  // the header names the columns
    std::istringstream header(kept.substr(0, kept.find('\n')));
    std::string name;
    std::getline(header, name, ',');  // "step"
    while (std::getline(header, name, ',')) columns_.push_back(name);
  }
  file_.write(kept.data(), kept.size());
  file_.publish();
  bytes_ = keep_bytes;
}

void SummaryWriter::write(std::int64_t step, const std::map<std::string, double>& scalars) {
  std::ostringstream text;
  if (csv_) {
    if (columns_.empty()) {
      text << "step";
      for (const auto& [name, value] : scalars) {
        columns_.push_back(name);
        text << "," << name;
      }
      text << "\n";
    }
    TL_CHECK(scalars.size() == columns_.size(), InvalidArgument,
             "summaries " << path_ << ": step " << step << " has " << scalars.size()
                          << " scalars, the CSV has " << columns_.size() << " columns");
    text << step;
    for (const std::string& name : columns_) {
      auto it = scalars.find(name);
      TL_CHECK(it != scalars.end(), InvalidArgument,
               "summaries " << path_ << ": step " << step << " lacks the column '" << name << "'");
      text << "," << std::setprecision(9) << it->second;
    }
    text << "\n";
  } else {
    nlohmann::json row{{"step", step}};
    for (const auto& [name, value] : scalars) row[name] = value;
    text << row.dump() << "\n";
  }
  const std::string row = text.str();
  file_.write(row.data(), row.size());
  if (!file_.published()) file_.publish();
  bytes_ += row.size();
}

}  // namespace towerlab
