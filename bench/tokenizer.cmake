# tokenizer_bench; included from bench/CMakeLists.txt
