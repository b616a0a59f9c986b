# Drives the CMake build and the Python checks.  `make` builds the library and puts it
# into the package folder, where `import pyroundlib` finds it.
PYTHON     ?= python3
BUILD_DIR  ?= build
BUILD_TYPE ?= Release
CMAKE_ARGS ?=
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
LIB        := libpyroundlib.so
PYTEST_ARGS ?= -q

.PHONY: all build deps demo test bench sanitize fuzz cuda-sanitize clean

all: build

build:
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_ARGS)
	cmake --build $(BUILD_DIR) -j $(JOBS)
	cp $(BUILD_DIR)/$(LIB) pyroundlib/.$(LIB).tmp && mv -f pyroundlib/.$(LIB).tmp pyroundlib/$(LIB)

# Installs what the Python side needs, only where it is missing (a machine that already
# has a torch, e.g. a CUDA build, keeps it).
deps:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install -q "torch==2.13.0"
	@$(PYTHON) -c "import pytest, hypothesis, numpy" 2>/dev/null || $(PYTHON) -m pip install -q -r requirements-test.txt

demo: build deps
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON) examples/demo.py

test: build deps
	cd $(BUILD_DIR) && ctest --output-on-failure
	$(PYTHON) -m pytest $(PYTEST_ARGS) tests

# The benchmark (benchmarks/bench.py): on the GPU when there is one, else the CPU.
BENCH_ARGS ?=
bench: build deps
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON) benchmarks/bench.py $(BENCH_ARGS)

# Host code under AddressSanitizer + UndefinedBehaviorSanitizer: a CPU-only build, the C
# ABI test (ctest), then the Python tests of the CPU path against that library (libasan
# must be loaded first, and libstdc++ with it so that C++ exceptions in torch unwind).
SAN_BUILD_DIR ?= build-sanitize
SAN_TESTS ?= tests/test_round.py tests/test_lltm.py tests/test_validation.py tests/test_library.py \
             tests/test_threads.py tests/test_fuzz.py
sanitize: deps
	cmake -S . -B $(SAN_BUILD_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPYROUNDLIB_WITH_CUDA=OFF -DPYROUNDLIB_SANITIZE=ON \
	  -DPYROUNDLIB_CPU_MULTIVERSION=OFF
	cmake --build $(SAN_BUILD_DIR) -j $(JOBS)
	cd $(SAN_BUILD_DIR) && ctest --output-on-failure
	LD_PRELOAD="$$($(CC) -print-file-name=libasan.so) $$($(CXX) -print-file-name=libstdc++.so)" \
	  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  PYROUNDLIB_LIBRARY=$(CURDIR)/$(SAN_BUILD_DIR)/libpyroundlib.so \
	  $(PYTHON) -m pytest $(PYTEST_ARGS) -p no:cacheprovider $(SAN_TESTS)

# The long property-based tier: at least 10,000 examples per property.
FUZZ_EXAMPLES ?= 10000
fuzz: build deps
	PYROUNDLIB_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PYTHON) -m pytest $(PYTEST_ARGS) tests/test_fuzz.py

# compute-sanitizer's four tools over the CUDA tests (GPU machine).  Only our kernels
# are checked (torch's and cuBLAS's are not ours to fix); the >2^31-element tests are
# left out (hours under memcheck).  First, all four tools over the torch-free C workload
# (tests/c/cuda_workload.cu): every kernel, nothing filtered.  Then the pytest runs.
# racecheck there skips the float16/bfloat16 LLTM tests: inside a torch process,
# compute-sanitizer 2025.3.1's racecheck fails internally ("failed to handle a hardware
# exception") on those kernels, which racecheck passes in the C workload and memcheck
# passes everywhere (they use no shared memory, the only thing racecheck checks).  initcheck under torch reports
# torch's own cudaMemcpy reads (inside torch.equal) and, with host copies unchecked, reads
# of memory torch filled by copies; it cannot tell ours from torch's there.  So initcheck runs
# on the C workload (tests/c/cuda_workload.cu) only, where it sees every write and read.
CUDA_SANITIZE_TESTS ?= tests/test_cuda.py tests/test_round.py tests/test_lltm.py tests/test_threads.py
CUDA_SANITIZE_K ?= cuda and not 2_31 and not 64_bit
RACECHECK_K ?= $(CUDA_SANITIZE_K) and not (lltm and (float16 or bfloat16))
COMPUTE_SANITIZER ?= compute-sanitizer
cuda-sanitize: build deps
	status=0; for tool in memcheck racecheck initcheck synccheck; do \
	  echo "== compute-sanitizer --tool $$tool, C workload (no torch, every kernel checked)"; \
	  $(COMPUTE_SANITIZER) --tool $$tool --error-exitcode 99 $(BUILD_DIR)/prl_cuda_workload || status=1; \
	done; \
	for tool in memcheck racecheck synccheck; do \
	  k="$(CUDA_SANITIZE_K)"; [ $$tool = racecheck ] && k="$(RACECHECK_K)"; \
	  echo "== compute-sanitizer --tool $$tool"; \
	  $(COMPUTE_SANITIZER) --tool $$tool --error-exitcode 99 --kernel-name kns=round_kernel --kernel-name kns=lltm_ \
	    $(PYTHON) -m pytest -q -p no:cacheprovider $(CUDA_SANITIZE_TESTS) -k "$$k" || status=1; \
	done; exit $$status

clean:
	rm -rf $(BUILD_DIR) $(SAN_BUILD_DIR) pyroundlib/$(LIB)
