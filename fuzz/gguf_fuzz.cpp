// libFuzzer target: io::GgufFile::from_bytes on arbitrary bytes. Bad input may only throw
// InputError; a file that loads must dequantize (or refuse with InputError), answer the typed
// getters, and survive a write/read round trip with the same metadata and tensor bytes; its
// tokenizer.ggml.* metadata must load as a tokenizer (or refuse with InputError) that encodes
// and decodes.
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <vector>

#include "concord/io/gguf.h"
#include "concord/io/tokenizer.h"
#include "concord/numerics/check.h"

namespace {

using namespace concord::io;

void require(bool condition) {
  if (!condition) __builtin_trap();  // a finding: libFuzzer saves the input
}

bool same_value(const GgufValue& a, const GgufValue& b) {
  if (a.type != b.type || a.element_type() != b.element_type() || a.ints != b.ints ||
      a.strings != b.strings || a.floats.size() != b.floats.size()) {
    return false;
  }
  for (size_t i = 0; i < a.floats.size(); ++i) {
    // float32 values are held as double; compare bits so NaN payloads count too.
    if (std::bit_cast<uint64_t>(a.floats[i]) != std::bit_cast<uint64_t>(b.floats[i])) return false;
  }
  return true;
}

void exercise(const GgufFile& f) {
  for (const auto& [key, value] : f.metadata()) {
    try {
      f.get_int(key);
    } catch (const concord::InputError&) {
    }
    try {
      f.get_float(key);
    } catch (const concord::InputError&) {
    }
    try {
      f.get_string(key);
    } catch (const concord::InputError&) {
    }
    require(f.find_value(key) == &value);  // keys are unique
  }
  try {
    if (const std::optional<Tokenizer> t = tokenizer_from_gguf(f)) {
      const std::vector<int32_t> ids = t->encode_for_model("Hi <|im_start|>x  12 \xC3\xA9\n");
      for (int32_t id : ids) require(id >= 0 && id < t->vocab_size());
      (void)t->decode(ids);
    }
  } catch (const concord::InputError&) {
  }
  for (const GgufTensorInfo& t : f.tensors()) {
    require(f.find(t.name) != nullptr);
    try {
      const std::vector<float> values = gguf_tensor_to_floats(t);
      require(values.size() == static_cast<size_t>(t.numel()));
    } catch (const concord::InputError&) {
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> image(data, data + size);
  try {
    const GgufFile f = GgufFile::from_bytes(std::move(image), "fuzz.gguf");
    exercise(f);
    // Whatever the reader accepts, the writer writes back, and the reader reads the same.
    std::vector<GgufTensorToWrite> tensors;
    for (const GgufTensorInfo& t : f.tensors()) tensors.push_back({t.name, t.dims, t.type, t.bytes});
    const GgufFile again = GgufFile::from_bytes(
        serialize_gguf(f.metadata(), tensors, static_cast<uint32_t>(f.alignment())), "again.gguf");
    require(again.metadata().size() == f.metadata().size());
    for (size_t i = 0; i < f.metadata().size(); ++i) {
      require(again.metadata()[i].first == f.metadata()[i].first);
      require(same_value(again.metadata()[i].second, f.metadata()[i].second));
    }
    require(again.tensors().size() == f.tensors().size());
    for (size_t i = 0; i < f.tensors().size(); ++i) {
      const GgufTensorInfo &a = f.tensors()[i], &b = again.tensors()[i];
      require(a.name == b.name && a.dims == b.dims && a.type == b.type);
      require(std::equal(a.bytes.begin(), a.bytes.end(), b.bytes.begin(), b.bytes.end()));
    }
  } catch (const concord::InputError&) {
  }
  return 0;
}
