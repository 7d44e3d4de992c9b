// The fashion_mnist sample's command line and config file: every bad value stops
// it with exit code 2 and one short line that names the flag (or the config file and
// key), the value and what is allowed; the combinations, the paths and the batch
// against the data set are refused before any work. The whole program is run with
// bad input by the ctest cases fashion_mnist.bad_* (samples/CMakeLists.txt).
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "samples/fashion_mnist/options.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

namespace fs = std::filesystem;

struct Parsed {
  std::optional<int> code;  // nothing: accepted
  std::string printed;      // stderr
  sample::Options options;
};

Parsed parse(std::vector<std::string> args) {
  args.insert(args.begin(), "fashion_mnist");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  std::ostringstream err, out;
  std::streambuf* saved_err = std::cerr.rdbuf(err.rdbuf());
  std::streambuf* saved_out = std::cout.rdbuf(out.rdbuf());
  Parsed parsed;
  parsed.code = sample::parse_options(int(argv.size()), argv.data(), parsed.options);
  std::cerr.rdbuf(saved_err);
  std::cout.rdbuf(saved_out);
  parsed.printed = err.str();
  return parsed;
}

// A scratch file's path, unique to this process: ctest runs each case as its own
// process, several at once, and two cases writing one file would read each other's.
std::string scratch(const std::string& name) {
  return ::testing::TempDir() + "/towerlab-options-" + std::to_string(::getpid()) + "-" + name;
}

const std::string& config_path() {
  static const std::string path = scratch("config.yaml");
  return path;
}

Parsed parse_config(const std::string& yaml, std::vector<std::string> flags = {}) {
  std::ofstream(config_path()) << yaml;
  flags.insert(flags.begin(), {"--config", config_path()});
  Parsed parsed = parse(flags);
  fs::remove(config_path());
  return parsed;
}

// The form of every refusal: one line, starting with the program's name, short,
// and without a long number nobody typed (the 300-digit bounds of the flag
// parser's own range checks).
bool is_one_short_line(const std::string& printed) {
  return printed.rfind("fashion_mnist: ", 0) == 0 && printed.size() < 200 &&
         printed.find('\n') == printed.size() - 1 &&
         !std::regex_search(printed, std::regex("[0-9]{33}"));
}

TEST(FashionMnistOptions, TheRefusalFormCheckCanFail) {
  EXPECT_TRUE(is_one_short_line("fashion_mnist: --batch must be a positive integer, got '0'\n"));
  EXPECT_FALSE(is_one_short_line("--batch: Value 0 not in range 0.000000 to " +
                                 std::string(300, '9') + "\n"));
  EXPECT_FALSE(is_one_short_line("fashion_mnist: --batch: Value 0 not in range 0.000000 to " +
                                 std::string(40, '9') + "\n"));
  EXPECT_FALSE(is_one_short_line("fashion_mnist: bad\nRun with --help for more information.\n"));
  EXPECT_FALSE(is_one_short_line("fashion_mnist: no newline"));
}

void expect_refused(const Parsed& parsed, const std::string& message, const std::string& input) {
  EXPECT_EQ(parsed.code, 2) << input;
  EXPECT_NE(parsed.printed.find(message), std::string::npos)
      << input << "\nprinted:  " << parsed.printed << "expected: " << message;
  EXPECT_TRUE(is_one_short_line(parsed.printed)) << input << "\nprinted: " << parsed.printed;
}

TEST(FashionMnistOptions, GoodFlagsAreAccepted) {
  const Parsed parsed = parse({"--batch",
                               "64",
                               "--epochs",
                               "2",
                               "--lr",
                               "1e-2",
                               "--steps",
                               "0",
                               "--seed",
                               "7",
                               "--schedule",
                               "constant",
                               "--devices",
                               "cpu,cpu",
                               "--batch",
                               "1e3",
                               "--progress-every",
                               "0",
                               "--log-placement",
                               "--eval-only=false",
                               "--bucket-mib",
                               "0",
                               "--cross-process",
                               "host-staged"});
  ASSERT_EQ(parsed.code, std::nullopt) << parsed.printed;
  EXPECT_EQ(parsed.printed, "");
  EXPECT_EQ(parsed.options.batch, 1000);  // the last of a repeated flag; a whole exponent form
  EXPECT_EQ(parsed.options.epochs, 2);
  EXPECT_EQ(parsed.options.lr, 1e-2);
  EXPECT_EQ(parsed.options.seed, 7u);
  EXPECT_EQ(parsed.options.schedule, "constant");
  EXPECT_EQ(parsed.options.devices, "cpu,cpu");
  EXPECT_EQ(parsed.options.progress_every, 0);
  EXPECT_TRUE(parsed.options.log_placement);
  EXPECT_FALSE(parsed.options.eval_only);
  EXPECT_EQ(parsed.options.bucket_mib, 0);  // given: 0 (one bucket) is not the default
  EXPECT_EQ(parsed.options.cross_process, "host-staged");
  const Parsed defaults = parse({});
  EXPECT_EQ(defaults.options.bucket_mib, std::nullopt);  // the trainer's default
  EXPECT_EQ(defaults.options.cross_process, "auto");
}

// --model picks one of models/ (default FashionNet); the config file's key too.
TEST(FashionMnistOptions, ModelIsFashionNetMlpResNetOrVit) {
  EXPECT_EQ(parse({}).options.model, "fashion_net");
  for (const char* model : {"fashion_net", "mlp", "resnet", "vit"}) {
    const Parsed parsed = parse({"--model", model});
    ASSERT_EQ(parsed.code, std::nullopt) << parsed.printed;
    EXPECT_EQ(parsed.options.model, model);
  }
  EXPECT_EQ(parse_config("model: resnet\n").options.model, "resnet");
  expect_refused(parse({"--model", "vgg"}),
                 "--model must be one of fashion_net, mlp, resnet, vit, got 'vgg'", "--model vgg");
  expect_refused(parse_config("model: ResNet\n"),
                 "model must be one of fashion_net, mlp, resnet, vit, got 'ResNet'",
                 "model: ResNet");
}

// --label-smoothing E: the cross-entropy's, in [0, 1]; 0 (off) unless given.
TEST(FashionMnistOptions, LabelSmoothingIsFromZeroToOne) {
  EXPECT_EQ(parse({}).options.label_smoothing, 0.0);
  for (const char* value : {"0", "0.1", "1"}) {
    const Parsed parsed = parse({"--label-smoothing", value});
    ASSERT_EQ(parsed.code, std::nullopt) << parsed.printed;
    EXPECT_EQ(parsed.options.label_smoothing, std::stod(value));
  }
  EXPECT_EQ(parse_config("label_smoothing: 0.2\n").options.label_smoothing, 0.2);
  for (const char* bad : {"-0.1", "1.01", "nan", "abc"}) {
    expect_refused(parse({"--label-smoothing", bad}),
                   std::string("--label-smoothing must be a number from 0 to 1, got '") + bad + "'",
                   bad);
  }
}

// --master takes a device or "sharded" (MasterPlacement::Sharded).
TEST(FashionMnistOptions, MasterTakesADeviceOrSharded) {
  for (const char* master : {"sharded", "cpu", "cuda:1"}) {
    const Parsed parsed = parse({"--master", master});
    ASSERT_EQ(parsed.code, std::nullopt) << parsed.printed;
    EXPECT_EQ(parsed.options.master, master);
  }
  const Parsed bad = parse({"--master", "shard"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.printed.find("--master: cannot parse device 'shard'"), std::string::npos)
      << bad.printed;
}

// --precision: fp32 (the default), tf32, bf16, fp16.
TEST(FashionMnistOptions, PrecisionTakesFp32Tf32Bf16OrFp16) {
  EXPECT_EQ(parse({}).options.precision, "fp32");
  for (const char* precision : {"fp32", "tf32", "bf16", "fp16"}) {
    const Parsed parsed = parse({"--precision", precision});
    ASSERT_EQ(parsed.code, std::nullopt) << parsed.printed;
    EXPECT_EQ(parsed.options.precision, precision);
  }
  expect_refused(parse({"--precision", "half"}),
                 "--precision must be one of fp32, tf32, bf16, fp16, got 'half'",
                 "--precision half");
}

TEST(FashionMnistOptions, HelpExitsZero) {
  const Parsed parsed = parse({"--help"});
  EXPECT_EQ(parsed.code, 0);
}

TEST(FashionMnistOptions, BadFlagValuesExit2NamingTheFlagTheValueAndWhatIsAllowed) {
  const std::string long_number(300, '9');
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases{
      {{"--batch", "0"}, "--batch must be a positive integer, got '0'"},
      {{"--batch", "-3"}, "--batch must be a positive integer, got '-3'"},
      {{"--batch", "abc"}, "--batch must be a positive integer, got 'abc'"},
      {{"--batch", "2.5"}, "--batch must be a positive integer, got '2.5'"},
      {{"--batch", " 8"}, "--batch must be a positive integer, got ' 8'"},
      {{"--batch", "1e30"}, "--batch must be a positive integer, got '1e30'"},  // beyond int64
      {{"--batch", long_number}, "--batch must be a positive integer, got '999"},
      {{"--epochs", "-1"}, "--epochs must be a positive integer"},
      {{"--epochs", "0"},
       "--epochs must be a positive integer (to train nothing, use --eval-only --load FILE), "
       "got '0'"},
      {{"--epochs", "3000000000"}, "--epochs must be a positive integer"},  // beyond int
      {{"--steps", "-1"}, "--steps must be a non-negative integer (0: whole epochs), got '-1'"},
      {{"--checkpoint-every", "-1"},
       "--checkpoint-every must be a non-negative integer (0: every epoch), got '-1'"},
      {{"--keep", "0"}, "--keep must be a positive integer, got '0'"},
      {{"--test-samples", "0"},
       "--test-samples must be a positive integer (default: the whole test set), got '0'"},
      {{"--test-samples", "-5"}, "--test-samples must be a positive integer"},
      {{"--test-samples", "1.5"}, "--test-samples must be a positive integer"},
      {{"--test-samples", "many"}, "--test-samples must be a positive integer"},
      {{"--lr", "-1"}, "--lr must be a positive number, got '-1'"},
      {{"--lr", "0"}, "--lr must be a positive number, got '0'"},
      {{"--lr", "nan"}, "--lr must be a positive number, got 'nan'"},
      {{"--lr", "inf"}, "--lr must be a positive number, got 'inf'"},
      {{"--weight-decay", "-0.1"}, "--weight-decay must be a non-negative number, got '-0.1'"},
      {{"--n-gpus", "0"}, "--n-gpus must be a positive integer, got '0'"},
      {{"--seed", "-1"}, "--seed must be a non-negative integer, got '-1'"},
      {{"--progress-every", "-5"}, "--progress-every must be a non-negative integer"},
      {{"--schedule", "linear"}, "--schedule must be one of cosine, constant, got 'linear'"},
      {{"--numeric-guard", "maybe"}, "--numeric-guard must be one of stop, skip, off, got 'maybe'"},
      {{"--optimizer", "lbfgs"}, "--optimizer must be one of adam, adamw, sgd, momentum, rmsprop"},
      {{"--batchnorm", "global"}, "--batchnorm must be one of local, sync, got 'global'"},
      {{"--bucket-mib", "-1"},
       "--bucket-mib must be an integer from 0 (one bucket) to 1048576, got '-1'"},
      {{"--bucket-mib", "1048577"}, "--bucket-mib must be an integer from 0"},  // past the bound
      {{"--bucket-mib", "0.5"}, "--bucket-mib must be an integer from 0"},
      {{"--cross-process", "mpi"},
       "--cross-process must be one of auto, host-staged, nccl, got 'mpi'"},
      {{"--devices", "cpu,foo"}, "--devices: cannot parse device 'foo'"},
      {{"--master", "gpu:x"}, "--master: cannot parse device 'gpu:x'"},
      {{"--batch"}, "--batch"},  // the flag parser's own words for a missing value
      {{"--no-such-flag"}, "--no-such-flag"},
      {{"stray"}, "stray"},
  };
  for (const auto& [args, message] : cases) {
    std::string input;
    for (const std::string& a : args) input += a + " ";
    expect_refused(parse(args), message, input);
  }
  // Cut short: the message quotes 32 characters of a long value.
  EXPECT_EQ(parse({"--batch", long_number}).printed.find(long_number.substr(0, 33)),
            std::string::npos);
}

TEST(FashionMnistOptions, EvalOnlyNeedsLoadAndTrainsNothing) {
  const std::string checkpoint = scratch("checkpoint");
  std::ofstream(checkpoint) << "not read by the parser";
  expect_refused(parse({"--eval-only"}),
                 "--eval-only needs --load FILE: without it the test set would be scored with "
                 "the random initial weights",
                 "--eval-only");
  const std::string out = scratch("out");
  for (const char* flag : {"--save", "--trace", "--summaries"}) {
    expect_refused(
        parse({"--eval-only", "--load", checkpoint, flag, out}),
        std::string("--eval-only trains nothing, so ") + flag + " " + out + " would not be written",
        flag);
  }
  const Parsed parsed = parse({"--eval-only", "--load", checkpoint, "--metrics", out});
  EXPECT_EQ(parsed.code, std::nullopt) << parsed.printed;
  EXPECT_TRUE(parsed.options.eval_only);
  EXPECT_FALSE(fs::exists(out));  // checking the output created nothing
  fs::remove(checkpoint);
}

TEST(FashionMnistOptions, ConfigValuesAreCheckedLikeFlagsAndNameTheFileAndTheKey) {
  const Parsed good = parse_config(
      "epochs: 2\nbatch: 64\nschedule: cosine\nlr: 1e-3\n"
      "devices: [cpu, cpu]\neval_only: false\n");
  ASSERT_EQ(good.code, std::nullopt) << good.printed;
  EXPECT_EQ(good.options.devices, "cpu,cpu");
  EXPECT_EQ(good.options.batch, 64);
  EXPECT_EQ(parse_config("").code, std::nullopt);  // an empty file sets nothing

  const std::string in = "config " + config_path() + ": ";
  const std::vector<std::pair<std::string, std::string>> cases{
      {"batch: -1\n", in + "batch must be a positive integer, got '-1'"},
      {"batch: 0\n", in + "batch must be a positive integer, got '0'"},
      {"batch: abc\n", in + "batch must be a positive integer, got 'abc'"},
      {"batch: [1, 2]\n", in + "batch must be a positive integer, got a list"},
      {"batch: {a: 1}\n", in + "batch must be a positive integer, got a mapping"},
      {"epochs: -3\n", in + "epochs must be a positive integer"},
      {"epochs: 0\n", in + "epochs must be a positive integer (to train nothing, use --eval-only"},
      {"lr: .nan\n", in + "lr must be a positive number, got '.nan'"},
      {"lr: -0.1\n", in + "lr must be a positive number, got '-0.1'"},
      {"weight_decay: .inf\n", in + "weight_decay must be a non-negative number, got '.inf'"},
      {"clip_grad_norm: -1\n", in + "clip_grad_norm must be a non-negative number, got '-1'"},
      {"label_smoothing: 1.5\n", in + "label_smoothing must be a number from 0 to 1, got '1.5'"},
      {"warmup: -5\n", in + "warmup must be a non-negative integer, got '-5'"},
      {"n_gpus: 0\n", in + "n_gpus must be a positive integer, got '0'"},
      {"test_samples: 0\n", in + "test_samples must be a positive integer"},
      {"seed: -2\n", in + "seed must be a non-negative integer, got '-2'"},
      {"schedule: linear\n", in + "schedule must be one of cosine, constant, got 'linear'"},
      {"numeric_guard: maybe\n", in + "numeric_guard must be one of stop, skip, off"},
      {"optimizer: lbfgs\n", in + "optimizer must be one of adam, adamw, sgd, momentum, rmsprop"},
      {"batchnorm: global\n", in + "batchnorm must be one of local, sync, got 'global'"},
      {"eval_only: maybe\n", in + "eval_only must be true or false, got 'maybe'"},
      {"save:\n", in + "save must be a file name, got no value"},
      {"devices: [cpu, [cpu]]\n", in + "devices must be a list of device names"},
      {"master: tpu\n", in + "master: cannot parse device 'tpu'"},
      {"learning_rate: 3\n", in + "unknown key 'learning_rate'"},
      {"- a\n- b\n", in + "expected a mapping of keys to values"},
      {"epochs: {\n", in + "line 2, column 1: not YAML"},
      {"batch: \"two\\nlines\"\n", in + "batch must be a positive integer, got 'two?lines'"},
  };
  for (const auto& [yaml, message] : cases) expect_refused(parse_config(yaml), message, yaml);
  expect_refused(parse({"--config", config_path() + ".missing"}),
                 "config " + config_path() + ".missing: cannot read the file", "missing config");

  // A flag overrides the config, and its own value is checked as a flag.
  EXPECT_EQ(parse_config("batch: -1\n", {"--batch", "32"}).code, std::nullopt);
  expect_refused(parse_config("epochs: 1\n", {"--batch", "0"}),
                 "--batch must be a positive integer, got '0'", "--batch 0 over a config");
}

// A scratch directory for the path checks, removed with its contents.
class OutputPaths : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = scratch("paths");
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add);
    fs::remove_all(dir_);
  }
  std::string at(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

TEST_F(OutputPaths, GoodOutputsPassAndNothingIsCreatedOrTruncated) {
  std::ofstream(at("metrics.json")) << "there before";
  sample::Options o;
  o.metrics = at("metrics.json");
  o.save = at("model.safetensors");
  o.trace = at("trace.json");
  o.summaries = at("summaries.csv");
  EXPECT_NO_THROW(sample::check_paths(o));
  std::ifstream in(at("metrics.json"));
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "there before");
  EXPECT_FALSE(fs::exists(at("model.safetensors")));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

TEST_F(OutputPaths, BadOutputsThrowIoErrorNamingTheFlagAndThePath) {
  std::ofstream(at("file")) << "x";
  auto with = [](std::string sample::Options::*member, const std::string& path) {
    sample::Options o;
    o.*member = path;
    return o;
  };
  using O = sample::Options;
  EXPECT_THROW_WITH(sample::check_paths(with(&O::metrics, at("none/m.json"))), IoError,
                    "--metrics " + at("none/m.json") + ": no such directory: " + at("none"));
  EXPECT_THROW_WITH(sample::check_paths(with(&O::save, at("file/m.safetensors"))), IoError,
                    "--save " + at("file/m.safetensors") + ": is not a directory: " + at("file"));
  EXPECT_THROW_WITH(sample::check_paths(with(&O::trace, dir_.string())), IoError,
                    "--trace " + dir_.string() + ": names a directory, not a file");
  EXPECT_THROW_WITH(sample::check_paths(with(&O::summaries, dir_.string() + "/")), IoError,
                    "names a directory, not a file");
  EXPECT_THROW_WITH(sample::check_paths(with(&O::metrics, "/dev/null")), IoError,
                    "--metrics /dev/null: is there and is not a regular file");
  EXPECT_THROW_WITH(sample::check_paths(with(&O::load, at("none.safetensors"))), IoError,
                    "--load " + at("none.safetensors") + ": no such file");
  O both;
  both.save = at("out");
  both.metrics = dir_.string() + "/./out";
  EXPECT_THROW_WITH(sample::check_paths(both), IoError,
                    "--save and --metrics name the same file " + both.metrics);
  if (::geteuid() != 0) {  // root may write anywhere
    fs::permissions(dir_, fs::perms::owner_write, fs::perm_options::remove);
    EXPECT_THROW_WITH(
        sample::check_paths(with(&O::metrics, at("m.json"))), IoError,
        "--metrics " + at("m.json") + ": cannot write in " + dir_.string() + ": Permission denied");
  }
}

TEST_F(OutputPaths, ABadPathStopsTheParserWithExit2) {
  expect_refused(parse({"--steps", "1", "--metrics", at("none/m.json")}),
                 "--metrics " + at("none/m.json") + ": no such directory", "bad --metrics");
}

TEST_F(OutputPaths, PredictionsIsAnOutputAndLoadPartialNeedsLoad) {
  expect_refused(parse({"--predictions", at("none/p.safetensors")}),
                 "--predictions " + at("none/p.safetensors") + ": no such directory",
                 "bad --predictions");
  expect_refused(parse({"--load-partial"}),
                 "--load-partial needs --load FILE: it says how closely that file must match "
                 "the model",
                 "--load-partial");
  const Parsed parsed = parse({"--predictions", at("p.safetensors")});
  EXPECT_EQ(parsed.code, std::nullopt) << parsed.printed;
  EXPECT_EQ(parsed.options.predictions, at("p.safetensors"));
  EXPECT_FALSE(fs::exists(at("p.safetensors")));  // checking the output created nothing
}

TEST(FashionMnistOptions, ABatchLargerThanTheTrainingSetIsRefused) {
  sample::Options o;
  o.batch = 60000;
  EXPECT_NO_THROW(sample::check_against_data(o, 60000, 10000));
  o.batch = 60001;
  EXPECT_THROW_WITH(sample::check_against_data(o, 60000, 10000), InvalidArgument,
                    "--batch must be at most the 60000 images of the training set, got '60001'");
  o.batch = 1'000'000'000'000;
  EXPECT_THROW_WITH(sample::check_against_data(o, 60000, 10000), InvalidArgument,
                    "got '1000000000000'");
  o.eval_only = true;  // evaluation goes by batches of 1000 and never uses --batch
  EXPECT_NO_THROW(sample::check_against_data(o, 60000, 10000));
}

TEST_F(OutputPaths, CheckpointDirIsADirectoryWeMayCreateAndItsOptionsNeedIt) {
  expect_refused(parse({"--checkpoint-every", "5"}),
                 "--checkpoint-every needs --checkpoint-dir DIR", "--checkpoint-every");
  expect_refused(parse({"--keep", "3"}), "--keep needs --checkpoint-dir DIR", "--keep");
  std::ofstream(at("file")) << "x";
  expect_refused(parse({"--checkpoint-dir", at("file")}),
                 "--checkpoint-dir " + at("file") + ": is there and is not a directory", "file");
  expect_refused(parse({"--checkpoint-dir", at("none/run")}),
                 "--checkpoint-dir " + at("none/run") + ": no such directory: " + at("none"),
                 "missing parent");
  expect_refused(parse({"--eval-only", "--load", at("file"), "--checkpoint-dir", at("run")}),
                 "--eval-only trains nothing, so --checkpoint-dir", "--eval-only");
  const Parsed parsed =
      parse({"--checkpoint-dir", at("run"), "--checkpoint-every", "100", "--keep", "3"});
  ASSERT_EQ(parsed.code, std::nullopt) << parsed.printed;
  EXPECT_EQ(parsed.options.checkpoint_dir, at("run"));
  EXPECT_EQ(parsed.options.checkpoint_every, 100);
  EXPECT_EQ(parsed.options.keep, 3);
  EXPECT_FALSE(fs::exists(at("run")));  // created when the run starts, not by the check
}

// --test-samples: a positive count, checked against the test set once it is loaded,
// with --eval-only too (which evaluates it).
TEST(FashionMnistOptions, TestSamplesAreAtMostTheTestSet) {
  const Parsed parsed = parse({"--test-samples", "500"});
  ASSERT_EQ(parsed.code, std::nullopt) << parsed.printed;
  EXPECT_EQ(parsed.options.test_samples, 500);
  EXPECT_EQ(parse({}).options.test_samples, std::nullopt);  // the whole test set
  sample::Options o;
  o.test_samples = 10000;
  EXPECT_NO_THROW(sample::check_against_data(o, 60000, 10000));
  o.test_samples = 10001;
  EXPECT_THROW_WITH(sample::check_against_data(o, 60000, 10000), InvalidArgument,
                    "--test-samples must be at most the 10000 images of the test set, got "
                    "'10001'");
  o.eval_only = true;
  EXPECT_THROW_WITH(sample::check_against_data(o, 60000, 10000), InvalidArgument,
                    "--test-samples must be at most the 10000 images of the test set");
}

// --trace-steps: a range of steps counted from 1, checked for its form at once and
// against the run's steps once the data set's size is known.
TEST(FashionMnistOptions, TraceStepsTakeARangeAndRefuseABadOne) {
  const fs::path trace = fs::path(scratch("trace.json"));
  const Parsed range = parse({"--trace", trace.string(), "--trace-steps", "3:5"});
  ASSERT_EQ(range.code, std::nullopt) << range.printed;
  EXPECT_EQ(range.options.trace_steps, (std::pair<std::int64_t, std::int64_t>{3, 5}));
  const Parsed one = parse({"--trace", trace.string(), "--trace-steps", "4"});
  ASSERT_EQ(one.code, std::nullopt) << one.printed;
  EXPECT_EQ(one.options.trace_steps, (std::pair<std::int64_t, std::int64_t>{4, 4}));
  for (const std::string bad : {"0:2", "5:3", "a:b", "2:", ":3", "-1", "1:2:3", "", "2 :4"}) {
    expect_refused(parse({"--trace", trace.string(), "--trace-steps", bad}),
                   "--trace-steps must be FIRST:LAST with 1 <= FIRST <= LAST (steps count from "
                   "1), or one step N, got '" +
                       bad + "'",
                   bad);
  }
  expect_refused(parse({"--trace-steps", "2:3"}), "--trace-steps needs --trace FILE", "no --trace");

  // 60000 images in batches of 1000 are 60 steps an epoch; 2 epochs are 120.
  sample::Options o;
  o.batch = 1000;
  o.epochs = 2;
  o.trace = trace.string();
  EXPECT_EQ(sample::trace_range(o, 60000), (std::pair<std::int64_t, std::int64_t>{2, 2}));
  o.trace_steps = {{60, 120}};
  EXPECT_NO_THROW(sample::check_against_data(o, 60000, 10000));
  EXPECT_EQ(sample::trace_range(o, 60000), (std::pair<std::int64_t, std::int64_t>{60, 120}));
  o.trace_steps = {{60, 121}};
  EXPECT_THROW_WITH(sample::check_against_data(o, 60000, 10000), InvalidArgument,
                    "--trace-steps must be within the run's 120 steps (2 epoch(s) of 60), got "
                    "'60:121'");
  o.steps = 10;  // --steps caps each epoch
  o.trace_steps = {{15, 20}};
  EXPECT_NO_THROW(sample::check_against_data(o, 60000, 10000));
  o.trace_steps = {{15, 21}};
  EXPECT_THROW_WITH(sample::check_against_data(o, 60000, 10000), InvalidArgument, "run's 20 steps");
  // A one-step run traces its only step by default.
  o.trace_steps.reset();
  o.epochs = 1;
  o.steps = 1;
  EXPECT_EQ(sample::trace_range(o, 60000), (std::pair<std::int64_t, std::int64_t>{1, 1}));
}

}  // namespace
}  // namespace towerlab::testing
