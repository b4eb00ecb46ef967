# ivtrace - top-level build. `make` leaves the tools in bin/.
#   make          build bin/ivtrace, bin/ivtrace-loadgen, bin/ivtrace-forward (and libivtrace)
#   make guest    the guest: Debian kernel + initramfs (vm/out), ivtrace.ko against that kernel,
#                 the static guest tools and the workloads (vm/build --all)
#   make guest KERNEL=trixie-backports   the same for another kernel: a suite (bookworm, trixie,
#                 trixie-backports: its newest kernel) or an ABI name, in vm/out/kernels/<ver>/;
#                 another Debian release's kernel and module in its build root (python/ivtools/buildroot.py)
#   make check    the quick tier, before every commit (~2 min warm, no root, no QEMU): build,
#                 the C tests of abi/ (x86-64 and -m32) and guest/lib, the Rust tests, ivtools'
#                 unit tests, then `make lint`
#   make test-kernels  ivtrace.ko on bookworm's 6.1, trixie's 6.12 and trixie-backports' newest
#                 7.x: built, booted (TCG), recorded and read back, DKMS in each build root
#                 (tests/kernels; part of make test)
#   make test     the full suite (what .ci/run runs): install what is missing, `make check`,
#                 then every test that boots guests, installs packages or needs root
#   make test-nested  the whole nest: L0 records L1, a TCG guest running QEMU for L2 and
#                 forwarding L2's trace (tests/nested/full_nest.py; 5-20+ min, so not in `make test`)
#   make lint     clippy -D warnings, rustfmt --check and cargo doc -D warnings on host/, ruff
#                 on the Python, no C or Python function over 80 lines of code, shellcheck on
#                 the shell scripts, codespell, checkpatch on guest/kmod, the C tests of abi/
#                 and guest/lib built with ASan+UBSan and TSan
#   make tracecompass  Trace Compass 6.2's core jars for tests/tracecompass (build/tracecompass)
#   make demo     install what is missing, build, record a real guest (vm/demo), summary
#   make demo-loopback  the same without a VM: a program on this host (scripts/demo.sh)
#   make demo-vmview  the guest seen from the host: a host CPU hog pinned to a vCPU's CPU, and
#                 the guest threads that lost time to it (vm/demo-vmview, ~1 min, root)
#   make demo-boot  a guest's boot traced from its first moment: phases, initcall levels,
#                 function profile, chart (vm/demo-boot, ~2 min, root; docs/boot.md)
#   make bench    the native benchmarks (bench/run native), then docs/performance.md
#   make soak     serve for 30 min under churn, a never-idle writer and a full disk
#                 (bench/run soak), then docs/performance.md
#   make eval     the whole performance page from scratch: bench/run native, doorbell,
#                 evaluation (ivtrace's states vs ftrace over net/SSH/9p/virtio-serial in a real
#                 guest) and guest (ivtrace.ko vs LTTng, ftrace and perf in one guest), then
#                 docs/performance.md and its plots (bench/report; ~80 min, TCG)
#   make fuzz     fuzz the host reader (FUZZ_SECONDS, default 600 per target); `make test`
#                 runs each target for 10 s (test-fuzz)
#   make lint-host  clippy (warnings as errors) and rustfmt --check on host/
#   make gen-docs man pages and bash/zsh/fish completions from the CLI definition, in
#                 build/gen-docs/ (host's gen-docs example; the packages run it too)
#   make deb      the Debian packages (ivtrace, ivtrace-dkms, libivtrace0, libivtrace-dev) in
#                 build/deb/, then lintian (scripts/build-deb; docs/install.md)
#   make test-deb the packages installed on this machine (apt-get install ./build/deb/*.deb):
#                 contents, the service as its unit runs it, DKMS for the guest kernel,
#                 pkg-config, then a real libvirtd domain traced through the packaged serve
SHELL := /bin/bash
CARGO ?= cargo
PYTHON ?= /usr/bin/python3

.PHONY: all preflight deps host lib guest check test test-abi test-lib test-host test-pyunit test-py test-eval \
	test-fuzz test-soak tracecompass lint lint-host lint-rust lint-doc lint-py lint-fnlength lint-shell \
	lint-spell lint-kmod lint-sanitizers test-asan test-tsan \
	demo demo-loopback demo-vmview demo-boot bench eval soak fuzz clean deb test-deb gen-docs test-nested \
	test-kernels

all: host lib

preflight:
	@scripts/preflight

deps:
	@scripts/deps.sh

host:
	$(CARGO) build --release --locked --manifest-path host/Cargo.toml
	@mkdir -p bin && cp host/target/release/ivtrace bin/ivtrace

lib:
	$(MAKE) -C guest/lib
	@mkdir -p bin && cp guest/lib/build/ivtrace-loadgen guest/lib/build/ivtrace-forward bin/

# Trace Compass as a reader in the tests: bullseye's eclipse-tracecompass jars through apt,
# on bookworm's Eclipse libraries (scripts/install-tracecompass; cached, quick when present).
tracecompass:
	$(PYTHON) scripts/install-tracecompass

guest:
	vm/build --all $(if $(KERNEL),--kernel $(KERNEL))

# ---- the two tiers --------------------------------------------------------------------------
# check: what to run before every commit. No root, no QEMU, no guest: the build, the C tests,
# the Rust tests (unit, property, and the integration tests, which run bin/ tools on regions
# in /dev/shm and read traces back with babeltrace2), ivtools' unit tests (python/tests), then
# every lint part. Needs what scripts/deps.sh installed (as root, once).
check: all test-abi test-lib test-host test-pyunit lint

# test: the full suite, what .ci/run runs. preflight first (too little disk fails half the suite
# for no reason of ours), then check: a build, unit test or lint failure stops it before the half
# hour of guests, packages and benchmarks.
test: preflight deps check tracecompass test-py test-eval test-fuzz test-soak test-deb \
	test-kernels

# L2 is TCG inside TCG: minutes of boot on a 2-core machine, beyond make test's budget.
# tests/nested/test_forward.py (in make test) checks the forwarding path at one level.
test-nested: all
	$(MAKE) -C guest/lib build/ivtrace-forward-static
	$(PYTHON) -m pytest -q -s tests/nested/full_nest.py

test-abi:
	$(MAKE) -C abi test

test-lib:
	$(MAKE) -C guest/lib test

test-host:
	$(CARGO) test --release --locked --manifest-path host/Cargo.toml

# ivtools' unit tests and the repository's self-containment check (no root, no QEMU).
test-pyunit:
	$(PYTHON) -m pytest -q --tb=short -rfE python/tests tests/test_docs.py

# tests/deb and tests/libvirt need the packages: test-deb runs them; tests/kernels: test-kernels.
# One directory per checkout for the traces the tests write, emptied by pytest at each run
# (its default keeps the last three runs: ~4 GiB each).
PYTEST_TMP ?= $(or $(TMPDIR),/tmp)/ivtrace-pytest-$(notdir $(CURDIR))
test-py: all
	$(PYTHON) -m pytest -q --tb=short -rfE --basetemp=$(PYTEST_TMP) tests --ignore=tests/deb \
		--ignore=tests/libvirt --ignore=tests/kernels

# The guest kernels users run, each resolved from the archive now (versions printed), built
# (trixie's in a build root cached in /var/cache/ivtrace), booted under TCG with ivtrace.ko
# events=all and the ftrace relay, recorded, read back; DKMS of ivtrace-dkms in each build root
# (build/deb's package, built again if the module changed). Prints kernel | events | lost |
# dmesg problems (also build/kernels/summary.txt).
test-kernels: all
	$(PYTHON) -m pytest -q --tb=short -rfE tests/kernels

deb:
	scripts/build-deb

gen-docs:
	$(CARGO) run --release --locked --manifest-path host/Cargo.toml -p ivtrace \
		--example gen-docs -- build/gen-docs

# Installs the packages on this machine (as an administrator would) and checks them;
# then the libvirt test, whose serve is the installed one run as its unit runs it.
test-deb: deb guest
	$(PYTHON) -m pytest -q --tb=short -rfE tests/deb tests/libvirt

# The evaluation's quick mode: every tracing state and transport once, short workloads
# (~2-3 min); fails only when something could not be measured, never on a timing. Its
# results go to build/eval/quick.json, so that `make test` leaves the tree clean.
test-eval: all
	mkdir -p build/eval
	bench/run evaluation --quick -o build/eval/quick.json

# The soak benchmark's quick mode: 90 s of serve with guests coming and going, a never-idle
# writer and a full disk; fails when serve's memory or descriptors grow or an event goes
# uncounted (bench/harness/soak.py), never on a timing. Results in build/soak/quick.json.
test-soak: all
	mkdir -p build/soak
	bench/run soak --quick -o build/soak/quick.json

# Every fuzz target of host/fuzz for a few seconds (cargo-fuzz on nightly; long runs:
# `make fuzz`, docs/fuzzing.md).
test-fuzz:
	$(MAKE) -C host fuzz-smoke

# ---- lint: every part runs, then the failed ones are named --------------------------------
LINT_PARTS := lint-rust lint-doc lint-py lint-fnlength lint-shell lint-spell lint-kmod lint-sanitizers

lint:
	@failed=; for t in $(LINT_PARTS); do \
		echo "== lint: $$t"; $(MAKE) --no-print-directory $$t || failed="$$failed $$t"; \
	done; \
	if [ -n "$$failed" ]; then echo "lint: FAILED:$$failed" >&2; exit 1; fi; echo "lint: ok"

# clippy with warnings as errors (no function over 80 lines of code) and rustfmt --check on
# host/ (tests, examples and the fuzz crate included): host/Makefile's lint-host.
lint-rust:
	$(MAKE) -C host lint-host

# The API documentation of host/ builds without a warning (broken intra-doc links, bad HTML).
lint-doc:
	cd host && RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps --workspace --locked

# ruff (pinned in scripts/deps.sh, which pip-installs it into build/pytools; rules: ruff.toml)
# on every Python file.
RUFF := build/pytools/bin/ruff
lint-py:
	@scripts/deps.sh pip
	$(RUFF) check --no-cache .

# No function of the C and the Python over 80 lines of code, clippy's rule for host/
# (ivtools.fnlength: comments, blank lines and docstrings do not count).
lint-fnlength:
	PYTHONPATH=python $(PYTHON) -m ivtools.fnlength

# Every shell script: the files git tracks (or would) whose first line is a sh, bash or dash
# shebang, the guest's busybox ash scripts included. Warnings and errors; the style notes
# (quoting where the scripts split words on purpose) are not checked.
SHELL_SCRIPTS = $(shell git ls-files -co --exclude-standard | while read -r f; do \
	[ -f "$$f" ] && head -n1 "$$f" | grep -qE '^\#!.*[/ ](ba|da)?sh([[:space:]]|$$)' && echo "$$f"; done)
lint-shell:
	@command -v shellcheck >/dev/null || { echo "lint-shell: shellcheck is missing: run scripts/deps.sh" >&2; exit 1; }
	shellcheck --severity=warning $(SHELL_SCRIPTS)

# Spelling of the docs and the code (codespell; its exceptions: .codespellrc).
lint-spell:
	@command -v codespell >/dev/null || { echo "lint-spell: codespell is missing: run scripts/deps.sh" >&2; exit 1; }
	@codespell $$(git ls-files -co --exclude-standard) && echo "codespell: ok"

lint-kmod:
	$(MAKE) -C guest/kmod checkpatch

lint-sanitizers: test-asan test-tsan

# The C tests again under AddressSanitizer + UndefinedBehaviorSanitizer, then under
# ThreadSanitizer: guest/lib's (its test-asan / test-tsan targets, their own build trees)
# and abi/'s (the vectors program, in build/abi-asan and build/abi-tsan).
ABI_CFLAGS := -std=gnu11 -Wall -Wextra -Werror -Iinclude -g

test-asan:
	$(MAKE) -C abi test BUILD=../build/abi-asan \
		CFLAGS="$(ABI_CFLAGS) -fsanitize=address,undefined -fno-sanitize-recover=all"
	$(MAKE) -C guest/lib test-asan

test-tsan:
	$(MAKE) -C abi test BUILD=../build/abi-tsan CFLAGS="$(ABI_CFLAGS) -fsanitize=thread"
	$(MAKE) -C guest/lib test-tsan

demo:
	vm/demo

demo-loopback: deps all
	scripts/demo.sh

demo-vmview:
	vm/demo-vmview

demo-boot:
	vm/demo-boot

bench: deps all
	$(MAKE) -C bench

eval: deps all
	$(MAKE) -C bench build
	bench/run native
	bench/run doorbell
	bench/run evaluation
	bench/run guest
	bench/report

soak: deps all
	bench/run soak
	bench/report

fuzz:
	$(MAKE) -C host fuzz

clean:
	rm -rf bin build
	$(MAKE) -C guest/lib clean
	$(CARGO) clean --manifest-path host/Cargo.toml

lint-host: lint-rust
