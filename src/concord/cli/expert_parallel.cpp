// Expert parallelism's setup shared by `concord generate` and `concord serve` (expert_parallel.h).
#include "concord/cli/expert_parallel.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>
#include <xxhash.h>

#include "concord/io/json_file.h"
#include "concord/numerics/check.h"

namespace concord::cli {

// Ranks hold only their experts' weights: with `replan`, every expert's content hash taken first,
// as loaded (the weight-sync check of an expert moved later); then the experts not on this rank's
// slots released. A model serving its file's stored blocks keeps every expert (they move as fp32
// values), and then may not re-place (`replan`: InputError).
void hold_own_experts(model::Model& m, model::ExpertParallel& ep, bool replan) {
  const model::ModelConfig& c = m.config();
  try {
    if (replan) {
      ep.expert_hash.assign(static_cast<size_t>(c.applications()), {});
      for (int64_t app = 0; app < c.applications(); ++app)
        if (c.is_moe_layer(c.block_of(app)))
          for (int64_t e = 0; e < c.num_experts; ++e) {
            const std::vector<uint8_t> b = m.expert_bytes(c.block_of(app), e);
            ep.expert_hash[static_cast<size_t>(app)].push_back(XXH3_64bits(b.data(), b.size()));
          }
    } else {
      for (int64_t app = 0; app < c.applications(); ++app)
        if (c.is_moe_layer(c.block_of(app))) {
          m.holds_expert(c.block_of(app), 0);  // InputError when the experts are stored blocks
          break;
        }
    }
  } catch (const InputError& e) {
    if (replan) throw InputError(fmt::format("--replan-every: {}", e.what()));
    return;
  }
  if (c.applications() != c.num_hidden_layers) return;  // a block run twice: its experts serve both
  for (int64_t app = 0; app < c.applications(); ++app) {
    if (!c.is_moe_layer(c.block_of(app))) continue;
    for (int64_t e = 0; e < c.num_experts; ++e) {
      bool mine = false;
      if (ep.rank_experts.empty()) {
        mine = e >= ep.first_expert(c.num_experts, ep.rank) && e < ep.first_expert(c.num_experts, ep.rank + 1);
      } else {
        const auto& own = ep.rank_experts[static_cast<size_t>(app)][static_cast<size_t>(ep.rank)];
        mine = std::find(own.begin(), own.end(), e) != own.end();
      }
      if (!mine && m.holds_expert(c.block_of(app), e)) m.release_expert(c.block_of(app), e);
    }
  }
}

serve::epsim::CostModel read_ep_cost(const std::string& path, const std::string& layer) {
  const nlohmann::json j = io::read_json_file(path, layer, "the cost model");
  const io::JsonValue v(j, "[" + layer + "]", path);
  serve::epsim::CostModel c;
  c.pass_s = v["pass_s"].number_at_least(0);
  c.piece_s = v["piece_s"].number_at_least(0);
  c.row_s = v["row_s"].number_at_least(0);
  c.exchange_pass_s = v["exchange_pass_s"].number_at_least(0);
  c.exchange_row_s = v["exchange_row_s"].number_at_least(0);
  if (v.contains("exchange")) {
    const std::string e = v["exchange"].string();
    if (e != "alltoall" && e != "allgather")
      throw InputError(fmt::format("[{}] {}: 'exchange' must be alltoall or allgather, got '{}'", layer, path, e));
    c.alltoall = e == "alltoall";
  }
  return c;
}

}  // namespace concord::cli
