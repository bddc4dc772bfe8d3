// Checkpoints: bit-exact round trip, `latest`, keep-N pruning, crash leftovers, corrupt files;
// the AdamW state through a checkpoint; the progress formatting and metrics truncation.
#include "concord/train/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "concord/io/atomic_file.h"
#include "concord/io/safetensors.h"
#include "concord/numerics/check.h"
#include "concord/train/progress.h"
#include "temp_dir.h"

namespace concord::train {
namespace {

namespace fs = std::filesystem;


std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// A small model's tensors with awkward values (subnormals, -0, NaN payloads, extremes) that a
// round trip must keep bit for bit.
struct Fixture {
  std::vector<NamedTensor> model, optimizer;

  explicit Fixture(uint32_t seed) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> normal;
    auto make = [&](std::string name, std::vector<int64_t> shape) {
      int64_t n = 1;
      for (const int64_t d : shape) n *= d;
      std::vector<float> v(static_cast<size_t>(n));
      for (float& x : v) x = normal(gen);
      return NamedTensor{std::move(name), std::move(shape), std::move(v)};
    };
    model.push_back(make("model.embed_tokens.weight", {259, 8}));
    model.push_back(make("model.norm.weight", {8}));
    model.push_back(make("model.layers.0.self_attn.q_proj.weight", {8, 8}));
    auto& special = model[0].values;
    special[0] = std::numeric_limits<float>::denorm_min();
    special[1] = -0.0f;
    special[2] = std::bit_cast<float>(0x7FC01234u);  // NaN with a payload
    special[3] = std::numeric_limits<float>::max();
    for (const NamedTensor& p : model) {
      optimizer.push_back(make(p.name + ".exp_avg", p.shape));
      optimizer.push_back(make(p.name + ".exp_avg_sq", p.shape));
    }
  }
  static std::vector<TensorView> views(const std::vector<NamedTensor>& tensors) {
    std::vector<TensorView> out;
    for (const NamedTensor& t : tensors) out.push_back({t.name, t.shape, t.values});
    return out;
  }
  fs::path save(const fs::path& run, int64_t step, int keep = 3,
                nlohmann::json state = nlohmann::json::object()) const {
    return save_checkpoint(run, step, views(model), views(optimizer), state, keep);
  }
};

void expect_same_bits(const std::vector<NamedTensor>& got, const std::vector<NamedTensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const NamedTensor& w : want) {
    const NamedTensor* g = find_tensor(got, w.name);
    ASSERT_NE(g, nullptr) << w.name;
    EXPECT_EQ(g->shape, w.shape) << w.name;
    ASSERT_EQ(g->values.size(), w.values.size());
    EXPECT_EQ(0, std::memcmp(g->values.data(), w.values.data(), w.values.size() * sizeof(float)))
        << w.name;
  }
}

std::string load_error(const fs::path& dir) {
  try {
    load_checkpoint(dir);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(Checkpoint, RoundTripIsBitExact) {
  TempDir tmp;
  const Fixture f(1);
  const nlohmann::json state = {{"config", {{"lr", 3e-4}, {"seq_len", 64}}},
                                {"data", {{"seed", 1234}}},
                                {"metrics", {{"loss", 2.5}}}};
  const fs::path dir = f.save(tmp.path, 120, 3, state);
  EXPECT_EQ(dir, tmp.path / "checkpoints" / "step-00000120");
  EXPECT_TRUE(fs::is_regular_file(dir / "model.safetensors"));
  EXPECT_TRUE(fs::is_regular_file(dir / "optimizer.safetensors"));
  EXPECT_TRUE(fs::is_regular_file(dir / "state.json"));

  const LoadedCheckpoint loaded = load_checkpoint(dir);
  EXPECT_EQ(loaded.step, 120);
  EXPECT_EQ(loaded.dir, dir);
  expect_same_bits(loaded.model, f.model);
  expect_same_bits(loaded.optimizer, f.optimizer);
  nlohmann::json want = state;
  want["step"] = 120;
  EXPECT_EQ(loaded.state, want);

  // The model file is a plain HF-style safetensors file with the metadata the header promises.
  const io::SafetensorsFile model = io::SafetensorsFile::open(dir / "model.safetensors");
  EXPECT_EQ(model.metadata().at("format"), "pt");
  EXPECT_EQ(model.metadata().at("step"), "120");
  EXPECT_EQ(model.get("model.norm.weight").dtype, io::Dtype::F32);
}

TEST(Checkpoint, LatestPointsToTheNewestAndKeepPrunes) {
  TempDir tmp;
  const Fixture f(2);
  EXPECT_EQ(latest_checkpoint(tmp.path), std::nullopt);
  for (const int64_t step : {100, 200, 300, 400, 500}) {
    f.save(tmp.path, step, 2);
    EXPECT_EQ(latest_checkpoint(tmp.path), tmp.path / "checkpoints" / checkpoint_dir_name(step));
    EXPECT_EQ(read_text(tmp.path / "checkpoints" / "latest"), checkpoint_dir_name(step) + "\n");
  }
  const std::vector<fs::path> left = list_checkpoints(tmp.path);
  ASSERT_EQ(left.size(), 2u);
  EXPECT_EQ(left[0].filename(), "step-00000400");
  EXPECT_EQ(left[1].filename(), "step-00000500");
}

TEST(Checkpoint, SavingTheSameStepAgainReplacesIt) {
  TempDir tmp;
  const Fixture a(3), b(4);
  a.save(tmp.path, 50);
  b.save(tmp.path, 50);
  expect_same_bits(load_checkpoint(tmp.path / "checkpoints" / "step-00000050").model, b.model);
  EXPECT_EQ(list_checkpoints(tmp.path).size(), 1u);
}

TEST(Checkpoint, ResumingFromAnEarlierCheckpointKeepsTheLaterOnes) {
  TempDir tmp;
  const Fixture f(5);
  f.save(tmp.path, 100, 1);
  f.save(tmp.path, 200, 1);  // prunes 100
  ASSERT_EQ(list_checkpoints(tmp.path).size(), 1u);
  f.save(tmp.path, 150, 1);  // a run resumed elsewhere: 200 is not deleted, latest is 150
  EXPECT_EQ(list_checkpoints(tmp.path).size(), 2u);
  EXPECT_EQ(latest_checkpoint(tmp.path)->filename(), "step-00000150");
}

TEST(Checkpoint, CrashLeftoversAreIgnoredAndCleaned) {
  TempDir tmp;
  const Fixture f(6);
  f.save(tmp.path, 10);
  // A writer killed mid-write: a half-written directory with a dead writer's pid (pid numbers
  // above the kernel's pid_max, 2^22, are never in use).
  const fs::path torn = tmp.path / "checkpoints" / "step-00000020.tmp-9999999";
  fs::create_directories(torn);
  write_text(torn / "model.safetensors", "garbage");
  // ... and one of this very process (a save that threw earlier).
  const fs::path own = tmp.path / "checkpoints" / ("step-00000030.tmp-" + std::to_string(::getpid()));
  fs::create_directories(own);
  EXPECT_EQ(latest_checkpoint(tmp.path)->filename(), "step-00000010");
  EXPECT_EQ(list_checkpoints(tmp.path).size(), 1u);
  // Even without `latest`, the scan ignores the leftovers.
  fs::remove(tmp.path / "checkpoints" / "latest");
  EXPECT_EQ(latest_checkpoint(tmp.path)->filename(), "step-00000010");
  f.save(tmp.path, 40);
  EXPECT_FALSE(fs::exists(torn));
  EXPECT_FALSE(fs::exists(own));
  EXPECT_EQ(latest_checkpoint(tmp.path)->filename(), "step-00000040");
}

TEST(Checkpoint, DanglingOrCorruptLatest) {
  TempDir tmp;
  const Fixture f(7);
  f.save(tmp.path, 10);
  f.save(tmp.path, 20);
  write_text(tmp.path / "checkpoints" / "latest", "step-00000099\n");  // gone: fall back to a scan
  EXPECT_EQ(latest_checkpoint(tmp.path)->filename(), "step-00000020");
  write_text(tmp.path / "checkpoints" / "latest", "../../etc\n");
  EXPECT_THROW(latest_checkpoint(tmp.path), InputError);
}

TEST(Checkpoint, CorruptOrMissingFilesNameTheFile) {
  TempDir tmp;
  const Fixture f(8);
  const fs::path dir = f.save(tmp.path, 7);
  const fs::path copy = tmp.path / "copy" / "step-00000007";

  auto fresh_copy = [&] {
    fs::remove_all(copy);
    fs::create_directories(copy.parent_path());
    fs::copy(dir, copy);
  };
  auto expect_error = [&](const std::string& file, const std::string& problem) {
    const std::string message = load_error(copy);
    EXPECT_NE(message.find(file), std::string::npos) << message;
    EXPECT_NE(message.find(problem), std::string::npos) << message;
  };

  fresh_copy();
  EXPECT_EQ(load_error(copy), "");

  fresh_copy();
  fs::remove(copy / "optimizer.safetensors");
  expect_error("optimizer.safetensors", "missing");

  fresh_copy();
  fs::remove(copy / "state.json");
  expect_error("state.json", "missing");

  fresh_copy();
  write_text(copy / "model.safetensors", read_text(copy / "model.safetensors").substr(0, 100));
  expect_error("model.safetensors", "");

  fresh_copy();
  write_text(copy / "state.json", "{\"step\": 7, ");
  expect_error("state.json", "not valid JSON");

  fresh_copy();
  write_text(copy / "state.json", "{\"step\": 8}");
  expect_error("state.json", "differs");

  fresh_copy();
  write_text(copy / "state.json", "[7]");
  expect_error("state.json", "\"step\"");

  // A BF16 tensor where F32 is required.
  fresh_copy();
  const std::vector<uint8_t> two_bf16(4, 0);
  io::write_safetensors(copy / "model.safetensors",
                        {{"model.norm.weight", io::Dtype::BF16, {2}, two_bf16}},
                        {{"format", "pt"}, {"step", "7"}});
  expect_error("model.safetensors", "BF16");

  // Moments of a parameter the model lacks.
  fresh_copy();
  const std::vector<float> one(1, 0.0f);
  const std::span<const uint8_t> one_bytes(reinterpret_cast<const uint8_t*>(one.data()), 4);
  io::write_safetensors(copy / "optimizer.safetensors",
                        {{"nope.exp_avg", io::Dtype::F32, {1}, one_bytes}});
  expect_error("optimizer.safetensors", "nope.exp_avg");

  // A directory whose name is not a checkpoint's.
  EXPECT_NE(load_error(tmp.path / "copy").find("step-XXXXXXXX"), std::string::npos);
}

TEST(Checkpoint, RejectsBadArguments) {
  TempDir tmp;
  const Fixture f(9);
  EXPECT_THROW(f.save(tmp.path, -1), InputError);
  EXPECT_THROW(f.save(tmp.path, 100'000'000), InputError);
  EXPECT_THROW(f.save(tmp.path, 5, 0), InputError);
  EXPECT_THROW(f.save(tmp.path, 5, 1, nlohmann::json{{"step", 6}}), InputError);
  EXPECT_THROW(f.save(tmp.path, 5, 1, nlohmann::json::array()), InputError);
  std::vector<TensorView> wrong = Fixture::views(f.model);
  wrong[1].shape = {9};  // 8 values
  EXPECT_THROW(save_checkpoint(tmp.path, 5, wrong, {}, nlohmann::json::object(), 1), InputError);
  // Nothing half-written is left behind.
  EXPECT_TRUE(list_checkpoints(tmp.path).empty());
  for (const auto& entry : fs::directory_iterator(tmp.path / "checkpoints")) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
  }
}

TEST(Checkpoint, AdamWStateSurvivesACheckpoint) {
  TempDir tmp;
  std::mt19937 gen(10);
  std::normal_distribution<float> normal;
  std::vector<float> w(300), n(12), gw(300), gn(12);
  for (float& x : w) x = normal(gen);
  for (float& x : n) x = 1.0f;
  auto randomize = [&] {
    for (float& x : gw) x = normal(gen);
    for (float& x : gn) x = normal(gen);
  };
  const std::vector<ParamView> params = {{"w", w, gw, true}, {"n", n, gn, false}};
  AdamW adamw({});
  for (int s = 0; s < 3; ++s) {
    randomize();
    adamw.step(params, 1e-3);
  }
  const std::vector<TensorView> model = {{"w", {30, 10}, w}, {"n", {12}, n}};
  const std::vector<TensorView> moments = adamw_state_views(adamw, model);
  ASSERT_EQ(moments.size(), 4u);
  EXPECT_EQ(moments[0].name, "w.exp_avg");
  EXPECT_EQ(moments[0].shape, (std::vector<int64_t>{30, 10}));
  save_checkpoint(tmp.path, 3, model, moments, {{"optimizer_steps", adamw.steps_taken()}}, 1);

  // Continue the original for one step, and a restored copy for the same step.
  randomize();
  std::vector<float> w_restored = w, n_restored = n;
  adamw.step(params, 1e-3);
  const LoadedCheckpoint loaded = load_checkpoint(*latest_checkpoint(tmp.path));
  AdamW restored({});
  restore_adamw_state(restored, loaded.optimizer, loaded.state["optimizer_steps"].get<int64_t>());
  EXPECT_EQ(restored.steps_taken(), 3);
  const std::vector<ParamView> restored_params = {{"w", w_restored, gw, true},
                                                  {"n", n_restored, gn, false}};
  restored.step(restored_params, 1e-3);
  EXPECT_EQ(0, std::memcmp(w.data(), w_restored.data(), w.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(n.data(), n_restored.data(), n.size() * sizeof(float)));

  const std::vector<NamedTensor> lonely = {{"w.exp_avg", {1}, {0.0f}}};
  EXPECT_THROW(restore_adamw_state(restored, lonely, 1), InputError);
}

// The ef rule's carried error through state.safetensors: the restored rule serves the next step
// bit for bit as the original does; model.safetensors keeps only the master; bad state is named.
TEST(Checkpoint, ExportStateRoundTripsThroughStateSafetensors) {
  const TempDir tmp;
  std::mt19937 gen(11);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> w(24 * 40), n(40), served_w(w.size()), served_n(n.size());
  for (float& x : w) x = normal(gen);
  for (float& x : n) x = 1.0f + normal(gen);
  const std::vector<TensorView> model = {{"w", {24, 40}, w}, {"n", {40}, n}};
  auto export_step = [&](ExportRule& rule, std::vector<float>& sw, std::vector<float>& sn, uint64_t step) {
    rule.apply(0, w, sw, 24, 40, step);
    rule.apply(1, n, sn, 1, 40, step);
  };
  const auto ef = make_export_rule("ef", numerics::Format::bf16, 1);
  for (uint64_t step = 0; step < 3; ++step) {
    for (float& x : w) x += 1e-5f * normal(gen);  // updates below half a bf16 ulp: error carries
    export_step(*ef, served_w, served_n, step);
  }
  const std::vector<NamedTensor> state = export_state_tensors(*ef, model);
  ASSERT_FALSE(state.empty());
  EXPECT_EQ(state[0].name, "export.w");
  EXPECT_EQ(state[0].shape, (std::vector<int64_t>{24, 40}));
  std::vector<TensorView> state_views;
  for (const NamedTensor& t : state) state_views.push_back({t.name, t.shape, t.values});
  save_checkpoint(tmp.path, 3, model, {}, nlohmann::json::object(), 1, state_views);

  const LoadedCheckpoint loaded = load_checkpoint(*latest_checkpoint(tmp.path));
  for (const NamedTensor& t : loaded.model) EXPECT_FALSE(t.name.starts_with("export.")) << t.name;
  expect_same_bits(loaded.state_tensors, state);
  const auto restored = make_export_rule("ef", numerics::Format::bf16, 1);
  const fs::path file = loaded.dir / "state.safetensors";
  restore_export_state(*restored, loaded.state_tensors, model, file);
  std::vector<float> rw(w.size()), rn(n.size());
  export_step(*ef, served_w, served_n, 3);
  export_step(*restored, rw, rn, 3);
  EXPECT_EQ(0, std::memcmp(served_w.data(), rw.data(), rw.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(served_n.data(), rn.data(), rn.size() * sizeof(float)));
  // Without the restored error the served copy differs (the test can fail).
  const auto unrestored = make_export_rule("ef", numerics::Format::bf16, 1);
  std::vector<float> uw(w.size()), un(n.size());
  export_step(*unrestored, uw, un, 3);
  EXPECT_NE(0, std::memcmp(served_w.data(), uw.data(), uw.size() * sizeof(float)));

  // Errors name the file and the tensor.
  auto expect_error = [&](ExportRule& rule, const std::vector<NamedTensor>& tensors, const std::string& fragment) {
    try {
      restore_export_state(rule, tensors, model, file);
      ADD_FAILURE() << "no error for " << fragment;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(file.string()), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  const auto fresh = make_export_rule("ef", numerics::Format::bf16, 1);
  expect_error(*fresh, {{"export.v", {24, 40}, state[0].values}}, "'export.v' names no parameter");
  expect_error(*fresh, {{"export.w", {40, 24}, state[0].values}}, "'export.w' has shape [40, 24], the parameter [24, 40]");
  const auto rne = make_export_rule("rne", numerics::Format::bf16, 1);
  expect_error(*rne, state, "keeps no state");
  expect_error(*fresh, {}, "holds no state for the 'ef' export rule");
  // ef into f32 is a copy: it keeps no state, and a checkpoint without any is fine.
  EXPECT_NO_THROW(restore_export_state(*make_export_rule("ef", numerics::Format::f32, 1), {}, model, file));
  // A checkpoint without state tensors has no state.safetensors, and loads with none.
  save_checkpoint(tmp.path, 4, model, {}, nlohmann::json::object(), 1);
  EXPECT_FALSE(fs::exists(tmp.path / "checkpoints" / "step-00000004" / "state.safetensors"));
  EXPECT_TRUE(load_checkpoint(tmp.path / "checkpoints" / "step-00000004").state_tensors.empty());
}

// --- progress and metrics -------------------------------------------------------------------

TEST(Progress, FormatsDurationsAndRates) {
  EXPECT_EQ(format_duration(0), "0s");
  EXPECT_EQ(format_duration(42.4), "42s");
  EXPECT_EQ(format_duration(59.6), "1m00s");
  EXPECT_EQ(format_duration(65), "1m05s");
  EXPECT_EQ(format_duration(3599), "59m59s");
  EXPECT_EQ(format_duration(2 * 3600 + 3 * 60 + 10), "2h03m");
  EXPECT_EQ(format_duration(3 * 86400 + 4 * 3600), "3d04h");
  EXPECT_EQ(format_duration(-1), "--");
  EXPECT_EQ(format_duration(std::numeric_limits<double>::infinity()), "--");

  EXPECT_EQ(format_rate(0), "0");
  EXPECT_EQ(format_rate(950.2), "950");
  EXPECT_EQ(format_rate(999.6), "1.00k");
  EXPECT_EQ(format_rate(1234), "1.23k");
  EXPECT_EQ(format_rate(12'345), "12.3k");
  EXPECT_EQ(format_rate(123'456), "123k");
  EXPECT_EQ(format_rate(999'960), "1.00M");
  EXPECT_EQ(format_rate(4'560'000), "4.56M");
  EXPECT_EQ(format_rate(1.2e9), "1.20G");
  EXPECT_EQ(format_rate(std::nan("")), "--");
}

TEST(Progress, Line) {
  EXPECT_EQ(format_progress_line(120, 600, 2.3141, 12'345, 65, 10),
            "[##........] step 120/600  loss 2.314  12.3k tok/s  ETA 1m05s");
  EXPECT_EQ(format_progress_line(600, 600, 1.0, 500, 0, 4), "[####] step 600/600  loss 1.000  500 tok/s  ETA 0s");
  EXPECT_EQ(format_progress_line(0, 600, 5.5, 0, -1, 4), "[....] step 0/600  loss 5.500  0 tok/s  ETA --");
}

TEST(Progress, PlainLinesEveryFivePercent) {
  // Non-interactive output (a CI log): the first update, one line per 5% and the last step.
  std::FILE* out = std::tmpfile();
  ASSERT_NE(out, nullptr);
  {
    ProgressBar bar(out, false);
    for (int64_t step = 1; step <= 200; ++step) bar.update(step, 200, 1.0, 100.0);
    bar.message("checkpoint saved");
    bar.finish();
  }
  std::rewind(out);
  std::string text;
  for (int c; (c = std::fgetc(out)) != EOF;) text += static_cast<char>(c);
  std::fclose(out);
  int lines = 0;
  for (const char c : text) lines += c == '\n';
  EXPECT_EQ(lines, 21 + 1);  // steps 1, 10, 20, ..., 200 and the message
  EXPECT_EQ(text.find('\r'), std::string::npos);
  EXPECT_NE(text.find("step 200/200"), std::string::npos);
  EXPECT_NE(text.find("checkpoint saved\n"), std::string::npos);
}

TEST(Progress, TerminalRedrawsInPlace) {
  std::FILE* out = std::tmpfile();
  ASSERT_NE(out, nullptr);
  {
    ProgressBar bar(out, true);
    bar.update(1, 3, 2.0, 10.0);
    bar.message("note");
    bar.update(3, 3, 1.5, 10.0);  // the last step is always drawn
    bar.finish();
  }
  std::rewind(out);
  std::string text;
  for (int c; (c = std::fgetc(out)) != EOF;) text += static_cast<char>(c);
  std::fclose(out);
  // The bar, cleared and replaced by the message, redrawn, then the final state and a newline.
  EXPECT_EQ(text.find("\r[######"), 0u) << text;
  EXPECT_NE(text.find("\rnote\n\r[######"), std::string::npos) << text;
  EXPECT_NE(text.find("\r[####################] step 3/3  loss 1.500"), std::string::npos) << text;
  EXPECT_TRUE(text.ends_with("\n")) << text;
  int newlines = 0;
  for (const char c : text) newlines += c == '\n';
  EXPECT_EQ(newlines, 2);
}

TEST(Metrics, AppendsAndTruncatesAfterAStep) {
  TempDir tmp;
  const fs::path path = tmp.path / "run" / "metrics.jsonl";
  {
    MetricsWriter metrics(path);
    metrics.write({{"event", "start"}});
    for (int step = 10; step <= 50; step += 10) metrics.write({{"step", step}, {"loss", 0.5 * step}});
  }
  {
    MetricsWriter metrics(path);  // a second run appends
    metrics.write({{"step", 60}, {"loss", 30.0}});
  }
  std::ofstream(path, std::ios::app) << "{\"step\": 70, \"lo";  // killed mid-line
  EXPECT_EQ(truncate_after_step(path, 30), 4);  // 40, 50, 60 and the torn line
  const std::string text = read_text(path);
  EXPECT_EQ(text,
            "{\"event\":\"start\"}\n{\"loss\":5.0,\"step\":10}\n{\"loss\":10.0,\"step\":20}\n"
            "{\"loss\":15.0,\"step\":30}\n");
  {
    MetricsWriter metrics(path);  // the resumed run continues the file
    metrics.write({{"step", 40}});
  }
  EXPECT_TRUE(read_text(path).ends_with("{\"loss\":15.0,\"step\":30}\n{\"step\":40}\n"));
  EXPECT_EQ(truncate_after_step(tmp.path / "absent.jsonl", 5), 0);
  EXPECT_FALSE(fs::exists(tmp.path / "absent.jsonl"));
  write_text(path, "{\"step\": 1}\nnot json\n{\"step\": 2}\n");
  EXPECT_THROW(truncate_after_step(path, 5), InputError);
}

// The run-directory building blocks (issue 26): discarding the previous run's files, and a folder
// written as a whole.
TEST(RunDir, DiscardRemovesTheNamedFilesAndLeftovers) {
  TempDir tmp;
  const fs::path run = tmp.path;
  fs::create_directories(run / "checkpoints/step-00000004");
  std::ofstream(run / "config.json") << "{}";
  std::ofstream(run / "metrics.jsonl") << "{}\n";
  std::ofstream(run / "keep.txt") << "mine";
  fs::create_directories(run / ".discarded.tmp-999999999/checkpoints");  // a killed discard's
  const std::vector<std::string> names = {"config.json", "checkpoints", "final", "metrics.jsonl"};
  discard_run_files(run, names);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(run)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"keep.txt"});
}

TEST(RunDir, AFolderIsWrittenAsAWholeOrNotAtAll) {
  TempDir tmp;
  const fs::path target = tmp.path / "final";
  io::write_directory_atomic(target, [](const fs::path& dir) { std::ofstream(dir / "a") << "one"; });
  EXPECT_TRUE(fs::exists(target / "a"));
  // A writer that fails half-way leaves the old folder as it was, and no temporary one.
  EXPECT_THROW(io::write_directory_atomic(target,
                                      [](const fs::path& dir) {
                                        std::ofstream(dir / "b") << "half";
                                        throw InputError("disk full");
                                      }),
               InputError);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(tmp.path)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"final"});
  EXPECT_TRUE(fs::exists(target / "a"));
  EXPECT_FALSE(fs::exists(target / "b"));
  // A second write replaces the whole folder (no file of the old one survives).
  io::write_directory_atomic(target, [](const fs::path& dir) { std::ofstream(dir / "c") << "two"; });
  EXPECT_FALSE(fs::exists(target / "a"));
  EXPECT_TRUE(fs::exists(target / "c"));
  // Temporaries of a killed writer (a pid that cannot run) go; a running writer's stays.
  fs::create_directories(tmp.path / "final.tmp-999999999");
  fs::create_directories(tmp.path / "final.tmp-999999999.old");
  fs::create_directories(tmp.path / "final.tmp-1");  // pid 1 runs
  fs::create_directories(tmp.path / "final.tmp-x");   // not a temporary of ours
  io::write_directory_atomic(target, [](const fs::path& dir) { std::ofstream(dir / "d") << "three"; });
  left.clear();
  for (const auto& e : fs::directory_iterator(tmp.path)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"final", "final.tmp-1", "final.tmp-x"}));
  // The parent is never created.
  EXPECT_THROW(io::write_directory_atomic(tmp.path / "missing" / "final", [](const fs::path&) {}), InputError);
}

TEST(RunDir, FirstDifferenceNamesTheDottedKey) {
  using nlohmann::json;
  EXPECT_FALSE(first_difference(json{{"a", 1}}, json{{"a", 1}}).has_value());
  EXPECT_EQ(*first_difference(json{{"train", {{"lr", 1}, {"seed", 1}}}}, json{{"train", {{"lr", 1}, {"seed", 2}}}}),
            "train.seed");
  EXPECT_EQ(*first_difference(json{{"a", 1}}, json{{"a", 1}, {"b", 2}}), "b");
  EXPECT_EQ(*first_difference(json(1), json(2)), "");
}

}  // namespace
}  // namespace concord::train
