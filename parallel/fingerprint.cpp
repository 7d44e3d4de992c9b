#include "parallel/fingerprint.h"

#include <algorithm>
#include <charconv>
#include <sstream>
#include <string_view>

namespace towerlab {
namespace {

// The shortest text that reads back as the same double, so that two rates that
// differ in the last bit do not print alike.
std::string number(double v) {
  char buffer[32];
  const auto end = std::to_chars(buffer, buffer + sizeof buffer, v).ptr;
  return std::string(buffer, end);
}

const char* init_name(Initializer::Kind kind) {
  switch (kind) {
    case Initializer::Kind::Zeros:
      return "zeros";
    case Initializer::Kind::Ones:
      return "ones";
    case Initializer::Kind::Constant:
      return "constant";
    case Initializer::Kind::Uniform:
      return "uniform";
    case Initializer::Kind::Normal:
      return "normal";
    case Initializer::Kind::HeNormal:
      return "he_normal";
    case Initializer::Kind::HeUniform:
      return "he_uniform";
    case Initializer::Kind::GlorotNormal:
      return "glorot_normal";
    case Initializer::Kind::GlorotUniform:
      return "glorot_uniform";
  }
  return "?";
}

std::string learning_rate(const LearningRate& lr) {
  switch (lr.kind) {
    case LearningRate::Kind::Constant:
      return "constant " + number(lr.base);
    case LearningRate::Kind::Step:
      return "step " + number(lr.base) + " every " + std::to_string(lr.every) + " gamma " +
             number(lr.gamma);
    case LearningRate::Kind::Cosine:
      return "cosine " + number(lr.base) + " total " + std::to_string(lr.total) + " min " +
             number(lr.min);
  }
  return "?";
}

const char* kind_name(Device d) {
  return d.is_cuda() ? "cuda" : "cpu";
}

struct Line {
  std::string_view key, value;
};

std::vector<Line> lines_of(std::string_view text) {
  std::vector<Line> lines;
  while (!text.empty()) {
    const std::size_t end = std::min(text.find('\n'), text.size());
    const std::string_view line = text.substr(0, end);
    const std::size_t tab = line.find('\t');
    lines.push_back(tab == std::string_view::npos
                        ? Line{line, {}}
                        : Line{line.substr(0, tab), line.substr(tab + 1)});
    text.remove_prefix(std::min(end + 1, text.size()));
  }
  return lines;
}

std::string whole(const Line& line) {
  return line.value.empty() ? std::string(line.key)
                            : std::string(line.key) + " " + std::string(line.value);
}

}  // namespace

std::string trainer_fingerprint(const VariableSet& variables, DType dtype,
                                const Optimizer& optimizer, const TrainerOptions& options) {
  std::ostringstream out;
  const auto line = [&out](const std::string& key, const std::string& value) {
    out << key << '\t' << value << '\n';
  };
  for (const VariableSpec& v : variables.specs()) {
    line("variable " + v.name, to_string(v.shape) + " " + dtype_name(dtype) + " " +
                                   (v.trainable ? "trainable" : "state") + " " +
                                   init_name(v.init.kind) + "(" + number(v.init.a) + ", " +
                                   number(v.init.b) + ")");
  }
  line("variables", std::to_string(variables.specs().size()));
  line("optimizer", optimizer.name());
  line("optimizer learning rate", learning_rate(optimizer.learning_rate()));
  line("optimizer learning rate warmup", std::to_string(optimizer.learning_rate().warmup));
  line("optimizer weight decay on", optimizer.decays() == WeightDecayOn::All ? "all" : "matrices");
  switch (optimizer.kind()) {
    case Optimizer::Kind::Sgd: {
      const SgdParams& p = optimizer.sgd_params();
      line("optimizer momentum", number(p.momentum));
      line("optimizer weight_decay", number(p.weight_decay));
      line("optimizer nesterov", p.nesterov ? "true" : "false");
      break;
    }
    case Optimizer::Kind::Rmsprop: {
      const RmspropParams& p = optimizer.rmsprop_params();
      line("optimizer decay", number(p.decay));
      line("optimizer momentum", number(p.momentum));
      line("optimizer epsilon", number(p.epsilon));
      line("optimizer centered", p.centered ? "true" : "false");
      break;
    }
    case Optimizer::Kind::Adam:
    case Optimizer::Kind::AdamW: {
      const AdamParams& p = optimizer.adam_params();
      line("optimizer beta1", number(p.beta1));
      line("optimizer beta2", number(p.beta2));
      line("optimizer epsilon", number(p.epsilon));
      line("optimizer weight_decay", number(p.weight_decay));
      break;
    }
  }
  line("optimizer steps", std::to_string(optimizer.steps()));
  std::string kinds;
  for (Device d : options.devices) {
    if (kinds.find(kind_name(d)) == std::string::npos) kinds += std::string(" ") + kind_name(d);
  }
  line("towers per process", std::to_string(options.devices.size()) + " on" + kinds);
  line("master", options.master_placement == MasterPlacement::Sharded ? "sharded"
                 : options.master                                     ? kind_name(*options.master)
                                                                      : "first tower's");
  line("reduction", options.reduction == AllReduce::Ring          ? "ring"
                    : options.reduction == AllReduce::ReduceToOne ? "reduce_to_one"
                                                                  : "nccl");
  // Every rank must cut the gradient into the same buckets: one call each.
  line("bucket_bytes", std::to_string(options.bucket_bytes));
  line("batchnorm", options.batchnorm == BatchNormMode::Sync ? "sync" : "local");
  line("batchnorm_stats",
       options.batchnorm_stats == BatchNormStats::Average ? "average" : "tower0");
  line("numeric_guard", options.numeric_guard == NumericGuard::Stop   ? "stop"
                        : options.numeric_guard == NumericGuard::Skip ? "skip"
                                                                      : "off");
  line("seed", std::to_string(options.seed));
  line("clip_grad_norm", number(options.clip_grad_norm));
  line("precision", precision_name(options.precision));
  if (options.precision == Precision::Fp16) {
    line("loss_scale_growth_interval", std::to_string(options.loss_scale_growth_interval));
  }
  // Only when not float32, so that the fingerprints of earlier states still match.
  if (options.reduce_dtype != DType::Float32)
    line("reduce_dtype", dtype_name(options.reduce_dtype));
  return out.str();
}

std::string first_fingerprint_difference(const std::vector<std::string>& by_rank) {
  if (by_rank.empty()) return {};
  const std::vector<Line> reference = lines_of(by_rank[0]);
  for (std::size_t r = 1; r < by_rank.size(); ++r) {
    const std::vector<Line> mine = lines_of(by_rank[r]);
    for (std::size_t i = 0; i < std::max(mine.size(), reference.size()); ++i) {
      const bool have_mine = i < mine.size(), have_reference = i < reference.size();
      if (have_mine && have_reference && mine[i].key == reference[i].key &&
          mine[i].value == reference[i].value) {
        continue;
      }
      std::ostringstream what;
      what << "rank " << r << ": ";
      if (have_mine && have_reference && mine[i].key == reference[i].key) {
        what << whole(mine[i]) << " vs rank 0: " << reference[i].value;
      } else {
        what << (have_mine ? whole(mine[i]) : "(nothing more)")
             << " vs rank 0: " << (have_reference ? whole(reference[i]) : "(nothing more)");
      }
      return what.str();
    }
  }
  return {};
}

}  // namespace towerlab
