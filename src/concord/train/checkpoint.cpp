// Training checkpoints: atomic directory writes, `latest`, pruning, validated loads (see
// checkpoint.h).
#include "concord/train/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "concord/io/atomic_file.h"
#include "concord/io/safetensors.h"
#include "concord/numerics/check.h"

namespace concord::train {
namespace fs = std::filesystem;

namespace {

constexpr std::string_view kPrefix = "step-";
constexpr int kStepDigits = 8;
constexpr int64_t kStepLimit = 100'000'000;  // 10^kStepDigits
constexpr std::string_view kTmpMarker = ".tmp-";
constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kStateFile = "state.json";
constexpr const char* kStateTensorsFile = "state.safetensors";
constexpr const char* kLatestFile = "latest";

// The step of a complete checkpoint directory name ("step-" and exactly 8 digits), or -1.
int64_t step_of_name(std::string_view name) {
  if (name.size() != kPrefix.size() + kStepDigits || !name.starts_with(kPrefix)) return -1;
  int64_t step = 0;
  for (const char c : name.substr(kPrefix.size())) {
    if (c < '0' || c > '9') return -1;
    step = step * 10 + (c - '0');
  }
  return step;
}

// The writer's pid of a "step-XXXXXXXX.tmp-<pid>[...]" directory name, or -1 for other names.
long tmp_writer_pid(std::string_view name) {
  const size_t at = name.find(kTmpMarker);
  if (!name.starts_with(kPrefix) || at == std::string_view::npos) return -1;
  long pid = 0;
  size_t i = at + kTmpMarker.size();
  if (i >= name.size() || name[i] < '0' || name[i] > '9') return -1;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) {
    pid = pid * 10 + (name[i] - '0');
    if (pid > 1'000'000'000) return -1;
  }
  return pid;
}

// Removes step-*.tmp-<pid>* directories whose writer is this process or no longer runs.
void remove_stale_tmp_dirs(const fs::path& checkpoints) {
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(checkpoints, ec)) {
    const std::string name = entry.path().filename().string();
    const long pid = tmp_writer_pid(name);
    if (pid < 0) continue;
    const bool alive = pid != ::getpid() &&
                       (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
    if (!alive) fs::remove_all(entry.path(), ec);
  }
}

void write_tensors(const fs::path& path, std::span<const TensorView> tensors, int64_t step) {
  std::vector<io::TensorToWrite> out;
  out.reserve(tensors.size());
  for (const TensorView& t : tensors) {
    int64_t numel = 1;
    for (const int64_t d : t.shape) numel = d < 0 ? -1 : numel * d;
    if (numel != static_cast<int64_t>(t.values.size())) {
      throw InputError(fmt::format("[checkpoint] {}: tensor '{}' has shape {} but {} values",
                                   path.string(), t.name, io::shape_text(t.shape),
                                   t.values.size()));
    }
    out.push_back({t.name, io::Dtype::F32, t.shape,
                   {reinterpret_cast<const uint8_t*>(t.values.data()), t.values.size_bytes()}});
  }
  io::write_safetensors(path, std::move(out), {{"format", "pt"}, {"step", std::to_string(step)}});
}

std::vector<NamedTensor> read_tensors(const fs::path& path, int64_t step) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    throw InputError(fmt::format("[checkpoint] {}: missing; the checkpoint is incomplete",
                                 path.string()));
  }
  const io::SafetensorsFile file = io::SafetensorsFile::open(path);
  const auto& meta = file.metadata();
  if (const auto it = meta.find("step"); it != meta.end() && it->second != std::to_string(step)) {
    throw InputError(fmt::format("[checkpoint] {}: metadata step '{}' differs from the "
                                 "directory's step {}",
                                 path.string(), it->second, step));
  }
  std::vector<NamedTensor> tensors;
  for (const io::TensorInfo& info : file.tensors()) {
    if (info.dtype != io::Dtype::F32) {
      throw InputError(fmt::format("[checkpoint] {}: tensor '{}' is {}; checkpoints hold F32",
                                   path.string(), info.name, io::dtype_name(info.dtype)));
    }
    tensors.push_back({info.name, info.shape, io::tensor_to_floats(info)});
  }
  std::sort(tensors.begin(), tensors.end(),
            [](const NamedTensor& a, const NamedTensor& b) { return a.name < b.name; });
  return tensors;
}

nlohmann::json read_state(const fs::path& path, int64_t step) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw InputError(fmt::format("[checkpoint] {}: missing or unreadable; the checkpoint is "
                                 "incomplete",
                                 path.string()));
  }
  std::ostringstream text;
  text << in.rdbuf();
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(std::move(text).str());
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("[checkpoint] {}: not valid JSON ({})", path.string(), e.what()));
  }
  if (!state.is_object() || !state.contains("step") || !state["step"].is_number_integer()) {
    throw InputError(fmt::format("[checkpoint] {}: must be a JSON object with an integer "
                                 "\"step\"",
                                 path.string()));
  }
  if (state["step"].get<int64_t>() != step) {
    throw InputError(fmt::format("[checkpoint] {}: step {} differs from the directory's step {}",
                                 path.string(), state["step"].get<int64_t>(), step));
  }
  return state;
}

}  // namespace

std::string checkpoint_dir_name(int64_t step) {
  if (step < 0 || step >= kStepLimit) {
    throw InputError(fmt::format("[checkpoint] step {} is outside [0, {})", step, kStepLimit));
  }
  return fmt::format("{}{:0{}d}", kPrefix, step, kStepDigits);
}

fs::path save_checkpoint(const fs::path& run_dir, int64_t step, std::span<const TensorView> model,
                         std::span<const TensorView> optimizer, const nlohmann::json& state,
                         int keep, std::span<const TensorView> state_tensors) {
  const std::string name = checkpoint_dir_name(step);
  if (keep < 1) throw InputError(fmt::format("[checkpoint] keep {} must be >= 1", keep));
  if (!state.is_object()) {
    throw InputError("[checkpoint] the state to save must be a JSON object");
  }
  if (state.contains("step") &&
      !(state["step"].is_number_integer() && state["step"].get<int64_t>() == step)) {
    throw InputError(fmt::format("[checkpoint] state \"step\" {} differs from the step {} being "
                                 "saved",
                                 state["step"].dump(), step));
  }
  nlohmann::json full_state = state;
  full_state["step"] = step;
  std::string state_text;
  try {
    state_text = full_state.dump(2) + "\n";
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("[checkpoint] the state cannot be written as JSON ({})",
                                 e.what()));
  }

  const fs::path checkpoints = run_dir / "checkpoints";
  const fs::path final_dir = checkpoints / name;
  try {
    fs::create_directories(checkpoints);
    remove_stale_tmp_dirs(checkpoints);
  } catch (const fs::filesystem_error& e) {
    throw InputError(fmt::format("[checkpoint] {}: {}", checkpoints.string(), e.what()));
  }
  io::write_directory_atomic(final_dir, [&](const fs::path& dir) {
    write_tensors(dir / kModelFile, model, step);
    write_tensors(dir / kOptimizerFile, optimizer, step);
    if (!state_tensors.empty()) write_tensors(dir / kStateTensorsFile, state_tensors, step);
    io::write_file_atomic(dir / kStateFile, std::string_view(state_text));
  });
  io::write_file_atomic(checkpoints / kLatestFile, std::string_view(name + "\n"));

  // Pruning: the new checkpoint and the keep - 1 newest below it stay. Checkpoints of higher
  // steps (left by a continuation abandoned when the run was resumed from an earlier one) are
  // neither counted nor deleted: they may be wanted, and `latest` no longer names them.
  std::vector<fs::path> older;
  for (const fs::path& dir : list_checkpoints(run_dir)) {
    if (step_of_name(dir.filename().string()) < step) older.push_back(dir);
  }
  const auto excess = static_cast<int64_t>(older.size()) - (keep - 1);
  std::error_code ec;
  for (int64_t i = 0; i < excess; ++i) fs::remove_all(older[static_cast<size_t>(i)], ec);
  return final_dir;
}

std::vector<fs::path> list_checkpoints(const fs::path& run_dir) {
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(run_dir / "checkpoints", ec)) {
    const int64_t step = step_of_name(entry.path().filename().string());
    if (step >= 0 && entry.is_directory(ec)) found.emplace_back(step, entry.path());
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> dirs;
  for (auto& [step, dir] : found) dirs.push_back(std::move(dir));
  return dirs;
}

std::optional<fs::path> latest_checkpoint(const fs::path& run_dir) {
  const fs::path latest = run_dir / "checkpoints" / kLatestFile;
  std::ifstream in(latest);
  if (in) {
    std::string name;
    std::getline(in, name);
    while (!name.empty() && (name.back() == '\r' || name.back() == ' ')) name.pop_back();
    if (step_of_name(name) < 0) {
      throw InputError(fmt::format("[checkpoint] {}: holds '{}', not a checkpoint directory "
                                   "name (step-XXXXXXXX); fix or delete it",
                                   latest.string(), name.substr(0, 64)));
    }
    std::error_code ec;
    const fs::path dir = run_dir / "checkpoints" / name;
    if (fs::is_directory(dir, ec)) return dir;
  }
  const std::vector<fs::path> all = list_checkpoints(run_dir);
  if (all.empty()) return std::nullopt;
  return all.back();
}

LoadedCheckpoint load_checkpoint(const fs::path& checkpoint_dir) {
  fs::path dir = checkpoint_dir.lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw InputError(fmt::format("[checkpoint] {}: not a directory", dir.string()));
  }
  const int64_t step = step_of_name(dir.filename().string());
  if (step < 0) {
    throw InputError(fmt::format("[checkpoint] {}: not a checkpoint directory (the name must be "
                                 "step-XXXXXXXX)",
                                 dir.string()));
  }
  LoadedCheckpoint out;
  out.step = step;
  out.dir = dir;
  out.state = read_state(dir / kStateFile, step);
  out.model = read_tensors(dir / kModelFile, step);
  out.optimizer = read_tensors(dir / kOptimizerFile, step);
  if (fs::exists(dir / kStateTensorsFile, ec)) out.state_tensors = read_tensors(dir / kStateTensorsFile, step);
  for (const NamedTensor& t : out.optimizer) {
    std::string_view base = t.name;
    bool known = false;
    std::string_view key_of;
    for (const std::string& key : optimizer_state_keys()) {
      if (base.size() > key.size() + 1 && base.ends_with(key) && base[base.size() - key.size() - 1] == '.') {
        base.remove_suffix(key.size() + 1);
        key_of = std::string_view(t.name).substr(base.size() + 1);
        known = true;
        break;
      }
    }
    if (!known) {
      throw InputError(fmt::format("[checkpoint] {}: tensor '{}' is no optimizer state "
                                   "<param>.<{}>",
                                   (dir / kOptimizerFile).string(), t.name,
                                   fmt::join(optimizer_state_keys(), "|")));
    }
    const NamedTensor* param = find_tensor(out.model, base);
    if (param == nullptr || optimizer_state_shape(key_of, param->shape) != t.shape) {
      throw InputError(fmt::format(
          "[checkpoint] {}: tensor '{}' {} matches no parameter of that shape in {}",
          (dir / kOptimizerFile).string(), t.name, io::shape_text(t.shape), kModelFile));
    }
  }
  return out;
}

const NamedTensor* find_tensor(std::span<const NamedTensor> tensors, std::string_view name) {
  for (const NamedTensor& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::vector<TensorView> adamw_state_views(const AdamW& optimizer,
                                          std::span<const TensorView> model) {
  return optimizer.state_views(model);
}

void restore_adamw_state(AdamW& optimizer, std::span<const NamedTensor> tensors,
                         int64_t steps_taken) {
  optimizer.restore_state(tensors, {}, steps_taken);
}

namespace {
constexpr std::string_view kExportPrefix = "export.";
}  // namespace

std::vector<NamedTensor> export_state_tensors(const ExportRule& rule, std::span<const TensorView> model) {
  std::vector<NamedTensor> out;
  for (auto& [param, values] : rule.state()) {
    const TensorView& p = model[static_cast<size_t>(param)];
    out.push_back({std::string(kExportPrefix) + p.name, p.shape, std::move(values)});
  }
  return out;
}

void restore_export_state(ExportRule& rule, std::span<const NamedTensor> tensors,
                          std::span<const TensorView> model, const fs::path& file) {
  bool restored = false;
  for (const NamedTensor& t : tensors) {
    if (!t.name.starts_with(kExportPrefix)) continue;
    restored = true;
    const std::string_view name = std::string_view(t.name).substr(kExportPrefix.size());
    const auto p = std::find_if(model.begin(), model.end(), [&](const TensorView& v) { return v.name == name; });
    if (p == model.end())
      throw InputError(fmt::format("[checkpoint] {}: '{}' names no parameter of the model", file.string(), t.name));
    if (p->shape != t.shape)
      throw InputError(fmt::format("[checkpoint] {}: '{}' has shape {}, the parameter {}", file.string(),
                                   t.name, io::shape_text(t.shape), io::shape_text(p->shape)));
    const bool matrix = p->shape.size() == 2;  // rows x cols as the rules see it; 1-D: one row
    try {
      rule.restore_state(static_cast<int>(p - model.begin()), t.values, matrix ? p->shape[0] : 1,
                         matrix ? p->shape[1] : static_cast<int64_t>(t.values.size()));
    } catch (const InputError& e) {
      throw InputError(fmt::format("[checkpoint] {}: {}", file.string(), e.what()));
    }
  }
  const bool any_matrix = std::any_of(model.begin(), model.end(), [](const TensorView& v) { return v.shape.size() == 2; });
  if (rule.keeps_state() && any_matrix && !restored)
    throw InputError(fmt::format("[checkpoint] {}: holds no state for the '{}' export rule (written by a "
                                 "concord that did not save it?); resuming without it would not "
                                 "continue the run: start afresh (--no-resume)",
                                 file.string(), rule.name()));
}

// --- run directories ----------------------------------------------------------------------------

std::optional<std::string> first_difference(const nlohmann::json& a, const nlohmann::json& b) {
  if (a == b) return std::nullopt;
  if (!a.is_object() || !b.is_object()) return std::string();
  std::vector<std::string> keys;
  for (const auto& [key, value] : a.items()) keys.push_back(key);
  for (const auto& [key, value] : b.items())
    if (!a.contains(key)) keys.push_back(key);
  for (const std::string& key : keys) {
    if (!a.contains(key) || !b.contains(key)) return key;
    if (auto inner = first_difference(a.at(key), b.at(key)))
      return inner->empty() ? key : key + "." + *inner;
  }
  return std::string();  // not reached: the objects differ in some key
}

namespace {

// The value at a dotted key of `j`, or "(absent)", cut short for a message.
std::string value_text(const nlohmann::json& j, const std::string& dotted) {
  const nlohmann::json* at = &j;
  size_t start = 0;
  while (!dotted.empty() && start <= dotted.size()) {
    const size_t dot = dotted.find('.', start);
    const std::string key = dotted.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!at->is_object() || !at->contains(key)) return "(absent)";
    at = &at->at(key);
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  std::string text = at->dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

}  // namespace

void check_checkpoint_config(const LoadedCheckpoint& ckpt, const nlohmann::json& identity,
                             std::string_view layer) {
  if (!ckpt.state.contains("config"))
    throw InputError(fmt::format("[{}] {}: state.json records no config (written by an older concord?), so "
                                 "nothing shows that it belongs to this run; start afresh (--no-resume "
                                 "or another --out)", layer, ckpt.dir.string()));
  const nlohmann::json& saved = ckpt.state.at("config");
  if (const auto key = first_difference(saved, identity)) {
    const std::string where = key->empty() ? "config" : "'" + *key + "'";
    throw InputError(fmt::format("[{}] {}: written by a run with another {} ({} there, {} in this config); "
                                 "resuming it would continue another run: resume with that run's "
                                 "config, or start afresh (--no-resume or another --out)",
                                 layer, ckpt.dir.string(), where, value_text(saved, *key),
                                 value_text(identity, *key)));
  }
}

namespace {

constexpr std::string_view kDiscardedPrefix = ".discarded.tmp-";

}  // namespace

void discard_run_files(const fs::path& run_dir, std::span<const std::string> names) {
  io::remove_stale_temporaries(run_dir, kDiscardedPrefix);
  const fs::path trash = run_dir / fmt::format("{}{}", kDiscardedPrefix, ::getpid());
  try {
    bool made = false;
    for (const std::string& name : names) {
      std::error_code ec;
      if (!fs::exists(fs::symlink_status(run_dir / name, ec))) continue;
      if (!made) {
        fs::create_directory(trash);
        made = true;
      }
      fs::rename(run_dir / name, trash / name);
    }
    if (made) {
      io::fsync_directory(run_dir);
      fs::remove_all(trash);
    }
  } catch (const fs::filesystem_error& e) {
    throw InputError(fmt::format("[run] {}: cannot discard the previous run's files ({}); remove them or "
                                 "use another --out", run_dir.string(), e.what()));
  }
}

std::string identity_tag(std::string_view text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : text) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return fmt::format("{:016x}", h);
}

}  // namespace concord::train
