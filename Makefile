# loom - the two commands of the quick start, plus the pieces they are made of.
#   make demo   install what is missing, build, train the Fashion-MNIST CNN for one epoch
#   make test   install what is missing, build, run the whole suite (and the sanitizer build)
export OPENBLAS_CORETYPE ?= Haswell

BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
FUZZ_BUILD ?= build-fuzz
GENERATOR  := -G Ninja
WERROR     := $(if $(filter true 1,$(CI)),-DLOOM_WERROR=ON,)
# the sanitizer builds' tests share the Release build's dataset and kernel caches (tests/CMakeLists.txt)
DATA_CACHE := -DLOOM_TEST_DATA_CACHE=$(CURDIR)/$(BUILD)/tests/cache/data \
              -DLOOM_TEST_KERNEL_CACHE=$(CURDIR)/$(BUILD)/tests/cache/kernels

.PHONY: all deps build demo test test-asan test-tsan test-fuzz format-check bench install clean

all: build

deps:
	@bash scripts/install-deps.sh

build: deps
	cmake -S . -B $(BUILD) $(GENERATOR) -DCMAKE_BUILD_TYPE=Release $(WERROR)
	cmake --build $(BUILD)

demo: build
	./$(BUILD)/loom train fmnist-cnn --epochs 1

test: build
	@bash scripts/interop-venv.sh $(BUILD)/venv
	cd $(BUILD) && ctest --output-on-failure -j2
	$(MAKE) --no-print-directory test-asan
	$(MAKE) --no-print-directory test-tsan
	$(MAKE) --no-print-directory test-fuzz
	$(MAKE) --no-print-directory format-check

# clang-format (.clang-format) over every C file, where clang-format is installed.
format-check:
	@if command -v clang-format >/dev/null; then \
	    clang-format --dry-run -Werror $$(git ls-files '*.c' '*.h' 2>/dev/null || find src include tools tests examples -name '*.[ch]') \
	    && echo "format: clean"; \
	else echo "format: clang-format not installed, skipped"; fi

# AddressSanitizer + UndefinedBehaviorSanitizer over everything but the slow end-to-end runs and
# the install check (a sanitized library cannot serve an unsanitized program). At -O1, as
# ASan's authors advise: half the time of -O0 here (test_matrix 176 -> 88 s), the same checks.
test-asan: deps
	cmake -S . -B $(ASAN_BUILD) $(GENERATOR) -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_C_FLAGS_DEBUG=-O1 -g" \
	    -DLOOM_SANITIZE=address $(WERROR) $(DATA_CACHE)
	cmake --build $(ASAN_BUILD)
	cd $(ASAN_BUILD) && LOOM_TEST_QUICK=1 ctest --output-on-failure -j2 -LE "e2e|install"

# ThreadSanitizer over the tests with threads: the data-parallel layer (collectives, devices and
# their cores) and the loader (which assembles batches ahead). The model matrix runs three of its
# models there (an MLP, the CNN, overlapping pooling): the devices' threads and collectives are
# the same for every model, and ASan runs them all. Two tests at a time, as the other stages
# (its five ran one after another: 76 -> 41 s; test_dp's watchdog bounds held in 3 runs).
test-tsan: deps
	cmake -S . -B $(TSAN_BUILD) $(GENERATOR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_SANITIZE=thread $(WERROR) $(DATA_CACHE)
	cmake --build $(TSAN_BUILD)
	cd $(TSAN_BUILD) && TSAN_OPTIONS="halt_on_error=1 suppressions=$(CURDIR)/tests/tsan.supp" \
	    LOOM_TEST_QUICK=1 LOOM_TEST_MODELS=fmnist-mlp,fmnist-cnn,cnn-pool3s2 \
	    ctest --output-on-failure -j2 -L "dist|threads"

# The libFuzzer targets (tests/fuzz) under ASan+UBSan, built with clang: each replays its committed
# corpus and fuzzes for 6 s (scripts/fuzz.sh runs long campaigns; 8 s before the devices of
# several cores added their tests, to keep make test under 10 minutes).
test-fuzz: deps
	cmake -S . -B $(FUZZ_BUILD) $(GENERATOR) -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	    -DLOOM_SANITIZE=address -DLOOM_FUZZ=ON -DLOOM_FUZZ_SECONDS=6
	cmake --build $(FUZZ_BUILD)
	cd $(FUZZ_BUILD) && ctest --output-on-failure -j2 -L fuzz

bench: build
	bash bench/run.sh

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD)
