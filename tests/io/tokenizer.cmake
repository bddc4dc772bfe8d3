# tokenizer_test (owned by the tokenizer work); included from tests/io/CMakeLists.txt
