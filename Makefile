# Set-up and everyday commands. `make demo` and `make test` work on a fresh
# Debian 12 machine: they install what is missing, configure, build and run.
#
#   make demo     the library, d2l::viz and the demo program, then the demo
#   make test     the release suite on one LibTorch (TORCH, below)
#   make check    what CI runs: make test and the Debian 12 package, ASan+UBSan
#                 on LibTorch 2.x, TSan, a bounded fuzz run, and the Debian 13
#                 leg with its package
#   make test-debian13  make test in a Debian 13 root (its LibTorch 2.6)
#   make package  Debian packages of this build (CPack): BUILD_DIR/packages/
#   make dist     the source tarball of HEAD (git archive): dist/
#
# TORCH picks the LibTorch:
#   debian        Debian's libtorch-dev (1.13 on Debian 12), the default
#   wheel         PyPI's torch $(TORCH2_VERSION) in a project-local .venv
#                 (TORCH2_VARIANT=cpu: without its CUDA packages, in .venv-cpu)
#   <prefix>      any other LibTorch: a folder holding TorchConfig.cmake (an
#                 official archive's libtorch/, or a wheel's
#                 torch.utils.cmake_prefix_path); Debian's libtorch-dev is
#                 then not installed

TORCH      ?= debian
BUILD_TYPE ?= Release
CMAKE_ARGS ?=
JOBS       ?= $(shell nproc)
PYTHON     ?= /usr/bin/python3

# Debian's packages for every leg, and Debian's LibTorch for TORCH=debian.
# dataset-fashion-mnist: the data of d2l 1.0's FashionMNIST, which its tests
# read (/usr/share/datasets/fashion-mnist; `make fashion-mnist` alone).
DEBIAN_PACKAGES := cmake ninja-build g++ python3 libfmt-dev libgtest-dev libgmock-dev \
                   libbenchmark-dev libopenblas0-pthread libsleef-dev libxml2-dev zlib1g-dev \
                   libgloo-dev libcli11-dev dataset-fashion-mnist
DEBIAN_TORCH_PACKAGES := libtorch-dev
# Only `make bench` (bench-book) and `make fixtures` need Python with torch;
# the Fashion-MNIST fixture also PIL (the book's resize).
PYTHON_PACKAGES := python3-torch python3-pil

# The LibTorch 2.x leg: PyPI's torch wheel (a CUDA build; with its CUDA
# packages its LibTorch also compiles our NCCL path) in a project-local
# virtual environment. Pinned:
# the GPU machines carry 2.11, and 2.14 on needs C++20.
TORCH2_VERSION ?= 2.11.0
# TORCH2_VARIANT: cuda (the wheel as pip installs it, with its CUDA packages:
# 4.6 GB) or cpu (the wheel without them, 1.3 GB, in its own environment; the
# build links LibTorch's CPU libraries, D2L_TORCH_CPU_ONLY, and has no CUDA).
TORCH2_VARIANT ?= cuda
ifeq ($(TORCH2_VARIANT),cuda)
  VENV ?= .venv
  TORCH2_PIP := torch==$(TORCH2_VERSION)
  TORCH2_CPU_ONLY := OFF
else ifeq ($(TORCH2_VARIANT),cpu)
  VENV ?= .venv-cpu
  # torch alone, and the two CUDA libraries libtorch_cpu.so links (the CUDA
  # runtime and CUPTI, 9 MB), at the versions torch $(TORCH2_VERSION) names.
  TORCH2_PIP := --no-deps torch==$(TORCH2_VERSION) nvidia-cuda-runtime==13.0.96 nvidia-cuda-cupti==13.0.85
  TORCH2_CPU_ONLY := ON
else
  $(error TORCH2_VARIANT=$(TORCH2_VARIANT): cuda or cpu)
endif
# Named either way, so that a build tree configured with one variant follows
# a switch to the other.
TORCH2_CMAKE_ARGS := -DD2L_TORCH_CPU_ONLY=$(TORCH2_CPU_ONLY)
BUILD2_DIR     ?= build-torch2
TORCH2_STAMP   := $(VENV)/.torch-$(TORCH2_VERSION)-$(TORCH2_VARIANT)
# torch.utils.cmake_prefix_path, found without importing torch (the cpu
# variant cannot import it: its Python dependencies are not installed).
TORCH2_PREFIX   = $$($(VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"] + "/torch/share/cmake")')
# The sanitizer and fuzz builds (CMakePresets.json): clang 14 and its runtimes.
SANITIZER_PACKAGES := clang-14 libclang-rt-14-dev
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# How long `make fuzz` fuzzes, and the bounded run inside `make check`.
FUZZ_SECONDS ?= 60
CI_FUZZ_SECONDS ?= 60
# CHECK_PRUNE=1 (the default under CI): each leg's build tree, Debian root
# and Python environment is deleted once the leg has passed, but for the logs
# the summary reads (tests/check_prune.sh); CHECK_PRUNE=0 keeps them all.
CHECK_PRUNE ?= $(if $(CI),1,0)
# What `make check` needs free to start (docs/building.md, "What CI runs"):
# pruned, its largest leg (3.4 GiB measured: the Debian 13 root and build
# tree) and Debian's packages (0.7 GB); unpruned, every tree, both roots and
# .venv-cpu (the sum of the trees of a whole run, 13 GB, less the wheel's
# 3.3 GB of CUDA packages), and the packages.
CHECK_DISK_GIB ?= $(if $(filter 1,$(CHECK_PRUNE)),5,12)

# A LibTorch named on the CMake side (CMAKE_ARGS or the environment) counts
# as TORCH=<prefix>: two LibTorch installations on one machine are how
# programs end up linking both, so Debian's is not installed beside it.
FOREIGN_TORCH := $(strip $(filter -DCMAKE_PREFIX_PATH=% -DTorch_DIR=%,$(CMAKE_ARGS)) \
                         $(CMAKE_PREFIX_PATH) $(Torch_DIR))

ifeq ($(TORCH),debian)
  BUILD_DIR ?= build
  TORCH_DEPS := $(if $(FOREIGN_TORCH),,deps-debian-torch)
  TORCH_CMAKE_ARGS :=
else ifeq ($(TORCH),wheel)
  BUILD_DIR ?= $(BUILD2_DIR)
  TORCH_DEPS := deps-torch2
  TORCH_CMAKE_ARGS = -DCMAKE_PREFIX_PATH="$(TORCH2_PREFIX)" $(TORCH2_CMAKE_ARGS)
else
  TORCH_CONFIG := $(firstword $(wildcard $(addprefix $(TORCH)/,TorchConfig.cmake Torch/TorchConfig.cmake \
                    share/cmake/Torch/TorchConfig.cmake lib/cmake/Torch/TorchConfig.cmake)))
  ifeq ($(TORCH_CONFIG),)
    $(error TORCH=$(TORCH): not debian, not wheel, and no TorchConfig.cmake under it (looked in ., Torch/, share/cmake/Torch/, lib/cmake/Torch/); give the LibTorch folder (libtorch/ of an archive, or python -c 'import torch.utils; print(torch.utils.cmake_prefix_path)'))
  endif
  BUILD_DIR ?= build-$(subst /,_,$(patsubst /%,%,$(abspath $(TORCH))))
  TORCH_DEPS :=
  TORCH_CMAKE_ARGS := -DCMAKE_PREFIX_PATH="$(abspath $(TORCH))"
endif

.PHONY: deps deps-debian-torch deps-python deps-sanitizers deps-torch2 configure build demo nadaraya-watson \
        attention-pooling \
        multi-head python-weights python-transformer \
        fra-eng fashion-mnist bahdanau transformer vit-fashion-mnist seq2seq test check check-disk check-prune build-torch2 \
        package deps-package test-package-debian12 test-package-debian13 dist test-torch2 test-asan test-asan-torch2 \
        test-tsan test-fuzz test-debian13 clean-debian13 fuzz bench bench-book bench-sdpa bench-gqa bench-bands bench-transformer bench-generate bench-nn bench-spread bench-dp device-sources \
        fixtures clean
# The steps of `make check` each build with all cores; running them side by
# side would only fight over the two.
.NOTPARALLEL:

define install_missing
	@missing=$$(for p in $(1); do \
	  dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; \
	done); \
	if [ -n "$$missing" ]; then \
	  command -v apt-get > /dev/null || { \
	    echo "make: needs the Debian packages $$missing, and this is not Debian: install their equivalents, or build with plain CMake (docs/building.md)" >&2; exit 1; }; \
	  echo "Installing Debian packages:" $$missing; \
	  $(SUDO) apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q -o APT::Keep-Downloaded-Packages=false $$missing; \
	fi
endef

deps: $(TORCH_DEPS)
	$(call install_missing,$(DEBIAN_PACKAGES))

deps-debian-torch:
	$(call install_missing,$(DEBIAN_PACKAGES) $(DEBIAN_TORCH_PACKAGES))

deps-python:
	$(call install_missing,$(PYTHON_PACKAGES))

deps-sanitizers: deps
	$(call install_missing,$(SANITIZER_PACKAGES))

# Debian's python3 (3.11) makes the environment; pip brings torch and, for
# the cuda variant, the CUDA libraries it links (about 3 GB). Not kept in
# pip's cache: that would hold the 3 GB a second time.
deps-torch2: $(TORCH2_STAMP)
	$(call install_missing,$(DEBIAN_PACKAGES))

$(TORCH2_STAMP):
	$(call install_missing,python3-venv)
	/usr/bin/python3 -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-cache-dir $(TORCH2_PIP)
	$(VENV)/bin/python -c 'import importlib.metadata as m; v = m.version("torch"); assert v.split("+")[0] == "$(TORCH2_VERSION)", v'
	touch $@

$(BUILD_DIR)/CMakeCache.txt: | deps
	cmake --preset release -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(TORCH_CMAKE_ARGS) $(CMAKE_ARGS)

configure: deps $(BUILD_DIR)/CMakeCache.txt

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

# The 2.x leg by its old names: the same as TORCH=wheel.
build-torch2:
	$(MAKE) build TORCH=wheel
test-torch2:
	$(MAKE) test TORCH=wheel

# Each example builds its own program and what it links, nothing else.
demo: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target attention_scoring
	$(BUILD_DIR)/examples/attention_scoring --out $(BUILD_DIR)/heatmaps

# The book's Nadaraya-Watson regression: training progress and SVG pictures.
nadaraya-watson: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target nadaraya_watson
	$(BUILD_DIR)/examples/nadaraya_watson --out $(BUILD_DIR)/nadaraya_watson

# d2l 1.0's attention pooling by similarity: the kernels, their fits and
# attention weights.
attention-pooling: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target attention_pooling_kernels
	$(BUILD_DIR)/examples/attention_pooling_kernels --out $(BUILD_DIR)/attention_pooling

# The book's multi-head attention: the output's shape and each head's
# weights as heatmaps.
multi-head: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target multi_head_attention
	$(BUILD_DIR)/examples/multi_head_attention --out $(BUILD_DIR)/multi_head

# Weights from Python: the book's PyTorch MultiHeadAttention saves its
# state dict and outputs; the C++ program loads the weights and compares.
# The book's Python Transformer trained on the sample (its recipe, 200
# epochs, about 3 minutes on one thread), saved with torch.save(state_dict),
# then loaded into the C++ Transformer, which must translate the four
# sentences exactly as Python did (docs/examples.md).
PYTHON_TRANSFORMER_DIR = $(BUILD_DIR)/python_transformer
python-transformer: deps-python configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target bahdanau_fra_eng
	mkdir -p $(PYTHON_TRANSFORMER_DIR)
	OPENBLAS_NUM_THREADS=1 $(PYTHON) benchmarks/book_bahdanau.py --model transformer --threads 1 \
	  --save $(PYTHON_TRANSFORMER_DIR)/transformer_state_dict.pt \
	  --translations $(PYTHON_TRANSFORMER_DIR)/translations.txt
	$(BUILD_DIR)/examples/bahdanau_fra_eng --model transformer --threads 1 \
	  --load $(PYTHON_TRANSFORMER_DIR)/transformer_state_dict.pt \
	  --expect $(PYTHON_TRANSFORMER_DIR)/translations.txt --out $(PYTHON_TRANSFORMER_DIR)

python-weights: deps-python configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target load_python_weights
	$(PYTHON) examples/python_weights.py $(BUILD_DIR)/python_weights
	$(BUILD_DIR)/examples/load_python_weights $(BUILD_DIR)/python_weights

# The book's Bahdanau attention against the plain seq2seq decoder on a
# generated reversal task: BLEU of both, loss curves, alignment heatmap.
# OpenMP's threads spin between parallel regions unless OMP_WAIT_POLICY is
# passive; with other programs on the cores that made an epoch 20 times
# slower (98 s instead of 4.8 s on 2 cores), so the training targets set it.
SEQ2SEQ_ARGS ?=
seq2seq: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target seq2seq_attention
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-passive} $(BUILD_DIR)/examples/seq2seq_attention --out $(BUILD_DIR)/seq2seq \
	  --save $(BUILD_DIR)/seq2seq/attention_model.pt $(SEQ2SEQ_ARGS)

# d2l's fra-eng data (English-French pairs from tatoeba.org via manythings.org,
# CC BY 2.0), fetched from d2l's data hub and checked against the SHA-1 in
# d2l's DATA_HUB; without a network, says where to put the file.
FRA_ENG_URL := http://d2l-data.s3-accelerate.amazonaws.com/fra-eng.zip
FRA_ENG_SHA1 := 94646ad1522d915e7b0f9296181140edcf86a4f5
FRA_ENG_ZIP := data/fra-eng.zip
fra-eng:
	@mkdir -p $(dir $(FRA_ENG_ZIP))
	@if [ -f $(FRA_ENG_ZIP) ] && echo "$(FRA_ENG_SHA1)  $(FRA_ENG_ZIP)" | sha1sum -c --status; then \
	  echo "$(FRA_ENG_ZIP): present, SHA-1 $(FRA_ENG_SHA1)"; \
	elif curl -fsSL --connect-timeout 20 -o $(FRA_ENG_ZIP).part $(FRA_ENG_URL); then \
	  if echo "$(FRA_ENG_SHA1)  $(FRA_ENG_ZIP).part" | sha1sum -c --status; then \
	    mv $(FRA_ENG_ZIP).part $(FRA_ENG_ZIP); echo "$(FRA_ENG_ZIP): downloaded, SHA-1 $(FRA_ENG_SHA1)"; \
	  else \
	    echo "$(FRA_ENG_URL): SHA-1 $$(sha1sum < $(FRA_ENG_ZIP).part | cut -d' ' -f1), expected $(FRA_ENG_SHA1)" >&2; \
	    rm -f $(FRA_ENG_ZIP).part; exit 1; \
	  fi; \
	else \
	  rm -f $(FRA_ENG_ZIP).part; \
	  echo "cannot download $(FRA_ENG_URL)." >&2; \
	  echo "Put d2l's fra-eng.zip (SHA-1 $(FRA_ENG_SHA1)) at $(CURDIR)/$(FRA_ENG_ZIP)" >&2; \
	  echo "and run make fra-eng again; the examples take --data PATH to the zip or its fra.txt." >&2; \
	  exit 1; \
	fi

# Fashion-MNIST (d2l 1.0's FashionMNIST) from Debian's dataset-fashion-mnist,
# which `make deps` also installs: the four gzipped IDX files in
# $(FASHION_MNIST_DIR). The library reads them there by default; elsewhere,
# FashionMNISTOptions().root(...) or D2L_FASHION_MNIST names the folder.
FASHION_MNIST_DIR := /usr/share/datasets/fashion-mnist
fashion-mnist:
	$(call install_missing,dataset-fashion-mnist)
	@ls -l $(foreach split,train t10k,$(foreach file,images-idx3 labels-idx1,\
	  $(FASHION_MNIST_DIR)/$(split)-$(file)-ubyte.gz))

# The dtype `make bahdanau` and `make transformer` train in: float32, or
# bfloat16 with float32 master weights (make transformer DTYPE=bfloat16);
# other dtypes than float32 write into <target>-<dtype>/.
DTYPE ?= float32
DTYPE_SUFFIX = $(if $(filter-out float32,$(DTYPE)),-$(DTYPE))

# The book's Bahdanau section on fra-eng (the book's recipe, 250 epochs):
# loss, tokens/s, four translations with BLEU, loss curve and heatmap.
bahdanau: configure fra-eng
	cmake --build $(BUILD_DIR) -j $(JOBS) --target bahdanau_fra_eng
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-passive} $(BUILD_DIR)/examples/bahdanau_fra_eng --data $(FRA_ENG_ZIP) \
	  --dtype $(DTYPE) --out $(BUILD_DIR)/bahdanau$(DTYPE_SUFFIX)

# The book's Transformer section (its recipe, 200 epochs) on the fra-eng
# sample in tests/data, or on d2l's fra-eng.zip once `make fra-eng` has
# fetched it: loss, tokens/s, four translations with BLEU, the loss curve and
# the attention heatmaps per layer and head.
transformer: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target bahdanau_fra_eng
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-passive} $(BUILD_DIR)/examples/bahdanau_fra_eng --model transformer \
	  $(if $(wildcard $(FRA_ENG_ZIP)),--data $(FRA_ENG_ZIP)) --dtype $(DTYPE) \
	  --out $(BUILD_DIR)/transformer$(DTYPE_SUFFIX)

# The book's Vision Transformer section: its recipe on all of Fashion-MNIST,
# 10 epochs on 2 threads (hours on 2 cores): progress, the final validation
# accuracy, the log and the loss/accuracy plot under $(VIT_DIR) (docs/vit.md).
# A checkpoint after every epoch: run it again after an interruption and it
# resumes where it stopped (the log is appended to).
VIT_DIR = $(BUILD_DIR)/vit
vit-fashion-mnist: configure fashion-mnist
	cmake --build $(BUILD_DIR) -j $(JOBS) --target vit_fashion_mnist
	mkdir -p $(VIT_DIR)
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-passive} $(BUILD_DIR)/examples/vit_fashion_mnist --threads 2 \
	  --profile --svg $(VIT_DIR)/loss.svg --checkpoint $(VIT_DIR)/checkpoint.pt 2>&1 \
	  | tee -a $(VIT_DIR)/train.log; \
	grep -q '^final val_acc 0[.]' $(VIT_DIR)/train.log

# One line per ctest log: its count, failures and skips; then their total.
define ctest_summary
	@for log in $(1); do \
	  sed -n "s|.*tests passed, \([0-9]*\) tests failed out of \([0-9]*\).*|$$log: \2 tests, \1 failed, $$(grep -c '(Skipped)' $$log) skipped|p" $$log; \
	done
	@for log in $(1); do \
	  sed -n 's/.*tests passed, \([0-9]*\) tests failed out of \([0-9]*\).*/\1 \2/p' $$log | tr '\n' ' '; \
	  grep -c '(Skipped)' $$log; \
	done | awk '{ failed += $$1; total += $$2; skipped += $$3 } \
	  END { printf "total: %d passed, %d failed, %d skipped\n", total - failed - skipped, failed, skipped }'
endef

# The release suite on one LibTorch (TORCH): the GoogleTest suite and the
# benchmark scripts' self-test; with CONSUMER_TESTS=1 (make check, and the
# Debian 13 leg) also the consumer tests, projects that use the library as
# an installed package, a subproject and through FetchContent (label
# consumer: a second build of the library). Build and ctest are timed apart.
# A slice: cd $(BUILD_DIR) && ctest -L fast (labels fast, slow, cuda,
# distributed, consumer).
test: configure
	@t0=$$(date +%s); \
	cmake --build $(BUILD_DIR) -j $(JOBS) || exit 1; \
	t1=$$(date +%s); \
	rm -rf $(BUILD_DIR)/gtest-reports; \
	(cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) -O ctest.log \
	  $(if $(filter 1,$(CONSUMER_TESTS)),,-LE consumer)); rc=$$?; \
	t2=$$(date +%s); \
	echo "make test ($(BUILD_DIR)/): build $$((t1 - t0)) s, ctest $$((t2 - t1)) s"; \
	exit $$rc
	$(call ctest_summary,$(BUILD_DIR)/ctest.log)
	@$(PYTHON) tests/gtest_summary.py $(BUILD_DIR)/gtest-reports

# Everything CI checks, one suite after the other, then one line adding up
# their ctest summaries. Each LibTorch once, where it finds the most:
#   build:       the release suite on Debian's LibTorch 1.13 (make test), then
#                its Debian packages installed, used and removed in a clean
#                Debian 12 root (make test-package-debian12);
#   build-asan-torch2: the suite under AddressSanitizer + UBSan (clang 14) on
#                PyPI's torch $(TORCH2_VERSION) without its CUDA packages
#                (TORCH2_VARIANT=cpu, in .venv-cpu: CI's disk does not hold
#                the 3 GB of them); the CUDA wheel's own build and the CUDA
#                paths are make test TORCH=wheel's and .ci/gpu-run's;
#   build-tsan:  the concurrency and kernel-thread tests under ThreadSanitizer;
#   build-fuzz:  fuzz_attention for CI_FUZZ_SECONDS from the committed corpus
#                (ASan + UBSan, 1.13, the static library);
#   build-debian13: the release suite on Debian 13's own LibTorch 2.6, in a
#                Debian 13 root, and its packages installed there
#                (make test-debian13 test-package-debian13).
# The wheel's release suite (make test TORCH=wheel) is not in it: the ASan
# leg runs its GoogleTest cases but two that measure memory use (the
# sanitizers' quarantine holds freed memory), which the 1.13 and 2.6 legs run
# (docs/building.md, "What CI runs").
CHECK_LOGS := build/ctest.log build-asan-torch2/ctest.log \
              build-tsan/ctest.log build-fuzz/ctest.log build-debian13/ctest.log
CHECK_VENV := .venv-cpu
# Through make, so that `make -n check` prints the deletions instead of
# running them (a recipe line that names $(MAKE) runs even under -n).
check_prune = $(if $(filter 1,$(CHECK_PRUNE)),$(MAKE) --no-print-directory check-prune CHECK_PRUNE_PATHS="$(1)",true)
check-prune:
	tests/check_prune.sh $(CHECK_PRUNE_PATHS)
check: check-disk
	@t0=$$(date +%s); $(MAKE) test TORCH=debian BUILD_DIR=build CONSUMER_TESTS=1 && \
	t1=$$(date +%s) && $(MAKE) package TORCH=debian BUILD_DIR=build && $(call check_prune,build) && \
	$(MAKE) test-package-debian12 PACKAGE_BUILT=1 && $(call check_prune,$(DEBIAN12_ROOT)) && \
	t2=$$(date +%s) && $(MAKE) test-asan-torch2 TORCH2_VARIANT=cpu VENV=$(CHECK_VENV) && \
	$(call check_prune,build-asan-torch2 $(CHECK_VENV)) && \
	t3=$$(date +%s) && $(MAKE) test-tsan && $(call check_prune,build-tsan) && \
	t4=$$(date +%s) && $(MAKE) test-fuzz && $(call check_prune,build-fuzz) && \
	t5=$$(date +%s) && $(MAKE) test-debian13 && $(call check_prune,build-debian13) && \
	t6=$$(date +%s) && $(MAKE) test-package-debian13 && $(call check_prune,$(DEBIAN13_ROOT)) && \
	t7=$$(date +%s) && \
	echo "make check: 1.13 $$((t1 - t0)) s, Debian 12 package $$((t2 - t1)) s, ASan 2.x $$((t3 - t2)) s," \
	  "TSan $$((t4 - t3)) s, fuzz $$((t5 - t4)) s, Debian 13 $$((t6 - t5)) s, Debian 13 package $$((t7 - t6)) s," \
	  "in all $$((t7 - t0)) s"
	$(call ctest_summary,$(CHECK_LOGS))
	@$(PYTHON) tests/gtest_summary.py build/gtest-reports \
	  build-asan-torch2/gtest-reports build-tsan/gtest-reports build-debian13/gtest-reports

# Debian packages of BUILD_DIR's build (cmake/D2LPackaging.cmake): the
# runtime library and the development files, in $(BUILD_DIR)/packages/.
# CPack's DEB generator needs dpkg-deb and dpkg-shlibdeps (dpkg-dev), and
# file(1) to find the libraries whose dependencies dpkg-shlibdeps reads.
deps-package:
	$(call install_missing,dpkg-dev file)

package: deps-package configure
	@command -v dpkg-deb > /dev/null && command -v dpkg-shlibdeps > /dev/null && command -v file > /dev/null || { \
	  echo "make package: needs dpkg-deb, dpkg-shlibdeps (Debian's dpkg-dev) and file; install them, or install with cmake --install $(BUILD_DIR) (docs/building.md)" >&2; exit 1; }
	cmake --build $(BUILD_DIR) -j $(JOBS)
	rm -rf $(BUILD_DIR)/packages
	cd $(BUILD_DIR) && cpack -G DEB
	@for f in $(BUILD_DIR)/packages/*.deb; do \
	  echo "$$f: $$(dpkg-deb -f $$f Package) $$(dpkg-deb -f $$f Version), depends: $$(dpkg-deb -f $$f Depends)"; \
	done

# The packages installed, used through find_package and pkg-config, and
# removed, in a clean Debian root (tests/debian_package.sh): Debian 12's
# (DEBIAN12_ROOT, built by debootstrap and kept) with make package's 1.13
# build, and the Debian 13 root with its own.
DEBIAN12_ROOT ?= .debian12
# PACKAGE_BUILT=1: build/packages is there already (make check, which prunes
# the build tree before the root is made).
test-package-debian12:
	$(if $(PACKAGE_BUILT),,$(MAKE) package TORCH=debian BUILD_DIR=build)
	JOBS=$(JOBS) tests/debian_package.sh bookworm $(DEBIAN12_ROOT) build/packages
test-package-debian13:
	JOBS=$(JOBS) tests/debian_package.sh trixie $(DEBIAN13_ROOT) build-debian13/packages

# The source tarball of HEAD (committed work only), with its SHA-256, as the
# FetchContent example takes it (docs/building.md, "Cutting a release").
VERSION := $(shell awk '/^project.d2l_attention VERSION/ { print $$3 }' CMakeLists.txt)
dist:
	@git rev-parse --git-dir > /dev/null 2>&1 || { \
	  echo "make dist: $(CURDIR) is not a git checkout (a release tarball has no .git); run it in a clone of the repository" >&2; exit 1; }
	@git diff --quiet HEAD || echo "make dist: uncommitted changes are not in the tarball (it is HEAD, $$(git rev-parse --short HEAD))"
	mkdir -p dist
	git archive --format=tar.gz --prefix=d2l_attention-$(VERSION)/ -o dist/d2l_attention-$(VERSION).tar.gz HEAD
	cd dist && sha256sum d2l_attention-$(VERSION).tar.gz | tee d2l_attention-$(VERSION).tar.gz.sha256

# Refuse before any compiler runs when the build trees cannot fit.
check-disk:
	@free=$$(df -Pk . | awk 'NR == 2 { printf "%d", $$4 / 1048576 }'); \
	if [ "$$free" -lt $(CHECK_DISK_GIB) ]; then \
	  echo "make check: $$free GiB free in $(CURDIR), needs $(CHECK_DISK_GIB) GiB (CHECK_PRUNE=$(CHECK_PRUNE)$(if $(filter 1,$(CHECK_PRUNE)),,: every leg's trees kept; CHECK_PRUNE=1 deletes each once it has passed)); free some, or run make test (one tree)" >&2; \
	  exit 1; \
	fi

# The suite under ASan + UBSan against the wheel's LibTorch (clang 14).
test-asan-torch2: deps-sanitizers deps-torch2
	cmake --preset asan-ubsan-torch2 -DCMAKE_PREFIX_PATH="$(TORCH2_PREFIX)" $(TORCH2_CMAKE_ARGS)
	cmake --build --preset asan-ubsan-torch2 -j $(JOBS)
	rm -rf build-asan-torch2/gtest-reports
	ctest --preset asan-ubsan-torch2 -j $(JOBS) -O build-asan-torch2/ctest.log

# The release suite on Debian 13 ("trixie", the current Debian stable) and
# its own LibTorch 2.6, in a Debian 13 root that debootstrap builds in
# DEBIAN13_ROOT from Debian's archive (about 2 GB, kept for the next run):
# tests/debian13.sh, which runs `make test` inside it into build-debian13/.
DEBIAN13_ROOT ?= .debian13
test-debian13:
	JOBS=$(JOBS) tests/debian13.sh $(DEBIAN13_ROOT)
clean-debian13:
	tests/debian13.sh $(DEBIAN13_ROOT) --remove

# The same on Debian's 1.13: not in make check (see CHECK_LOGS above).
test-asan: deps-sanitizers
	cmake --preset asan-ubsan
	cmake --build --preset asan-ubsan -j $(JOBS)
	ctest --preset asan-ubsan -j $(JOBS) -O build-asan/ctest.log

test-tsan: deps-sanitizers
	cmake --preset tsan
	cmake --build --preset tsan -j $(JOBS)
	rm -rf build-tsan/gtest-reports
	ctest --preset tsan -O build-tsan/ctest.log

test-fuzz: deps-sanitizers
	cmake --preset fuzz -DD2L_FUZZ_SECONDS=$(CI_FUZZ_SECONDS)
	cmake --build --preset fuzz -j $(JOBS)
	ctest --preset fuzz -O build-fuzz/ctest.log

# Fuzzes for FUZZ_SECONDS from a copy of fuzz/corpus (new inputs and any
# finding land in build-fuzz/fuzz/long/).
fuzz: deps-sanitizers
	cmake --preset fuzz
	cmake --build --preset fuzz -j $(JOBS)
	fuzz/run_fuzzer.sh build-fuzz/fuzz/fuzz_attention $(FUZZ_SECONDS) fuzz/corpus build-fuzz/fuzz/long

# Samples/s of the Bahdanau example in 1 and 2 processes (d2l::distributed),
# run alternately; DP_REPS runs of DP_EPOCHS epochs each (README, "Data-parallel training").
DP_REPS ?= 3
DP_EPOCHS ?= 30
bench-dp: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target bahdanau_fra_eng
	benchmarks/data_parallel.sh $(BUILD_DIR) $(DP_REPS) $(DP_EPOCHS)

# `make bench`: both tables of the README's Performance section, the library
# against the book (bench-book) and the flash kernel against LibTorch 2.x's
# SDPA (bench-sdpa, which builds the torch 2.11 leg first).
bench: bench-book bench-sdpa bench-transformer

# Times this library and the book's Python code on the same shapes and thread
# counts, one run after the other, and prints one table (also written to
# $(BUILD_DIR)/bench-report.md).
BENCH_THREADS ?= 1,2
# One process per thread count and shape: a fresh heap each, so that page
# faults left by one case's allocations do not land on another's timing.
# OpenBLAS (pthreads) keeps its own pool, which at::set_num_threads does not
# size: the book's side runs with OPENBLAS_NUM_THREADS = threads, as its
# users would; bench_attention sizes both pools with d2l::set_num_threads
# (ATen at the thread count, OpenBLAS at 1: at 2 threads OpenBLAS's spinning
# workers compete with OpenMP's), whatever OPENBLAS_NUM_THREADS says.
BENCH_SHAPES ?= toy d2l mid big
# $(1): build dir, $(2): shapes, $(3): prefix of the JSON files. One process
# per thread count and shape; OpenBLAS's pool sized like ours (README).
define run_bench_attention
	for t in $$(echo $(BENCH_THREADS) | tr , ' '); do for s in $(2); do \
	  OPENBLAS_NUM_THREADS=$$t $(1)/benchmarks/bench_attention --threads $$t --shapes $$s $(BENCH_FLAGS) \
	    --benchmark_out=$(1)/$(3)-threads$$t-$$s.json --benchmark_out_format=json \
	    || exit 1; \
	done; done
endef
BENCH_FLAGS ?= --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
               --benchmark_enable_random_interleaving=true \
               --benchmark_min_time=0.2
bench-book: deps deps-python configure
	cmake -S . -B $(BUILD_DIR) -DD2L_BUILD_BENCHMARKS=ON
	cmake --build $(BUILD_DIR) -j $(JOBS) --target bench_attention
	$(call run_bench_attention,$(BUILD_DIR),$(BENCH_SHAPES),bench-cpp)
	for t in $$(echo $(BENCH_THREADS) | tr , ' '); do \
	  OPENBLAS_NUM_THREADS=$$t $(PYTHON) benchmarks/book_reference.py --threads $$t --out $(BUILD_DIR)/bench-book-threads$$t.json \
	    || exit 1; \
	done
	python3 benchmarks/compare.py \
	  $$(for t in $$(echo $(BENCH_THREADS) | tr , ' '); do for s in $(BENCH_SHAPES); do \
	    echo --cpp $(BUILD_DIR)/bench-cpp-threads$$t-$$s.json; done; done) \
	  $$(for t in $$(echo $(BENCH_THREADS) | tr , ' '); do echo --book $(BUILD_DIR)/bench-book-threads$$t.json; done) \
	  --out $(BUILD_DIR)/bench-report.md
	cat $(BUILD_DIR)/bench-report.md

# Dot-product attention without weights against LibTorch 2.x's SDPA on the CPU,
# (BH, n = m, d = 64) and one query against m keys (`q1`: a decoding step),
# with random valid lengths, at each thread count, one process per shape, in
# float32 and bfloat16; prints markdown tables of medians, ratios, useful
# GFLOP/s and their fractions of the limits.
# `limits` times what the rows are quoted against (one core's float32 FMA and
# VDPBF16PS peaks, torch::mm in float32 and bfloat16). SDPA_TABLE_FLAGS=--cpu-time
# reads CPU time instead of real time, for a machine other programs load.
SDPA_SHAPES ?= limits sdpa128 sdpa512 sdpa1024 sdpa2048 sdpa4096 sdpa8192 sdpa128full sdpa512full \
               sdpa2048full sdpa512q1 sdpa2048q1 sdpa8192q1 sdpa16384q1 sdpa2048q1full sdpa16384q1full
SDPA_TABLE_FLAGS ?=
bench-sdpa:
	$(MAKE) configure TORCH=wheel
	cmake -S . -B $(BUILD2_DIR) -DD2L_BUILD_BENCHMARKS=ON
	cmake --build $(BUILD2_DIR) -j $(JOBS) --target bench_attention
	$(call run_bench_attention,$(BUILD2_DIR),$(SDPA_SHAPES),bench-sdpa)
	python3 benchmarks/sdpa_table.py $(SDPA_TABLE_FLAGS) $(BUILD2_DIR)/bench-sdpa-threads*-sdpa*.json \
	  $(BUILD2_DIR)/bench-sdpa-threads*-limits.json | tee $(BUILD2_DIR)/bench-sdpa-report.md

# Python's SDPA with grouped-query heads (d2l::nn::functional::
# scaled_dot_product_attention, enable_gqa: Hq 32 over 8 or 4 key/value
# heads, E 128) beside LibTorch's own SDPA on the same arguments, float32 and
# bfloat16, forward and forward+backward, one process per thread count on
# the torch 2.11 leg (docs/sdpa.md, "Speed"). GQA_SHAPES: a subset of
# bench_sdpa_gqa's shapes.
empty :=
space := $(empty) $(empty)
GQA_SHAPES ?= gqa4_b1_n512,gqa4_b4_n512,gqa8_b1_n512_causal,gqa8_b8_n512,gqa4_b1_n2048_causal,\
              gqa8_b1_n2048,gqa8_b1_n8192_causal
# Three repetitions: the n = 8192 cases run seconds an iteration.
GQA_FLAGS ?= --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
             --benchmark_min_time=0.1
bench-gqa:
	$(MAKE) configure TORCH=wheel
	cmake -S . -B $(BUILD2_DIR) -DD2L_BUILD_BENCHMARKS=ON
	cmake --build $(BUILD2_DIR) -j $(JOBS) --target bench_sdpa_gqa
	gcc -O2 benchmarks/compute_peak.c -o $(BUILD2_DIR)/compute_peak
	for t in $$(echo $(BENCH_THREADS) | tr , ' '); do \
	  OPENBLAS_NUM_THREADS=1 $(BUILD2_DIR)/benchmarks/bench_sdpa_gqa --threads $$t \
	    --shapes $(subst $(space),,$(GQA_SHAPES)) $(GQA_FLAGS) \
	    --benchmark_out=$(BUILD2_DIR)/bench-gqa-threads$$t.json --benchmark_out_format=json \
	    || exit 1; \
	done
	python3 benchmarks/gqa_table.py \
	  --peak "$$($(BUILD2_DIR)/compute_peak | sed -n 's/^float32 FMA peak, 1 thread: \([0-9.]*\).*/\1/p')" \
	  $(BUILD2_DIR)/bench-gqa-threads*.json | tee $(BUILD2_DIR)/bench-gqa-report.md

# Sliding windows and packed sequences (d2l::nn::functional::
# scaled_dot_product_attention's window_left, scaled_dot_product_attention_varlen):
# a window of 512 over 8192 keys against 16 blocks of 512, packed against
# padded, each beside LibTorch's SDPA given the same attention as a mask;
# float32 and bfloat16, one process per thread count on the torch 2.11 leg
# (docs/sdpa.md, "Windows and packed sequences").
BANDS_FLAGS ?= --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
               --benchmark_min_time=0.1
bench-bands:
	$(MAKE) configure TORCH=wheel
	cmake -S . -B $(BUILD2_DIR) -DD2L_BUILD_BENCHMARKS=ON
	cmake --build $(BUILD2_DIR) -j $(JOBS) --target bench_sdpa_bands
	gcc -O2 benchmarks/compute_peak.c -o $(BUILD2_DIR)/compute_peak
	for t in $$(echo $(BENCH_THREADS) | tr , ' '); do \
	  OPENBLAS_NUM_THREADS=1 $(BUILD2_DIR)/benchmarks/bench_sdpa_bands --threads $$t $(BANDS_FLAGS) \
	    --benchmark_out=$(BUILD2_DIR)/bench-bands-threads$$t.json --benchmark_out_format=json \
	    || exit 1; \
	done
	python3 benchmarks/bands_table.py \
	  --peak "$$($(BUILD2_DIR)/compute_peak | sed -n 's/^float32 FMA peak, 1 thread: \([0-9.]*\).*/\1/p')" \
	  $(BUILD2_DIR)/bench-bands-threads*.json | tee $(BUILD2_DIR)/bench-bands-report.md

# The Transformer's attention beside its peers on the torch 2.11 leg: causal
# self-attention at n = m = 2048 against the same kernel unmasked and SDPA's
# is_causal, and multi-head attention at the book's Transformer shapes against
# torch::nn::MultiheadAttention, at 1 and 2 threads, one process
# (docs/performance.md, "The Transformer's attention").
bench-transformer:
	$(MAKE) configure TORCH=wheel
	cmake -S . -B $(BUILD2_DIR) -DD2L_BUILD_BENCHMARKS=ON
	cmake --build $(BUILD2_DIR) -j $(JOBS) --target bench_transformer
	OPENBLAS_NUM_THREADS=1 $(BUILD2_DIR)/benchmarks/bench_transformer $(BENCH_FLAGS) \
	  --benchmark_out=$(BUILD2_DIR)/bench-transformer.json --benchmark_out_format=json
	python3 benchmarks/transformer_table.py $(BUILD2_DIR)/bench-transformer.json \
	  --out $(BUILD2_DIR)/bench-transformer-report.md
	cat $(BUILD2_DIR)/bench-transformer-report.md

# d2l::generate beside CTranslate2 on the book's Transformer at two sizes
# (benchmarks/ct2_table.py: greedy and beam 4, batch 1 and 32, 1 and 2
# threads, whole processes; docs/generation.md's speed table). The library
# runs on the torch 2.11 leg; CTranslate2 (PyPI, pinned) and the book's Python
# in a venv over Debian's torch 1.13. CT2_TABLE_FLAGS=--scale 0.1: a quick run.
CT2_VERSION     ?= 4.8.5
CT2_VENV        ?= $(BUILD_DIR)/ct2-venv
CT2_TABLE_FLAGS ?=
$(CT2_VENV)/.ctranslate2-$(CT2_VERSION):
	$(call install_missing,python3-venv $(PYTHON_PACKAGES))
	/usr/bin/python3 -m venv --system-site-packages $(CT2_VENV)
	$(CT2_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-cache-dir \
	  ctranslate2==$(CT2_VERSION)
	touch $@
bench-generate: $(CT2_VENV)/.ctranslate2-$(CT2_VERSION)
	$(MAKE) configure TORCH=wheel
	cmake -S . -B $(BUILD2_DIR) -DD2L_BUILD_BENCHMARKS=ON
	cmake --build $(BUILD2_DIR) -j $(JOBS) --target generate_ids
	$(CT2_VENV)/bin/python benchmarks/ct2_table.py $(CT2_TABLE_FLAGS) \
	  --generate-ids $(BUILD2_DIR)/benchmarks/generate_ids --work $(BUILD2_DIR)/ct2-bench \
	  --out $(BUILD2_DIR)/bench-generate.json | tee $(BUILD2_DIR)/bench-generate-report.md

# The drop-ins of <d2l/nn.h> beside torch::nn's modules, one process per
# LibTorch: Debian's 1.13 (build/) and the 2.11 wheel (build-torch2/), at 1
# thread, forward + backward (docs/performance.md, "The torch::nn drop-ins").
NN_BENCH_FLAGS ?= --benchmark_repetitions=5 --benchmark_min_time=0.3
bench-nn:
	$(MAKE) configure TORCH=debian BUILD_DIR=build
	cmake -S . -B build -DD2L_BUILD_BENCHMARKS=ON
	cmake --build build -j $(JOBS) --target bench_nn
	$(MAKE) configure TORCH=wheel
	cmake -S . -B $(BUILD2_DIR) -DD2L_BUILD_BENCHMARKS=ON
	cmake --build $(BUILD2_DIR) -j $(JOBS) --target bench_nn
	OPENBLAS_NUM_THREADS=1 build/benchmarks/bench_nn $(NN_BENCH_FLAGS) \
	  --benchmark_out=build/bench-nn.json --benchmark_out_format=json
	OPENBLAS_NUM_THREADS=1 $(BUILD2_DIR)/benchmarks/bench_nn $(NN_BENCH_FLAGS) \
	  --benchmark_out=$(BUILD2_DIR)/bench-nn.json --benchmark_out_format=json
	python3 benchmarks/nn_table.py build/bench-nn.json $(BUILD2_DIR)/bench-nn.json \
	  --out $(BUILD2_DIR)/bench-nn-report.md

# The masked-softmax backward against ATen's softmax, run to run: 20 fresh
# processes per thread count, the distribution of times and ratios
# (README, "Run to run").
SPREAD_RUNS ?= 20
bench-spread: deps configure
	cmake -S . -B $(BUILD_DIR) -DD2L_BUILD_BENCHMARKS=ON
	cmake --build $(BUILD_DIR) -j $(JOBS) --target bench_attention
	python3 benchmarks/softmax_spread.py $(BUILD_DIR)/benchmarks/bench_attention \
	  --runs $(SPREAD_RUNS) --threads $(BENCH_THREADS) --out $(BUILD_DIR)/bench-spread-report.md
	cat $(BUILD_DIR)/bench-spread-report.md

# What a lent GPU machine, which has no Debian packages, needs from here:
# GoogleTest's sources, SLEEF's library (the AVX2/AVX-512 kernels; sleef.h
# comes with the wheel) and Google Benchmark's (bench_attention). The device
# call carries .device/ and runs .ci/gpu-run (docs/building.md, "Machines
# without Debian's packages"). Files, not symbolic links: a link travels as
# a link only.
DEVICE_LIB := /usr/lib/x86_64-linux-gnu
device-sources:
	$(call install_missing,libgtest-dev libgmock-dev libsleef-dev libbenchmark-dev)
	rm -rf .device && mkdir -p .device/sleef .device/benchmark/include \
	  .device/benchmark/lib/x86_64-linux-gnu/cmake
	cp -r /usr/src/googletest .device/googletest
	cp -L $(DEVICE_LIB)/libsleef.so .device/sleef/libsleef.so.3
	cp -r /usr/include/benchmark .device/benchmark/include/
	cp -r $(DEVICE_LIB)/cmake/benchmark .device/benchmark/lib/x86_64-linux-gnu/cmake/
	for f in $(DEVICE_LIB)/libbenchmark.so.* $(DEVICE_LIB)/libbenchmark_main.a; do \
	  cp -L $$f .device/benchmark/lib/x86_64-linux-gnu/; done

# Regenerates the golden fixtures from the Python reference code.
fixtures: deps-python fashion-mnist
	$(PYTHON) tests/fixtures/generate_fixtures.py
	$(PYTHON) tests/fixtures/generate_fixtures_v1_fashion_mnist.py $(FASHION_MNIST_DIR)
	$(PYTHON) tests/fixtures/generate_fixtures_seq2seq.py
	$(PYTHON) tests/fixtures/generate_fixtures_transformer.py
	$(PYTHON) tests/fixtures/generate_fixtures_beam.py
	$(PYTHON) tests/fixtures/generate_fixtures_v1.py
	$(PYTHON) tests/fixtures/generate_state_dicts.py --verify-cpp
	$(PYTHON) tests/fixtures/generate_fixtures_v1.py --verify-cpp
	if [ -x $(VENV)/bin/python ]; then $(VENV)/bin/python tests/fixtures/generate_fixtures_v1.py --verify-cpp; fi
	$(PYTHON) tests/fixtures/generate_fixtures_nn.py
	$(PYTHON) tests/fixtures/generate_fixtures_v1_pooling.py
	$(PYTHON) tests/fixtures/generate_fixtures_v1_vit.py
	$(PYTHON) tests/fixtures/generate_fixtures_v1_vit.py --verify-cpp
	if [ -x $(VENV)/bin/python ]; then $(VENV)/bin/python tests/fixtures/generate_fixtures_nn.py; \
	  else echo "fixtures: no $(VENV) (make deps-torch2): the torch 2.11 cases of generate_fixtures_nn.py are not regenerated"; fi

clean:
	rm -rf $(sort $(BUILD_DIR) build $(BUILD2_DIR)) build-asan-torch2 build-asan build-tsan build-fuzz \
	  build-debian13 dist
