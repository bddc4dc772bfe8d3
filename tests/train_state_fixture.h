// Checkpoint fingerprints recorded before a refactor of the training state (issue 35), for the
// tests that show a killed-and-resumed `train` run and RL run still end on the same bits.
//
// fingerprint(): FNV-1a 64 over everything a resumed run continues from, in a fixed order: the
// step, state.json's "optimizer_steps", and every tensor of model.safetensors,
// optimizer.safetensors and state.safetensors (sorted by name: name, shape, the fp32 bytes).
// The fixture is tests/golden/train_state_fingerprints.json, {"<case>": "<16 hex digits>"},
// found through CONCORD_GOLDEN_DIR (ctest sets it). A deliberate change of the bits records new
// values with CONCORD_RECORD_FINGERPRINTS=1 (the test then writes the file and fails, so that
// a recording never passes silently); say why in the commit.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "concord/train/checkpoint.h"

namespace concord::test {

class Fnv1a {
 public:
  void add(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) h_ = (h_ ^ p[i]) * 0x100000001b3ull;
  }
  void add(std::string_view s) {
    const uint64_t n = s.size();
    add(&n, sizeof n);
    add(s.data(), s.size());
  }
  void add_i64(int64_t v) { add(&v, sizeof v); }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 0xcbf29ce484222325ull;
};

inline std::string fingerprint(const train::LoadedCheckpoint& ckpt) {
  Fnv1a h;
  h.add_i64(ckpt.step);
  h.add_i64(ckpt.state.value("optimizer_steps", int64_t{-1}));
  for (const auto* group : {&ckpt.model, &ckpt.optimizer, &ckpt.state_tensors}) {
    h.add_i64(static_cast<int64_t>(group->size()));
    for (const train::NamedTensor& t : *group) {
      h.add(t.name);
      h.add_i64(static_cast<int64_t>(t.shape.size()));
      for (const int64_t d : t.shape) h.add_i64(d);
      h.add(t.values.data(), t.values.size() * sizeof(float));
    }
  }
  return fmt::format("{:016x}", h.value());
}

// Compares `actual` with the fixture's value for `name` (or records it, see above).
inline void expect_fingerprint(const std::string& name, const std::string& actual) {
  const char* dir = std::getenv("CONCORD_GOLDEN_DIR");
  ASSERT_NE(dir, nullptr) << "CONCORD_GOLDEN_DIR is not set (ctest sets it to tests/golden)";
  const std::filesystem::path path = std::filesystem::path(dir) / "train_state_fingerprints.json";
  nlohmann::json fixture = nlohmann::json::object();
  if (std::ifstream in(path); in) {
    std::stringstream s;
    s << in.rdbuf();
    fixture = nlohmann::json::parse(s.str());
  }
  if (const char* record = std::getenv("CONCORD_RECORD_FINGERPRINTS"); record && *record == '1') {
    fixture[name] = actual;
    std::ofstream(path) << fixture.dump(2) << "\n";
    FAIL() << "recorded " << name << " = " << actual << " in " << path.string();
  }
  ASSERT_TRUE(fixture.contains(name)) << path.string() << " has no entry '" << name << "'";
  EXPECT_EQ(fixture.at(name).get<std::string>(), actual)
      << name << ": the resumed run's checkpoint differs from the one recorded before the change";
}

}  // namespace concord::test
