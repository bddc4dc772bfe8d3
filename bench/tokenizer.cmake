# tokenizer_bench; included from bench/CMakeLists.txt. Encode MB/s on the KJV, one thread.
add_executable(tokenizer_bench tokenizer_bench.cpp)
target_compile_definitions(tokenizer_bench PRIVATE CONCORD_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
target_link_libraries(tokenizer_bench PRIVATE concord_io concord_model concord_train benchmark::benchmark
  concord_warnings)
