// Training checkpoints: fp32 master weights, optimizer moments and the caller's state, written
// so that a crash at any moment leaves either the previous checkpoint or the new one, whole.
//
// Layout:  <run_dir>/checkpoints/step-00000120/model.safetensors      HF names, F32
//                                              optimizer.safetensors  "<name>.exp_avg", "<name>.exp_avg_sq", F32
//                                              state.safetensors      the caller's other tensors, F32
//                                                                     (only when it has any)
//                                              state.json             the caller's JSON, with "step"
//          <run_dir>/checkpoints/latest                               "step-00000120\n"
// The safetensors files carry the metadata {"format": "pt", "step": "<step>"}; model.safetensors
// holds the master weights and nothing else, so it loads in Hugging Face tools as it is. State
// tensors (an export rule's carried error, a meter's anchors, a reference policy) go to
// state.safetensors.
//
// Writing: everything goes into step-XXXXXXXX.tmp-<pid>/ (each file fsynced), the directory is
// fsynced and renamed into place (atomically exchanged with an existing checkpoint of the same
// step), then `latest` is rewritten atomically, then all but the newest `keep` checkpoints are
// deleted, along with *.tmp-* directories left by writers that are no longer running. The
// directory rename is the commit point: a checkpoint directory without the .tmp suffix is
// always complete.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "concord/train/export.h"
#include "concord/train/optimizer.h"
#include "concord/train/tensors.h"

namespace concord::train {

// "step-00000120". Steps must lie in [0, 10^8) so that names sort as numbers.
std::string checkpoint_dir_name(int64_t step);

// Writes the checkpoint of `step` and returns its directory. `state` must be a JSON object; its
// "step" is set to `step` (InputError if it holds another value). keep >= 1. Throws InputError
// on I/O failure, a shape that does not match the value count, or a duplicate name.
// `state_tensors` go to state.safetensors (not written when empty).
std::filesystem::path save_checkpoint(const std::filesystem::path& run_dir, int64_t step,
                                      std::span<const TensorView> model,
                                      std::span<const TensorView> optimizer,
                                      const nlohmann::json& state, int keep,
                                      std::span<const TensorView> state_tensors = {});

// The checkpoint `latest` names; when `latest` is missing or names a directory that is gone,
// the complete checkpoint of the highest step. nullopt when there is none. InputError when
// `latest` holds something that is not a checkpoint directory name.
std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& run_dir);

// Complete checkpoints under run_dir/checkpoints (names step-XXXXXXXX), oldest first.
std::vector<std::filesystem::path> list_checkpoints(const std::filesystem::path& run_dir);

struct LoadedCheckpoint {
  int64_t step = 0;
  std::vector<NamedTensor> model, optimizer;  // sorted by name
  std::vector<NamedTensor> state_tensors;     // sorted by name; empty without state.safetensors
  nlohmann::json state;
  std::filesystem::path dir;
};

// Loads and validates a checkpoint directory: every file present and parsable, every tensor
// F32, state.json an object whose "step" matches the directory name (and the safetensors
// metadata), every optimizer tensor "<param>.exp_avg" or "<param>.exp_avg_sq" of a model
// tensor of the same shape. Errors are InputError naming the file and the problem.
LoadedCheckpoint load_checkpoint(const std::filesystem::path& checkpoint_dir);

// The tensor named `name`, or nullptr.
const NamedTensor* find_tensor(std::span<const NamedTensor> tensors, std::string_view name);

// --- AdamW state <-> checkpoint tensors -----------------------------------------------------

// Views of the optimizer's moments for each model tensor that has state, shaped like it:
// "<name>.exp_avg" and "<name>.exp_avg_sq". Valid while `optimizer` is not stepped or changed.
std::vector<TensorView> adamw_state_views(const AdamW& optimizer,
                                          std::span<const TensorView> model);
// Replaces the optimizer's state with the moments in `tensors` (as load_checkpoint returns
// them) and sets its step count; InputError when an exp_avg lacks its exp_avg_sq or vice versa.
void restore_adamw_state(AdamW& optimizer, std::span<const NamedTensor> tensors,
                         int64_t steps_taken);

// --- export rule state <-> checkpoint tensors -------------------------------------------------

// The rule's state (ef: each parameter's carried error) as "export.<name>" tensors shaped like
// the parameter of `model` (the master views, in the rule's parameter order); empty for a
// stateless rule.
std::vector<NamedTensor> export_state_tensors(const ExportRule& rule, std::span<const TensorView> model);
// Puts back every "export.<name>" tensor of `tensors`; other names are left alone. InputError
// naming `file` for a name that is no parameter of `model` or a shape that differs from it,
// (ExportRule::restore_state) for state a stateless rule is offered, and for no state at all
// when the rule keeps some (ExportRule::keeps_state) and the model has a matrix.
void restore_export_state(ExportRule& rule, std::span<const NamedTensor> tensors,
                          std::span<const TensorView> model, const std::filesystem::path& file);

// --- run directories --------------------------------------------------------------------------
// A run directory (concord train, concord rl) holds one run: config.json describes it, and each
// checkpoint records in its state.json, under "config", the identity of the config it was written
// under (the config without the keys that do not change results, such as "out"). A resume checks
// the checkpoint it loads against the run's identity, so that it can only continue the run its
// config describes; a fresh start first discards the previous run's files, then writes its own.

// Where two JSON values first differ, as a dotted key ("train.lr"; "" for the values themselves
// when they are not both objects), or nullopt when they are equal.
std::optional<std::string> first_difference(const nlohmann::json& a, const nlohmann::json& b);

// InputError "[layer] <checkpoint dir>: ..." unless the checkpoint's state.json records
// "config" equal to `identity`; the message names the first key that differs and both values.
void check_checkpoint_config(const LoadedCheckpoint& ckpt, const nlohmann::json& identity,
                             std::string_view layer);

// Removes each of `names` (files or folders directly under run_dir; absent ones are skipped), in
// order, each by one atomic rename into run_dir/.discarded.tmp-<pid>/ that is then deleted (left
// over by a killed process, it is deleted by the next call). List config.json first: a kill at
// any point then leaves either the old run whole or no config.json beside what remains of it.
void discard_run_files(const std::filesystem::path& run_dir, std::span<const std::string> names);

// FNV-1a (64-bit) of `text` as 16 hex digits: a short, stable tag of a config's identity.
std::string identity_tag(std::string_view text);

}  // namespace concord::train
