// concord.Model / concord.Engine: load a model (HF folder or GGUF), forward to logits, tokenize,
// generate with serve::Engine and score token log-probs with the engine's one definition
// (model/logprob.h) — what `concord generate` and `concord contract dump` run.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bindings.h"
#include "concord/model/files.h"
#include "concord/numerics/check.h"
#include "concord/rl/sync.h"
#include "concord/serve/engine.h"
#include "concord/serve/text.h"

namespace concord::python {
namespace {

using namespace nb::literals;

nb::object to_python(const nlohmann::json& j) { return nb::module_::import_("json").attr("loads")(j.dump()); }

// A loaded model as Python holds it: the model and what its file says besides (tokenizer, stop
// ids, chat template).
struct PyModel {
  model::LoadedModel loaded;
  std::string path;
  model::Model& model() { return loaded.model; }
  const io::Tokenizer& tokenizer(const char* op) const {
    if (!loaded.source.tokenizer)
      throw InputError(fmt::format("[{}] {}: the model has no tokenizer", op, path));
    return *loaded.source.tokenizer;
  }
};

// Token ids from a list of ints or a 1-D int32 / int64 array; checked against the vocabulary.
std::vector<int32_t> token_ids(nb::handle obj, const char* op, const char* arg, int64_t vocab) {
  std::vector<int32_t> ids;
  if (nb::hasattr(obj, "__dlpack__") || nb::hasattr(obj, "__array_interface__")) {
    nb::ndarray<> a = any_array_in(obj, op, arg, 1, 1);
    if (a.dtype() == nb::dtype<int32_t>()) {
      const auto v = array_in<int32_t>(obj, op, arg, 1, 1);
      ids.assign(v.data, v.data + v.size);
    } else if (a.dtype() == nb::dtype<int64_t>()) {
      const auto v = array_in<int64_t>(obj, op, arg, 1, 1);
      for (int64_t i = 0; i < v.size; ++i) {
        if (v.data[i] < INT32_MIN || v.data[i] > INT32_MAX)
          throw InputError(fmt::format("[{}] {}: token id {} outside the vocabulary [0, {})", op, arg, v.data[i], vocab));
        ids.push_back(static_cast<int32_t>(v.data[i]));
      }
    } else {
      raise_dtype(op, arg, a.dtype(), "int32 or int64");
    }
  } else if (nb::isinstance<nb::list>(obj) || nb::isinstance<nb::tuple>(obj)) {
    ids = nb::cast<std::vector<int32_t>>(obj);
  } else {
    throw nb::type_error((arg_prefix(op, arg) + "expected token ids (a list of int or an int32/int64 array)").c_str());
  }
  for (const int32_t t : ids)
    if (t < 0 || t >= vocab)
      throw InputError(fmt::format("[{}] {}: token id {} outside the vocabulary [0, {})", op, arg, t, vocab));
  return ids;
}

// The text of generated tokens as `concord generate` prints it: special tokens (stop and control
// tokens) skipped, the bytes decoded as a UTF-8 stream.
std::string completion_text(const io::Tokenizer& tokenizer, std::span<const int32_t> tokens) {
  serve::Utf8Stream out;
  std::string text;
  for (const int32_t t : tokens)
    if (!tokenizer.is_special(t)) text += out.push(tokenizer.token_bytes(t));
  return text + out.flush();
}

struct PyCompletion {
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<double> logprobs;
  std::string finish_reason;
  std::vector<int32_t> prompt;
};

struct PyEngine {
  PyModel* model;
  std::unique_ptr<serve::Engine> engine;
};

}  // namespace

void bind_model(nb::module_& m) {
  m.doc() = "Models and the inference engine: load (HF folder or GGUF), forward to logits, "
            "tokenize, generate, token log-probs.";

  nb::class_<PyModel>(m, "Model",
                      "A decoder loaded from a Hugging Face folder (config.json + safetensors + "
                      "tokenizer.json) or a GGUF file, running a precision policy.")
      .def_static(
          "load",
          [](const std::string& path, const std::string& policy) {
            nb::gil_scoped_release release;
            auto* p = new PyModel{model::load_model(path, policy), path};
            return p;
          },
          "path"_a, "policy"_a = "native", nb::rv_policy::take_ownership,
          "Loads a model folder or .gguf file. policy: 'native' (the file's own precision: a "
          "GGUF's Q4_0/Q4_1/Q8_0 weights served as stored, every other operand fp32), a precision "
          "preset on fp32 values (fp32, bf16, mxfp8, fp8-tensor, nvfp4, mxfp4) or a policy JSON "
          "file — the --policy of `concord generate`.")
      .def_prop_ro("path", [](const PyModel& p) { return p.path; }, "The file or folder it was loaded from.")
      .def_prop_ro("policy", [](PyModel& p) { return p.model().policy().name; }, "The precision policy's name.")
      .def_prop_ro("vocab_size", [](PyModel& p) { return p.model().config().vocab_size; }, "Logits per position.")
      .def_prop_ro("config", [](PyModel& p) { return to_python(p.model().config().to_json()); },
                   nb::sig("def config(self) -> dict[str, typing.Any]"),
                   "The model's config.json content as a dict.")
      .def_prop_ro("stop_token_ids", [](const PyModel& p) { return p.loaded.source.stop_token_ids; },
                   "The eos ids the model's files list (generation stops at them by default).")
      .def_prop_ro("chat_template", [](const PyModel& p) { return p.loaded.source.chat_template; },
                   "The chat template text ('' when none).")
      .def(
          "forward",
          [](PyModel& p, nb::handle tokens) {
            const int64_t V = p.model().config().vocab_size;
            std::vector<int32_t> ids;
            int64_t B = 1, T = 0;
            bool batched = false;
            if ((nb::hasattr(tokens, "__dlpack__") || nb::hasattr(tokens, "__array_interface__")) &&
                any_array_in(tokens, "Model.forward", "tokens", 1, 2).ndim() == 2) {
              nb::ndarray<> a = any_array_in(tokens, "Model.forward", "tokens", 2, 2);
              B = static_cast<int64_t>(a.shape(0));
              T = static_cast<int64_t>(a.shape(1));
              nb::object flat = nb::borrow(tokens).attr("reshape")(-1);
              ids = token_ids(flat, "Model.forward", "tokens", V);
              batched = true;
            } else {
              ids = token_ids(tokens, "Model.forward", "tokens", V);
              T = static_cast<int64_t>(ids.size());
            }
            if (T < 1) throw InputError("[Model.forward] tokens: need at least one token");
            std::vector<float> logits(static_cast<size_t>(B * T * V));
            {
              nb::gil_scoped_release release;
              p.model().forward(ids, B, T, logits);
            }
            if (batched) {
              const int64_t shape[3] = {B, T, V};
              return nb::cast(to_numpy(std::move(logits), shape));
            }
            const int64_t shape[2] = {T, V};
            return nb::cast(to_numpy(std::move(logits), shape));
          },
          "tokens"_a,
          nb::sig("def forward(self, tokens: collections.abc.Sequence[int] | numpy.typing.ArrayLike) -> "
                  "numpy.typing.NDArray[numpy.float32]"),
          "Logits of every position, teacher-forced (Model::forward): tokens (T,) -> (T, V) "
          "float32, or (B, T) -> (B, T, V); the array owns the C++ buffer (no copy). tokens: a "
          "list of int or an int32/int64 array.")
      .def(
          "encode",
          [](const PyModel& p, const std::string& text, bool bos) {
            const io::Tokenizer& t = p.tokenizer("Model.encode");
            return bos ? t.encode_for_model(text) : t.encode(text);
          },
          "text"_a, nb::kw_only(), "bos"_a = true,
          "Token ids of text; bos=True adds the BOS where the vocabulary does, as `concord "
          "generate` encodes a prompt.")
      .def(
          "decode",
          [](const PyModel& p, const std::vector<int32_t>& ids, bool skip_special) {
            return p.tokenizer("Model.decode").decode(ids, skip_special);
          },
          "ids"_a, nb::kw_only(), "skip_special"_a = false, "HF's decode(ids, skip_special_tokens=...).")
      .def(
          "state_dict",
          [](nb::handle self) {
            PyModel& p = nb::cast<PyModel&>(self);
            nb::dict out;
            for (const model::ParamSpec& spec : p.model().params()) {
              if (p.model().stored_weight(spec.name)) continue;  // file blocks: no fp32 values
              std::span<float> v = p.model().param(spec.name);
              out[spec.name.c_str()] = numpy_view<float>(v.data(), spec.shape, self);
            }
            return out;
          },
          nb::sig("def state_dict(self) -> dict[str, numpy.typing.NDArray[numpy.float32]]"),
          "The fp32 values of every parameter by HF name, as writable float32 NumPy views of the "
          "model's own memory (no copy; they keep the model alive). Call weights_changed() after "
          "writing them. Weights a 'native' GGUF model keeps in its file's blocks have no fp32 "
          "values and are left out (load with a preset policy, e.g. 'fp32', to get them).")
      .def("weights_changed", [](PyModel& p) { p.model().weights_changed(); },
           "Rebuilds the quantized / pre-packed copies from the values on the next forward (after "
           "writing into state_dict()'s arrays).")
      .def(
          "precision_plan",
          [](PyModel& p, std::optional<std::string> policy) {
            const model::PrecisionPolicy pol =
                policy ? model::PrecisionPolicy::from_name_or_file(*policy) : p.model().policy();
            return to_python(rl::make_precision_plan(p.model().config(), pol).to_json());
          },
          "policy"_a = nb::none(), nb::sig("def precision_plan(self, policy: str | None = None) -> dict[str, typing.Any]"),
          "The precision plan (concord.sync.plan) `policy` (a preset name or policy JSON; None: the "
          "model's own) gives this model's GEMM weights: what the RL loop's check 3 compares.")
      .def(
          "content_hashes",
          [](PyModel& p) {
            std::vector<std::pair<std::string, uint64_t>> hashes;
            {
              nb::gil_scoped_release release;
              hashes = rl::sync_content_hashes(p.model());
            }
            nb::dict out;
            for (const auto& [name, hash] : hashes) out[name.c_str()] = fmt::format("0x{:016x}", hash);
            return out;
          },
          nb::sig("def content_hashes(self) -> dict[str, str]"),
          "The content hash of every GEMM weight as this model's kernels read it ({name: "
          "'0x<16 hex>'}): what a learner publishes as concord.sync.content (check 4).")
      .def("__repr__", [](PyModel& p) {
        return fmt::format("Model('{}', policy='{}', vocab_size={})", p.path, p.model().policy().name,
                           p.model().config().vocab_size);
      });

  nb::class_<PyCompletion>(m, "Completion", "One generated sequence.")
      .def_ro("tokens", &PyCompletion::tokens, "Generated token ids (a stop token included).")
      .def_ro("text", &PyCompletion::text,
              "The generated text as `concord generate` prints it (special tokens skipped).")
      .def_ro("logprobs", &PyCompletion::logprobs,
              "logp of each generated token (model/logprob.h: log_softmax(logits / T), before "
              "top-k/top-p/min-p).")
      .def_ro("finish_reason", &PyCompletion::finish_reason, "'stop', 'length', 'context' or 'cancelled'.")
      .def_ro("prompt", &PyCompletion::prompt, "The prompt's token ids.")
      .def("__repr__", [](const PyCompletion& c) {
        return fmt::format("Completion(tokens={}, finish_reason='{}')", c.tokens.size(), c.finish_reason);
      });

  nb::class_<PyEngine>(m, "Engine",
                       "Generation for many sequences on one Model (serve::Engine): KV cache, "
                       "chunked prefill, batched decode, seeded sampling.")
      .def(
          "__init__",
          [](PyEngine* self, PyModel& model, int64_t max_sequences, int64_t prefill_chunk, int64_t max_context) {
            new (self) PyEngine{&model, std::make_unique<serve::Engine>(
                                            model.model(), serve::EngineOptions{.max_sequences = max_sequences,
                                                                                .prefill_chunk = prefill_chunk,
                                                                                .max_context = max_context})};
          },
          "model"_a, nb::kw_only(), "max_sequences"_a = 8, "prefill_chunk"_a = 512, "max_context"_a = 0,
          nb::keep_alive<1, 2>(),
          "An engine on `model` (kept alive by the engine): max_sequences decoded together, "
          "prefill_chunk prompt tokens per pass, max_context tokens per sequence (0: the model's "
          "max_position_embeddings).")
      .def(
          "generate",
          [](PyEngine& e, nb::handle prompts, int64_t max_tokens, float temperature, int32_t top_k, float top_p,
             float min_p, uint64_t seed, std::optional<std::vector<int32_t>> stop) {
            const int64_t V = e.model->model().config().vocab_size;
            // One prompt (a str or a token list) or a list of them.
            std::vector<nb::handle> items;
            const bool single = nb::isinstance<nb::str>(prompts) ||
                                ((nb::isinstance<nb::list>(prompts) || nb::isinstance<nb::tuple>(prompts)) &&
                                 nb::len(prompts) > 0 && nb::isinstance<nb::int_>(prompts[0])) ||
                                nb::hasattr(prompts, "__dlpack__");
            if (single) {
              items.push_back(prompts);
            } else {
              for (nb::handle h : prompts) items.push_back(h);
            }
            std::vector<serve::Request> requests;
            for (nb::handle h : items) {
              serve::Request r;
              r.prompt = nb::isinstance<nb::str>(h)
                             ? e.model->tokenizer("Engine.generate").encode_for_model(nb::cast<std::string>(h))
                             : token_ids(h, "Engine.generate", "prompts", V);
              r.sampling.temperature = temperature;
              r.sampling.top_k = top_k;
              r.sampling.top_p = top_p;
              r.sampling.min_p = min_p;
              r.sampling.seed = seed;
              r.max_tokens = max_tokens;
              r.stop_tokens = stop ? *stop : e.model->loaded.source.stop_token_ids;
              requests.push_back(std::move(r));
            }
            std::vector<serve::Completion> done;
            std::vector<std::vector<int32_t>> prompt_ids;
            for (const serve::Request& r : requests) prompt_ids.push_back(r.prompt);
            {
              nb::gil_scoped_release release;
              done = e.engine->generate(std::move(requests));
            }
            nb::list out;
            for (size_t i = 0; i < done.size(); ++i) {
              PyCompletion c;
              c.tokens = std::move(done[i].tokens);
              c.logprobs = std::move(done[i].logprobs);
              c.finish_reason = serve::finish_reason_name(done[i].finish);
              if (e.model->loaded.source.tokenizer) c.text = completion_text(*e.model->loaded.source.tokenizer, c.tokens);
              c.prompt = std::move(prompt_ids[i]);
              out.append(nb::cast(std::move(c)));
            }
            if (single) return nb::object(out[0]);
            return nb::object(out);
          },
          "prompts"_a, nb::kw_only(), "max_tokens"_a = 256, "temperature"_a = 1.0f, "top_k"_a = 0,
          "top_p"_a = 1.0f, "min_p"_a = 0.0f, "seed"_a = 0, "stop"_a = nb::none(),
          nb::sig("def generate(self, prompts: str | collections.abc.Sequence[int] | numpy.typing.ArrayLike | "
                  "collections.abc.Sequence[str | collections.abc.Sequence[int] | numpy.typing.ArrayLike], *, "
                  "max_tokens: int = 256, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, "
                  "min_p: float = 0.0, seed: int = 0, stop: collections.abc.Sequence[int] | None = None) -> "
                  "Completion | list[Completion]"),
          "Generates from a prompt or a list of prompts (each a str, encoded as `concord "
          "generate` encodes it, or token ids) and returns a Completion (a list for a list): "
          "tokens, text, logprobs, finish_reason. Sampling as `concord generate`'s --temp, "
          "--top-k, --top-p, --min-p, --seed (every request gets `seed`; a request's tokens do not "
          "depend on the others in the batch); stop: stop token ids (default: the model's eos "
          "ids). The GIL is released while the engine runs.")
      .def(
          "token_logprobs",
          [](PyEngine& e, nb::handle tokens, float temperature) {
            const int64_t V = e.model->model().config().vocab_size;
            serve::Request r;
            r.prompt = token_ids(tokens, "Engine.token_logprobs", "tokens", V);
            if (r.prompt.size() < 2) throw InputError("[Engine.token_logprobs] tokens: need at least two tokens");
            r.max_tokens = 0;
            r.prompt_logprobs = true;
            r.sampling.temperature = temperature;
            std::vector<serve::Completion> done;
            {
              nb::gil_scoped_release release;
              std::vector<serve::Request> requests;
              requests.push_back(std::move(r));
              done = e.engine->generate(std::move(requests));
            }
            std::vector<double> lp = std::move(done.at(0).prompt_logprobs);
            const auto n = static_cast<int64_t>(lp.size());
            return to_numpy(std::move(lp), std::span<const int64_t>(&n, 1));
          },
          "tokens"_a, nb::kw_only(), "temperature"_a = 1.0f,
          nb::sig("def token_logprobs(self, tokens: collections.abc.Sequence[int] | numpy.typing.ArrayLike, *, "
                  "temperature: float = 1.0) -> numpy.typing.NDArray[numpy.float64]"),
          "logp(tokens[i] | tokens[:i]) for i >= 1 under the model, float64 (T - 1,): the engine "
          "scores the sequence as a prompt (model/logprob.h's one definition, the values the "
          "engine reports for sampled tokens; temperature as in sampling, 0 counts as 1).")
      .def_prop_ro("model", [](PyEngine& e) { return e.model; }, nb::rv_policy::reference,
                   "The Model it runs.");
}

}  // namespace concord::python
