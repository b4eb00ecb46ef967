# ivtrace - top-level build. `make` leaves the tools in bin/.
#   make          build bin/ivtrace and bin/ivtrace-loadgen (and libivtrace)
#   make test     install what is missing, build, run every test
#   make demo     install what is missing, build, record a real guest (vm/demo), summary
#   make demo-loopback  the same without a VM: a program on this host (scripts/demo.sh)
#   make bench    native per-event and drain benchmarks -> bench/results/
#   make fuzz     fuzz the host reader (FUZZ_SECONDS, default 600)
SHELL := /bin/bash
CARGO ?= cargo
PYTHON ?= /usr/bin/python3

.PHONY: all deps host lib test test-abi test-lib test-host test-py demo demo-loopback bench fuzz clean

all: host lib

deps:
	@scripts/deps.sh

host:
	$(CARGO) build --release --locked --manifest-path host/Cargo.toml
	@mkdir -p bin && cp host/target/release/ivtrace bin/ivtrace

lib:
	$(MAKE) -C guest/lib
	@mkdir -p bin && cp guest/lib/build/ivtrace-loadgen bin/ivtrace-loadgen

test: deps all test-abi test-lib test-host test-py

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

fuzz:
	$(MAKE) -C host fuzz

clean:
	rm -rf bin build
	$(MAKE) -C guest/lib clean
	$(CARGO) clean --manifest-path host/Cargo.toml
