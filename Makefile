# ivtrace - top-level build. `make` leaves the tools in bin/.
#   make          build bin/ivtrace and bin/ivtrace-loadgen (and libivtrace)
#   make test     install what is missing, build, run every test
#   make demo     install what is missing, build, record a real guest (vm/demo), summary
#   make demo-loopback  the same without a VM: a program on this host (scripts/demo.sh)
#   make bench    native per-event and drain benchmarks -> bench/results/
#   make fuzz     fuzz the host reader (FUZZ_SECONDS, default 600)
#   make lint-host  clippy (warnings as errors) and rustfmt --check on host/
#   make eval     the whole performance page from scratch: native per-event + drain (bench),
#                 doorbell (bench/doorbell, when present), the evaluation matrix in a real guest
#                 (bench/eval: ivtrace states vs ftrace over net/SSH/9p/virtio-serial), then
#                 docs/performance.md and its plots (~45 min under TCG)
SHELL := /bin/bash
CARGO ?= cargo
PYTHON ?= /usr/bin/python3

.PHONY: all deps host lib test test-abi test-lib test-host test-py test-eval demo demo-loopback bench eval fuzz clean

all: host lib

deps:
	@scripts/deps.sh

host:
	$(CARGO) build --release --locked --manifest-path host/Cargo.toml
	@mkdir -p bin && cp host/target/release/ivtrace bin/ivtrace

lib:
	$(MAKE) -C guest/lib
	@mkdir -p bin && cp guest/lib/build/ivtrace-loadgen bin/ivtrace-loadgen

test: deps all test-abi test-lib test-host test-py test-eval

test-abi:
	$(MAKE) -C abi test

test-lib:
	$(MAKE) -C guest/lib test

test-host:
	$(CARGO) test --release --locked --manifest-path host/Cargo.toml

test-py: all
	$(PYTHON) -m pytest -q tests

demo:
	vm/demo

demo-loopback: deps all
	scripts/demo.sh

bench: deps all
	$(MAKE) -C bench

# bench/eval --quick: every tracing state and transport once, short workloads (~2-3 min);
# fails only when something could not be measured, never on a timing. Its results go to
# build/eval/quick.json, so that `make test` leaves the tree clean.
test-eval: all
	mkdir -p build/eval
	bench/eval/run --quick -o build/eval/quick.json

eval: deps all
	rm -f docs/performance.md
	$(MAKE) -C bench run
	@if [ -f bench/doorbell/Makefile ]; then $(MAKE) -C bench/doorbell run \
		|| echo "eval: WARNING: the doorbell bench failed: its figures are missing or stale"; \
	else echo "eval: bench/doorbell not present: doorbell figures not yet measured"; fi
	bench/eval/run

fuzz:
	$(MAKE) -C host fuzz

clean:
	rm -rf bin build
	$(MAKE) -C guest/lib clean
	$(CARGO) clean --manifest-path host/Cargo.toml

# clippy with warnings as errors (no function over 80 lines of code) and
# rustfmt --check, on host/ (tests and examples included) and its fuzz crate.
.PHONY: lint-host
lint-host:
	$(MAKE) -C host lint-host
