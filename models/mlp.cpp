#include "models/mlp.h"

#include "engine/error.h"

namespace towerlab::models {

Sequential mlp(VariableSet& vars, const MlpOptions& o) {
  TL_CHECK(o.inputs > 0 && o.classes > 0, InvalidArgument,
           "mlp: inputs and classes must be positive, got " << o.inputs << " and " << o.classes);
  Sequential net;
  net.add<Flatten>();
  std::int64_t in = o.inputs;
  for (std::size_t i = 0; i < o.hidden.size(); ++i) {
    const std::string name = "fc" + std::to_string(i + 1);
    net.add<Linear>(vars, name, in, o.hidden[i], true, Activation::ReLU);
    if (o.dropout > 0.0) net.add<Dropout>(name + "/dropout", o.dropout);
    in = o.hidden[i];
  }
  net.add<Linear>(vars, "fc" + std::to_string(o.hidden.size() + 1), in, o.classes);
  return net;
}

}  // namespace towerlab::models
