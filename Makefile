# Everything a fresh Debian machine needs: `make demo`, `make test`, `make bench`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench deps system-deps clean

# libfuse3 for the resctrl emulator (mfusepy loads it through ctypes); promtool
# (Debian package prometheus) for the metrics lint test.
SYSTEM_PACKAGES := fuse3 libfuse3-3 prometheus
system-deps:
	@if command -v fusermount3 >/dev/null && /sbin/ldconfig -p | grep -q 'libfuse3\.so\.3' \
	    && command -v promtool >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    $(SYSTEM_PACKAGES) >/dev/null; \
	else echo "noded: missing system packages; as root: apt-get install $(SYSTEM_PACKAGES)" >&2; exit 1; fi

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $@

deps: system-deps $(STAMP)

test: deps
	$(PY) -m pytest

demo: deps
	$(PY) -m noded run --sim scenarios/contention.yaml --config scenarios/demo-config.yaml

bench: deps
	$(PY) -m bench.mbm_sample
	$(PY) -m bench.tick_cost
	$(PY) -m bench.exec_latency
	$(PY) -m bench.reaction

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis bench/out
