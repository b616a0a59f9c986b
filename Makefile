# Drives the CMake build and the Python checks.  `make` builds the library and puts it
# into the package folder, where `import pyroundlib` finds it.
PYTHON     ?= python3
BUILD_DIR  ?= build
BUILD_TYPE ?= Release
CMAKE_ARGS ?=
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
LIB        := libpyroundlib.so
PYTEST_ARGS ?= -q

.PHONY: all build deps demo test bench clean

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

clean:
	rm -rf $(BUILD_DIR) pyroundlib/$(LIB)
