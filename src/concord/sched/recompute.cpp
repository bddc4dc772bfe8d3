// Selective recomputation (recompute.h): the training step's activation memory under a plan, and
// the plans.
#include "concord/sched/recompute.h"

#include <algorithm>
#include <functional>

#include <fmt/format.h>

#include "concord/numerics/check.h"

namespace concord::sched {
namespace {

// An allocation of n floats in the model's arena (tensor::Arena: 64-byte lines, at least one).
int64_t r(int64_t floats) { return (std::max<int64_t>(floats * 4, 1) + 63) / 64 * 64; }

// One application's shape in the arena and in FLOPs.
struct AppCost {
  int64_t pre = 0;     // through the attention output (the block's allocations before its probabilities)
  int64_t probs = 0;   // the attention probabilities
  int64_t post = 0;    // after them: residual, post-norm, the MLP
  int64_t out = 0;     // a block-mode application's kept output
  int64_t att = 0;     // the attention output (recomputed beside the probabilities, discarded)
  int64_t backward = 0;  // the block backward's own scratch (MoE), released after it
  double block_flops = 0, attention_flops = 0;
  bool moe = false;
};

struct Shape {
  std::vector<AppCost> apps;
  int64_t embed = 0, head = 0, dlogits = 0, scratch = 0;
  double step_flops = 0;
};

Shape shape_of(const model::ModelConfig& c, int64_t B, int64_t S) {
  if (c.recurrent()) throw InputError("[sched] recomputation: a depth-recurrent model's training step is not planned yet");
  if (B < 1 || S < 1) throw InputError(fmt::format("[sched] recomputation: {} sequences of {} tokens", B, S));
  const int64_t T = B * S, C = c.hidden_size, D = c.head_dim, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  const int64_t F = c.intermediate_size, V = c.vocab_size, E = c.num_experts, k = c.num_experts_per_tok;
  const int64_t Fm = c.moe_intermediate_size, R = T * k;
  const auto t = static_cast<double>(T);
  Shape s;
  double forward = 0;
  for (int64_t a = 0; a < c.applications(); ++a) {
    AppCost x;
    x.moe = c.is_moe_layer(c.block_of(a));
    // block_dense.cpp's attention_inputs / the pass's attention / attention_output, in order.
    x.pre = r(T) + r(T * C) + r(T * Hq * D) + 2 * r(T * Hkv * D) + r(T * Hq * D) + r(T * Hkv * D) +
            (c.qk_norm() ? r(T * Hq) + r(T * Hkv) : 0) + r(T * Hq * D);
    x.probs = r(B * Hq * S * S);
    x.post = r(T * C) + r(T) + r(T * C);
    if (x.moe) {  // block_moe.cpp: logits, probs, gathered rows, gate, up, h, y, out
      x.post += 2 * r(T * E) + r(R * C) + 3 * r(R * Fm) + r(R * C) + r(T * C);
      x.backward = r(R * C) + 3 * r(R * Fm) + r(R * C) + r(T * E);
    } else {
      x.post += 3 * r(T * F) + r(T * C);
    }
    x.out = r(T * C);
    x.att = r(T * Hq * D);
    const double proj = 2 * t * static_cast<double>(C) * static_cast<double>(2 * Hq * D + 2 * Hkv * D);
    x.attention_flops = 2.0 * static_cast<double>(B * Hq * D) * static_cast<double>(S) * static_cast<double>(S + 1);
    const double mlp = x.moe ? 2 * t * static_cast<double>(C * E) + 2 * static_cast<double>(R) * 3 * static_cast<double>(C * Fm)
                             : 2 * t * 3 * static_cast<double>(C * F);
    x.block_flops = proj + x.attention_flops + mlp;
    forward += x.block_flops;
    s.apps.push_back(x);
  }
  forward += 2 * t * static_cast<double>(C * V);
  s.step_flops = 3 * forward;
  s.embed = r(T * C);
  s.head = r(T) + r(T * C) + r(T * V);
  s.dlogits = r(T * V);
  s.scratch = 3 * r(T * C) + 3 * r(T * Hq * D) + 3 * r(T * Hkv * D) + 3 * r(T * F);
  return s;
}

TrainingMemory evaluate(const Shape& s, std::span<const Recompute> modes) {
  TrainingMemory m;
  m.step_flops = s.step_flops;
  int64_t L = s.embed;
  auto moment = [&](int64_t bytes, const std::string& where) {
    if (bytes > m.peak) {
      m.peak = bytes;
      m.peak_at = where;
    }
  };
  auto mode = [&](size_t a) { return modes.empty() ? Recompute::keep : modes[a]; };
  for (size_t a = 0; a < s.apps.size(); ++a) {
    const AppCost& x = s.apps[a];
    const std::string where = fmt::format("forward, application {}", a);
    switch (mode(a)) {
      case Recompute::keep:
        L += x.pre + x.probs + x.post;
        moment(L, where);
        break;
      case Recompute::attention:
        moment(L + x.pre + x.probs, where);
        L += x.pre + x.post;
        moment(L, where);
        break;
      case Recompute::block:
        moment(L + x.out + x.pre + x.probs, where);
        moment(L + x.out + x.pre + x.post, where);
        L += x.out;
        m.recompute_flops += x.block_flops;
        break;
    }
    if (mode(a) == Recompute::attention) m.recompute_flops += x.attention_flops;
  }
  L += s.head;
  moment(L, "loss head");
  m.kept = L;
  L += s.dlogits + s.scratch;
  m.backward_scratch = s.dlogits + s.scratch;
  moment(L, "backward start");
  for (size_t a = s.apps.size(); a-- > 0;) {  // Model::Impl::recompute_for_backward, then the block's backward
    const AppCost& x = s.apps[a];
    int64_t t = x.backward;
    if (mode(a) == Recompute::attention) t += x.probs + x.att;
    if (mode(a) == Recompute::block) t += x.pre + x.probs + x.post;
    moment(L + t, fmt::format("backward, application {}", a));
  }
  return m;
}

void check_modes(const model::ModelConfig& c, std::span<const Recompute> modes) {
  if (!modes.empty() && static_cast<int64_t>(modes.size()) != c.applications())
    throw InputError(fmt::format("[sched] recomputation: {} modes for a schedule of {} applications", modes.size(),
                                 c.applications()));
  if (c.output_router_logits)
    for (size_t a = 0; a < modes.size(); ++a)
      if (modes[a] == Recompute::block && c.is_moe_layer(c.block_of(static_cast<int64_t>(a))))
        throw InputError(fmt::format("[sched] recomputation: application {} is an MoE layer of a model with "
                                     "output_router_logits; it cannot be recomputed as a block", a));
}

// Whether application a may take block mode (Model::set_recompute's rule).
bool block_allowed(const model::ModelConfig& c, size_t a) {
  return !(c.output_router_logits && c.is_moe_layer(c.block_of(static_cast<int64_t>(a))));
}

bool better(const RecomputePlan& a, const std::optional<RecomputePlan>& b) {
  if (!b) return true;
  if (a.memory.recompute_flops != b->memory.recompute_flops) return a.memory.recompute_flops < b->memory.recompute_flops;
  return a.memory.peak < b->memory.peak;
}

}  // namespace

TrainingMemory training_memory(const model::ModelConfig& c, int64_t B, int64_t S, std::span<const Recompute> modes) {
  check_modes(c, modes);
  return evaluate(shape_of(c, B, S), modes);
}

std::optional<RecomputePlan> plan_recompute(const model::ModelConfig& c, int64_t B, int64_t S, int64_t budget) {
  const Shape s = shape_of(c, B, S);
  const size_t A = s.apps.size();
  // Classes of interchangeable applications: dense, MoE that may be blocks, MoE that may not.
  std::vector<std::vector<size_t>> classes(3);
  for (size_t a = 0; a < A; ++a) classes[!s.apps[a].moe ? 0 : block_allowed(c, a) ? 1 : 2].push_back(a);
  std::optional<RecomputePlan> best;
  std::vector<Recompute> modes(A, Recompute::keep);
  // Per class: nb blocks then na attention on its first applications, the rest kept.
  std::function<void(size_t)> search = [&](size_t k) {
    if (k == classes.size()) {
      const TrainingMemory m = evaluate(s, modes);
      if (m.peak <= budget) {
        RecomputePlan p{modes, m};
        if (better(p, best)) best = std::move(p);
      }
      return;
    }
    const std::vector<size_t>& apps = classes[k];
    const size_t n = apps.size();
    const size_t max_blocks = k == 2 ? 0 : n;
    for (size_t nb = 0; nb <= max_blocks; ++nb)
      for (size_t na = 0; nb + na <= n; ++na) {
        for (size_t i = 0; i < n; ++i) modes[apps[i]] = i < nb ? Recompute::block : i < nb + na ? Recompute::attention : Recompute::keep;
        search(k + 1);
      }
  };
  search(0);
  return best;
}

std::optional<RecomputePlan> recompute_exact(const model::ModelConfig& c, int64_t B, int64_t S, int64_t budget) {
  const Shape s = shape_of(c, B, S);
  const size_t A = s.apps.size();
  if (A > 16) throw InputError(fmt::format("[sched] recompute_exact: {} applications (at most 16; plan_recompute is exact "
                                           "for a decoder's classes of identical blocks)", A));
  std::optional<RecomputePlan> best;
  std::vector<Recompute> modes(A, Recompute::keep);
  // A lower bound on the peak of any completion: what is kept after the backward starts, with
  // the unassigned applications at their smallest (a block's output).
  const int64_t fixed = s.embed + s.head + s.dlogits + s.scratch;
  std::function<void(size_t, int64_t, double)> dfs = [&](size_t a, int64_t kept, double flops) {
    int64_t rest = 0;
    for (size_t i = a; i < A; ++i) rest += std::min(s.apps[i].out, s.apps[i].pre + s.apps[i].post);
    if (fixed + kept + rest > budget) return;
    if (best && flops > best->memory.recompute_flops) return;
    if (a == A) {
      const TrainingMemory m = evaluate(s, modes);
      if (m.peak <= budget) {
        RecomputePlan p{modes, m};
        if (better(p, best)) best = std::move(p);
      }
      return;
    }
    const AppCost& x = s.apps[a];
    modes[a] = Recompute::keep;
    dfs(a + 1, kept + x.pre + x.probs + x.post, flops);
    modes[a] = Recompute::attention;
    dfs(a + 1, kept + x.pre + x.post, flops + x.attention_flops);
    if (block_allowed(c, a)) {
      modes[a] = Recompute::block;
      dfs(a + 1, kept + x.out, flops + x.block_flops);
    }
    modes[a] = Recompute::keep;
  };
  dfs(0, 0, 0);
  return best;
}

std::optional<RecomputePlan> recompute_greedy(const model::ModelConfig& c, int64_t B, int64_t S, int64_t budget) {
  const Shape s = shape_of(c, B, S);
  const size_t A = s.apps.size();
  std::vector<Recompute> modes(A, Recompute::keep);
  TrainingMemory m = evaluate(s, modes);
  while (m.peak > budget) {
    // The move that saves the most kept bytes per added FLOP.
    double best_rate = -1;
    size_t best_a = A;
    Recompute best_mode = Recompute::keep;
    for (size_t a = 0; a < A; ++a) {
      const AppCost& x = s.apps[a];
      auto consider = [&](Recompute to, int64_t saved, double flops) {
        if (saved <= 0) return;
        const double rate = static_cast<double>(saved) / std::max(flops, 1.0);
        if (rate > best_rate) {
          best_rate = rate;
          best_a = a;
          best_mode = to;
        }
      };
      if (modes[a] == Recompute::keep) consider(Recompute::attention, x.probs, x.attention_flops);
      if (modes[a] != Recompute::block && block_allowed(c, a))
        consider(Recompute::block,
                 (modes[a] == Recompute::keep ? x.pre + x.probs + x.post : x.pre + x.post) - x.out,
                 x.block_flops - (modes[a] == Recompute::attention ? x.attention_flops : 0));
    }
    if (best_a == A) return std::nullopt;
    modes[best_a] = best_mode;
    m = evaluate(s, modes);
  }
  return RecomputePlan{modes, m};
}

std::vector<Recompute> smallest_plan(const model::ModelConfig& c) {
  std::vector<Recompute> modes(static_cast<size_t>(c.applications()), Recompute::block);
  for (size_t a = 0; a < modes.size(); ++a)
    if (!block_allowed(c, a)) modes[a] = Recompute::attention;
  return modes;
}

std::string recompute_summary(std::span<const Recompute> modes) {
  int64_t n[3] = {0, 0, 0};
  for (Recompute r : modes) ++n[static_cast<int>(r)];
  return fmt::format("{} keep, {} attention, {} block", n[0], n[1], n[2]);
}

std::vector<RecomputePlan> recompute_curve(const model::ModelConfig& c, int64_t B, int64_t S, int points) {
  const Shape s = shape_of(c, B, S);
  const int64_t low = evaluate(s, smallest_plan(c)).peak, high = evaluate(s, {}).peak;
  std::vector<RecomputePlan> curve;
  for (int i = 0; i < std::max(points, 2); ++i) {
    const int64_t budget = low + (high - low) * i / (std::max(points, 2) - 1);
    if (auto p = plan_recompute(c, B, S, budget))
      if (curve.empty() || p->memory.peak != curve.back().memory.peak) curve.push_back(std::move(*p));
  }
  return curve;
}

std::string recompute_name(Recompute r) {
  switch (r) {
    case Recompute::keep: return "keep";
    case Recompute::attention: return "attention";
    case Recompute::block: return "block";
  }
  return "?";
}

Recompute recompute_from_name(const std::string& name) {
  if (name == "keep") return Recompute::keep;
  if (name == "attention") return Recompute::attention;
  if (name == "block") return Recompute::block;
  throw InputError(fmt::format("[sched] unknown recomputation mode '{}' (keep, attention, block)", name));
}

}  // namespace concord::sched
