// Weight sync (rl/sync.h): clean syncs over several steps and presets raise no alarm; every
// injected fault is caught by its check with a specific message; a failed sync leaves the
// serving model untouched; the payload, hashes and probe against independent recomputations.
#include <gtest/gtest.h>
#include <omp.h>
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "concord/io/safetensors.h"
#include "concord/model/model.h"
#include "concord/numerics/block.h"
#include "concord/numerics/check.h"
#include "concord/rl/sync.h"
#include "concord/tensor/qgemm.h"
#include "concord/train/export.h"

namespace concord::rl {
namespace {

using json = nlohmann::json;
using model::Model;
using model::ModelConfig;
using model::PrecisionPolicy;

ModelConfig tiny_config(bool tied = true) {
  ModelConfig c;
  c.architecture = "Qwen3ForCausalLM";
  c.vocab_size = 300;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;  // q_proj and o_proj are square (64 x 64)
  c.max_position_embeddings = 64;
  c.tie_word_embeddings = tied;
  return c;
}

ProbeOptions small_probe() {
  ProbeOptions p;
  p.sequences = 2;
  p.length = 12;
  return p;
}

// A learner (fp32 master, served copy exported with `rne`) and a sampler serving `sampler`.
struct Rig {
  ModelConfig config;
  PrecisionPolicy policy;
  std::vector<std::vector<float>> master;
  Model served, serving;
  std::unique_ptr<train::ExportRule> rule;
  WeightPublisher publisher;
  WeightReceiver receiver;

  Rig(const std::string& preset, bool tied = true, ProbeOptions probe = small_probe())
      : Rig(PrecisionPolicy::preset(preset), PrecisionPolicy::preset(preset), tied, probe) {}
  Rig(PrecisionPolicy learner_view, PrecisionPolicy sampler, bool tied, ProbeOptions probe)
      : Rig(learner_view, sampler, tiny_config(tied), probe) {}
  Rig(PrecisionPolicy learner_view, PrecisionPolicy sampler, ModelConfig model_config, ProbeOptions probe)
      : config(std::move(model_config)),
        policy(sampler),
        served(config, learner_view),
        serving(config, sampler),
        rule(train::make_export_rule("rne", learner_view.served_weights, 1)),
        publisher(served, learner_view, probe),
        receiver(serving, probe) {
    Model init(config);
    init.init_random(11, 0.08f);
    for (const auto& spec : init.params()) {
      const auto v = init.param(spec.name);
      master.emplace_back(v.begin(), v.end());
    }
    step(0);
  }

  // One optimizer-like step: the master moves by N(0, sigma²), the served copy follows (rne).
  void step(uint64_t k, float sigma = 2e-3f) {
    std::mt19937_64 gen(100 + k);
    std::normal_distribution<float> noise(0.0f, sigma);
    const auto& specs = served.params();
    for (size_t p = 0; p < specs.size(); ++p) {
      if (k > 0 && specs[p].is_matrix())
        for (float& x : master[p]) x += noise(gen);
      rule->export_param(static_cast<int>(p), specs[p], master[p], served.param(specs[p].name), k);
    }
    served.weights_changed();
  }

  SyncReport sync(uint64_t version, Fault fault = Fault::none) {
    const std::vector<uint8_t> payload =
        publisher.publish(version, learner_side(fault) ? fault : Fault::none);
    return receiver.apply(payload, version, learner_side(fault) ? Fault::none : fault);
  }
};

std::vector<int32_t> test_tokens(int64_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(gen() % 300);
  return t;
}

std::vector<float> logits_of(Model& m) {
  const std::vector<int32_t> tokens = test_tokens(2 * 10, 5);
  std::vector<float> out(static_cast<size_t>(2 * 10 * m.config().vocab_size));
  m.forward(tokens, 2, 10, out);
  return out;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void expect_all_passed(const SyncReport& r) {
  ASSERT_EQ(r.checks.size(), 7u);
  for (const CheckOutcome& c : r.checks) {
    EXPECT_TRUE(c.pass) << c.message;
    EXPECT_TRUE(c.message.empty());
  }
  EXPECT_FALSE(r.failure().has_value());
  EXPECT_TRUE(r.applied);
}

// ---- clean runs --------------------------------------------------------------------------------

class CleanSync : public ::testing::TestWithParam<std::string> {};

TEST_P(CleanSync, SeveralStepsRaiseNoAlarmAndServeTheLearnersWeights) {
  Rig s(GetParam());
  for (uint64_t v = 1; v <= 3; ++v) {
    if (v > 1) s.step(v);
    const SyncReport r = s.sync(v);
    expect_all_passed(r);
    EXPECT_EQ(r.serving, v);
    EXPECT_EQ(s.receiver.version(), v);
    // Same precision on both sides: the probe's log-probs agree exactly.
    EXPECT_EQ(r.probe_max_abs_dlogp, 0.0);
    EXPECT_EQ(r.probe_k3_kl, 0.0);
    // The serving model holds the served copy bit for bit (it is on the bf16 grid already).
    for (const auto& spec : s.served.params()) {
      const auto a = s.served.param(spec.name), b = s.serving.param(spec.name);
      ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size_bytes()), 0) << spec.name;
    }
  }
  // And serves the learner's logits at the sampler's precision.
  Model reference(s.config, s.policy);
  for (const auto& spec : s.served.params()) {
    const auto from = s.served.param(spec.name);
    std::copy(from.begin(), from.end(), reference.param(spec.name).begin());
  }
  reference.weights_changed();
  EXPECT_TRUE(bitwise_equal(logits_of(reference), logits_of(s.serving)));
}

INSTANTIATE_TEST_SUITE_P(Presets, CleanSync,
                         ::testing::Values("bf16", "mxfp8", "nvfp4", "fp8-tensor", "fp32"));

TEST(Sync, UntiedEmbeddingsSyncCleanly) {
  Rig s("mxfp8", /*tied=*/false);
  expect_all_passed(s.sync(1));
  s.step(2);
  expect_all_passed(s.sync(2));
}

// ---- faults ------------------------------------------------------------------------------------

struct FaultCase {
  Fault fault;
  std::string preset;
  SyncCheck check;
  std::string fragment;  // a piece of the message
};

std::string case_name(const ::testing::TestParamInfo<FaultCase>& p) {
  std::string preset = p.param.preset;
  for (char& ch : preset)
    if (ch == '-') ch = '_';
  return std::string(fault_name(p.param.fault)) + "_" + preset;
}

class FaultInjection : public ::testing::TestWithParam<FaultCase> {};

// A clean sync first (version 1), then the faulty one (version 2, after a step): the fault is
// caught by its check, the message names it, and version 1 keeps serving, bit for bit.
TEST_P(FaultInjection, CaughtByItsCheckAndServingUntouched) {
  const FaultCase& fc = GetParam();
  Rig s(fc.preset);
  expect_all_passed(s.sync(1));
  const std::vector<float> before = logits_of(s.serving);
  s.step(2);
  const SyncReport r = s.sync(2, fc.fault);
  const auto failure = r.failure();
  ASSERT_TRUE(failure.has_value()) << "fault " << fault_name(fc.fault) << " was not caught";
  EXPECT_EQ(failure->check, fc.check) << failure->message;
  EXPECT_NE(failure->message.find(fc.fragment), std::string::npos) << failure->message;
  const std::string prefix = "[sync] check " + std::to_string(static_cast<int>(fc.check)) + " " +
                             std::string(sync_check_name(fc.check)) + ": ";
  EXPECT_EQ(failure->message.rfind(prefix, 0), 0u) << failure->message;
  // The checks run before it passed; it is the last one run.
  EXPECT_EQ(r.checks.back().check, fc.check);
  for (size_t i = 0; i + 1 < r.checks.size(); ++i) EXPECT_TRUE(r.checks[i].pass);
  EXPECT_FALSE(r.applied);
  EXPECT_EQ(r.serving, 1u);
  EXPECT_EQ(s.receiver.version(), 1u);
  EXPECT_TRUE(bitwise_equal(before, logits_of(s.serving)));
  // The next clean sync goes through.
  s.step(3);
  expect_all_passed(s.sync(3));
}

std::vector<FaultCase> fault_cases() {
  std::vector<FaultCase> cases;
  // Faults every preset is exposed to.
  for (const std::string p : {"bf16", "mxfp8", "nvfp4", "fp8-tensor"}) {
    cases.push_back({Fault::stale_version, p, SyncCheck::version, "payload version 1 != announced 2"});
    cases.push_back({Fault::dropped_tensor, p, SyncCheck::manifest,
                     "model.layers.0.mlp.up_proj.weight is in the manifest but missing from the payload"});
    cases.push_back({Fault::swapped_tensors, p, SyncCheck::content, "model.layers.0.mlp.gate_proj.weight "});
    cases.push_back({Fault::transposed_tensor, p, SyncCheck::content, "model.layers.0.self_attn.q_proj.weight "});
    cases.push_back({Fault::untied_lm_head, p, SyncCheck::manifest,
                     "lm_head.weight: the learner ties it to model.embed_tokens.weight, the sampler "
                     "holds a separate copy"});
    cases.push_back({Fault::stale_derived, p, SyncCheck::derived_state,
                     "model.embed_tokens.weight: the prepared copy was built from values hashing"});
    cases.push_back({Fault::partial_sync, p, SyncCheck::manifest, "is not a whole safetensors image"});
    cases.push_back({Fault::flipped_bit, p, SyncCheck::content, "model.layers.0.self_attn.v_proj.weight "});
    cases.push_back({Fault::stale_weights, p, SyncCheck::probe, "slice all osc "});
    cases.push_back({Fault::overwritten_codes, p, SyncCheck::content,
                     "model.layers.1.mlp.down_proj.weight: the codes changed after the copy was built"});
  }
  // Faults that need a quantized sampler (bf16 has no scales, and its cast of bf16 values is
  // exact under any rounding rule: see BF16IsImmuneToScaleAndRoundingFaults).
  cases.push_back({Fault::zeroed_scales, "mxfp8", SyncCheck::scale_sanity,
                   "has a placeholder 2^-127 scale but nonzero elements"});
  cases.push_back({Fault::zeroed_scales, "nvfp4", SyncCheck::scale_sanity, "has a zero scale but nonzero elements"});
  cases.push_back({Fault::zeroed_scales, "fp8-tensor", SyncCheck::scale_sanity,
                   "tensor scale 0 is not a positive finite number"});
  for (const std::string p : {"mxfp8", "nvfp4", "fp8-tensor"})
    cases.push_back({Fault::wrong_rounding, p, SyncCheck::content,
                     "model.layers.0.self_attn.q_proj.weight codes/scales hash"});
  // Faults that need a tensor scale (per-tensor FP8, NVFP4): see NoTensorScaleNoWrongTensorScale.
  for (const std::string p : {"nvfp4", "fp8-tensor"})
    cases.push_back({Fault::wrong_tensor_scale, p, SyncCheck::scale_sanity,
                     "model.layers.0.self_attn.q_proj.weight"});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Faults, FaultInjection, ::testing::ValuesIn(fault_cases()), case_name);

// A Qwen3-MoE policy (issue 37): clean syncs pass all seven checks at bf16 and mxfp8, the
// routers travel in f32 and are planned as their own class, and an expert's flipped bit and a
// stale router are caught by check 4, serving untouched.
TEST(Sync, AQwen3MoePolicySyncsCleanlyAndItsFaultsAreCaught) {
  ModelConfig c = tiny_config(true);
  c.architecture = "Qwen3MoeForCausalLM";
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 32;
  c.mlp_only_layers = {0};
  for (const std::string preset : {"bf16", "mxfp8"}) {
    const PrecisionPolicy policy = PrecisionPolicy::preset(preset);
    const PrecisionPlan plan = make_precision_plan(c, policy);
    const auto router = std::find_if(plan.weights.begin(), plan.weights.end(),
                                     [](const PlanWeight& w) { return w.name == "model.layers.1.mlp.gate.weight"; });
    ASSERT_NE(router, plan.weights.end()) << preset;
    EXPECT_EQ(router->a, "f32");
    EXPECT_EQ(router->b, "f32");
    for (Fault fault : {Fault::flipped_bit, Fault::stale_router}) {
      Rig s(policy, policy, c, small_probe());
      for (uint64_t v = 1; v <= 2; ++v) {
        if (v > 1) s.step(v);
        expect_all_passed(s.sync(v));
      }
      const std::vector<float> before = logits_of(s.serving);
      s.step(3);
      const SyncReport r = s.sync(3, fault);
      const auto failure = r.failure();
      ASSERT_TRUE(failure.has_value()) << preset << " " << fault_name(fault);
      EXPECT_EQ(failure->check, SyncCheck::content) << failure->message;
      const std::string where = fault == Fault::flipped_bit ? "model.layers.1.mlp.experts.0.down_proj.weight "
                                                            : "model.layers.1.mlp.gate.weight ";
      EXPECT_NE(failure->message.find(where), std::string::npos) << failure->message;
      EXPECT_TRUE(bitwise_equal(before, logits_of(s.serving)));
      s.step(4);
      expect_all_passed(s.sync(4));
    }
  }
}

TEST(Sync, EveryFaultHasATest) {
  std::set<Fault> tested;
  for (const FaultCase& c : fault_cases()) tested.insert(c.fault);
  tested.insert(Fault::stale_router);  // AQwen3MoePolicySyncsCleanlyAndItsFaultsAreCaught
  for (const std::string& name : fault_names()) EXPECT_TRUE(tested.count(fault_from_name(name))) << name;
}

TEST(Sync, BF16IsImmuneToScaleAndRoundingFaults) {
  // No block or tensor scales to zero, and rounding bf16 values to bf16 is exact under any
  // rule: what the kernels read is unchanged, so the sync rightly applies.
  for (Fault f : {Fault::zeroed_scales, Fault::wrong_rounding}) {
    Rig s("bf16");
    expect_all_passed(s.sync(1));
    s.step(2);
    expect_all_passed(s.sync(2, f));
  }
}

TEST(Sync, NoTensorScaleNoWrongTensorScale) {
  // bf16 and MX weights have no tensor scale to double: the sync rightly applies.
  for (const std::string preset : {"bf16", "mxfp8"}) {
    Rig s(preset);
    expect_all_passed(s.sync(1));
    s.step(2);
    expect_all_passed(s.sync(2, Fault::wrong_tensor_scale));
  }
}

// The message of a doubled tensor scale names the weight and both scales.
TEST(Sync, WrongTensorScaleIsNamedWithBothScales) {
  for (const std::string preset : {"nvfp4", "fp8-tensor"}) {
    Rig s(preset);
    expect_all_passed(s.sync(1));
    s.step(2);
    const SyncReport r = s.sync(2, Fault::wrong_tensor_scale);
    ASSERT_TRUE(r.failure().has_value()) << preset;
    EXPECT_NE(r.failure()->message.find(": tensor scale "), std::string::npos) << r.failure()->message;
    EXPECT_NE(r.failure()->message.find(", the one the staged values' amax "), std::string::npos)
        << r.failure()->message;
  }
}

// Check 5 over every copy: only one weight's values change between two versions and the sampler
// keeps its copies (stale_derived): exactly that copy is stale, and check 5 names it — for the
// first (the tied embedding), the middle and the last GEMM weight in visit order.
TEST(Sync, AStaleCopyOfAnyWeightIsCaughtByCheck5) {
  for (const std::string preset : {"bf16", "mxfp8", "nvfp4", "fp8-tensor"}) {
    std::vector<std::string> names;
    {
      Rig probe(preset);
      probe.served.visit_derived_weights([&](const Model::DerivedWeight& w) { names.emplace_back(w.name); });
    }
    for (const std::string& name : names) {
      Rig s(preset);
      expect_all_passed(s.sync(1));
      // The same weights again: the staging model then holds version 1's copies (a sync swaps
      // the previous serving state into the staging model).
      expect_all_passed(s.sync(2));
      const auto& specs = s.served.params();
      for (size_t p = 0; p < specs.size(); ++p)
        if (specs[p].name == name)
          for (float& x : s.master[p]) x *= 1.25f;
      s.step(0);  // re-export, no noise: only `name` changed
      const SyncReport r = s.sync(3, Fault::stale_derived);
      ASSERT_TRUE(r.failure().has_value()) << preset << " " << name;
      EXPECT_EQ(r.failure()->check, SyncCheck::derived_state) << r.failure()->message;
      EXPECT_EQ(r.failure()->message.rfind("[sync] check 5 derived_state: " + name + ": ", 0), 0u)
          << preset << ": " << r.failure()->message;
    }
  }
}

TEST(Sync, StaleDerivedOnAFreshSamplerIsCaughtToo) {
  // A fresh staging model's copies come from its initial values; keeping them for version 1 is
  // as stale as keeping version 0's, and the next clean sync repairs it.
  Rig s("mxfp8");
  const SyncReport r = s.sync(1, Fault::stale_derived);
  ASSERT_TRUE(r.failure().has_value());
  EXPECT_EQ(r.failure()->check, SyncCheck::derived_state) << r.failure()->message;
  EXPECT_FALSE(r.applied);
  expect_all_passed(s.sync(1));
}

TEST(Sync, UntiedLmHeadFaultNeedsTiedEmbeddings) {
  Rig s("mxfp8", /*tied=*/false);
  expect_all_passed(s.sync(1, Fault::untied_lm_head));
}

TEST(Sync, OlderVersionIsRejected) {
  Rig s("bf16");
  const std::vector<uint8_t> old = s.publisher.publish(1);
  s.step(2);
  expect_all_passed(s.receiver.apply(s.publisher.publish(2), 2));
  const SyncReport r = s.receiver.apply(old, 1);
  ASSERT_TRUE(r.failure().has_value());
  EXPECT_EQ(r.failure()->check, SyncCheck::version);
  EXPECT_NE(r.failure()->message.find("announced version 1 is older than the serving version 2"),
            std::string::npos) << r.failure()->message;
  EXPECT_EQ(s.receiver.version(), 2u);
}

TEST(Sync, StaleFaultsNeedAPreviousPublish) {
  Rig s("bf16");
  EXPECT_THROW(s.publisher.publish(1, Fault::stale_version), InputError);
  EXPECT_THROW(s.publisher.publish(1, Fault::stale_weights), InputError);
}

// ---- check 4 over every tensor -----------------------------------------------------------------

// The sign of the largest element of one tensor flipped in transit (amax, hence every scale,
// unchanged: checks 5 and 6 pass), for every GEMM weight in turn in visit_derived_weights order
// — the first (the tied embedding / lm_head), the middle ones and the last (layer 1 down_proj;
// untied: lm_head) — on every preset: check 4 names that tensor each time.
TEST(Sync, CorruptionOfAnyTensorIsCaughtByCheck4) {
  for (const bool tied : {true, false}) {
    for (const std::string preset : {"bf16", "mxfp8", "nvfp4", "fp8-tensor", "fp32"}) {
      Rig s(preset, tied);
      expect_all_passed(s.sync(1));
      s.step(2);
      const std::vector<uint8_t> genuine = s.publisher.publish(2);
      const auto f = io::SafetensorsFile::from_bytes(genuine, "payload");
      std::vector<std::string> names;
      s.served.visit_derived_weights([&](const Model::DerivedWeight& w) { names.emplace_back(w.name); });
      ASSERT_EQ(names.size(), 15u);  // 7 per layer and lm_head (tied: the embedding table)
      for (const std::string& name : names) {
        std::vector<std::vector<uint8_t>> bytes;
        std::vector<io::TensorToWrite> tensors;
        for (const io::TensorInfo& t : f.tensors()) {
          bytes.emplace_back(t.bytes.begin(), t.bytes.end());
          if (t.name != name) continue;
          const std::vector<float> v = io::tensor_to_floats(t);
          const auto top = static_cast<size_t>(std::max_element(v.begin(), v.end(), [](float x, float y) {
                                                 return std::fabs(x) < std::fabs(y);
                                               }) - v.begin());
          const size_t es = bytes.back().size() / v.size();
          bytes.back()[top * es + es - 1] ^= 0x80;  // the sign bit (little-endian)
        }
        size_t i = 0;
        for (const io::TensorInfo& t : f.tensors()) tensors.push_back({t.name, t.dtype, t.shape, bytes[i++]});
        const SyncReport r = s.receiver.apply(io::serialize_safetensors(tensors, f.metadata()), 2);
        const std::string where = preset + (tied ? " tied " : " untied ") + name;
        ASSERT_TRUE(r.failure().has_value()) << where << ": not caught";
        EXPECT_EQ(r.failure()->check, SyncCheck::content) << where << ": " << r.failure()->message;
        EXPECT_EQ(r.failure()->message.rfind("[sync] check 4 content: " + name + " ", 0), 0u)
            << where << ": " << r.failure()->message;
        EXPECT_FALSE(r.applied);
      }
      expect_all_passed(s.receiver.apply(genuine, 2));
    }
  }
}

// Codes changed in the staged copy after it was built (Fault::overwritten_codes): the hash taken
// at build time still matches the learner's, so only check 4's re-sample of the codes sees it —
// named as such, before the probe runs on the damaged copy. Tied and untied (the last weight
// is then lm_head), every preset.
TEST(Sync, CodesChangedAfterTheBuildAreCaughtByTheResample) {
  for (const bool tied : {true, false}) {
    for (const std::string preset : {"bf16", "mxfp8", "nvfp4", "fp8-tensor", "fp32"}) {
      Rig s(preset, tied);
      expect_all_passed(s.sync(1));
      s.step(2);
      const SyncReport r = s.sync(2, Fault::overwritten_codes);
      const std::string last = tied ? "model.layers.1.mlp.down_proj.weight" : "lm_head.weight";
      ASSERT_TRUE(r.failure().has_value()) << preset;
      ASSERT_EQ(r.checks.size(), 6u) << preset << ": " << r.failure()->message;  // 1, 2, 3, 5, 6, 4
      EXPECT_EQ(r.failure()->check, SyncCheck::content) << r.failure()->message;
      EXPECT_EQ(r.failure()->message.rfind("[sync] check 4 content: " + last + ": the ", 0), 0u)
          << preset << ": " << r.failure()->message;
      EXPECT_NE(r.failure()->message.find("changed after the copy was built (sampled hash 0x"),
                std::string::npos) << r.failure()->message;
      EXPECT_FALSE(r.applied);
      s.step(3);
      expect_all_passed(s.sync(3));
    }
  }
}

// A tensor the manifest does not list (added in transit or by a learner of another config)
// is named by check 2, whatever it holds.
TEST(Sync, ManifestCatchesATensorItDoesNotList) {
  Rig s("mxfp8");
  const auto f = io::SafetensorsFile::from_bytes(s.publisher.publish(1), "payload");
  std::vector<io::TensorToWrite> tensors;
  for (const io::TensorInfo& t : f.tensors()) tensors.push_back({t.name, t.dtype, t.shape, t.bytes});
  const std::vector<float> extra(8, 1.0f);
  tensors.push_back({"model.layers.0.extra.weight", io::Dtype::F32, {8},
                     std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(extra.data()), 32)});
  const SyncReport r = s.receiver.apply(io::serialize_safetensors(tensors, f.metadata()), 1);
  ASSERT_TRUE(r.failure().has_value());
  EXPECT_EQ(r.failure()->message,
            "[sync] check 2 manifest: model.layers.0.extra.weight is in the payload but not in the manifest");
  expect_all_passed(s.sync(1));
}

// A sampler tensor the manifest (and payload) lacks — the first parameter or the last — is named
// by check 2.
TEST(Sync, ManifestWithoutASamplerTensorIsCaught) {
  Rig s("mxfp8");
  const auto f = io::SafetensorsFile::from_bytes(s.publisher.publish(1), "payload");
  for (const std::string& name : {s.served.params().front().name, s.served.params().back().name}) {
    std::vector<io::TensorToWrite> tensors;
    for (const io::TensorInfo& t : f.tensors())
      if (t.name != name) tensors.push_back({t.name, t.dtype, t.shape, t.bytes});
    std::map<std::string, std::string> metadata = f.metadata();
    json manifest = json::parse(metadata.at("concord.sync.manifest"));
    json kept = json::array();
    for (const json& e : manifest.at("tensors"))
      if (e.at("name") != name) kept.push_back(e);
    manifest["tensors"] = kept;
    metadata["concord.sync.manifest"] = manifest.dump();
    const SyncReport r = s.receiver.apply(io::serialize_safetensors(tensors, metadata), 1);
    ASSERT_TRUE(r.failure().has_value()) << name;
    EXPECT_EQ(r.failure()->message, "[sync] check 2 manifest: " + name + ": the sampler's tensor has no learner tensor");
  }
  expect_all_passed(s.sync(1));
}

// A learner serving f32 to a sampler that serves bf16: the payload is self-consistent, and
// check 2 names the dtype the sampler did not expect.
TEST(Sync, ManifestCatchesADifferentServedDtype) {
  PrecisionPolicy learner = PrecisionPolicy::preset("mxfp8");
  learner.served_weights = numerics::Format::f32;
  Rig s(learner, PrecisionPolicy::preset("mxfp8"), true, small_probe());
  const SyncReport r = s.sync(1);
  ASSERT_TRUE(r.failure().has_value());
  EXPECT_EQ(r.failure()->message, "[sync] check 2 manifest: model.embed_tokens.weight: learner dtype F32 != "
                                  "the sampler's served dtype BF16");
}

// A weight turned NaN in transit (the learner's own probe refuses to publish NaN weights): its
// block gets the NaN scale code, and check 6 names the weight and the block — for every weight
// with block scales in turn, the last in visit order included.
TEST(Sync, NaNWeightIsCaughtByScaleSanity) {
  for (const std::string preset : {"mxfp8", "nvfp4"}) {
    Rig s(preset);
    const auto f = io::SafetensorsFile::from_bytes(s.publisher.publish(1), "payload");
    std::vector<std::string> scaled;  // weights with block scales, in visit order
    s.served.visit_derived_weights([&](const Model::DerivedWeight& w) {
      if (w.forward->desc && (w.forward->desc->is_mx() || w.forward->desc->is_nvfp4())) scaled.emplace_back(w.name);
    });
    ASSERT_GE(scaled.size(), 7u) << preset;
    for (const std::string& name : scaled) {
      std::vector<std::vector<uint8_t>> bytes;
      std::vector<io::TensorToWrite> tensors;
      for (const io::TensorInfo& t : f.tensors()) {
        bytes.emplace_back(t.bytes.begin(), t.bytes.end());
        if (t.name == name) {
          ASSERT_EQ(t.dtype, io::Dtype::BF16);
          bytes.back()[2 * 3] = 0xC0;  // element 3: bf16 0x7FC0, a quiet NaN
          bytes.back()[2 * 3 + 1] = 0x7F;
        }
      }
      size_t i = 0;
      for (const io::TensorInfo& t : f.tensors()) tensors.push_back({t.name, t.dtype, t.shape, bytes[i++]});
      const SyncReport r = s.receiver.apply(io::serialize_safetensors(tensors, f.metadata()), 1);
      ASSERT_TRUE(r.failure().has_value()) << preset << " " << name;
      EXPECT_EQ(r.failure()->check, SyncCheck::scale_sanity) << r.failure()->message;
      EXPECT_EQ(r.failure()->message.rfind("[sync] check 6 scale_sanity: " + name + " (", 0), 0u)
          << r.failure()->message;
      EXPECT_NE(r.failure()->message.find("block (0, 0) has the invalid scale code"), std::string::npos)
          << r.failure()->message;
    }
    expect_all_passed(s.receiver.apply(s.publisher.publish(1), 1));
  }
}

// ---- the fast paths' fallbacks -----------------------------------------------------------------

// Blocks whose elements are all zero rightly get a zero (ue4m3) or 2^-127 (e8m0) scale, and an
// all-zero weight a per-tensor scale of 1: check 6's min/max scan sees the zero codes, walks the
// blocks, and raises no alarm.
TEST(Sync, AllZeroBlocksAndWeightsPassScaleSanity) {
  for (const std::string preset : {"mxfp8", "nvfp4", "fp8-tensor"}) {
    Rig s(preset);
    const auto& specs = s.served.params();
    for (size_t p = 0; p < specs.size(); ++p) {
      if (specs[p].name == "model.layers.0.mlp.up_proj.weight")  // rows 0-15: whole blocks (1x32,
        std::fill_n(s.master[p].begin(), 16 * specs[p].shape[1], 0.0f);  // 1x16 or 16x16) of zeros
      if (specs[p].name == "model.layers.0.self_attn.k_proj.weight")  // the whole weight
        std::fill(s.master[p].begin(), s.master[p].end(), 0.0f);
    }
    s.step(0);  // re-export without noise
    int zero_scales = 0;
    s.served.visit_derived_weights([&](const Model::DerivedWeight& w) {
      const auto& q = w.forward->quantized;
      if (w.name == "model.layers.0.mlp.up_proj.weight" && !q.scales.empty()) zero_scales += q.scales[0] == 0;
      if (w.name == "model.layers.0.self_attn.k_proj.weight") {
        EXPECT_EQ(q.tensor_scale, 1.0f) << preset;
      }
    });
    if (preset != "fp8-tensor") {
      EXPECT_EQ(zero_scales, 1) << preset << ": the test needs a zero block scale";
    }
    expect_all_passed(s.sync(1));
  }
}

// The metadata in another JSON layout (indented, manifest entries reversed): the texts differ
// from the ones the sampler expects, so checks 2, 3 and 4 parse them, and pass; a wrong hash
// in that layout is still named.
TEST(Sync, MetadataInAnotherLayoutIsParsedAndChecked) {
  Rig s("nvfp4");
  const auto f = io::SafetensorsFile::from_bytes(s.publisher.publish(1), "payload");
  std::vector<io::TensorToWrite> tensors;
  for (const io::TensorInfo& t : f.tensors()) tensors.push_back({t.name, t.dtype, t.shape, t.bytes});
  std::map<std::string, std::string> metadata = f.metadata();
  json manifest = json::parse(metadata.at("concord.sync.manifest"));
  std::reverse(manifest.at("tensors").begin(), manifest.at("tensors").end());
  metadata["concord.sync.manifest"] = manifest.dump(2);
  metadata["concord.sync.plan"] = json::parse(metadata.at("concord.sync.plan")).dump(2);
  json content = json::parse(metadata.at("concord.sync.content"));
  metadata["concord.sync.content"] = content.dump(2);
  expect_all_passed(s.receiver.apply(io::serialize_safetensors(tensors, metadata), 1));

  const std::string name = "model.layers.0.mlp.gate_proj.weight";
  content[name] = "0x0123456789abcdef";
  metadata["concord.sync.version"] = "2";
  metadata["concord.sync.content"] = content.dump(2);
  const SyncReport r = s.receiver.apply(io::serialize_safetensors(tensors, metadata), 2);
  ASSERT_TRUE(r.failure().has_value());
  EXPECT_EQ(r.failure()->check, SyncCheck::content);
  EXPECT_NE(r.failure()->message.find(name + " codes/scales hash 0x"), std::string::npos) << r.failure()->message;
  EXPECT_NE(r.failure()->message.find("!= learner 0x0123456789abcdef"), std::string::npos) << r.failure()->message;
}

// Above 2^20 elements the payload is installed on the OpenMP threads, a tensor per thread; each
// tensor's hash runs in order, so check 5 compares equal hashes for any thread count.
TEST(Sync, InstallHashesDoNotDependOnTheThreadCount) {
  ModelConfig c = tiny_config();
  c.hidden_size = 128;
  c.intermediate_size = 512;
  c.head_dim = 32;
  c.vocab_size = 6000;  // 6000 x 128 + 2 layers x 256K: 1.28M elements
  Model served(c, PrecisionPolicy::preset("mxfp8")), serving(c, PrecisionPolicy::preset("mxfp8"));
  auto export_bf16 = [&](uint64_t seed) {
    served.init_random(seed, 0.05f);
    for (const auto& spec : served.params())
      for (float& x : served.param(spec.name)) x = std::bit_cast<float>(std::bit_cast<uint32_t>(x) & 0xFFFF0000u);
    served.weights_changed();
  };
  WeightPublisher publisher(served, PrecisionPolicy::preset("mxfp8"), small_probe());
  WeightReceiver receiver(serving, small_probe());
  const int saved = omp_get_max_threads();
  uint64_t version = 0;
  for (const int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    export_bf16(static_cast<uint64_t>(threads));
    ++version;
    expect_all_passed(receiver.apply(publisher.publish(version), version));
    export_bf16(10 + static_cast<uint64_t>(threads));  // new values, kept copies: caught by check 5
    const SyncReport stale = receiver.apply(publisher.publish(version + 1), version + 1, Fault::stale_derived);
    ASSERT_TRUE(stale.failure().has_value());
    EXPECT_EQ(stale.failure()->check, SyncCheck::derived_state) << stale.failure()->message;
  }
  omp_set_num_threads(saved);
}

// ---- check 3: precision plans ------------------------------------------------------------------

TEST(Sync, PrecisionPlanCatchesADifferentLastLayerOverride) {
  // The learner assumes NVIDIA's recipe (last layer in bf16); the sampler quantizes every layer.
  PrecisionPolicy sampler = PrecisionPolicy::preset("nvfp4");
  sampler.high_precision_last_layers = 0;
  Rig s(PrecisionPolicy::preset("nvfp4"), sampler, true, small_probe());
  const SyncReport r = s.sync(1);
  ASSERT_TRUE(r.failure().has_value());
  EXPECT_EQ(r.failure()->check, SyncCheck::precision_plan);
  EXPECT_NE(r.failure()->message.find("model.layers.1.self_attn.q_proj.weight: the learner keeps it "
                                      "in high precision"), std::string::npos) << r.failure()->message;
  EXPECT_FALSE(r.applied);
}

TEST(Sync, PrecisionPlanCatchesADifferentActivationFormat) {
  PrecisionPolicy sampler = PrecisionPolicy::preset("mxfp8");
  for (int c = 0; c < 2; ++c)  // attention and MLP activations in E5M2 on the sampler
    sampler.layer_class[c].role[0].a = numerics::QuantDesc::mx(numerics::Format::e5m2, numerics::ScaleRule::rceil);
  Rig s(PrecisionPolicy::preset("mxfp8"), sampler, true, small_probe());
  const SyncReport r = s.sync(1);
  ASSERT_TRUE(r.failure().has_value());
  EXPECT_EQ(r.failure()->check, SyncCheck::precision_plan);
  EXPECT_NE(r.failure()->message.find("model.layers.0.self_attn.q_proj.weight: forward formats differ"),
            std::string::npos) << r.failure()->message;
}

TEST(Sync, PrecisionPlanCatchesADifferentWeightFormat) {
  PrecisionPolicy sampler = PrecisionPolicy::preset("mxfp8");
  for (int c = 0; c < 2; ++c)  // attention and MLP weights in E5M2 on the sampler
    sampler.layer_class[c].role[0].b = numerics::QuantDesc::mx(numerics::Format::e5m2, numerics::ScaleRule::rceil);
  Rig s(PrecisionPolicy::preset("mxfp8"), sampler, true, small_probe());
  const SyncReport r = s.sync(1);
  ASSERT_TRUE(r.failure().has_value());
  EXPECT_EQ(r.failure()->check, SyncCheck::precision_plan) << r.failure()->message;
  EXPECT_NE(r.failure()->message.find("model.layers.0.self_attn.q_proj.weight: forward formats differ"),
            std::string::npos) << r.failure()->message;
}

TEST(Sync, PrecisionPlanCatchesADifferentLastLayerCountEvenWhereTheFormatsAgree) {
  // bf16: the high-precision layers are bf16 like every other, so every weight's formats agree;
  // the configured override still differs, and check 3 says so.
  PrecisionPolicy sampler = PrecisionPolicy::preset("bf16");
  sampler.high_precision_last_layers = 1;
  PrecisionPolicy learner = PrecisionPolicy::preset("bf16");
  learner.high_precision_last_layers = 0;
  Rig s(learner, sampler, true, small_probe());
  const SyncReport r = s.sync(1);
  ASSERT_TRUE(r.failure().has_value());
  EXPECT_EQ(r.failure()->check, SyncCheck::precision_plan) << r.failure()->message;
  EXPECT_NE(r.failure()->message.find("high-precision last layers: learner 0, sampler 1"), std::string::npos)
      << r.failure()->message;
}

// ---- check 7: a stale weight set that passes checks 1-6 ----------------------------------------

// The probe's k3 KL threshold on its own: a contract loose enough to let stale weights through
// (osc up to 1000 nats), and the k3 KL of the stale weights above max_k3_kl.
TEST(Sync, ProbeK3ThresholdCatchesWhatALooseContractLetsThrough) {
  ProbeOptions probe = small_probe();
  probe.contract.ref = "learner";
  probe.contract.cand = "sampler";
  probe.contract.slices.push_back({"all", 0, 0.99, 1e3, 1e3});
  probe.max_k3_kl = 1e-6;
  Rig s("mxfp8", true, probe);
  expect_all_passed(s.sync(1));
  s.step(2);
  const SyncReport r = s.sync(2, Fault::stale_weights);
  ASSERT_TRUE(r.failure().has_value());
  EXPECT_EQ(r.failure()->check, SyncCheck::probe) << r.failure()->message;
  EXPECT_EQ(r.failure()->message.rfind("[sync] check 7 probe: k3 KL ", 0), 0u) << r.failure()->message;
  EXPECT_GT(r.probe_k3_kl, 1e-6);
}

// Every probe row is compared: the learner's reference perturbed in one row only (first,
// middle, last), by 0.01 nats on one entry, is caught, and the worst row named.
TEST(Sync, ProbeComparesEveryRow) {
  Rig s("bf16");
  expect_all_passed(s.sync(1));
  s.step(2);
  const std::vector<uint8_t> genuine = s.publisher.publish(2);
  const auto f = io::SafetensorsFile::from_bytes(genuine, "payload");
  const json probe = json::parse(f.metadata().at("concord.sync.probe"));
  const int64_t sequences = probe.at("sequences").get<int64_t>(), length = probe.at("length").get<int64_t>();
  const int64_t rows = sequences * (length - 1), V = s.config.vocab_size;
  for (const int64_t row : {int64_t{0}, rows / 2, rows - 1}) {
    std::vector<io::TensorToWrite> tensors;
    std::vector<float> ref;
    for (const io::TensorInfo& t : f.tensors()) {
      if (t.name != kProbeTensor) {
        tensors.push_back({t.name, t.dtype, t.shape, t.bytes});
        continue;
      }
      ref = io::tensor_to_floats(t);
      ref[static_cast<size_t>(row * V + 7)] += 0.01f;
    }
    tensors.push_back({std::string(kProbeTensor), io::Dtype::F32, {rows, V},
                       std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(ref.data()), ref.size() * 4)});
    const SyncReport r = s.receiver.apply(io::serialize_safetensors(tensors, f.metadata()), 2);
    ASSERT_TRUE(r.failure().has_value()) << "row " << row;
    EXPECT_EQ(r.failure()->check, SyncCheck::probe) << r.failure()->message;
    const std::string worst = fmt::format("worst: sequence {} position {})", row / (length - 1), row % (length - 1));
    EXPECT_NE(r.failure()->message.find(worst), std::string::npos) << worst << " / " << r.failure()->message;
  }
  expect_all_passed(s.receiver.apply(genuine, 2));
}

// A malicious (or buggy) sender: step 1's weights with their own, self-consistent manifest, plan
// and hashes, relabelled as version 2 and carrying step 2's probe reference. Checks 1-6 see a
// consistent payload; only the behaviour probe can tell the weights are stale. (The
// stale_weights fault does the same inside the publisher; this forges it from two genuine
// payloads, sharing none of that code.)
TEST(Sync, ProbeAloneCatchesStaleWeights) {
  Rig s("mxfp8");
  const std::vector<uint8_t> stale = s.publisher.publish(1);
  s.step(2);  // one ordinary step: the weights moved by N(0, 2e-3²)
  const std::vector<uint8_t> fresh = s.publisher.publish(2);
  const auto a = io::SafetensorsFile::from_bytes(stale, "stale");
  const auto b = io::SafetensorsFile::from_bytes(fresh, "fresh");
  std::vector<io::TensorToWrite> tensors;
  for (const io::TensorInfo& t : a.tensors()) {
    const io::TensorInfo& src = t.name == kProbeTensor ? b.get(t.name) : t;
    tensors.push_back({src.name, src.dtype, src.shape, src.bytes});
  }
  std::map<std::string, std::string> metadata = a.metadata();
  metadata["concord.sync.version"] = "2";
  metadata["concord.sync.probe"] = b.metadata().at("concord.sync.probe");
  const std::vector<uint8_t> forged = io::serialize_safetensors(tensors, metadata);

  const SyncReport r = s.receiver.apply(forged, 2);
  ASSERT_EQ(r.checks.size(), 7u);
  for (size_t i = 0; i + 1 < r.checks.size(); ++i) EXPECT_TRUE(r.checks[i].pass) << r.checks[i].message;
  ASSERT_TRUE(r.failure().has_value());
  EXPECT_EQ(r.failure()->check, SyncCheck::probe);
  EXPECT_NE(r.failure()->message.find("[sync] check 7 probe: slice all osc "), std::string::npos)
      << r.failure()->message;
  EXPECT_GT(r.probe_max_abs_dlogp, 1e-4);
  EXPECT_GT(r.probe_k3_kl, 0.0);
  EXPECT_FALSE(r.applied);
  // The genuine payload of step 2 goes through.
  expect_all_passed(s.receiver.apply(fresh, 2));
}

// ---- the payload against independent recomputations -------------------------------------------

TEST(Sync, PayloadIsASafetensorsImageWithTheManifestedTensors) {
  Rig s("mxfp8");
  const std::vector<uint8_t> payload = s.publisher.publish(7);
  const auto f = io::SafetensorsFile::from_bytes(payload, "payload");
  EXPECT_EQ(f.metadata().at("concord.sync.version"), "7");
  // Matrices in the served format (bf16), norms in f32, lm_head tied (carried once).
  EXPECT_EQ(f.get("model.layers.0.mlp.up_proj.weight").dtype, io::Dtype::BF16);
  EXPECT_EQ(f.get("model.layers.0.input_layernorm.weight").dtype, io::Dtype::F32);
  EXPECT_EQ(f.find("lm_head.weight"), nullptr);
  const json manifest = json::parse(f.metadata().at("concord.sync.manifest")).at("tensors");
  bool tied = false;
  for (const json& e : manifest)
    if (e.at("name") == "lm_head.weight") tied = e.at("tied_to") == "model.embed_tokens.weight";
  EXPECT_TRUE(tied);
  EXPECT_EQ(manifest.size(), s.served.params().size() + 1);
  // The bf16 bytes are the served values (decoded independently: bf16 is the top half of fp32).
  const io::TensorInfo& t = f.get("model.layers.1.self_attn.k_proj.weight");
  const auto served = s.served.param(t.name);
  for (size_t i = 0; i < served.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, t.bytes.data() + 2 * i, 2);
    ASSERT_EQ(std::bit_cast<float>(static_cast<uint32_t>(h) << 16), served[i]) << i;
  }
}

// The learner's content hash of a weight equals XXH3 over the codes, scales and tensor scale
// that the quantizer makes of it with the sampler's descriptor (blocks along K).
TEST(Sync, ContentHashIsTheQuantizersOutput) {
  for (const std::string preset : {"mxfp8", "nvfp4", "fp8-tensor", "bf16"}) {
    Rig s(preset);
    const auto f = io::SafetensorsFile::from_bytes(s.publisher.publish(1), "payload");
    const json content = json::parse(f.metadata().at("concord.sync.content"));
    const std::string name = "model.layers.0.mlp.down_proj.weight";
    const auto& spec = s.served.params()[static_cast<size_t>(
        std::find_if(s.served.params().begin(), s.served.params().end(),
                     [&](const auto& p) { return p.name == name; }) - s.served.params().begin())];
    numerics::QuantDesc desc = *s.policy.layer_class[1].role[0].b;
    if (desc.block.rows == 1) desc.axis = 1;  // along K, the reduction of X·Wᵀ
    const auto q = numerics::quantize_ref(desc, s.served.param(name).data(), spec.shape[0], spec.shape[1]);
    uint64_t h = XXH3_64bits(q.codes.data(), q.codes.size());
    h = XXH3_64bits_withSeed(q.scales.data(), q.scales.size(), h);
    const uint32_t bits = std::bit_cast<uint32_t>(q.tensor_scale);
    h = XXH3_64bits_withSeed(&bits, 4, h);
    char hex[32];
    std::snprintf(hex, sizeof hex, "0x%016llx", static_cast<unsigned long long>(h));
    EXPECT_EQ(content.at(name).get<std::string>(), hex) << preset;
  }
}

TEST(Sync, DerivedWeightsRecordTheValuesTheyWereBuiltFrom) {
  Model m(tiny_config(), PrecisionPolicy::preset("mxfp8"));
  m.init_random(3);
  const std::string name = "model.layers.1.mlp.gate_proj.weight";
  auto source_of = [&] {
    uint64_t h = 0;
    int visited = 0;
    m.visit_derived_weights([&](const Model::DerivedWeight& w) {
      ++visited;
      if (w.name == name) {
        h = w.source_hash;
        EXPECT_TRUE(w.forward->desc.has_value());
        EXPECT_FALSE(w.forward->quantized.codes.empty());
      }
    });
    EXPECT_EQ(visited, 2 * 7 + 1);  // 7 GEMM weights per layer and the tied lm_head
    return h;
  };
  const auto v = m.param(name);
  const uint64_t built = source_of();
  EXPECT_EQ(built, XXH3_64bits(v.data(), v.size_bytes()));
  v[5] += 1.0f;  // changed without weights_changed(): the copy is stale and says so
  EXPECT_EQ(source_of(), built);
  EXPECT_NE(built, XXH3_64bits(v.data(), v.size_bytes()));
  m.weights_changed();  // rebuilt on the next visit, as on the next forward
  EXPECT_EQ(source_of(), XXH3_64bits(v.data(), v.size_bytes()));
}

// The probe reference: log-softmax (fp64, written here) of Model::forward's logits at the
// sampler's precision on the served weights, against the payload's rows.
TEST(Sync, ProbeReferenceIsTheLearnersLogSoftmaxAtTheSamplersPrecision) {
  Rig s("bf16");
  const auto f = io::SafetensorsFile::from_bytes(s.publisher.publish(1), "payload");
  const json probe = json::parse(f.metadata().at("concord.sync.probe"));
  const auto seqs = probe.at("tokens").get<std::vector<std::vector<int32_t>>>();
  const std::vector<float> rows = io::tensor_to_floats(f.get(kProbeTensor));
  const int64_t V = s.config.vocab_size, T = probe.at("length").get<int64_t>();
  ASSERT_EQ(static_cast<int64_t>(rows.size()), static_cast<int64_t>(seqs.size()) * (T - 1) * V);
  Model ref(s.config, s.policy);
  for (const auto& spec : s.served.params()) {
    const auto from = s.served.param(spec.name);
    std::copy(from.begin(), from.end(), ref.param(spec.name).begin());
  }
  ref.weights_changed();
  size_t row = 0;
  for (const auto& seq : seqs) {
    std::vector<float> logits(static_cast<size_t>(T * V));
    ref.forward(seq, 1, T, logits);
    for (int64_t t = 0; t + 1 < T; ++t, ++row) {
      double m = -INFINITY, sum = 0;
      for (int64_t i = 0; i < V; ++i) m = std::max(m, static_cast<double>(logits[t * V + i]));
      for (int64_t i = 0; i < V; ++i) sum += std::exp(logits[t * V + i] - m);
      for (int64_t i = 0; i < V; ++i) {
        const double want = logits[t * V + i] - m - std::log(sum);
        ASSERT_NEAR(rows[row * V + i], want, 1e-5) << "row " << row << " token " << i;
      }
    }
  }
}

// A payload whose metadata has the wrong shape is reported by the check that reads it, not
// thrown out of apply().
TEST(Sync, MalformedMetadataFailsItsCheck) {
  Rig s("bf16");
  const auto f = io::SafetensorsFile::from_bytes(s.publisher.publish(1), "payload");
  std::vector<io::TensorToWrite> tensors;
  for (const io::TensorInfo& t : f.tensors()) tensors.push_back({t.name, t.dtype, t.shape, t.bytes});
  std::map<std::string, std::string> metadata = f.metadata();
  metadata["concord.sync.manifest"] = R"({"tensors": [{"name": 3}]})";
  const SyncReport r = s.receiver.apply(io::serialize_safetensors(tensors, metadata), 1);
  ASSERT_TRUE(r.failure().has_value());
  EXPECT_EQ(r.failure()->check, SyncCheck::manifest);
  EXPECT_NE(r.failure()->message.find("malformed sync metadata"), std::string::npos) << r.failure()->message;
  metadata = f.metadata();
  metadata.erase("concord.sync.version");
  const SyncReport v = s.receiver.apply(io::serialize_safetensors(tensors, metadata), 1);
  ASSERT_TRUE(v.failure().has_value());
  EXPECT_EQ(v.failure()->message, "[sync] check 1 version: the payload has no concord.sync.version");
}

// ---- names and the report ----------------------------------------------------------------------

TEST(Sync, FaultNamesRoundTrip) {
  // The issue's ten, stale_weights (check 7's), overwritten_codes (check 4's re-sample),
  // wrong_tensor_scale (check 6's tensor-scale comparison) and stale_router (Qwen3-MoE, check 4).
  EXPECT_EQ(fault_names().size(), 14u);
  for (const std::string& n : fault_names()) EXPECT_EQ(fault_name(fault_from_name(n)), n);
  EXPECT_EQ(fault_from_name("none"), Fault::none);
  try {
    fault_from_name("bitrot");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown fault 'bitrot' (faults: none, stale_version"),
              std::string::npos) << e.what();
  }
  EXPECT_TRUE(learner_side(Fault::flipped_bit));
  EXPECT_FALSE(learner_side(Fault::stale_derived));
  EXPECT_TRUE(learner_side(Fault::stale_weights));
  EXPECT_EQ(sync_check_name(SyncCheck::precision_plan), "precision_plan");
}

TEST(Sync, ReportJson) {
  Rig s("bf16");
  const SyncReport ok = s.sync(1);
  const json j = ok.to_json();
  EXPECT_EQ(j.at("applied"), true);
  EXPECT_EQ(j.at("checks").size(), 7u);
  EXPECT_EQ(j.at("checks")[0].at("check"), "version");
  EXPECT_EQ(j.at("checks")[3].at("check"), "derived_state");  // run order 1, 2, 3, 5, 6, 4, 7
  EXPECT_EQ(j.at("probe").at("max_abs_dlogp"), 0.0);
  EXPECT_GT(j.at("payload_bytes").get<size_t>(), 0u);
  s.step(2);
  const json bad = s.sync(2, Fault::dropped_tensor).to_json();
  EXPECT_EQ(bad.at("applied"), false);
  EXPECT_EQ(bad.at("checks").back().at("id"), 2);
}

}  // namespace
}  // namespace concord::rl
