// `concord sched`: the peak memory of a model pass under every scheduler and planner
// (docs/sched.md, issue 24) — program order, greedy, the exact DP with its certificate or its
// proven gap; the working-set bound; each planner's arena; with --run, the pass executed node by
// node through each arena and the measured high-water marks beside the predictions, the logits
// checked against Model::forward (a prefill chunk or decode step: Model::forward_cached on a KV
// cache of --context tokens, logits and cache rows) bit for bit.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "concord/cli/commands.h"
#include "concord/cli/flags.h"
#include "concord/io/atomic_file.h"
#include "concord/model/files.h"
#include "concord/numerics/check.h"
#include "concord/sched/executor.h"
#include "concord/sched/model_graph.h"
#include "concord/sched/recompute.h"

namespace concord::cli {
namespace {

using nlohmann::ordered_json;

std::string mib(int64_t bytes) { return fmt::format("{:.3f} MiB", static_cast<double>(bytes) / (1 << 20)); }



}  // namespace

void add_sched_command(CLI::App& app) {
  struct Args {
    std::string model, pass = "forward", policy = "fp32", json;
    int64_t tokens = 256, batch = 1, alignment = 64, dp_states = 2'000'000, context = 0;
    std::optional<int64_t> budget;
    double dp_seconds = 60;
    bool run = false;
    uint64_t seed = 0;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "sched",
      "Peak memory of a model pass (the inference forward, or the training step's forward with every "
      "activation the backward reads) over B sequences of T tokens: the memory model's peak under program "
      "order, the greedy order and the exact DP (its certificate, or its proven lower bound when the budget "
      "runs out), the working-set bound, and each offset planner's arena. With --run, the pass runs node by "
      "node through each plan's arena and through per-buffer allocations, and the measured high-water marks "
      "are printed beside the predictions (the logits checked against Model::forward bit for bit).");
  cmd->add_option("--model", a->model,
                  "a model folder or GGUF file (its config; its weights with --run), or a config.json "
                  "(random weights with --run)")
      ->required();
  cmd->add_option("--pass", a->pass,
                  "forward (inference), prefill (a chunk of --tokens after --context cached ones per sequence), "
                  "decode (one token after --context cached ones), train (the training step's forward, with the "
                  "recomputation plans) or step (the whole training step, backward nodes included; dense models); "
                  "default forward");
  add_integer_flag(cmd, "--tokens", a->tokens, between(1, 1 << 20), "new tokens per sequence T (default 256; decode: 1)");
  add_integer_flag(cmd, "--context", a->context, between(0, 1 << 20),
                   "prefill and decode: tokens already in each sequence's KV cache (default 0)");
  add_integer_flag(cmd, "--batch", a->batch, between(1, 4096), "sequences B (default 1)");
  add_integer_flag(cmd, "--alignment", a->alignment, between(4, 1 << 20),
                   "the planners' alignment in bytes, a multiple of 4 (default 64)");
  add_integer_flag(cmd, "--dp-states", a->dp_states, between(1, int64_t{1} << 40), "the DP's state budget (default 2000000)");
  add_real_flag(cmd, "--dp-seconds", a->dp_seconds, positive(), "the DP's time budget (default 60)");
  cmd->add_flag("--run", a->run, "execute the pass under every order and planner and measure its memory");
  add_size_flag(cmd, "--budget", a->budget,
                "with --pass train: the activation plan of least recomputation within this many bytes");
  cmd->add_option("--policy", a->policy, "with --run: precision preset, policy JSON or native (default fp32)");
  add_seed_flag(cmd, "--seed", a->seed, "with --run: the tokens (and a config.json's random weights; default 0)");
  cmd->add_option("--json", a->json, "write the figures to this JSON file");
  cmd->callback([a]() {
    if (a->alignment % 4 != 0) throw InputError(fmt::format("[sched] --alignment {}: a multiple of 4 bytes", a->alignment));
    const sched::Pass pass = sched::pass_from_name(a->pass);
    const bool cached = pass == sched::Pass::decode || pass == sched::Pass::prefill;
    if (a->context > 0 && !cached) throw InputError("[sched] --context is for --pass prefill and decode");
    if (a->budget && pass != sched::Pass::train)
      throw InputError("[sched] --budget plans the training step's recomputation: use it with --pass train");
    const std::filesystem::path path(a->model);
    const bool config_only = path.extension() == ".json";
    std::optional<model::Model> owned;
    std::optional<model::LoadedModel> loaded;
    if (config_only) {
      owned.emplace(model::ModelConfig::load(path), a->run ? model::PrecisionPolicy::from_name_or_file(a->policy)
                                                          : model::PrecisionPolicy::preset("fp32"));
      if (a->run) owned->init_random(a->seed, 0.05f);
    } else if (a->run) {
      loaded.emplace(model::load_model(path, a->policy));
    } else {
      owned.emplace(model::inspect_model(path).config);
    }
    model::Model& m = loaded ? loaded->model : *owned;
    const model::ModelConfig& c = m.config();
    const int64_t B = a->batch, T = pass == sched::Pass::decode ? 1 : a->tokens;
    if (T + a->context > c.max_position_embeddings)
      throw InputError(fmt::format("[sched] {} tokens{} exceed the model's max_position_embeddings {}", T,
                                   cached ? fmt::format(" after --context {}", a->context) : "", c.max_position_embeddings));

    std::vector<int32_t> tokens, targets;
    std::vector<float> reference;
    std::vector<std::vector<float>> reference_grads;  // --pass step: forward_backward's
    float reference_loss = 0;
    constexpr uint64_t kStep = 1;  // seeds the step's backward GEMMs
    std::optional<sched::ExpertRows> rows;
    const bool step = pass == sched::Pass::step;
    // A cached pass runs on a KV cache whose B slots hold --context tokens each (fed through
    // forward_cached first); the reference is forward_cached on a twin cache, and each run starts
    // from the cache as it was before the pass.
    std::optional<model::KvCache> reference_cache, cache;
    std::vector<std::vector<int32_t>> new_tokens;
    std::vector<model::CachedInput> inputs;
    auto rewind = [&] {
      for (int64_t b = 0; b < B; ++b) cache->truncate(static_cast<int>(b), a->context);
    };
    if (a->run && cached) {
      std::mt19937_64 rng(a->seed);
      auto draw = [&](int64_t n) {
        std::vector<int32_t> t(static_cast<size_t>(n));
        for (int32_t& x : t) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(c.vocab_size));
        return t;
      };
      reference_cache.emplace(c, B, a->context + T);
      cache.emplace(c, B, a->context + T);
      for (int64_t b = 0; b < B; ++b) {
        reference_cache->allocate();
        cache->allocate();
        if (a->context == 0) continue;
        const std::vector<int32_t> prompt = draw(a->context);
        const model::CachedInput in{static_cast<int>(b), prompt, model::LogitRows::none};
        m.forward_cached(*reference_cache, std::span(&in, 1), {});
        m.forward_cached(*cache, std::span(&in, 1), {});
      }
      for (int64_t b = 0; b < B; ++b) new_tokens.push_back(draw(T));
      for (int64_t b = 0; b < B; ++b) inputs.push_back({static_cast<int>(b), new_tokens[static_cast<size_t>(b)], model::LogitRows::last});
      reference.resize(static_cast<size_t>(B * c.vocab_size));
      m.set_router_stats(true);
      m.forward_cached(*reference_cache, inputs, reference);
      if (c.num_experts > 0) rows = m.router_stats().counts;
      m.set_router_stats(false);
    } else if (a->run) {
      std::mt19937_64 rng(a->seed);
      tokens.resize(static_cast<size_t>(B * T));
      for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(c.vocab_size));
      if (step) {
        targets.resize(tokens.size());
        for (int32_t& t : targets) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(c.vocab_size));
        reference_loss = m.forward_backward(tokens, targets, B, T, kStep);
        for (const model::ParamSpec& p : m.params()) {
          const auto gr = m.grad(p.name);
          reference_grads.emplace_back(gr.begin(), gr.end());
        }
      } else {
        reference.resize(static_cast<size_t>(B * T * c.vocab_size));
        m.forward(tokens, B, T, reference);
      }
      if (c.num_experts > 0) rows = sched::expert_rows_of(m, tokens, B, T);
    }
    const sched::Graph g = sched::model_graph(m, pass, T, B, rows ? &*rows : nullptr, a->context);
    ordered_json out;
    out["model"] = a->model;
    out["architecture"] = c.architecture;
    out["pass"] = a->pass;
    out["batch"] = B;
    out["tokens"] = T;
    out["context"] = a->context;
    out["nodes"] = g.nodes.size();
    out["tensors"] = g.tensors.size();
    out["expert_rows"] = c.num_experts == 0 ? "dense" : rows ? "exact (this batch's routing)" : "balanced (T·k/E)";
    out["kv_cache_bytes"] = g.outside_bytes;
    std::printf("%s\n", fmt::format("{} ({}, {} layers), pass {}, {} x {} tokens{}: {} nodes, {} tensors{}", a->model,
                                    c.architecture, c.num_hidden_layers, a->pass, B, T,
                                    cached ? fmt::format(" after {} cached", a->context) : "", g.nodes.size(), g.tensors.size(),
                                    c.num_experts == 0 ? "" : fmt::format("; expert rows {}", out["expert_rows"].get<std::string>()))
                                .c_str());
    if (cached)
      std::printf("%s\n", fmt::format("KV cache {} (the KvCache's own memory, outside the activation arena planned below)",
                                      mib(g.outside_bytes))
                              .c_str());

    const int64_t bound = sched::working_set_bound(g);
    const sched::DpResult dp = sched::dp_schedule(g, {.max_states = a->dp_states, .max_seconds = a->dp_seconds});
    const int64_t lower = std::max(bound, dp.lower_bound);
    out["working_set_bound"] = bound;
    out["dp"] = {{"peak", dp.peak},          {"lower_bound", dp.lower_bound}, {"optimal", dp.optimal},
                 {"states", dp.states},      {"seconds", dp.seconds}};
    std::printf("%s\n", fmt::format("working-set bound {}; DP: {} states in {:.2f} s, {}", mib(bound), dp.states, dp.seconds,
                                    dp.optimal ? fmt::format("optimal (certificate: exhaustive, lower bound = peak = {} B)", dp.peak)
                                               : fmt::format("stopped: peak {} B, proven lower bound {} B (gap {:.2f}%)", dp.peak,
                                                             lower, 100.0 * static_cast<double>(dp.peak - lower) /
                                                                        static_cast<double>(std::max<int64_t>(lower, 1))))
                            .c_str());

    const std::vector<std::pair<std::string, sched::Order>> orders = {
        {"program", sched::program_order(g)}, {"greedy", sched::greedy_order(g)}, {"dp", dp.order}};
    std::vector<sched::Planner> planners(std::begin(sched::kPlanners), std::end(sched::kPlanners));
    planners.push_back(sched::Planner::exact);
    std::string header = fmt::format("  {:<8} {:>16}", "order", "peak (model)");
    for (sched::Planner p : planners) header += fmt::format(" {:>19}", sched::planner_name(p));
    if (a->run) header += fmt::format(" {:>16}   {}", "measured dynamic", "measured arenas");
    std::printf("%s\n", header.c_str());
    bool all_equal = true;
    out["orders"] = ordered_json::array();
    for (const auto& [name, order] : orders) {
      const int64_t predicted = sched::peak(g, order);
      ordered_json row = {{"order", name}, {"peak", predicted}, {"planners", ordered_json::object()}};
      std::string line = fmt::format("  {:<8} {:>16}", name, predicted);
      std::vector<sched::ArenaPlan> plans;
      for (sched::Planner p : planners) {
        plans.push_back(sched::plan_offsets(g, order, p, a->alignment));
        line += fmt::format(" {:>19}", fmt::format("{}{}", plans.back().arena_bytes, plans.back().optimal ? "*" : ""));
        row["planners"][sched::planner_name(p)] = {{"arena_bytes", plans.back().arena_bytes},
                                                   {"lower_bound", plans.back().lower_bound},
                                                   {"optimal", plans.back().optimal}};
      }
      if (a->run) {
        // The logits bit for bit Model::forward's; for the training step, the loss and every
        // gradient forward_backward's.
        auto same = [&](const sched::Execution& ex) {
          if (cached) {  // and the cache rows forward_cached wrote
            for (int64_t b = 0; b < B; ++b) {
              const auto floats = static_cast<size_t>(reference_cache->length(static_cast<int>(b)) * cache->row_width());
              if (cache->length(static_cast<int>(b)) != reference_cache->length(static_cast<int>(b))) return false;
              for (int64_t l = 0; l < cache->num_layers(); ++l)
                if (std::memcmp(cache->keys(static_cast<int>(b), l), reference_cache->keys(static_cast<int>(b), l), 4 * floats) != 0 ||
                    std::memcmp(cache->values(static_cast<int>(b), l), reference_cache->values(static_cast<int>(b), l), 4 * floats) != 0)
                  return false;
            }
          }
          if (!step)
            return ex.logits.size() == reference.size() &&
                   std::memcmp(ex.logits.data(), reference.data(), sizeof(float) * reference.size()) == 0;
          const float loss = static_cast<float>(ex.loss);
          if (std::memcmp(&loss, &reference_loss, sizeof(float)) != 0) return false;
          for (size_t i = 0; i < reference_grads.size(); ++i) {
            const auto gr = m.grad(m.params()[i].name);
            if (std::memcmp(gr.data(), reference_grads[i].data(), sizeof(float) * gr.size()) != 0) return false;
          }
          return true;
        };
        auto execute = [&](const sched::ArenaPlan* plan) {
          if (!cached)
            return plan != nullptr ? sched::execute_planned(m, g, order, *plan, tokens, B, T, targets, kStep)
                                   : sched::execute_dynamic(m, g, order, tokens, B, T, targets, kStep);
          rewind();
          return plan != nullptr ? sched::execute_planned(m, g, order, *plan, *cache, inputs)
                                 : sched::execute_dynamic(m, g, order, *cache, inputs);
        };
        const sched::Execution dyn = execute(nullptr);
        const bool dyn_ok = dyn.high_water == predicted && same(dyn);
        line += fmt::format(" {:>16}  ", dyn.high_water);
        row["measured_dynamic"] = dyn.high_water;
        row["logits_equal"] = same(dyn);
        bool ok = dyn_ok;
        for (size_t i = 0; i < plans.size(); ++i) {
          const sched::Execution ex = execute(&plans[i]);
          const bool equal = ex.high_water == plans[i].arena_bytes && ex.touched_bytes == plans[i].arena_bytes && same(ex);
          ok = ok && equal;
          line += fmt::format(" {}{}", ex.touched_bytes, equal ? "" : "!");
          row["planners"][sched::planner_name(planners[i])]["measured_high_water"] = ex.high_water;
          row["planners"][sched::planner_name(planners[i])]["measured_touched"] = ex.touched_bytes;
          row["planners"][sched::planner_name(planners[i])]["logits_equal"] = same(ex);
          row["planners"][sched::planner_name(planners[i])]["seconds"] = ex.seconds;
        }
        line += ok ? "  (all equal)" : "  MISMATCH";
        all_equal = all_equal && ok;
      }
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
      out["orders"].push_back(std::move(row));
    }
    std::printf("%s\n", "  (* the arena is proven the smallest for the order: it equals the bound of buffers live at once, "
                        "or the exact planner's search finished)");
    const int64_t program = sched::peak(g, orders[0].second);
    std::printf("%s\n", fmt::format("the DP's order saves {:.2f}% of program order's peak ({} of {})",
                                    100.0 * static_cast<double>(program - dp.peak) / static_cast<double>(program),
                                    mib(program - dp.peak), mib(program))
                            .c_str());
    if (a->run) {
      out["all_equal"] = all_equal;
      std::printf("%s\n", all_equal ? (step ? "measured == predicted for every order and planner; loss and gradients == "
                                             "Model::forward_backward bit for bit"
                                    : cached ? "measured == predicted for every order and planner; logits and KV cache rows == "
                                               "Model::forward_cached bit for bit"
                                           : "measured == predicted for every order and planner; logits == Model::forward bit for bit")
                                    : "MISMATCH between measured and predicted (see the rows marked !)");
    }
    if (pass == sched::Pass::train && !c.recurrent()) {
      // The whole training step through the model's arena (backward included) under recomputation.
      const std::vector<sched::Recompute> every_attention(static_cast<size_t>(c.applications()), sched::Recompute::attention);
      auto pct = [](const sched::TrainingMemory& t) { return 100 * t.recompute_flops / t.step_flops; };
      const sched::TrainingMemory keep = sched::training_memory(c, B, T, {});
      const sched::TrainingMemory attention = sched::training_memory(c, B, T, every_attention);
      const sched::TrainingMemory block = sched::training_memory(c, B, T, sched::smallest_plan(c));
      std::printf("%s\n", fmt::format("training step (forward and backward, the model's activation arena): keep everything "
                                      "{} (peak at {}); recompute every attention {} (+{:.2f}% FLOPs); every block {} "
                                      "(checkpoint every layer, +{:.2f}% FLOPs)",
                                      mib(keep.peak), keep.peak_at, mib(attention.peak), pct(attention), mib(block.peak), pct(block))
                              .c_str());
      std::printf("  %-12s %-12s %-48s %-10s %s\n", "budget", "peak", "exact plan", "+FLOPs", "greedy +FLOPs");
      out["recompute"] = {{"keep", keep.peak}, {"attention", attention.peak}, {"block", block.peak},
                          {"block_flops_percent", pct(block)}, {"curve", ordered_json::array()}};
      std::vector<int64_t> budgets;
      for (const sched::RecomputePlan& p : sched::recompute_curve(c, B, T, 9)) budgets.push_back(p.memory.peak);
      const std::optional<int64_t> asked = a->budget;
      if (asked) budgets.push_back(*asked);
      for (int64_t b : budgets) {
        const auto exact = sched::plan_recompute(c, B, T, b);
        const auto greedy = sched::recompute_greedy(c, B, T, b);
        const bool mine = asked && b == *asked;
        if (!exact) {
          std::printf("%s\n", fmt::format("  {:<12} none fits: the smallest plan needs {}", mib(b), mib(block.peak)).c_str());
          out["recompute"]["budget"] = {{"bytes", b}, {"fits", false}};
          continue;
        }
        std::printf("%s\n", fmt::format("  {:<12} {:<12} {:<48} {:<10} {}{}", mib(b), mib(exact->memory.peak), sched::recompute_summary(exact->modes),
                                        fmt::format("{:.2f}%", pct(exact->memory)),
                                        greedy ? fmt::format("{:.2f}%", pct(greedy->memory)) : "none",
                                        mine ? "   <- --budget" : "")
                                .c_str());
        ordered_json row = {{"budget", b}, {"peak", exact->memory.peak}, {"flops_percent", pct(exact->memory)},
                            {"greedy_flops_percent", greedy ? pct(greedy->memory) : -1.0}, {"modes", ordered_json::array()}};
        for (sched::Recompute r : exact->modes) row["modes"].push_back(sched::recompute_name(r));
        if (mine) out["recompute"]["budget"] = row;
        else out["recompute"]["curve"].push_back(row);
      }
    }
    if (!a->json.empty()) io::write_file_atomic(a->json, out.dump(2) + "\n");
    if (a->run && !all_equal) throw InternalError("[sched] a measured peak or the logits differ from the prediction");
  });
}

}  // namespace concord::cli
