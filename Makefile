# concord's front door. The README's Quick start uses `make demo` and `make test`.
BUILD ?= build
ASAN_BUILD ?= build-asan
CUDA_BUILD ?= build-cuda
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 20
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: setup build demo test check asan bench fuzz cuda clean

setup:
	bash scripts/setup

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

# Sets up, builds (Release) the concord binary alone (not the tests and benchmarks that `build`
# and `test` compile) and runs the main job on its embedded defaults.
demo: setup $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS) --target concord
	$(BUILD)/bin/concord demo

# Sets up, builds and runs every test (C++ and the Python reference comparisons) with ctest.
test: setup build
	OMP_WAIT_POLICY=passive ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# The inner loop (docs/development.md): build only what one layer's tests need and run them,
# without setup or the rest of the build. LAYER is numerics, cuda, tensor, io, model, train, serve, rl,
# sched, audit, cli or python; SLOW=1 adds the tests labelled slow. Example: make check LAYER=model
LAYERS := numerics cuda tensor io model train serve rl sched audit cli python
check: $(BUILD)/build.ninja
	@case " $(LAYERS) " in *" $(LAYER) "*) ;; *) \
	  echo "make check: LAYER must be one of: $(LAYERS) (got '$(LAYER)')"; exit 2;; esac
	cmake --build $(BUILD) -j $(JOBS) --target tests_$(LAYER)
	OMP_WAIT_POLICY=passive ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) \
	  -L '^$(LAYER)$$' $(if $(SLOW),,-LE slow)

# The same tests under AddressSanitizer + UndefinedBehaviorSanitizer, warnings as errors.
asan: setup
	cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCONCORD_SANITIZE=ON \
	  -DCONCORD_BUILD_BENCH=OFF $(CMAKE_FLAGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  OMP_WAIT_POLICY=passive ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS) -LE slow

# The CUDA slice on its own (src/concord/cuda/: nvcc, sm_90, warnings as errors): compile and
# link only — nothing CUDA runs without a GPU (its check says so and exits 77). On a GPU machine
# tools/gpu_check.sh builds it the same way and runs it.
cuda:
	@if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then \
	  echo "make cuda: no nvcc (install the CUDA toolkit); skipped"; exit 0; fi; \
	PATH="$$PATH:/usr/local/cuda/bin" cmake -S src/concord/cuda -B $(CUDA_BUILD) -G Ninja \
	  -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) && \
	PATH="$$PATH:/usr/local/cuda/bin" cmake --build $(CUDA_BUILD) -j $(JOBS) && \
	{ $(CUDA_BUILD)/bin/cuda_check; rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 77 ]; }

# libFuzzer targets for the GGUF, safetensors and logit-dump readers (clang, ASan + UBSan), each
# run for FUZZ_SECONDS on a fresh seed corpus written by concord's own writers (docs/gguf.md).
fuzz: setup
	cmake -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g -DNDEBUG" \
	  -DCMAKE_CXX_COMPILER=clang++ -DCONCORD_BUILD_FUZZ=ON -DCONCORD_BUILD_TESTS=OFF \
	  -DCONCORD_BUILD_BENCH=OFF $(CMAKE_FLAGS)
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target gguf_fuzz safetensors_fuzz dump_fuzz fuzz_seeds
	rm -rf $(FUZZ_BUILD)/corpus
	$(FUZZ_BUILD)/bin/fuzz_seeds $(FUZZ_BUILD)/corpus
	for reader in gguf safetensors dump; do \
	  mkdir -p $(FUZZ_BUILD)/corpus/$$reader && \
	  $(FUZZ_BUILD)/bin/$${reader}_fuzz -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 \
	    -max_len=65536 -print_final_stats=1 -print_funcs=0 -artifact_prefix=$(FUZZ_BUILD)/$${reader}- \
	    $(FUZZ_BUILD)/corpus/$$reader || exit 1; \
	done

bench: setup build
	bash bench/run.sh $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
