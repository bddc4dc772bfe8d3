// Model::forward_backward_distill (a draft model's training loss): with a one-hot teacher the
// KL is the cross-entropy and the gradients are forward_backward's; with a soft teacher the
// gradient matches central differences of the KL computed here in long double from forward
// logits; a teacher equal to the model gives KL 0 and zero gradients.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "concord/model/model.h"
#include "concord/numerics/check.h"

namespace concord::model {
namespace {

ModelConfig distill_config() {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = 53;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 32;
  return c;
}

constexpr int64_t kB = 2, kT = 6;

std::vector<int32_t> tokens_of(uint64_t seed, int64_t V) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(kB * kT));
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(V));
  return t;
}

// Mean KL(softmax(u) || softmax(s)) over rows, in long double.
long double mean_kl(const std::vector<float>& u, const std::vector<float>& s, int64_t V) {
  const int64_t rows = static_cast<int64_t>(u.size()) / V;
  long double total = 0;
  for (int64_t r = 0; r < rows; ++r) {
    long double zu = 0, zs = 0;
    for (int64_t v = 0; v < V; ++v) {
      zu += std::exp(static_cast<long double>(u[r * V + v]));
      zs += std::exp(static_cast<long double>(s[r * V + v]));
    }
    for (int64_t v = 0; v < V; ++v) {
      const long double lu = u[r * V + v] - std::log(zu), ls = s[r * V + v] - std::log(zs);
      total += std::exp(lu) * (lu - ls);
    }
  }
  return total / rows;
}

TEST(Distill, OneHotTeacherGivesTheCrossEntropyAndItsGradients) {
  const ModelConfig c = distill_config();
  const int64_t V = c.vocab_size;
  Model a(c), b(c);
  a.init_random(3, 0.1f);
  b.init_random(3, 0.1f);
  const std::vector<int32_t> tokens = tokens_of(5, V), targets = tokens_of(6, V);
  std::vector<float> teacher(static_cast<size_t>(kB * kT * V), 0.0f);
  for (int64_t r = 0; r < kB * kT; ++r) teacher[static_cast<size_t>(r * V + targets[static_cast<size_t>(r)])] = 400.0f;
  const double kl = a.forward_backward_distill(tokens, teacher, kB, kT);
  const float ce = b.forward_backward(tokens, targets, kB, kT);
  EXPECT_NEAR(kl, ce, 2e-6 * ce);
  for (const ParamSpec& p : a.params()) {
    const auto ga = a.grad(p.name), gb = b.grad(p.name);
    double scale = 0;
    for (float x : gb) scale = std::max(scale, static_cast<double>(std::fabs(x)));
    for (size_t i = 0; i < ga.size(); ++i) ASSERT_NEAR(ga[i], gb[i], 1e-5 * scale + 1e-9) << p.name << "[" << i << "]";
  }
}

TEST(Distill, SoftTeacherGradientMatchesCentralDifferences) {
  const ModelConfig c = distill_config();
  const int64_t V = c.vocab_size;
  Model m(c);
  m.init_random(8, 0.15f);
  const std::vector<int32_t> tokens = tokens_of(9, V);
  std::vector<float> teacher(static_cast<size_t>(kB * kT * V));
  std::mt19937_64 rng(10);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (float& x : teacher) x = normal(rng);
  const double kl = m.forward_backward_distill(tokens, teacher, kB, kT);
  std::vector<float> logits(teacher.size());
  m.forward(tokens, kB, kT, logits);
  EXPECT_NEAR(kl, static_cast<double>(mean_kl(teacher, logits, V)), 1e-9 * kl);
  // Central differences on a few entries of every kind of parameter.
  for (const ParamSpec& p : m.params()) {
    const std::vector<float> g(m.grad(p.name).begin(), m.grad(p.name).end());
    const auto w = m.param(p.name);
    double scale = 0;
    for (float x : g) scale = std::max(scale, static_cast<double>(std::fabs(x)));
    for (size_t i : {size_t{0}, w.size() / 3, w.size() - 1}) {
      const float keep = w[i];
      const float h = 1e-2f * std::max(1.0f, std::fabs(keep));
      auto kl_at = [&](float value) {
        w[i] = value;
        m.weights_changed();
        m.forward(tokens, kB, kT, logits);
        return mean_kl(teacher, logits, V);
      };
      const long double up = kl_at(keep + h), down = kl_at(keep - h);
      w[i] = keep;
      m.weights_changed();
      const double fd = static_cast<double>((up - down) / (2.0L * static_cast<long double>(h)));
      EXPECT_NEAR(g[i], fd, 2e-3 * scale + 1e-6) << p.name << "[" << i << "]";
    }
  }
}

TEST(Distill, TeacherEqualToTheModelGivesZero) {
  const ModelConfig c = distill_config();
  Model m(c);
  m.init_random(11, 0.1f);
  const std::vector<int32_t> tokens = tokens_of(12, c.vocab_size);
  std::vector<float> teacher(static_cast<size_t>(kB * kT * c.vocab_size));
  m.forward(tokens, kB, kT, teacher);
  EXPECT_NEAR(m.forward_backward_distill(tokens, teacher, kB, kT), 0.0, 1e-12);
  for (const ParamSpec& p : m.params())
    for (float x : m.grad(p.name)) ASSERT_NEAR(x, 0.0f, 1e-7f) << p.name;
  std::vector<float> short_teacher(teacher.begin(), teacher.end() - 1);
  EXPECT_THROW(m.forward_backward_distill(tokens, short_teacher, kB, kT), InputError);
  teacher[5] = NAN;
  EXPECT_THROW(m.forward_backward_distill(tokens, teacher, kB, kT), InputError);
}

}  // namespace
}  // namespace concord::model
