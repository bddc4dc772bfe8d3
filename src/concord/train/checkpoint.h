// Training checkpoints: fp32 master weights, optimizer moments and the caller's state, written
// so that a crash at any moment leaves either the previous checkpoint or the new one, whole.
//
// Layout:  <run_dir>/checkpoints/step-00000120/model.safetensors      HF names, F32
//                                              optimizer.safetensors  "<name>.exp_avg", "<name>.exp_avg_sq", F32
//                                              state.json             the caller's JSON, with "step"
//          <run_dir>/checkpoints/latest                               "step-00000120\n"
// Both safetensors files carry the metadata {"format": "pt", "step": "<step>"}, so
// model.safetensors loads in Hugging Face tools as it is.
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

#include "concord/train/optimizer.h"

namespace concord::train {

struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// A tensor to save, without copying its values (they must stay alive during the call).
struct TensorView {
  std::string name;
  std::vector<int64_t> shape;
  std::span<const float> values;
};

// "step-00000120". Steps must lie in [0, 10^8) so that names sort as numbers.
std::string checkpoint_dir_name(int64_t step);

// Writes the checkpoint of `step` and returns its directory. `state` must be a JSON object; its
// "step" is set to `step` (InputError if it holds another value). keep >= 1. Throws InputError
// on I/O failure, a shape that does not match the value count, or a duplicate name.
std::filesystem::path save_checkpoint(const std::filesystem::path& run_dir, int64_t step,
                                      std::span<const TensorView> model,
                                      std::span<const TensorView> optimizer,
                                      const nlohmann::json& state, int keep);

// The checkpoint `latest` names; when `latest` is missing or names a directory that is gone,
// the complete checkpoint of the highest step. nullopt when there is none. InputError when
// `latest` holds something that is not a checkpoint directory name.
std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& run_dir);

// Complete checkpoints under run_dir/checkpoints (names step-XXXXXXXX), oldest first.
std::vector<std::filesystem::path> list_checkpoints(const std::filesystem::path& run_dir);

struct LoadedCheckpoint {
  int64_t step = 0;
  std::vector<NamedTensor> model, optimizer;  // sorted by name
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

}  // namespace concord::train
