// The gradient flow of a concord transformer against its real training runs (flow_model.h).
#include "concord/train/flow_model.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include <fmt/format.h>

#include "concord/numerics/check.h"
#include "concord/train/export.h"
#include "concord/train/optimizer.h"

namespace concord::train::flow {

ModelLoss::ModelLoss(model::Model& m, Batch population) : model_(m), population_(std::move(population)) {
  if (m.has_stored_weights())
    throw InputError("[flow] the model holds stored (file-block) weights; load it with fp32 values (policy fp32)");
  if (population_.B < 1 || population_.T < 1 ||
      population_.inputs.size() != static_cast<size_t>(population_.B * population_.T) ||
      population_.targets.size() != population_.inputs.size())
    throw InputError("[flow] the population batch is empty or its inputs and targets do not match B x T");
  for (const model::ParamSpec& p : m.params()) {
    offsets_.push_back(size_);
    size_ += p.numel();
  }
}

Vec ModelLoss::values() const {
  Vec out(size_);
  const std::vector<model::ParamSpec>& specs = model_.params();
  for (size_t p = 0; p < specs.size(); ++p) {
    const std::span<const float> v = std::as_const(model_).param(specs[p].name);
    std::copy(v.begin(), v.end(), out.begin() + offsets_[p]);
  }
  return out;
}

void ModelLoss::set(std::span<const double> theta) {
  if (static_cast<int64_t>(theta.size()) != size_)
    throw InputError(fmt::format("[flow] θ has {} values, the model {} parameters", theta.size(), size_));
  const std::vector<model::ParamSpec>& specs = model_.params();
  for (size_t p = 0; p < specs.size(); ++p) {
    const std::span<float> v = model_.param(specs[p].name);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(theta[offsets_[p] + static_cast<int64_t>(i)]);
  }
  model_.weights_changed();
}

double ModelLoss::run(const Batch& batch, std::span<double> g) {
  const float l = model_.forward_backward(batch.inputs, batch.targets, batch.B, batch.T);
  ++evaluations_;
  const std::vector<model::ParamSpec>& specs = model_.params();
  for (size_t p = 0; p < specs.size(); ++p) {
    const std::span<const float> gr = model_.grad(specs[p].name);
    std::copy(gr.begin(), gr.end(), g.begin() + offsets_[p]);
  }
  return l;
}

std::vector<float> ModelLoss::population_logits(std::span<const double> theta) {
  set(theta);
  std::vector<float> logits(static_cast<size_t>(population_.B * population_.T * model_.config().vocab_size));
  model_.forward(population_.inputs, population_.B, population_.T, logits);
  ++evaluations_;
  return logits;
}

double ModelLoss::distill_gradient(std::span<const double> theta, std::span<const float> teacher, std::span<double> g) {
  if (static_cast<int64_t>(g.size()) != size_) throw InputError("[flow] the gradient buffer has the wrong size");
  set(theta);
  const double kl = model_.forward_backward_distill(population_.inputs, teacher, population_.B, population_.T);
  ++evaluations_;
  const std::vector<model::ParamSpec>& specs = model_.params();
  for (size_t p = 0; p < specs.size(); ++p) {
    const std::span<const float> gr = model_.grad(specs[p].name);
    std::copy(gr.begin(), gr.end(), g.begin() + offsets_[p]);
  }
  return kl;
}

double ModelLoss::loss(std::span<const double> theta) { return cross_entropy(population_logits(theta)); }

double ModelLoss::cross_entropy(std::span<const float> logits) const {
  const int64_t v = model_.config().vocab_size;
  if (logits.size() != static_cast<size_t>(population_.B * population_.T * v))
    throw InputError("[flow] cross_entropy: the logits do not cover the population");
  double total = 0;
  int64_t count = 0;
  for (int64_t r = 0; r < population_.B * population_.T; ++r) {
    const int32_t t = population_.targets[r];
    if (t < 0) continue;
    const float* row = logits.data() + r * v;
    const double mx = *std::max_element(row, row + v);
    double s = 0;
    for (int64_t k = 0; k < v; ++k) s += std::exp(static_cast<double>(row[k]) - mx);
    total += mx + std::log(s) - row[t];
    ++count;
  }
  return count ? total / static_cast<double>(count) : 0.0;
}

double ModelLoss::gradient(std::span<const double> theta, std::span<double> g) {
  if (static_cast<int64_t>(g.size()) != size_) throw InputError("[flow] the gradient buffer has the wrong size");
  set(theta);
  return run(population_, g);
}

double ModelLoss::batch_gradient(std::span<const int64_t> rows, std::span<const double> theta, std::span<double> g) {
  if (rows.empty()) throw InputError("[flow] an empty minibatch");
  if (static_cast<int64_t>(g.size()) != size_) throw InputError("[flow] the gradient buffer has the wrong size");
  Batch b;
  b.B = static_cast<int64_t>(rows.size());
  b.T = population_.T;
  for (int64_t r : rows) {
    if (r < 0 || r >= population_.B) throw InputError(fmt::format("[flow] sequence {} of {}", r, population_.B));
    b.inputs.insert(b.inputs.end(), population_.inputs.begin() + r * b.T, population_.inputs.begin() + (r + 1) * b.T);
    b.targets.insert(b.targets.end(), population_.targets.begin() + r * b.T, population_.targets.begin() + (r + 1) * b.T);
  }
  set(theta);
  return run(b, g);
}

std::vector<float> ModelLoss::logits(std::span<const double> theta, const Batch& probe) {
  set(theta);
  std::vector<float> out(static_cast<size_t>(probe.B * probe.T * model_.config().vocab_size));
  model_.forward(probe.inputs, probe.B, probe.T, out);
  ++evaluations_;
  return out;
}

ModelRun run_model(ModelLoss& loss, std::span<const double> theta0, const ModelRunOptions& o, int64_t steps,
                   std::span<const int64_t> record) {
  const int64_t n = loss.size();
  if (static_cast<int64_t>(theta0.size()) != n)
    throw InputError(fmt::format("[flow] θ₀ has {} values, the model {} parameters", theta0.size(), n));
  if (o.optimizer != "gd" && o.optimizer != "sgd" && o.optimizer != "adamw")
    throw InputError(fmt::format("[flow] unknown optimizer '{}' (gd, sgd or adamw)", o.optimizer));
  if (!(o.lr > 0) || !std::isfinite(o.lr)) throw InputError(fmt::format("[flow] the learning rate must be > 0, got {}", o.lr));
  if (o.optimizer == "sgd" && o.batch < 1) throw InputError("[flow] sgd needs a batch of at least one sequence");
  for (size_t i = 0; i < record.size(); ++i)
    if (record[i] < 0 || record[i] > steps || (i > 0 && record[i] < record[i - 1]))
      throw InputError("[flow] recorded steps must be ascending, in [0, steps]");

  const std::vector<model::ParamSpec>& specs = loss.params();
  const std::vector<int64_t>& off = loss.offsets();
  std::unique_ptr<ExportRule> rule = make_export_rule(o.rule, o.served, o.seed);
  std::vector<float> master(n), served(n), grad(n);
  for (int64_t i = 0; i < n; ++i) master[i] = static_cast<float>(theta0[i]);
  auto export_all = [&](int64_t step) {
    for (size_t p = 0; p < specs.size(); ++p) {
      const auto len = static_cast<size_t>(specs[p].numel());
      rule->export_param(static_cast<int>(p), specs[p], std::span<const float>(master).subspan(off[p], len),
                         std::span<float>(served).subspan(off[p], len), static_cast<uint64_t>(step));
    }
  };
  std::unique_ptr<AdamW> adam;
  std::vector<ParamView> views;
  if (o.optimizer == "adamw") {
    adam = std::make_unique<AdamW>(AdamWConfig{o.lr, o.beta1, o.beta2, o.eps, 0.0, 0.0});
    for (size_t p = 0; p < specs.size(); ++p) {
      const auto len = static_cast<size_t>(specs[p].numel());
      views.push_back({specs[p].name, std::span<float>(master).subspan(off[p], len),
                       std::span<const float>(grad).subspan(off[p], len), false});
    }
  }

  ModelRun out;
  out.first_move.assign(static_cast<size_t>(n), -1);
  out.changes.assign(static_cast<size_t>(n), 0);
  export_all(0);
  const std::vector<float> served0 = served;
  std::vector<float> previous = served;
  Vec s(n), g(n);
  size_t next = 0;
  auto take = [&](int64_t step) {
    while (next < record.size() && record[next] == step) {
      out.steps.push_back(step);
      out.served.emplace_back(served.begin(), served.end());
      out.loss.push_back(loss.loss(out.served.back()));
      ++next;
    }
  };
  take(0);
  for (int64_t step = 1; step <= steps; ++step) {
    for (int64_t i = 0; i < n; ++i) s[i] = served[i];
    if (o.optimizer == "sgd")
      loss.batch_gradient(sgd_batch(loss.sequences(), o.batch, o.seed, step - 1), s, g);
    else
      loss.gradient(s, g);
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(g[i]))
        throw InputError(fmt::format("[flow] the gradient is not finite at step {} (lr {} diverged)", step, o.lr));
    if (adam) {
      for (int64_t i = 0; i < n; ++i) grad[i] = static_cast<float>(g[i]);
      adam->step(views, o.lr);
    } else {
      for (int64_t i = 0; i < n; ++i) master[i] = static_cast<float>(master[i] - o.lr * g[i]);
    }
    export_all(step);
    for (int64_t i = 0; i < n; ++i) {
      if (out.first_move[i] < 0 && served[i] != served0[i]) out.first_move[i] = step;
      out.changes[i] += served[i] != previous[i];
    }
    previous = served;
    take(step);
  }
  return out;
}

LinearizedLoss::LinearizedLoss(ModelLoss& loss, std::span<const double> theta0, double eps)
    : loss_(loss), theta0_(theta0.begin(), theta0.end()), grad0_(theta0.size()), eps_(eps) {
  if (static_cast<int64_t>(theta0.size()) != loss.size())
    throw InputError(fmt::format("[flow] θ₀ has {} values, the model {} parameters", theta0.size(), loss.size()));
  if (!(eps > 0)) throw InputError("[flow] the JVP step must be > 0");
  loss_.gradient(theta0_, grad0_);
  z0_ = loss_.population_logits(theta0_);
}

std::vector<double> LinearizedLoss::jvp(std::span<const double> v) {
  if (v.size() != theta0_.size()) throw InputError("[flow] jvp: v has the wrong size");
  double nv = 0;
  for (double x : v) nv += x * x;
  nv = std::sqrt(nv);
  std::vector<double> out(z0_.size(), 0.0);
  if (nv == 0) return out;
  Vec plus(theta0_.size()), minus(theta0_.size());
  for (size_t i = 0; i < v.size(); ++i) {
    plus[i] = theta0_[i] + eps_ * v[i] / nv;
    minus[i] = theta0_[i] - eps_ * v[i] / nv;
  }
  const std::vector<float> zp = loss_.population_logits(plus), zm = loss_.population_logits(minus);
  for (size_t i = 0; i < out.size(); ++i) out[i] = (static_cast<double>(zp[i]) - zm[i]) / (2 * eps_) * nv;
  return out;
}

Vec LinearizedLoss::vjp(std::span<const float> teacher_a, std::span<const float> teacher_b) {
  // ∇KL(q ‖ p_θ) = Jᵀ(p − q)/rows, so ∇KL(q_a ‖ p) − ∇KL(q_b ‖ p) = Jᵀ(q_b − q_a)/rows.
  Vec ga(theta0_.size()), gb(theta0_.size());
  loss_.distill_gradient(theta0_, teacher_a, ga);
  loss_.distill_gradient(theta0_, teacher_b, gb);
  for (size_t i = 0; i < ga.size(); ++i) ga[i] -= gb[i];
  return ga;
}

std::vector<float> LinearizedLoss::logits_at(std::span<const double> theta) {
  Vec d(theta.size());
  for (size_t i = 0; i < d.size(); ++i) d[i] = theta[i] - theta0_[i];
  const std::vector<double> jd = jvp(d);
  std::vector<float> z(z0_.size());
  for (size_t i = 0; i < z.size(); ++i) z[i] = static_cast<float>(z0_[i] + jd[i]);
  return z;
}

double LinearizedLoss::loss(std::span<const double> theta) { return loss_.cross_entropy(logits_at(theta)); }

double LinearizedLoss::gradient(std::span<const double> theta, std::span<double> g) {
  if (g.size() != theta0_.size()) throw InputError("[flow] the gradient buffer has the wrong size");
  const std::vector<float> z = logits_at(theta);
  Vec kl(g.size());
  loss_.distill_gradient(theta0_, z, kl);  // Jᵀ(p0 − softmax(z_lin))/rows
  for (size_t i = 0; i < g.size(); ++i) g[i] = grad0_[i] - kl[i];
  return loss_.cross_entropy(z);
}

std::vector<Vec> linearized_flow(LinearizedLoss& loss, std::span<const double> theta0, std::span<const double> times,
                                 const OdeOptions& options, OdeStats* stats) {
  const OdeRhs rhs = [&](double, std::span<const double> th, std::span<double> dth) {
    loss.gradient(th, dth);
    for (double& v : dth) v = -v;
  };
  return integrate(rhs, 0.0, Vec(theta0.begin(), theta0.end()), times, options, stats);
}

std::vector<Vec> model_flow(ModelLoss& loss, std::span<const double> theta0, std::span<const double> times,
                            const OdeOptions& options, OdeStats* stats) {
  const OdeRhs rhs = [&](double, std::span<const double> th, std::span<double> dth) {
    loss.gradient(th, dth);
    for (double& v : dth) v = -v;
  };
  return integrate(rhs, 0.0, Vec(theta0.begin(), theta0.end()), times, options, stats);
}

PowerResult model_sharpness(ModelLoss& loss, std::span<const double> theta, uint64_t seed, int max_iterations,
                            double tol, double eps) {
  const Vec at(theta.begin(), theta.end());
  const GradientFn grad = [&](std::span<const double> th, std::span<double> g) { loss.gradient(th, g); };
  const HvpFn hvp = [&](std::span<const double> v, std::span<double> out) { hvp_central(grad, at, v, eps, out); };
  PowerResult r = largest_eigenvalue(hvp, loss.size(), seed, max_iterations, tol);
  loss.set(at);
  return r;
}

}  // namespace concord::train::flow
