// `concord export`: a model folder, GGUF file or training run -> an HF folder or a GGUF file.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "concord/cli/commands.h"
#include "concord/io/atomic_file.h"
#include "concord/model/files.h"
#include "concord/numerics/check.h"

namespace concord::cli {
namespace {

namespace fs = std::filesystem;

// The files a safetensors export writes (model/files_hf.cpp).
constexpr const char* kExportFiles[] = {"model.safetensors", "config.json", "generation_config.json",
                                        "tokenizer.json", "tokenizer_config.json"};

// Whether `inner` is `outer` or lies inside it (both absolute and normal).
bool within(const fs::path& inner, const fs::path& outer) {
  auto i = inner.begin(), o = outer.begin();
  for (; o != outer.end() && !o->empty(); ++i, ++o)
    if (i == inner.end() || *i != *o) return false;
  return true;
}

fs::path absolute_normal(const fs::path& p) {
  std::error_code ec;
  fs::path out = fs::weakly_canonical(p, ec);
  if (ec) out = fs::absolute(p).lexically_normal();
  if (!out.has_filename()) out = out.parent_path();  // "dir/" -> "dir"
  return out;
}

// Refuses an --out that would lose data or that the export cannot write whole: a missing parent
// folder (never created silently), the source itself, a path inside the source or containing it,
// and for a folder, an existing one holding files an export does not write.
void check_out(const std::string& model, const std::string& out_text, bool gguf) {
  fs::path out = fs::path(out_text).lexically_normal();
  if (!out.has_filename()) out = out.parent_path();
  const fs::path parent = out.parent_path().empty() ? fs::path(".") : out.parent_path();
  std::error_code ec;
  if (!fs::is_directory(parent, ec))
    throw InputError(fmt::format("[export] --out {}: the folder {} does not exist (create it first)",
                                 out_text, parent.string()));
  const fs::path source = absolute_normal(model), target = absolute_normal(out);
  if (within(target, source) || within(source, target)) {
    const char* how = target == source ? "is" : within(target, source) ? "lies inside" : "contains";
    throw InputError(fmt::format("[export] --out {} {} the source --model {}; export to a path "
                                 "outside it", out_text, how, model));
  }
  if (!fs::exists(out, ec)) return;
  if (gguf) {
    if (fs::is_directory(out, ec))
      throw InputError(fmt::format("[export] --out {} is a folder; a GGUF export writes one file", out_text));
    return;  // an existing file is replaced atomically
  }
  if (!fs::is_directory(out, ec))
    throw InputError(fmt::format("[export] --out {} exists and is not a folder", out_text));
  for (const fs::directory_entry& e : fs::directory_iterator(out, ec)) {
    const std::string name = e.path().filename().string();
    if (std::find(std::begin(kExportFiles), std::end(kExportFiles), name) == std::end(kExportFiles))
      throw InputError(fmt::format("[export] --out {} holds '{}', which an export does not write; "
                                   "give a new or empty folder, or an earlier export to replace",
                                   out_text, name));
  }
}

// Writes the folder `out` whole (io::write_directory_atomic). The writer names the temporary
// folder it wrote into; the user knows it as `out`.
void write_folder_whole(const fs::path& out, const std::function<void(const fs::path&)>& fill) {
  fs::path tmp;
  try {
    io::write_directory_atomic(out, [&](const fs::path& dir) {
      tmp = dir;
      fill(dir);
    });
  } catch (const InputError& e) {
    std::string message = e.what();
    if (!tmp.empty())
      for (size_t at; (at = message.find(tmp.string())) != std::string::npos;)
        message.replace(at, tmp.string().size(), out.string());
    throw InputError(message);
  }
}

// `m` with its `classes` GEMM weights binarized per output channel: w -> sign(w) * mean_k |w|
// (in double, index order; +1 for zero), the config marked as a binary-weight model.
model::Model binarized(const model::Model& m, const std::string& classes) {
  model::ModelConfig config = m.config();
  config.binary_weights = classes;
  config.validate("--binarize");
  model::Model out(config, m.policy());
  for (const model::ParamSpec& spec : m.params()) {
    const std::span<const float> w = m.param(spec.name);
    const std::span<float> to = out.param(spec.name);
    if (!model::is_binary_weight(spec, classes)) {
      std::ranges::copy(w, to.begin());
      continue;
    }
    const int64_t K = spec.shape[1];
    for (int64_t r = 0; r < spec.shape[0]; ++r) {
      double sum = 0.0;
      for (int64_t k = 0; k < K; ++k) sum += std::fabs(static_cast<double>(w[static_cast<size_t>(r * K + k)]));
      const auto alpha = static_cast<float>(sum / static_cast<double>(K));
      for (int64_t k = 0; k < K; ++k) {
        const auto i = static_cast<size_t>(r * K + k);
        to[i] = w[i] < 0.0f ? -alpha : alpha;
      }
    }
  }
  out.weights_changed();
  return out;
}

}  // namespace

void add_export_command(CLI::App& app) {
  struct Args {
    std::string model;
    std::string to;
    std::string out;
    std::string dtype = "f32";
    std::string binarize;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "export",
      "Export a model (a Hugging Face folder, a GGUF file, or a training run directory, whose "
      "final/ folder is used) as a Hugging Face safetensors folder or a llama.cpp GGUF file, "
      "with its tokenizer, chat template and stop tokens.");
  cmd->add_option("--model", args->model, "source: model folder, .gguf file or run directory")->required();
  cmd->add_option("--to", args->to, "output format")
      ->required()
      ->check(CLI::Validator(
          [](std::string& to) {
            // "" is refused by check_text_values (main.cpp) with its own message.
            return to.empty() || to == "gguf" || to == "safetensors"
                       ? std::string()
                       : fmt::format("'{}' is not a format concord exports (gguf, safetensors)", to);
          },
          "", "FORMAT"));
  cmd->add_option("--out", args->out,
                  "output folder (safetensors) or file (gguf); its parent folder must exist, and it "
                  "must not be, contain or lie inside --model. An existing folder is replaced only "
                  "when it holds nothing but an earlier export's files")
      ->required();
  cmd->add_option("--dtype", args->dtype,
                  "weight type: safetensors f32, bf16, f16; gguf f32, f16, bf16, q4_0, q4_1, q8_0, mxfp4, "
                  "tq2_0 (a binary-weight model's +-alpha weights as llama.cpp's TQ2_0, its other matrices f32; "
                  "rows of 256) (1-D tensors stay f32)");
  cmd->add_option("--binarize", args->binarize,
                  "write a binary-weight model: these GEMM weights (attention,mlp | attention | mlp) become "
                  "sign(w) * mean|w| per output channel (XNOR-Net's scale), as a binary optimizer's first step "
                  "makes them; config.json then says concord_binary_weights (docs/binary.md)");
  cmd->callback([args]() {
    const bool gguf = args->to == "gguf";
    check_out(args->model, args->out, gguf);
    model::LoadedModel loaded = model::load_model(args->model);
    if (!args->binarize.empty()) loaded.model = binarized(loaded.model, args->binarize);
    model::ExportOptions options;
    options.format = gguf ? model::ExportFormat::gguf : model::ExportFormat::safetensors;
    options.dtype = args->dtype;
    options.tokenizer = loaded.source.tokenizer;
    options.chat_template = loaded.source.chat_template;
    options.stop_token_ids = loaded.source.stop_token_ids;
    fs::path out = fs::path(args->out).lexically_normal();
    if (!out.has_filename()) out = out.parent_path();
    if (gguf) {
      model::export_model(loaded.model, out, options);  // one file, written atomically
    } else {
      write_folder_whole(out, [&](const fs::path& tmp) { model::export_model(loaded.model, tmp, options); });
    }

    uint64_t bytes = 0;
    std::vector<std::string> files;
    if (options.format == model::ExportFormat::gguf) {
      bytes = fs::file_size(out);
      files.push_back(out.filename().string());
    } else {
      for (const char* name : kExportFiles)
        if (fs::exists(out / name)) {
          bytes += fs::file_size(out / name);
          files.push_back(name);
        }
    }
    const model::ModelConfig& c = loaded.model.config();
    std::printf("%s\n", fmt::format("exported {} ({} from {}, {} params) -> {} as {}: {} tensors, "
                                    "dtype {}{}, {} bytes ({:.2f} MiB)",
                                    args->model, c.architecture, loaded.source.format,
                                    c.parameter_count(), out.string(), args->to,
                                    loaded.model.params().size(), args->dtype,
                                    args->to == "gguf" && args->dtype != "f32" ? " (1-D tensors f32)" : "",
                                    bytes,
                                    static_cast<double>(bytes) / (1 << 20))
                            .c_str());
    std::printf("%s\n", fmt::format("files: {}; tokenizer: {}; chat template: {}; stop ids: [{}]",
                                    fmt::join(files, ", "),
                                    options.tokenizer ? fmt::format("{} tokens", options.tokenizer->vocab_size())
                                                      : "none",
                                    options.chat_template.empty() ? "none" : "yes",
                                    fmt::join(options.stop_token_ids, ", "))
                            .c_str());
  });
}

}  // namespace concord::cli
