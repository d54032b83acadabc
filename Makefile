# Thin wrapper over meson, as QEMU does. The real build is meson.build.
#   make demo   install what is missing, build, run the demo
#   make check  install what is missing, fetch the interop guest kernels, build, run every test
#               (plain build with the real-guest interop run, then everything but interop again
#               under ASan+UBSan)
# Only these targets install packages or fetch kernels; `meson test` itself never does (a test
# whose tools or kernels are missing skips loudly).
BUILD ?= build
ASAN_BUILD ?= build-asan
MESON_TEST_ARGS ?=

.PHONY: all deps interop-deps build build-asan check check-plain check-asan demo bench clean

all: build

deps:
	@scripts/install-deps.sh build test

# The interop run's packages (QEMU, static busybox...) and its guest kernels, into the cache of
# tests/interop (apt-get download, never installed). Not fatal: without them the interop tests
# skip loudly.
interop-deps:
	@scripts/install-deps.sh interop && scripts/fetch-kernels.sh || \
		echo "make: interop-deps failed; the interop tests will skip (exit 77)" >&2

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

# Both halves always run, so one failure does not hide the other; the exit code is the worst.
check: deps
	@rc=0; $(MAKE) --no-print-directory check-plain || rc=1; \
	$(MAKE) --no-print-directory check-asan || rc=1; exit $$rc

demo: build
	@scripts/demo.sh $(BUILD)

bench: build
	meson test -C $(BUILD) --benchmark --verbose

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)

# ThreadSanitizer over the threaded tests in $(TSAN_BUILD) (scripts/tsan.sh; about 5 minutes
# on 2 cores). Not part of `make check`.
TSAN_BUILD ?= build-tsan
.PHONY: tsan
tsan: deps
	@TSAN_BUILD=$(TSAN_BUILD) scripts/tsan.sh
