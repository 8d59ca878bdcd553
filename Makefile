# The two entry points a newcomer needs (see README.md). Everything they depend on
# is built or installed on demand; slow artefacts are cached per user outside the
# checkout (~/.cache/kustos, ~/.cache/uv, Go's caches), keyed by version.

UV_VERSION := 0.13.9
KUSTOS_CACHE ?= $(HOME)/.cache/kustos
UV := $(KUSTOS_CACHE)/tools/uv-$(UV_VERSION)/bin/uv
VENV := .venv
KUSTOS := $(VENV)/bin/kustos

.PHONY: dev-up dev-down test lint build-binaries crds chart

# The embedded default: local control plane plus a sample workload (F-DEV-3).
dev-up: $(VENV)/.synced
	$(KUSTOS) dev up

dev-down: $(VENV)/.synced
	$(KUSTOS) dev down

# The whole suite: lint, types, import contracts, unit and integration tests on the real control plane.
test: $(VENV)/.synced
	$(KUSTOS) dev build
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-logo
	$(VENV)/bin/pytest

lint: $(VENV)/.synced
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/mypy
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
