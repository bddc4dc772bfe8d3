// libFuzzer target: io::SafetensorsFile::from_bytes on arbitrary bytes. Bad input may only
// throw InputError; a file that loads must convert its float tensors (or refuse with
// InputError) and survive a write/read round trip with the same tensors and metadata.
#include <cstdint>
#include <vector>

#include "concord/io/safetensors.h"
#include "concord/numerics/check.h"

namespace {

void require(bool condition) {
  if (!condition) __builtin_trap();  // a finding: libFuzzer saves the input
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace concord::io;
  std::vector<uint8_t> image(data, data + size);
  try {
    const SafetensorsFile f = SafetensorsFile::from_bytes(std::move(image), "fuzz.safetensors");
    std::vector<TensorToWrite> tensors;
    for (const TensorInfo& t : f.tensors()) {
      require(f.find(t.name) == &t);
      try {
        const std::vector<float> values = tensor_to_floats(t);
        require(values.size() == static_cast<size_t>(t.numel()));
      } catch (const concord::InputError&) {
      }
      tensors.push_back({t.name, t.dtype, t.shape, t.bytes});
    }
    const SafetensorsFile again =
        SafetensorsFile::from_bytes(serialize_safetensors(tensors, f.metadata()), "again.safetensors");
    require(again.metadata() == f.metadata());
    require(again.tensors().size() == f.tensors().size());
    for (const TensorInfo& t : f.tensors()) {
      const TensorInfo& u = again.get(t.name);
      require(u.dtype == t.dtype && u.shape == t.shape);
      require(std::equal(t.bytes.begin(), t.bytes.end(), u.bytes.begin(), u.bytes.end()));
    }
  } catch (const concord::InputError&) {
  }
  return 0;
}
