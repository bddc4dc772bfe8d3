// Model files: which reader a path needs (HF folder, training run, GGUF file), the rules every
// source shares (tokenizer and stop ids fit the vocabulary), and export dispatch.
#include "concord/model/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstring>
#include <memory>
#include <cstdio>
#include <fstream>

#include "concord/model/expert_pager.h"
#include "concord/numerics/check.h"
#include "concord/model/files_internal.h"
#include "concord/tensor/quant_gemm.h"

namespace concord::model {
namespace fs = std::filesystem;
using files_detail::fail;

namespace files_detail {

void append_unique(std::vector<int32_t>& out, const std::vector<int64_t>& ids,
                   const fs::path& source, std::string_view what) {
  for (int64_t id : ids) {
    if (id < 0 || id > INT32_MAX) fail(source, fmt::format("{} {} is not a token id", what, id));
    const auto id32 = static_cast<int32_t>(id);
    if (std::find(out.begin(), out.end(), id32) == out.end()) out.push_back(id32);
  }
}

void check_source(const ModelSource& source) {
  const int64_t V = source.config.vocab_size;
  if (source.tokenizer && source.tokenizer->vocab_size() > V)
    fail(source.path, fmt::format("the tokenizer has {} tokens but the model's vocabulary is {}",
                                  source.tokenizer->vocab_size(), V));
  for (int32_t id : source.stop_token_ids)
    if (id >= V) fail(source.path, fmt::format("stop token id {} is outside the vocabulary ({})", id, V));
}

}  // namespace files_detail

namespace {

// A path that is not a folder: a GGUF file (by name or magic, io::is_gguf_path: a damaged one is
// reported by the GGUF reader), or an error saying what a model is.
void check_model_file(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) fail(path, "no such file or folder");
  if (io::is_gguf_path(path)) return;
  if (path.extension() == ".safetensors")
    fail(path, "a .safetensors file alone is not a model: give the folder that holds it with its "
               "config.json (and tokenizer.json), or a GGUF file");
  fail(path, "not a model: expected a folder with config.json, a training run with final/, or a "
             "GGUF file");
}

// A training run directory (`concord train --out DIR`) holds its served model in final/ (its
// own config.json is the training config, and it has no weights of its own).
fs::path resolve_folder(const fs::path& dir) {
  const bool has_weights =
      fs::exists(dir / "model.safetensors") || fs::exists(dir / "model.safetensors.index.json");
  if (!has_weights && fs::exists(dir / "final" / "config.json")) return dir / "final";
  return dir;
}

// A binary-weight model's folder in its own precision: its +-alpha weights as packed signs
// (tensor::BlockQuant::b1, W1A8), its embedding / head as Q8_0 blocks (W8A8: at decode the head
// would otherwise stream more bytes than every binary layer together), norms and biases fp32 —
// what its GGUF export (--dtype tq2_0) holds. A weight whose rows are not whole 32-element blocks
// stays fp32.
Model binary_model(const fs::path& dir, const ModelConfig& config, PrecisionPolicy policy) {
  Model values(config);
  files_detail::read_hf_weights(dir, values);
  StoredWeights stored;
  for (const ParamSpec& spec : values.params()) {
    if (spec.is_matrix() && (spec.kind == ParamKind::embed || spec.kind == ParamKind::lm_head) &&
        spec.shape[1] % 32 == 0) {
      // The embedding / head: Q8_0 blocks (W8A8), as the model's GGUF export (--dtype tq2_0) stores them.
      const std::vector<uint8_t> q8 = io::encode_gguf_tensor(io::GgmlType::q8_0, values.param(spec.name));
      stored.emplace(spec.name, std::make_shared<const tensor::QuantWeight>(tensor::pack_quant_weight(
                                    tensor::BlockQuant::q8_0, spec.shape[0], spec.shape[1], q8)));
      continue;
    }
    if (!is_binary_weight(spec, config.binary_weights) || spec.shape[1] % 32 != 0) continue;
    try {
      const std::vector<uint8_t> blocks = tensor::binary_blocks(values.param(spec.name), spec.shape[0], spec.shape[1]);
      stored.emplace(spec.name, std::make_shared<const tensor::QuantWeight>(tensor::pack_quant_weight(
                                    tensor::BlockQuant::b1, spec.shape[0], spec.shape[1], blocks)));
    } catch (const InputError& e) {
      fail(dir, fmt::format("'{}' is not a binary weight ({}): config.json says concord_binary_weights = {}", spec.name,
                            e.what(), config.binary_weights));
    }
  }
  Model model(config, std::move(policy), std::move(stored));
  for (const ParamSpec& spec : values.params())
    if (model.stored_weight(spec.name) == nullptr) std::ranges::copy(values.param(spec.name), model.param(spec.name).begin());
  model.weights_changed();
  return model;
}

}  // namespace

ModelSource inspect_model(const fs::path& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return files_detail::inspect_hf_folder(resolve_folder(path));
  check_model_file(path);
  return files_detail::inspect_gguf(io::GgufFile::open(path));
}

LoadedModel load_model(const fs::path& path, std::string_view policy_name_or_file) {
  if (policy_name_or_file == "native") {
    PrecisionPolicy policy = PrecisionPolicy::preset("fp32");
    policy.name = "native";
    LoadedModel loaded = load_model(path, std::move(policy), WeightStorage::native);
    // Nothing stored (an HF folder, a file of other types): what runs is plain fp32.
    if (!loaded.model.has_stored_weights()) loaded.model.set_policy(PrecisionPolicy::preset("fp32"));
    return loaded;
  }
  return load_model(path, PrecisionPolicy::from_name_or_file(policy_name_or_file));
}

LoadedModel load_model(const fs::path& path, PrecisionPolicy policy, WeightStorage storage) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path dir = resolve_folder(path);
    ModelSource source = files_detail::inspect_hf_folder(dir);
    if (storage == WeightStorage::native && !source.config.binary_weights.empty())
      return LoadedModel{source, binary_model(dir, source.config, std::move(policy))};
    Model model(source.config, std::move(policy));
    files_detail::read_hf_weights(dir, model);
    return LoadedModel{std::move(source), std::move(model)};
  }
  check_model_file(path);
  const io::GgufFile file = io::GgufFile::open(path);
  ModelSource source = files_detail::inspect_gguf(file);
  Model model(source.config, std::move(policy),
              storage == WeightStorage::native ? files_detail::gguf_stored_weights(file, source.config)
                                               : StoredWeights{});
  files_detail::read_gguf_weights(file, model);
  return LoadedModel{std::move(source), std::move(model)};
}

LoadedModel load_model_paged(const fs::path& path, const ExpertPaging& paging) {
  std::error_code ec;
  if (fs::is_directory(path, ec))
    fail(path, "a memory cap pages a GGUF's quantized experts, and this is a safetensors folder (export it with "
               "`concord export --format gguf --dtype q4_0`)");
  check_model_file(path);
  auto file = std::make_shared<const io::GgufFile>(io::GgufFile::open(path));
  ModelSource source = files_detail::inspect_gguf(*file);
  const ModelConfig& c = source.config;
  if (!c.moe())
    fail(path, fmt::format("a memory cap pages experts, and this {} has none", c.architecture));
  PrecisionPolicy policy = PrecisionPolicy::preset("fp32");
  policy.name = "native";
  Model model(c, std::move(policy), files_detail::gguf_stored_weights(*file, c, true));
  files_detail::read_gguf_weights(*file, model);
  const std::vector<ParamSpec>& specs = model.params();
  std::vector<ExpertPager::Expert> experts;
  int64_t total = 0;
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    if (!c.is_moe_layer(layer)) continue;
    for (int64_t e = 0; e < c.num_experts; ++e) {
      ExpertPager::Expert x;
      x.block = layer;
      x.expert = e;
      size_t j = 0;
      for (ParamKind kind : {ParamKind::expert_gate, ParamKind::expert_up, ParamKind::expert_down}) {
        const int id = require_param(specs, kind, static_cast<int>(layer), static_cast<int>(e));
        const tensor::QuantWeight* w = model.stored_weight(specs[static_cast<size_t>(id)].name);
        if (w == nullptr) fail(path, fmt::format("'{}' is not stored as blocks", specs[static_cast<size_t>(id)].name));
        x.params[j++] = id;
        x.bytes += static_cast<int64_t>(tensor::packed_quant_bytes(w->type(), w->rows(), w->cols()));
      }
      total += x.bytes;
      experts.push_back(x);
    }
  }
  if (paging.cap_bytes <= 0 && !(paging.cap_share > 0 && paging.cap_share <= 1))
    throw InputError(fmt::format("[memory cap] a cap of {} bytes or a share {} of the experts: give bytes > 0 or a share in (0, 1]",
                                 paging.cap_bytes, paging.cap_share));
  const int64_t cap = paging.cap_bytes > 0 ? paging.cap_bytes : static_cast<int64_t>(std::llround(paging.cap_share * static_cast<double>(total)));
  // The loader reads an expert's slab of its layer's 3-D tensor with pread into a buffer of its own
  // and packs it: no page of the file is mapped for it (a mapped read would leave the kernel's
  // large page-cache folio around the slab resident: 1 MiB per fault here), and the buffer goes
  // once packed. The GGUF's offsets were validated when it was opened.
  auto fd = std::shared_ptr<int>(new int(::open(path.c_str(), O_RDONLY | O_CLOEXEC)), [](int* p) {
    if (*p >= 0) ::close(*p);
    delete p;
  });
  if (*fd < 0) fail(path, fmt::format("cannot open it again to read experts ({})", std::strerror(errno)));
  auto loader = [file, fd, c, specs, label = path.string()](int param) {
    const ParamSpec& spec = specs[static_cast<size_t>(param)];
    const io::GgufTensorInfo& t = file->get(gguf_param_name(spec.kind, spec.layer));
    const tensor::BlockQuantTraits* block = tensor::block_quant_of_ggml(static_cast<uint32_t>(t.type));
    CONCORD_CHECK(block != nullptr && spec.expert >= 0, "a paged expert's tensor of no block type");
    const size_t slab = t.bytes.size() / static_cast<size_t>(c.num_experts);
    const auto at = static_cast<off_t>(file->data_offset() + t.offset + static_cast<uint64_t>(spec.expert) * slab);
    std::vector<uint8_t> bytes(slab);
    size_t got = 0;
    while (got < slab) {
      const ssize_t n = ::pread(*fd, bytes.data() + got, slab - got, at + static_cast<off_t>(got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        throw InputError(fmt::format("[model] {}: reading expert {} of '{}' failed at byte {} ({})", label, spec.expert,
                                     t.name, static_cast<int64_t>(at) + static_cast<int64_t>(got),
                                     n < 0 ? std::strerror(errno) : "the file is shorter than when it was opened"));
      got += static_cast<size_t>(n);
    }
    return std::make_shared<const tensor::QuantWeight>(
        tensor::pack_quant_weight(block->type, spec.shape[0], spec.shape[1], bytes));
  };
  auto pager = std::make_shared<ExpertPager>(std::move(experts), c.num_experts, cap, loader, paging.prefetch);
  if (!paging.pin_loads.empty())
    pager->pin(hottest_experts(c, paging.pin_loads), static_cast<int64_t>(paging.pin_share * static_cast<double>(cap)));
  model.set_expert_pager(std::move(pager));
  return LoadedModel{std::move(source), std::move(model)};
}

void export_model(const Model& model, const fs::path& out, const ExportOptions& options) {
  if (options.tokenizer && options.tokenizer->vocab_size() > model.config().vocab_size)
    fail(out, fmt::format("the tokenizer has {} tokens but the model's vocabulary is {}",
                          options.tokenizer->vocab_size(), model.config().vocab_size));
  for (int32_t id : options.stop_token_ids)
    if (id < 0 || id >= model.config().vocab_size)
      fail(out, fmt::format("stop token id {} is outside the vocabulary ({})", id,
                            model.config().vocab_size));
  if (options.format == ExportFormat::safetensors) {
    files_detail::write_hf_folder(model, out, options);
  } else {
    files_detail::write_gguf_file(model, out, options);
  }
}

bool is_ignored_hf_tensor(std::string_view name) {
  const std::string_view prefix = "model.layers.", suffix = ".self_attn.rotary_emb.inv_freq";
  if (name.size() <= prefix.size() + suffix.size() || name.substr(0, prefix.size()) != prefix ||
      name.substr(name.size() - suffix.size()) != suffix)
    return false;
  const std::string_view layer = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  return !layer.empty() && std::all_of(layer.begin(), layer.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace concord::model
