# tokenizer_test (owned by the tokenizer work); included from tests/io/CMakeLists.txt.
# Byte-level BPE: loading errors, the split patterns by hand, the training byte tokenizer,
# round trips through tokenizer.json and GGUF's vocabulary view, on tests/data/tokenizer.
add_executable(tokenizer_test tokenizer_test.cpp tokenizer_split_test.cpp)
target_compile_definitions(tokenizer_test PRIVATE CONCORD_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
target_link_libraries(tokenizer_test PRIVATE concord_io concord_train nlohmann_json::nlohmann_json
  GTest::gtest_main concord_test_warnings)
gtest_discover_tests(tokenizer_test DISCOVERY_TIMEOUT 60)
