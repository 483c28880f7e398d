# Set-up and everyday commands. `make demo` and `make test` work on a fresh
# Debian 12 machine: they install what is missing, configure, build and run.

BUILD_DIR  ?= build
BUILD_TYPE ?= Release
CMAKE_ARGS ?=
JOBS       ?= $(shell nproc)
PYTHON     ?= /usr/bin/python3

DEBIAN_PACKAGES := cmake ninja-build g++ libtorch-dev libfmt-dev libgtest-dev libgmock-dev \
                   libbenchmark-dev libopenblas0-pthread libsleef-dev
# Only `make bench` and `make fixtures` need Python with torch.
PYTHON_PACKAGES := python3-torch
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: deps deps-python configure build demo test bench fixtures clean

define install_missing
	@missing=$$(for p in $(1); do \
	  dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; \
	done); \
	if [ -n "$$missing" ]; then \
	  echo "Installing Debian packages:" $$missing; \
	  $(SUDO) apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q $$missing; \
	fi
endef

deps:
	$(call install_missing,$(DEBIAN_PACKAGES))

deps-python:
	$(call install_missing,$(PYTHON_PACKAGES))

$(BUILD_DIR)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_ARGS)

configure: deps $(BUILD_DIR)/CMakeCache.txt

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

demo: build
	$(BUILD_DIR)/examples/attention_scoring --out $(BUILD_DIR)/heatmaps

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

# Times this library and the book's Python code on the same shapes and thread
# counts, one run after the other, and prints one table (also written to
# $(BUILD_DIR)/bench-report.md).
BENCH_THREADS ?= 1,2
BENCH_FLAGS ?= --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
               --benchmark_min_time=0.2
bench: deps deps-python configure
	cmake -S . -B $(BUILD_DIR) -DD2L_BUILD_BENCHMARKS=ON
	cmake --build $(BUILD_DIR) -j $(JOBS) --target bench_attention
	$(BUILD_DIR)/benchmarks/bench_attention --threads $(BENCH_THREADS) $(BENCH_FLAGS) \
	  --benchmark_out=$(BUILD_DIR)/bench-cpp.json --benchmark_out_format=json
	for t in $$(echo $(BENCH_THREADS) | tr , ' '); do \
	  $(PYTHON) benchmarks/book_reference.py --threads $$t --out $(BUILD_DIR)/bench-book-threads$$t.json \
	    || exit 1; \
	done
	python3 benchmarks/compare.py --cpp $(BUILD_DIR)/bench-cpp.json \
	  $$(for t in $$(echo $(BENCH_THREADS) | tr , ' '); do echo --book $(BUILD_DIR)/bench-book-threads$$t.json; done) \
	  --out $(BUILD_DIR)/bench-report.md
	cat $(BUILD_DIR)/bench-report.md

# Regenerates the golden fixtures from the Python reference code.
fixtures: deps-python
	$(PYTHON) tests/fixtures/generate_fixtures.py

clean:
	rm -rf $(BUILD_DIR)
