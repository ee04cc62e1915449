# Everything a fresh Debian machine needs: `make demo`, `make test`, `make bench`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
NPM_STAMP := tests/kubernetes/node_modules/.installed

.PHONY: demo lock test test-thorough test-unit test-bench bench bench-deps deps test-deps system-deps k8s-test-deps clean install install-files install-config uninstall install-remote-scrape verify-unit nvml cli-docs image deb wheel

# libfuse3 for the resctrl emulator (mfusepy loads it through ctypes); promtool
# (Debian package prometheus) for the metrics lint test; a C compiler for the simulated
# node's stand-in libnvidia-ml.so.1 (sim/nodesim/nvml_native); Slurm (munge, slurmctld, slurmd, its
# client commands) for the end-to-end tests against a real one-host Slurm (tests/slurm);
# Intel's pqos (intel-cmt-cat, installed as /usr/sbin/pqos) for the tests that drive the
# resctrl emulator with it (tests/integration/test_pqos.py). For `make image` and `make deb` and their
# tests (tests/test_image.py, tests/test_deb.py): podman with runc (packaging/image/podman
# says why not crun), mmdebstrap for the image's base and the package test's throwaway root,
# dh-virtualenv and debhelper for the package, python3-venv for the venvs they make.
SYSTEM_PACKAGES := fuse3 libfuse3-3 prometheus gcc libc6-dev munge slurmctld slurmd slurm-client intel-cmt-cat \
    podman runc mmdebstrap dh-virtualenv debhelper python3-venv
system-deps:
	@if command -v fusermount3 >/dev/null && /sbin/ldconfig -p | grep -q 'libfuse3\.so\.3' \
	    && command -v promtool >/dev/null && command -v cc >/dev/null \
	    && test -x /usr/sbin/munged -a -x /usr/sbin/slurmctld -a -x /usr/sbin/slurmd -a -x /usr/sbin/pqos \
	    && command -v sbatch >/dev/null \
	    && command -v podman >/dev/null && command -v runc >/dev/null && command -v mmdebstrap >/dev/null \
	    && command -v dh_virtualenv >/dev/null && /usr/bin/python3 -c 'import ensurepip' 2>/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    $(SYSTEM_PACKAGES) >/dev/null; \
	else echo "noded: missing system packages; as root: apt-get install $(SYSTEM_PACKAGES)" >&2; exit 1; fi

# kubectl, whose built-in kustomize renders integrations/kubernetes, and Node.js with npm
# for the ServiceMonitor's validator (tests/kubernetes/): Debian's kubernetes-client and
# nodejs/npm, only where the machine has none (Debian's kubectl would collide with one
# installed from elsewhere).
k8s-test-deps:
	@missing=""; command -v kubectl >/dev/null || missing="kubernetes-client"; \
	command -v npm >/dev/null || missing="$$missing nodejs npm"; \
	if [ -z "$$missing" ]; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    $$missing >/dev/null; \
	else echo "noded: missing system packages; as root: apt-get install $$missing" >&2; exit 1; fi

# The ServiceMonitor's validator, pinned by its lock file.
$(NPM_STAMP): tests/kubernetes/package.json tests/kubernetes/package-lock.json | k8s-test-deps
	npm ci --prefix tests/kubernetes --no-audit --no-fund --loglevel=error
	touch $@

# The runtime dependencies first, from the lock (packaging/requirements.lock: exact versions,
# each file's hash checked), then noded, the simulation and the extras beside them (pip keeps
# the locked versions they accept): the tests run against the versions the package ships.
$(STAMP): pyproject.toml sim/pyproject.toml packaging/requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --require-hashes -r packaging/requirements.lock
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test,bench]' -e ./sim
	touch $@

# packaging/requirements.lock again, from pyproject.toml's runtime dependencies (not the
# simulation's): each with all it pulls in at the version installed in .venv (what the
# tests ran against; never a fresh resolution), and the sha256 of each of that version's
# files a Linux host can install, from the package index (PIP_INDEX_URL, or PyPI). To move
# a pin: pip install the version into .venv (within pyproject.toml's range), make lock, make
# test, commit both (docs/development.md). Written whole or not at all.
lock:
	@test -x $(PY) || { echo "noded: make lock reads the versions installed in $(VENV): make deps first" >&2; exit 1; }
	$(PY) packaging/requirements.py --lock pyproject.toml > packaging/requirements.lock.new \
	  || { rm -f packaging/requirements.lock.new; exit 1; }
	mv packaging/requirements.lock.new packaging/requirements.lock

# The stand-in NVML library, both builds, into build/nvml/ (again when its source changes).
nvml: $(STAMP)
	$(PY) -m nodesim.nvml_lib >/dev/null

deps: system-deps $(STAMP) nvml

# What only the tests need on top (the Kubernetes manifests' renderer and validators).
test-deps: deps k8s-test-deps $(NPM_STAMP)

# The tests with Python's bytecode cache on, whatever the environment says
# (PYTHONDONTWRITEBYTECODE=1 in many containers, this one included): the suite starts some
# hundreds of Python processes (noded, nodectl, the simulated node), each of which otherwise
# compiles every source it imports (importing noded's: 0.70 core-seconds, 0.45 cached), and
# pytest rewrites every test module's asserts in each of its processes at each run
# (collection: 11 core-seconds, 4 cached). The caches go to __pycache__/ (git ignores it;
# packaging/stage.py copies nothing git ignores).
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest

# Every tier of tests/ and of bench/tests/ (pyproject's testpaths; tests/README.md) but the
# benchmarks' own end-to-end runs (marker bench: make test-bench). In TEST_WORKERS workers:
# the tests wait on processes far more than they compute. Five on this 2-core machine (warm
# runs at 4b991c6, one after another: 4 workers 320 s, 5 285 s, 6 289 s; with four the two
# cores stood idle a sixth of the run, every worker waiting at once). Then the Slurm tests
# alone: their noded watches the whole cpuset hierarchy, which no simulated node's noded may share.
# A short base for the tests' directories: each worker adds popen-gwN/ to every path, and
# the simulated node's Unix sockets have 108 bytes for theirs. Kept where a test failed.
TEST_WORKERS ?= 5
test: test-deps
	base=$$(mktemp -d /tmp/nt-XXXXXX); \
	$(PYTEST) -n $(TEST_WORKERS) --dist loadgroup -m "not bench and not slurm" --basetemp=$$base/w; others=$$?; \
	$(PYTEST) -m "slurm and not bench" --basetemp=$$base/s; slurm=$$?; \
	[ $$others = 0 ] && { [ $$slurm = 0 ] || [ $$slurm = 5 ]; } && rm -rf $$base

# `make test` with every property test drawing the examples its @settings write (`make test`
# draws half of the heaviest ones': tests/support/examples.py).
test-thorough:
	NODED_EXAMPLES_SCALE=1 $(MAKE) test

# The unit tier alone (the suite's and bench's): pure code, no root, in seconds (two workers:
# its hypothesis tests compute).
test-unit: $(STAMP)
	$(PYTEST) -n 2 tests/unit bench/tests/unit

test-bench: test-deps
	$(PYTEST) -m bench

demo: deps
	$(PY) -m noded run --sim scenarios/contention.yaml --config scenarios/demo-config.yaml

# stress-ng and mbw: the stressor's baselines.
bench-deps:
	@if command -v stress-ng >/dev/null && command -v mbw >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends stress-ng mbw >/dev/null; \
	else echo "noded: bench baselines missing; as root: apt-get install stress-ng mbw" >&2; exit 1; fi

# Runs every benchmark named in bench/RESULTS.md and puts its output there.
bench: deps bench-deps
	$(PY) -m bench.report

# Shell completion (bash, zsh) and man pages, made from the commands' own parsers
# (noded.commands.clidoc), into build/cli to look at; `make install` writes them where the shells and
# man look.
cli-docs: $(STAMP)
	$(PY) -m noded.commands.clidoc build/cli

# The DaemonSet's image (integrations/kubernetes names IMAGE:VERSION): built from this
# checkout on a base made from Debian's packages (packaging/image), tagged VERSION and
# VERSION-REVISION; a build of the same files on the same base image (by its ID) is not done
# again. Tests build IMAGE=localhost/noded-test-HASH, a name of their checkout's own. Prints the second tag.
IMAGE ?= localhost/noded
BASE_IMAGE ?= localhost/noded-base:bookworm
image:
	@packaging/image/build $(IMAGE) $(BASE_IMAGE)

# The Debian package (packaging/debian: dh-virtualenv), into DEBDIR; DEB_VERSION defaults
# to VERSION+gitTIMESTAMP.REVISION-1 (packaging/deb/build). Prints the package's path.
# gzip at level 9, or at DPKG_DEB_COMPRESSOR_LEVEL from the environment (dpkg-deb's own).
DEBDIR ?= build/packaging/deb
DEB_VERSION ?=
deb:
	@packaging/deb/build $(DEBDIR) $(DEB_VERSION)

# A wheel of noded that names the revision it was built from (noded/util/_revision.py, baked
# into the staged tree it is built from), into WHEELDIR, by $(PYTHON)'s pip (Debian's
# python3-pip, or PYTHON=.venv/bin/python). Prints the wheel's path.
WHEELDIR ?= build/packaging/wheel
wheel:
	@mkdir -p $(WHEELDIR) build/packaging && src=$$(mktemp -d build/packaging/wheel-src.XXXXXX) \
	  && trap 'rm -rf "$$src"' EXIT \
	  && $(PYTHON) packaging/stage.py tree "$$src" pyproject.toml README.md LICENSE noded resctrl mps \
	  && $(PYTHON) -m pip wheel -q --disable-pip-version-check --no-deps -w "$$src/dist" "$$src" \
	  && wheel=$$(ls "$$src"/dist/*.whl) && mv "$$wheel" $(WHEELDIR)/ && echo "$(WHEELDIR)/$$(basename "$$wheel")"

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis bench/out build/nvml build/cli build/packaging tests/kubernetes/node_modules

# Install on a host: a private virtualenv in $(APPDIR) (the dependencies at the lock's
# versions, packaging/requirements.lock, each file's hash checked; noded then with --no-deps,
# and pip check that the locked versions meet its ranges), the two commands on PATH,
# the systemd unit, a commented default config (kept if one exists), the documentation
# the unit points at (README, LICENSE, the remote-scrape drop-in) in $(DOCDIR), the
# admin group, and Slurm's hooks for noded in $(SLURMHOOKDIR) (their settings in
# $(CONFDIR)/slurm-hooks.conf, kept if one exists; the docs and example configs in
# $(DOCDIR)/slurm). DESTDIR stages everything under another root to inspect it (the venv's
# scripts then point into DESTDIR: stage, look, but ship with a plain install).
# The venv is made from the system's Python: the unit's ProtectHome=yes hides
# /root and /home, so an interpreter living there would not start.
INSTALL_PYTHON ?= /usr/bin/python3
APPDIR ?= /opt/noded
BINDIR ?= /usr/local/bin
UNITDIR ?= /etc/systemd/system
CONFDIR ?= /etc/noded
DOCDIR ?= /usr/local/share/doc/noded
# Slurm's Prolog, Epilog and TaskProlog for noded (integrations/slurm/README.md)
SLURMHOOKDIR ?= /usr/local/lib/noded/slurm
ADMIN_GROUP ?= noded-admin
DROPINDIR = $(UNITDIR)/noded.service.d
# where bash-completion, zsh and man look for what a local install adds
SHAREDIR ?= /usr/local/share

install:
	$(INSTALL_PYTHON) -m venv $(DESTDIR)$(APPDIR)
	@# from a staged copy of the checkout (as make wheel builds): pip's build/ is the copy's,
	@# so two installs at once do not share one, and the installed noded names its revision
	mkdir -p build/packaging && src=$$(mktemp -d build/packaging/install-src.XXXXXX) \
	  && trap 'rm -rf "$$src"' EXIT \
	  && $(INSTALL_PYTHON) packaging/stage.py tree "$$src" pyproject.toml README.md LICENSE noded resctrl mps \
	  && $(DESTDIR)$(APPDIR)/bin/python -m pip install -q --disable-pip-version-check --require-hashes -r packaging/requirements.lock \
	  && $(DESTDIR)$(APPDIR)/bin/python -m pip install -q --disable-pip-version-check --no-deps "$$src" \
	  && { broken=$$($(DESTDIR)$(APPDIR)/bin/python -m pip check --disable-pip-version-check) || { echo "$$broken" >&2; exit 1; }; }
	$(DESTDIR)$(APPDIR)/bin/python -m noded.commands.clidoc $(DESTDIR)$(SHAREDIR) >/dev/null
	@$(MAKE) --no-print-directory install-files

# install's second half: everything but the virtualenv (and the completions and man page
# its noded writes), a target of its own so that a test of where files go needs no venv built.
install-files:
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(CONFDIR) $(DESTDIR)$(DOCDIR)
	ln -sf $(APPDIR)/bin/noded $(DESTDIR)$(BINDIR)/noded
	ln -sf $(APPDIR)/bin/nodectl $(DESTDIR)$(BINDIR)/nodectl
	@# the unit names the commands, the config and the docs where this install puts them
	@# (BINDIR=/usr/bin left it running /usr/local/bin/noded, a file not there)
	sed -e 's|/usr/local/bin/noded|$(BINDIR)/noded|g' -e 's|/etc/noded/noded.yaml|$(CONFDIR)/noded.yaml|g' \
	    -e 's|file:///usr/local/share/doc/noded/|file://$(DOCDIR)/|g' systemd/noded.service \
	    > $(DESTDIR)$(UNITDIR)/noded.service && chmod 0644 $(DESTDIR)$(UNITDIR)/noded.service
	install -m 0644 README.md LICENSE systemd/remote-scrape.conf $(DESTDIR)$(DOCDIR)/
	install -d $(DESTDIR)$(DOCDIR)/docs
	install -m 0644 docs/*.md $(DESTDIR)$(DOCDIR)/docs/  # where the README's links and the alerts' runbook_url point
	@$(MAKE) --no-print-directory install-config
	install -d $(DESTDIR)$(SLURMHOOKDIR) $(DESTDIR)$(DOCDIR)/slurm
	for hook in prolog epilog task-prolog; do \
	  sed 's|/opt/noded/bin/python|$(APPDIR)/bin/python|; s|/etc/noded/slurm-hooks.conf|$(CONFDIR)/slurm-hooks.conf|' \
	    integrations/slurm/$$hook > $(DESTDIR)$(SLURMHOOKDIR)/$$hook && chmod 0755 $(DESTDIR)$(SLURMHOOKDIR)/$$hook; done
	install -m 0644 integrations/slurm/README.md integrations/slurm/*.example $(DESTDIR)$(DOCDIR)/slurm/
	test -e $(DESTDIR)$(CONFDIR)/slurm-hooks.conf || install -m 0644 integrations/slurm/slurm-hooks.conf $(DESTDIR)$(CONFDIR)/slurm-hooks.conf
	@if [ -z "$(DESTDIR)" ]; then getent group $(ADMIN_GROUP) >/dev/null || groupadd --system $(ADMIN_GROUP); \
	  systemctl daemon-reload 2>/dev/null || true; \
	  echo "installed; now: systemctl enable --now noded"; fi

# The commented default config, unless the host has one (an operator's config survives a
# reinstall); part of `install`, a target of its own so that its tests need no venv built.
install-config:
	@install -d $(DESTDIR)$(CONFDIR)
	@if test -e $(DESTDIR)$(CONFDIR)/noded.yaml; then \
	  echo "kept $(CONFDIR)/noded.yaml: keys new in this version take their defaults (config/noded.yaml lists every key); before the restart: noded check-config $(CONFDIR)/noded.yaml"; \
	else install -m 0644 config/noded.yaml $(DESTDIR)$(CONFDIR)/noded.yaml; fi

uninstall:
	@if [ -z "$(DESTDIR)" ]; then systemctl disable --now noded 2>/dev/null || true; fi
	rm -f $(DESTDIR)$(UNITDIR)/noded.service $(DESTDIR)$(BINDIR)/noded $(DESTDIR)$(BINDIR)/nodectl
	rm -f $(DESTDIR)$(SHAREDIR)/bash-completion/completions/noded $(DESTDIR)$(SHAREDIR)/bash-completion/completions/nodectl
	rm -f $(DESTDIR)$(SHAREDIR)/zsh/site-functions/_noded $(DESTDIR)$(SHAREDIR)/zsh/site-functions/_nodectl
	rm -f $(DESTDIR)$(SHAREDIR)/man/man1/noded.1 $(DESTDIR)$(SHAREDIR)/man/man1/nodectl.1
	rm -f $(DESTDIR)$(DROPINDIR)/remote-scrape.conf
	if [ -d $(DESTDIR)$(DROPINDIR) ]; then rmdir --ignore-fail-on-non-empty $(DESTDIR)$(DROPINDIR); fi
	rm -rf $(DESTDIR)$(APPDIR) $(DESTDIR)$(DOCDIR) $(DESTDIR)$(SLURMHOOKDIR)
	if [ -d $(DESTDIR)$(dir $(SLURMHOOKDIR)) ]; then rmdir --ignore-fail-on-non-empty $(DESTDIR)$(dir $(SLURMHOOKDIR)); fi
	@if [ -z "$(DESTDIR)" ]; then systemctl daemon-reload 2>/dev/null || true; fi
	@echo "kept $(CONFDIR)/noded.yaml, $(CONFDIR)/slurm-hooks.conf, /var/lib/noded and the $(ADMIN_GROUP) group; remove them by hand if wanted"

# Remote scraping: the unit talks IP with localhost only; this drop-in allows the
# scrapers' network as well (PROM_NET: one or more networks in CIDR, space-separated).
# noded must also listen there: metrics.address in $(CONFDIR)/noded.yaml, then a restart.
# PROM_NET reaches the recipe through the environment, never pasted into its shell text.
export PROM_NET
install-remote-scrape:
	@set -e; \
	if [ -z "$$PROM_NET" ]; then \
	  echo "noded: name the scrapers' network: make install-remote-scrape PROM_NET=10.20.0.0/24" >&2; exit 2; fi; \
	nets=$$($(INSTALL_PYTHON) -c 'import ipaddress, sys; print(" ".join(str(ipaddress.ip_network(n)) for n in sys.argv[1:]))' \
	  $$PROM_NET 2>/dev/null) || { \
	  echo "noded: PROM_NET must be networks in CIDR (e.g. 10.20.0.0/24, host bits zero), got '$$PROM_NET'" >&2; exit 2; }; \
	install -d "$(DESTDIR)$(DROPINDIR)"; \
	new="$(DESTDIR)$(DROPINDIR)/.remote-scrape.conf.new"; \
	sed "s|^IPAddressAllow=localhost 192\.0\.2\.0/24\$$|IPAddressAllow=localhost $$nets|" systemd/remote-scrape.conf > "$$new"; \
	grep -qx "IPAddressAllow=localhost $$nets" "$$new"; \
	chmod 0644 "$$new"; mv "$$new" "$(DESTDIR)$(DROPINDIR)/remote-scrape.conf"; \
	echo "installed $(DESTDIR)$(DROPINDIR)/remote-scrape.conf: IPAddressAllow=localhost $$nets"; \
	if [ -z "$(DESTDIR)" ]; then systemctl daemon-reload 2>/dev/null || true; \
	  echo "now set metrics.address in $(CONFDIR)/noded.yaml (e.g. 0.0.0.0) and: systemctl restart noded"; fi

# The unit, alone and with the remote-scrape drop-in, as systemd loads it on a host:
# systemd-analyze verify (no warnings) and security (exposure at most 3.0), offline.
verify-unit:
	systemd/verify
	systemd/verify systemd/remote-scrape.conf
