// `concord export`: a model folder, GGUF file or training run -> an HF folder or a GGUF file.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "concord/cli/commands.h"
#include "concord/model/files.h"

namespace concord::cli {

void add_export_command(CLI::App& app) {
  struct Args {
    std::string model;
    std::string to;
    std::string out;
    std::string dtype = "f32";
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
      ->check(CLI::IsMember({"gguf", "safetensors"}));
  cmd->add_option("--out", args->out, "output folder (safetensors) or file (gguf)")->required();
  cmd->add_option("--dtype", args->dtype,
                  "weight type: safetensors f32, bf16, f16; gguf f32, f16, bf16, q8_0, mxfp4 "
                  "(1-D tensors stay f32)");
  cmd->callback([args]() {
    namespace fs = std::filesystem;
    model::LoadedModel loaded = model::load_model(args->model);
    model::ExportOptions options;
    options.format = args->to == "gguf" ? model::ExportFormat::gguf : model::ExportFormat::safetensors;
    options.dtype = args->dtype;
    options.tokenizer = loaded.source.tokenizer;
    options.chat_template = loaded.source.chat_template;
    options.stop_token_ids = loaded.source.stop_token_ids;
    const fs::path out = args->out;
    model::export_model(loaded.model, out, options);

    uint64_t bytes = 0;
    std::vector<std::string> files;
    if (options.format == model::ExportFormat::gguf) {
      bytes = fs::file_size(out);
      files.push_back(out.filename().string());
    } else {
      for (const char* name : {"model.safetensors", "config.json", "generation_config.json",
                               "tokenizer.json", "tokenizer_config.json"})
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
