# powercut: everything a user runs goes through here. Each target installs
# what is missing first (Debian packages, the pinned venv, the C build).
SHELL      := /bin/bash
PYTHON     ?= python3
VENV       ?= .venv
BUILD      ?= build
CC         ?= gcc
CFLAGS     ?= -O2 -g
CFLAGS     += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror
FUSE_CFLAGS = $(shell pkg-config --cflags fuse3 2>/dev/null)
FUSE_LIBS   = $(shell pkg-config --libs fuse3 2>/dev/null)

FS         ?= ext4
PC          = $(VENV)/bin/powercut
# PC=PATH on the command line: a powercut installed elsewhere (pip install .), so make builds nothing
# here (and a test that replaces powercut never rebuilds the checkout's venv).
PC_DEPS     = $(if $(filter command line,$(origin PC)),,deps)

# make fuzz / make soak
# Empty: powercut's default (hypothesis; mixed with KERNEL=, the vm backend).
ENGINE     ?=
DURATION   ?= 10m
# Workers mostly wait on the kernel (mount, fsync, the FUSE recorder): two per core pay off.
JOBS       ?= $(shell echo $$(( $$(nproc) * 2 )))
MOUNT_OPTS ?=
MKFS_OPTS  ?=
FUZZ_ARGS  ?=
# File systems, or fs:mkfs-feature for a configuration (ext4:fast_commit = mkfs -O fast_commit).
SOAK_FS        ?= ext4 ext4:fast_commit xfs btrfs
SOAK_WORKLOADS ?= 300
SOAK_DURATION  ?= 4h
SOAK_OPS       ?= 5-20
# make soak on several machines: each configuration one campaign joined through this Redis
# (redis://HOST:PORT/N), named SOAK_CAMPAIGN-CONFIG; run the same make soak on every machine.
SOAK_COORDINATOR ?=
SOAK_CAMPAIGN    ?= soak
# The oracle's tier for make fuzz/soak: linux (what ext4/xfs/btrfs developers promise) or posix.
SEMANTICS      ?= linux

.PHONY: all deps apt venv cbuild test test-deps test-quick corpus-check bench bench-ttf clean help ci-kernel fuzz soak afl fstests fstests-table

all: deps

help:
	@echo "make test        install what is missing, build, run the test suite"
	@echo "make test-quick  the quick tests only (no root, no guests, no campaigns)"
	@echo "make deps        only install/build (apt packages, venv, C programs)"
	@echo "make fuzz        a fuzzing campaign: FS=ext4|xfs|btrfs ENGINE=hypothesis|exhaustive|mixed|afl DURATION=10m"
	@echo "                 JOBS=N MOUNT_OPTS=... MKFS_OPTS=... FUZZ_ARGS='more powercut fuzz options'"
	@echo "make soak        long campaigns on $(SOAK_FS), $(SOAK_WORKLOADS) workloads of $(SOAK_OPS) ops each"
	@echo "                 (ext4:fast_commit finds a known kernel bug: exit 1 is expected there)"
	@echo "make corpus-check  every corpus entry on every matrix row this host can run; fails on an unexpected verdict"
	@echo "make bench       measure crash states/s and overheads; writes $(BUILD)/bench.json"
	@echo "make bench-ttf   minutes a default vm campaign needs per known kernel bug; writes $(BUILD)/bench-ttf.json"
	@echo "make fstests-table  the oracle against fstests' power-fail verdicts (docs/semantics.md), all rows on the"
	@echo "                 host kernel; FSTABLE_ROWS=ids FSTABLE_FS=ext4,.. FSTABLE_OUT=$(FSTABLE_OUT) (about an hour)"
	@echo "make fstests FSTESTS=DIR  build a user's fstests checkout (for powercut export --verify --fstests DIR)"
	@echo "make clean       remove build products and the venv"
	@echo "make ci-kernel KERNEL=debian:PKG [PREV_KERNEL=debian:PKG] [TOOLS=debian:SUITE] [ENTRIES=globs] [ROWS=rows] [OUT=dir]"
	@echo "                 corpus sample on that kernel (vm backend) vs the host kernel, diffed"

deps: apt venv cbuild

$(BUILD)/.apt-ok: ci/install-deps.sh
	@mkdir -p $(BUILD)
	bash ci/install-deps.sh
	@touch $@
apt: $(BUILD)/.apt-ok

$(VENV)/.deps-ok: requirements.txt pyproject.toml | $(BUILD)/.apt-ok
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r requirements.txt
	$(VENV)/bin/pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $@
venv: $(VENV)/.deps-ok

# The C builds wait for the Debian packages; `pip install .` (setup.py) builds with APT_DEP= instead.
APT_DEP      ?= $(BUILD)/.apt-ok
RECORDER_SRC := $(wildcard harness/backends/fuse/*.c)
EXEC_SRC     := $(wildcard workloads/executor/*.c)
DMLOG_SRC    := $(wildcard harness/backends/dm/*.c)
RECOVER_SRC  := $(wildcard harness/backends/vm/*.c)
COVER_SRC    := $(wildcard harness/backends/vm/cover/*.c)

$(BUILD)/pc-recorder: $(RECORDER_SRC) $(wildcard harness/backends/fuse/*.h) | $(APT_DEP)
	$(CC) $(CFLAGS) $(FUSE_CFLAGS) -o $@ $(RECORDER_SRC) $(FUSE_LIBS) -lpthread

# The executor's op tables (kinds, their plan fields and flag names) are generated from the
# workload schema, where each op's x-plan says them once (workloads/plan_schema.py).
$(BUILD)/gen/pc-kinds.h: workloads/schema/workload.schema.json workloads/plan_schema.py
	@mkdir -p $(@D)
	$(PYTHON) workloads/plan_schema.py $@

$(BUILD)/pc-exec: $(EXEC_SRC) $(wildcard workloads/executor/*.h) $(BUILD)/gen/pc-kinds.h | $(APT_DEP)
	$(CC) $(CFLAGS) -I$(BUILD)/gen -o $@ $(EXEC_SRC) -lpthread -lm

# pc-dmlog: the dm-log-writes target of the dm backend and of the vm guest.
$(BUILD)/pc-dmlog: $(DMLOG_SRC) | $(APT_DEP)
	$(CC) $(CFLAGS) $(FUSE_CFLAGS) -o $@ $(DMLOG_SRC) $(FUSE_LIBS)

# pc-recover: the recovery mounts of a vm guest's batch (copied into the guest).
$(BUILD)/pc-recover: $(RECOVER_SRC) $(wildcard harness/backends/vm/*.h) | $(APT_DEP)
	$(CC) $(CFLAGS) -o $@ $(RECOVER_SRC)

# pc-cover: which kernel functions a vm guest's workload and recovery mounts ran (BPF, copied into the guest).
$(BUILD)/pc-cover: $(COVER_SRC) | $(APT_DEP)
	$(CC) $(CFLAGS) -o $@ $(COVER_SRC)

CPROGS := $(if $(RECORDER_SRC),$(BUILD)/pc-recorder) $(if $(EXEC_SRC),$(BUILD)/pc-exec) \
          $(if $(DMLOG_SRC),$(BUILD)/pc-dmlog) $(if $(RECOVER_SRC),$(BUILD)/pc-recover) \
          $(if $(COVER_SRC),$(BUILD)/pc-cover)
cbuild: $(CPROGS)

# afl++ is optional (only the afl engine needs it): installed on demand.
$(BUILD)/.afl-ok: ci/install-deps.sh | $(BUILD)/.apt-ok
	POWERCUT_EXTRA_PKGS=afl++ bash ci/install-deps.sh
	@touch $@
afl: $(BUILD)/.afl-ok

# Build a user's fstests checkout for `powercut export --verify --fstests DIR`
# (its build needs these -dev packages and autotools; nothing is cloned here).
fstests: $(BUILD)/.apt-ok
	@test -n "$(FSTESTS)" -a -f "$(FSTESTS)/check" || { echo "make fstests FSTESTS=DIR: DIR must be an fstests checkout (git clone https://git.kernel.org/pub/scm/fs/xfs/xfstests-dev.git)"; exit 2; }
	POWERCUT_EXTRA_PKGS="autoconf automake libtool xfslibs-dev libattr1-dev libacl1-dev libaio-dev uuid-dev attr acl gawk bc" \
	    bash ci/install-deps.sh
	$(MAKE) -C "$(FSTESTS)" -j$(JOBS)

fuzz: deps $(if $(filter afl,$(ENGINE)),afl)
	$(PC) fuzz --fs $(FS) $(if $(ENGINE),--engine $(ENGINE)) --duration $(DURATION) --jobs $(JOBS) --semantics $(SEMANTICS) \
	    --mount-opts "$(MOUNT_OPTS)" --mkfs-opts "$(MKFS_OPTS)" \
	    $(if $(KERNEL),--backend vm --kernel '$(KERNEL)') $(FUZZ_ARGS)

# Each configuration's campaign goes to SOAK_OUT/<config> (default SOAK_OUT: campaigns/soak-DATE);
# SOAK_OUT/summary.{json,md}: one row per configuration (workloads, crash states, findings).
# Exit status of each campaign: 0 clean, 1 findings; one of 2 or more stops the soak.
soak: deps
	rc=0; out=$(or $(SOAK_OUT),campaigns/soak-$$(date -u +%Y%m%d-%H%M%S)); mkdir -p $$out; for c in $(SOAK_FS); do \
	    fs=$${c%%:*}; feat=$${c#$$fs}; feat=$${feat#:}; \
	    $(PC) fuzz --fs $$fs $${feat:+--mkfs-opts "-O $$feat"} $(if $(ENGINE),--engine $(ENGINE)) --max-workloads $(SOAK_WORKLOADS) \
	        --duration $(SOAK_DURATION) --jobs $(JOBS) --ops $(SOAK_OPS) --semantics $(SEMANTICS) \
	        --out $$out/$$fs$${feat:+-$$feat} $(FUZZ_ARGS) \
	        $(if $(SOAK_COORDINATOR),--coordinator $(SOAK_COORDINATOR) --campaign $(SOAK_CAMPAIGN)-$$fs$${feat:+-$$feat}); \
	    r=$$?; [ $$r -gt $$rc ] && rc=$$r; [ $$r -ge 2 ] && break; \
	done; \
	$(VENV)/bin/python -m harness.reports.soak_summary --json $$out/summary.json $$out \
	    | tee $$out/summary.md; exit $$rc

# Everything the whole suite needs beyond `deps`: the afl engine's afl++ and the vm backend's
# QEMU parts (packages.py VM_HOST_PACKAGES), so no test skips for want of a package.
TEST_PKGS := afl++ qemu-system-x86 busybox-static dmsetup kmod zstd
$(BUILD)/.test-deps-ok: ci/install-deps.sh | $(BUILD)/.apt-ok
	POWERCUT_EXTRA_PKGS="$(TEST_PKGS)" bash ci/install-deps.sh
	@touch $@ $(BUILD)/.afl-ok
test-deps: $(BUILD)/.test-deps-ok

# One pytest-xdist worker a core (a guest boot under TCG keeps one core busy; most host tests
# wait on loop devices, FUSE and mkfs); tests/conftest.py hands out the guest modules first and
# keeps tests that share a module's fixture, or a lab, on one worker. `serial` tests change
# something machine-wide while they run (a dead FUSE mount fails every mkfs.btrfs): after the
# others, alone. Both parts always run; make fails if either did.
TEST_JOBS ?= $(shell nproc)
TEST_ARGS ?=
PYTEST     = $(VENV)/bin/python -m pytest -q -p no:cacheprovider
test: deps test-deps
	rc=0; $(PYTEST) --durations=15 -n $(TEST_JOBS) --dist loadgroup -m "not serial" $(TEST_ARGS) tests || rc=$$?; \
	    $(PYTEST) -m serial tests || rc=$$?; exit $$rc

# The inner loop: tests without root, guests or campaigns (marker `quick`, seconds), on every core.
test-quick: deps
	$(PYTEST) --durations=5 -n $(TEST_JOBS) -m quick tests

# The whole corpus on every matrix row this host can run (CI runs it after `make test`).
CORPUS_JOBS ?= 2
CORPUS_OUT  ?= $(BUILD)/corpus-check
corpus-check: deps
	rm -rf $(CORPUS_OUT)
	$(PC) corpus run --runnable --jobs $(CORPUS_JOBS) --out $(CORPUS_OUT) --junit $(CORPUS_OUT).xml

# BENCH_KERNEL= (empty) skips the vm backend's part (a guest boot and ~16 workloads under TCG).
bench: BENCH_KERNEL ?= debian:linux-image-6.12-amd64
bench: deps
	$(PC) bench --json $(BUILD)/bench.json $(if $(BENCH_KERNEL),--kernel '$(BENCH_KERNEL)')
# Time to find (docs/time-to-find.md): a default vm campaign per known bug of
# bench/bugpairs.json on its buggy kernel, findings re-checked on the fixed one.
# Long (up to TTF_MINUTES per bug, one bug at a time): not part of `make test`.
TTF_MINUTES ?= 15
TTF_JOBS    ?= 2
TTF_BUGS    ?=
TTF_OUT     ?= out/time-to-find
bench-ttf: deps
	$(PC) bench --only time-to-find --minutes $(TTF_MINUTES) --jobs $(TTF_JOBS) \
	    $(if $(TTF_BUGS),--bugs '$(TTF_BUGS)') --out $(TTF_OUT) --json $(BUILD)/bench-ttf.json
# Kernel upgrade check: the same corpus sample on the host kernel (fuse
# backend) and on KERNEL (vm backend), a short fuzz campaign on KERNEL, then
# `powercut corpus diff` (and with PREV_KERNEL, `powercut bisect` of the changed
# cases): the Markdown diff is OUT/diff.md; the exit statuses of the campaign
# (1: findings), the diff (1: a verdict changed) and the bisection (2: error)
# are OUT/fuzz.rc, OUT/diff.rc, OUT/bisect.rc (make itself exits 2 on any
# failure, findings and changed verdicts included).
ci-kernel: ENTRIES ?= append-fsync,rename-over-durable,fsync-directory
ci-kernel: ROWS ?= ext4-ordered
ci-kernel: OUT ?= out/ci-kernel
ci-kernel: CI_FUZZ_WORKLOADS ?= 10
ci-kernel: CI_FUZZ_DURATION ?= 10m
ci-kernel: CI_FUZZ_ARGS ?=
ci-kernel: TOOLS ?=
ci-kernel: $(PC_DEPS)
	@test -n "$(KERNEL)" || { echo "make ci-kernel: set KERNEL=debian:PACKAGE (e.g. debian:linux-image-6.12-amd64)" >&2; exit 2; }
	@rm -f $(OUT)/diff.rc $(OUT)/fuzz.rc $(OUT)/bisect.rc $(OUT)/bisect.txt; mkdir -p $(OUT)
	$(PC) corpus run --entries '$(ENTRIES)' --rows '$(ROWS)' --out $(OUT)/host || [ $$? = 1 ]
	$(PC) corpus run --backend vm --kernel '$(KERNEL)' $(if $(TOOLS),--tools '$(TOOLS)') --entries '$(ENTRIES)' \
	    --rows '$(ROWS)' --out $(OUT)/kernel || [ $$? = 1 ]
	$(PC) fuzz --fs ext4 --backend vm --kernel '$(KERNEL)' $(if $(TOOLS),--tools '$(TOOLS)') --engine exhaustive --seq 1 \
	    --max-workloads $(CI_FUZZ_WORKLOADS) --duration $(CI_FUZZ_DURATION) $(CI_FUZZ_ARGS) \
	    --out $(OUT)/fuzz-$$(date +%Y%m%d-%H%M%S); \
	    rc=$$?; echo $$rc > $(OUT)/fuzz.rc; [ $$rc -le 1 ]
	$(PC) corpus diff $(OUT)/host/results.json $(OUT)/kernel/results.json --out $(OUT)/diff.md; \
	    rc=$$?; echo $$rc > $(OUT)/diff.rc; \
	    if [ $$rc = 1 ] && [ -n "$(PREV_KERNEL)" ]; then \
	        { $(PC) bisect $(OUT)/kernel/results.json --changed-against $(OUT)/host/results.json \
	            --kernels '$(PREV_KERNEL)..$(KERNEL)' --out $(OUT)/bisect; echo $$? > $(OUT)/bisect.rc; } \
	            | tee $(OUT)/bisect.txt; \
	        [ "$$(cat $(OUT)/bisect.rc)" -le 1 ] || exit 2; \
	    fi; [ $$rc = 0 ] && [ "$$(cat $(OUT)/fuzz.rc)" = 0 ]

# The oracle against fstests' power-fail verdicts (bench/fstable.py): each row's workload on the
# host kernel (0 findings expected), its buggy outcome planted and rechecked. Long: not in `make test`.
FSTABLE_ROWS ?=
FSTABLE_FS   ?=
FSTABLE_OUT  ?= out/fstests-table
fstests-table: deps
	$(VENV)/bin/python -m bench.fstable --out $(FSTABLE_OUT) $(if $(FSTABLE_ROWS),--rows '$(FSTABLE_ROWS)') \
	    $(if $(FSTABLE_FS),--fs '$(FSTABLE_FS)')

clean:
	rm -rf $(BUILD) $(VENV)
