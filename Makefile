# The two commands of README.md:
#   make demo   - installs what is missing, builds, runs a verified transfer demo
#   make check  - installs what is missing, builds, runs every test suite
# Each step is also a target of its own (deps, build, test, test-asan, ...).

JOBS ?= 2
PYTHON ?= /usr/bin/python3
BUILD ?= build
CMAKE_FLAGS ?=
PREFIX ?= /usr/local
DESTDIR ?=

.PHONY: all deps build install demo check check-layers test test-asan test-tsan test-python \
	test-fuzz test-examples bench-smoke python-ext format clean

all: build

deps:
	@./scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j$(JOBS)

# libferry.so.MAJOR (+ the libferry.so link) and libferry.a, ferry.h, ferry.pc,
# the CMake package (find_package(ferry)) and the ferry tool, under
# $(DESTDIR)$(PREFIX).
install: build
	@DESTDIR=$(DESTDIR) cmake --install $(BUILD) --prefix $(PREFIX)

# The build's output is shown only when it fails: the demo's lines are the point.
demo:
	@echo "demo: installing missing packages and building (output shown only on failure)"
	@log=$$(mktemp); $(MAKE) --no-print-directory build >$$log 2>&1 || { cat $$log; rm -f $$log; exit 1; }; \
	  rm -f $$log
	@./scripts/demo.sh $(BUILD)/ferry

# ctest says only "Skipped"; this lists each skipped test with the reason it
# printed (the lines tests/support/run_test.c adds), after the run's summary.
SHOW_SKIPS = grep -h '^ferry_run_test: skipped ' Testing/Temporary/LastTest.log || true

# Plain build: every ctest (unit, integration, fault injection, soak, fuzz
# corpus replay).
test: build
	@cd $(BUILD) && { ctest --output-on-failure -j1; rc=$$?; $(SHOW_SKIPS); exit $$rc; }

# AddressSanitizer + UBSan build of the whole C suite (rxm's bounce buffers
# as in test-tsan below: 2 KiB).
test-asan: deps
	@cmake -S . -B $(BUILD)-asan -DCMAKE_BUILD_TYPE=Debug -DFERRY_SANITIZE=address >/dev/null
	@cmake --build $(BUILD)-asan -j$(JOBS)
	@cd $(BUILD)-asan && { ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 FERRY_SOAK_SECONDS=30 \
	  FI_OFI_RXM_BUFFER_SIZE=2048 \
	  ctest --output-on-failure -j1 -L 'unit|threaded|soak|fuzz'; rc=$$?; $(SHOW_SKIPS); exit $$rc; }

# ThreadSanitizer build of the threaded tests and the soak (not the
# strict-MR fabric run: the same threads as the tcp one, tests/CMakeLists.txt).
# libfabric's rxm fills four pools of 1,024 16 KiB bounce buffers for every
# endpoint it opens (64 MiB); under TSan that took most of the fabric tests'
# time (one test case: 50 s, and 9 s with 2 KiB buffers). ferry sends no message
# that size matters to (its data moves by RMA), so TSan runs use 2 KiB.
test-tsan: deps
	@cmake -S . -B $(BUILD)-tsan -DCMAKE_BUILD_TYPE=Debug -DFERRY_SANITIZE=thread >/dev/null
	@cmake --build $(BUILD)-tsan -j$(JOBS)
	@cd $(BUILD)-tsan && { TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$(CURDIR)/tests/tsan.supp \
	  FI_OFI_RXM_BUFFER_SIZE=2048 FERRY_SOAK_SECONDS=30 ctest --output-on-failure -j1 -L 'unit|threaded|soak' -LE mr_variant; rc=$$?; \
	  $(SHOW_SKIPS); exit $$rc; }

# Python tests; test_wheel.py builds the wheel offline and runs the quick start
# from a fresh venv it was installed into (seconds).
# The CPython extension, built in place (python/ferry/_ferry*.so).
python-ext: build
	@$(PYTHON) setup.py -q build_ext --inplace >/dev/null

test-python: python-ext
	@FERRY_TOOL=$(CURDIR)/$(BUILD)/ferry $(PYTHON) -m pytest -q -rs tests/python
	@# the drop-in's protocol="rdma" forced onto the fabric transport's tcp provider
	@FERRY_TOOL=$(CURDIR)/$(BUILD)/ferry FERRY_TEST_PROTOCOL=rdma FERRY_TRANSPORTS=fabric,tcp \
	  FERRY_FABRIC_PROVIDER="tcp;ofi_rxm" $(PYTHON) -m pytest -q -rs tests/python/test_mooncake_engine.py

# libFuzzer (clang): every network parser for a bounded time, 6 s each.
test-fuzz: deps
	@fuzz/run.sh 6

# bench/run end to end in its short form, so the benchmark keeps working;
# figures come from a full `bench/run` (BENCHMARKS.md), never from here.
bench-smoke: build python-ext
	@./bench/run --quick >/dev/null

# The examples, built with pkg-config and find_package against a temporary
# install and run, so the install path cannot rot (seconds).
test-examples: build
	@./examples/run.sh $(BUILD)

# The layers of src/ (docs/architecture.md): every #include, and every call
# between the library's objects, points down (seconds).
check-layers: build
	@./scripts/check-layers --objects $(BUILD)

check: check-layers test test-asan test-tsan test-fuzz bench-smoke test-python test-examples

format:
	@clang-format -i include/*.h src/*/*.[ch] tools/*.[ch] tests/*/*.[ch] python/ferry/*.[ch] bench/*.c \
	  fuzz/*.[ch] examples/*.c

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-tsan $(BUILD)-fuzz python/ferry/*.so
