# Thin wrapper over meson, as QEMU does. The real build is meson.build.
#   make demo   install what is missing, build, run the demo
#   make check  install what is missing, fetch the interop guest kernels, build, run every test
#               (plain build with the real-guest interop run, then everything but interop again
#               under ASan+UBSan, then the threaded suites under ThreadSanitizer, then every
#               fuzz target CHECK_FUZZ_TIME seconds under libFuzzer)
#   make bench  install gnuplot-nox, build, run bench/run-all.sh (uvsock-perf) and the benchmarks
#   make fuzz   install what is missing, build the clang libFuzzer tree (build-fuzz/, ASan+UBSan)
#               and run every fuzz target FUZZ_TIME seconds (default 600) on its corpus,
#               printing exec/s and coverage; fails on any crash (fuzz/run-fuzzers.sh)
# Only these targets install packages or fetch kernels; `meson test` itself never does (a test
# whose tools or kernels are missing skips loudly).
BUILD ?= build
ASAN_BUILD ?= build-asan
MESON_TEST_ARGS ?=
FUZZ_BUILD ?= build-fuzz
FUZZ_TIME ?= 600
# Every fuzz/fuzz-<target>.c (fuzz-main.c is the replay main); e.g. FUZZ_TARGETS="device text".
FUZZ_TARGETS ?= $(patsubst fuzz/fuzz-%.c,%,$(filter-out fuzz/fuzz-main.c,$(wildcard fuzz/fuzz-*.c)))

.PHONY: all deps interop-deps build build-asan check check-plain check-asan check-tsan check-fuzz \
	demo bench fuzz clean

all: build

deps:
	@scripts/install-deps.sh build test

# The interop run's packages (QEMU, static busybox...), its guest kernels, the newer QEMU of
# interop-inorder (scripts/fetch-qemu.sh) and the patched QEMUs of the reconnect and migration
# cases (scripts/build-qemu.sh, contrib/qemu/), into the cache of
# tests/interop (apt-get download, never installed). Not fatal: without them the interop tests
# skip loudly.
interop-deps:
	@scripts/install-deps.sh interop && scripts/fetch-kernels.sh || \
		echo "make: interop-deps failed; the interop tests will skip (exit 77)" >&2
	@scripts/fetch-qemu.sh >/dev/null || \
		echo "make: scripts/fetch-qemu.sh failed; interop-inorder will skip (exit 77)" >&2
	@scripts/fetch-guest-tools.sh || \
		echo "make: scripts/fetch-guest-tools.sh failed; ssh-vsock-mux will skip (exit 77)" >&2
	@scripts/build-qemu.sh 7.2 10.0.2 >/dev/null || \
		echo "make: scripts/build-qemu.sh failed; the interop-qemu-* tests of the QEMU it could not build will skip (exit 77)" >&2

# The Debian package test's tools and build dependencies (tests/pkg); without them that test
# skips loudly (exit 77).
.PHONY: pkg-deps
pkg-deps:
	@scripts/install-deps.sh pkg

$(BUILD)/build.ninja:
	meson setup $(BUILD) --werror

build: deps $(BUILD)/build.ninja
	meson compile -C $(BUILD)

$(ASAN_BUILD)/build.ninja:
	meson setup $(ASAN_BUILD) -Db_sanitize=address,undefined -Dinterop=false

build-asan: deps $(ASAN_BUILD)/build.ninja
	meson compile -C $(ASAN_BUILD)

check-plain: build interop-deps
	meson test -C $(BUILD) --print-errorlogs $(MESON_TEST_ARGS)

check-asan: build-asan
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ASAN_OPTIONS=detect_leaks=1 \
	meson test -C $(ASAN_BUILD) --print-errorlogs --no-suite interop $(MESON_TEST_ARGS)

# ThreadSanitizer over the threaded suites (scripts/tsan.sh, its own build $(TSAN_BUILD)).
check-tsan: deps
	@TSAN_BUILD=$(TSAN_BUILD) scripts/tsan.sh

# A short libFuzzer run of every target on top of the corpus replay of the suite 'fuzz', as many
# targets at once as there are CPUs (fuzz/run-fuzzers.sh)
# (`make fuzz` is the long run). Results in $(FUZZ_BUILD)/fuzz-work/results.json for .ci/run.
CHECK_FUZZ_TIME ?= 15
check-fuzz: deps $(FUZZ_BUILD)/build.ninja
	meson compile -C $(FUZZ_BUILD) $(foreach t,$(FUZZ_TARGETS),fuzz/fuzz-$(t)-libfuzzer)
	fuzz/run-fuzzers.sh $(FUZZ_BUILD) $(CHECK_FUZZ_TIME) $(FUZZ_TARGETS)

# Every part always runs, so one failure does not hide another; the exit code is the worst.
check: deps pkg-deps
	@rc=0; $(MAKE) --no-print-directory check-plain || rc=1; \
	$(MAKE) --no-print-directory check-asan || rc=1; \
	$(MAKE) --no-print-directory check-tsan || rc=1; \
	$(MAKE) --no-print-directory check-fuzz || rc=1; exit $$rc

# clang and libclang-rt-14-dev (libFuzzer) come with the "test" package set of install-deps.sh.
$(FUZZ_BUILD)/build.ninja:
	CC=clang meson setup $(FUZZ_BUILD) -Dfuzzing=true -Db_sanitize=address,undefined -Dinterop=false

fuzz: deps $(FUZZ_BUILD)/build.ninja
	meson compile -C $(FUZZ_BUILD) $(foreach t,$(FUZZ_TARGETS),fuzz/fuzz-$(t)-libfuzzer)
	fuzz/run-fuzzers.sh $(FUZZ_BUILD) $(FUZZ_TIME) $(FUZZ_TARGETS)

demo: build
	@scripts/demo.sh $(BUILD)

# The uvsock-perf benchmark of bench/README.md (tables, CSV, JSON, the plot into BENCH_OUT; about
# 10 minutes), then every other registered benchmark (`meson test --benchmark`).
BENCH_OUT ?= bench
bench: build
	@scripts/install-deps.sh bench
	bench/run-all.sh $(BUILD) $(BENCH_OUT)
	meson test -C $(BUILD) --benchmark --verbose --no-suite perf

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)

# ThreadSanitizer over the threaded tests in $(TSAN_BUILD) (scripts/tsan.sh); `make check` runs
# it too (check-tsan).
TSAN_BUILD ?= build-tsan
.PHONY: tsan
tsan: check-tsan
