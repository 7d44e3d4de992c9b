// SummaryWriter: the rows it writes (CSV with a header, or JSON lines), its errors,
// and an earlier run's file left alone until the new run writes its first row.
#include "parallel/summary.h"

#include "engine/error.h"
#include "file_test_util.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

TEST(SummaryWriter, WritesCsvWithAHeaderFromTheFirstRow) {
  ScratchDir dir;
  const std::string path = dir.file("run.csv");
  {
    SummaryWriter writer(path);
    writer.write(1, {{"loss", 2.5}, {"accuracy", 0.125}});
    EXPECT_EQ(read_file(path), "step,accuracy,loss\n1,0.125,2.5\n") << "visible after each row";
    writer.write(2, {{"loss", 1.25}, {"accuracy", 0.5}});
  }
  EXPECT_EQ(read_file(path), "step,accuracy,loss\n1,0.125,2.5\n2,0.5,1.25\n");
  EXPECT_EQ(dir.list(), std::vector<std::string>{"run.csv"}) << "no temporary file is left";
}

TEST(SummaryWriter, WritesJsonLinesForOtherExtensions) {
  ScratchDir dir;
  const std::string path = dir.file("run.jsonl");
  {
    SummaryWriter writer(path);
    writer.write(7, {{"loss", 0.5}});
    writer.write(8, {{"loss", 0.25}, {"lr", 0.001}});
  }
  EXPECT_EQ(read_file(path),
            "{\"loss\":0.5,\"step\":7}\n{\"loss\":0.25,\"lr\":0.001,\"step\":8}\n");
}

TEST(SummaryWriter, AnEarlierFileStaysUntilTheFirstRow) {
  ScratchDir dir;
  const std::string path = dir.file("run.csv");
  write_file(path, "step,loss\n1,9\n");
  {
    SummaryWriter writer(path);  // a run that fails before its first step
  }
  EXPECT_EQ(read_file(path), "step,loss\n1,9\n");
  EXPECT_EQ(dir.list(), std::vector<std::string>{"run.csv"}) << "its temporary file is removed";

  SummaryWriter writer(path);
  EXPECT_EQ(read_file(path), "step,loss\n1,9\n") << "still the earlier run's before a row";
  writer.write(1, {{"loss", 3.0}});
  EXPECT_EQ(read_file(path), "step,loss\n1,3\n") << "the control: the first row replaces it";
}

TEST(SummaryWriter, RowsThatDoNotMatchTheColumnsAreRefused) {
  ScratchDir dir;
  SummaryWriter writer(dir.file("run.csv"));
  writer.write(1, {{"loss", 1.0}, {"accuracy", 0.5}});
  EXPECT_THROW_WITH(writer.write(2, {{"loss", 1.0}}), InvalidArgument,
                    "step 2 has 1 scalars, the CSV has 2 columns");
  EXPECT_THROW_WITH(writer.write(3, {{"loss", 1.0}, {"acc", 0.5}}), InvalidArgument,
                    "step 3 lacks the column 'accuracy'");
  writer.write(4, {{"loss", 0.5}, {"accuracy", 1.0}});
  EXPECT_EQ(read_file(dir.file("run.csv")), "step,accuracy,loss\n1,0.5,1\n4,1,0.5\n");
}

TEST(SummaryWriter, AMissingDirectoryIsAnIoErrorNamingThePath) {
  ScratchDir dir;
  const std::string path = dir.file("missing/run.csv");
  EXPECT_THROW_WITH(SummaryWriter{path}, IoError, path);
}

}  // namespace
}  // namespace towerlab::testing
