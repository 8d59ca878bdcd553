# The two entry points a newcomer needs (see README.md). Everything they depend on
# is built or installed on demand; slow artefacts are cached per user outside the
# checkout (~/.cache/kustos, ~/.cache/uv, Go's caches), keyed by version.

UV_VERSION := 0.13.9
KUSTOS_CACHE ?= $(HOME)/.cache/kustos
UV := $(KUSTOS_CACHE)/tools/uv-$(UV_VERSION)/bin/uv
VENV := .venv
# mypy's cache outside the checkout: a fresh clone (CI's) checks in about 2 s instead of 25.
# mypy revalidates every entry against its source and its own version.
MYPY := $(VENV)/bin/mypy --cache-dir $(KUSTOS_CACHE)/mypy
KUSTOS := $(VENV)/bin/kustos

.PHONY: dev-up dev-down test lint build-binaries crds chart proof

# The embedded default: local control plane plus a sample workload (F-DEV-3).
dev-up: $(VENV)/.synced
	$(KUSTOS) dev up

dev-down: $(VENV)/.synced
	$(KUSTOS) dev down

# The whole suite: lint, types, import contracts, unit and integration tests on the real control plane.
test: lint
	$(KUSTOS) dev build --test-servers
	$(VENV)/bin/python -m tests.shards

# The proof suite (docs/proof.md): histories recorded under injected failures, checked for
# linearizability, watch guarantees and lost writes; prints the report table. `make test` runs
# the same scenarios with the short profile; PROOF_PROFILE=full is the documented run,
# PROOF_PROFILE=nightly the same with an hour's soak. The crash points run here at every write
# (KUSTOS_CRASH_POINTS=all); `make test` crashes each scenario once.
# test_proof_real_nodes.py (full profile only) starts four real kubelet nodes.
PROOF_PROFILE ?= full
PROOF_DIR ?= $(KUSTOS_CACHE)/proof
proof: $(VENV)/.synced
	$(KUSTOS) dev build
	mkdir -p $(PROOF_DIR) && rm -f $(PROOF_DIR)/report.md
	KUSTOS_PROOF_PROFILE=$(PROOF_PROFILE) KUSTOS_PROOF_DIR=$(PROOF_DIR) KUSTOS_PROOF_REPORT=$(PROOF_DIR)/report.md \
		KUSTOS_CRASH_POINTS=all \
		$(VENV)/bin/pytest -q -p no:cacheprovider tests/integration/test_proof.py tests/integration/test_proof_nodes.py \
		tests/integration/test_proof_real_nodes.py tests/integration/test_crash_points.py; \
		status=$$?; cat $(PROOF_DIR)/report.md 2>/dev/null; echo "histories: $(PROOF_DIR)"; exit $$status

lint: $(VENV)/.synced
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(MYPY)
	$(VENV)/bin/lint-imports --no-logo

build-binaries: $(VENV)/.synced
	$(KUSTOS) dev build

# Regenerate deploy/crds from the models in kustos.api (a unit test fails when it is stale).
crds: $(VENV)/.synced
	$(KUSTOS) crds --write deploy/crds

$(UV):
	python3 -m venv $(KUSTOS_CACHE)/tools/uv-$(UV_VERSION)
	$(KUSTOS_CACHE)/tools/uv-$(UV_VERSION)/bin/pip install --quiet uv==$(UV_VERSION)

$(VENV)/.synced: $(UV) uv.lock pyproject.toml
	$(UV) sync --frozen --python python3
	touch $@

# Regenerate the chart's generated files (CRDs template, values.schema.json), its golden
# `helm template` outputs and deploy/manifests/kustos.yaml (unit tests fail when they are stale).
chart: $(VENV)/.synced
	$(KUSTOS) chart --write deploy/helm/kustos
	KUSTOS_UPDATE_GOLDEN=1 $(VENV)/bin/pytest -q tests/unit/test_chart.py
