"""Metrics under controller-runtime's names, so existing dashboards and alerts keep working."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kustos.runtime.metrics import Metrics

CONTROLLER_RUNTIME = {
    "controller_runtime_reconcile_total": "counter",
    "controller_runtime_reconcile_errors_total": "counter",
    "controller_runtime_reconcile_time_seconds": "histogram",
    "controller_runtime_active_workers": "gauge",
    "controller_runtime_max_concurrent_reconciles": "gauge",
    "workqueue_depth": "gauge",
    "workqueue_adds_total": "counter",
    "workqueue_queue_duration_seconds": "histogram",
    "workqueue_work_duration_seconds": "histogram",
    "workqueue_retries_total": "counter",
    "workqueue_unfinished_work_seconds": "gauge",
    "workqueue_longest_running_processor_seconds": "gauge",
    "rest_client_requests_total": "counter",
    "leader_election_master_status": "gauge",
}


def _types(metrics: Metrics) -> dict[str, str]:
    """Metric name -> type, as the exposition declares them (``# TYPE`` lines)."""
    text = generate_latest(metrics.registry).decode()
    return {
        parts[2]: parts[3]
        for parts in (line.split() for line in text.splitlines() if line.startswith("# TYPE "))
    }


def test_controller_runtime_names_and_types_are_exposed() -> None:
    types = _types(Metrics())
    for name, kind in CONTROLLER_RUNTIME.items():
        assert types.get(name) == kind, name


def test_process_and_platform_metrics_are_exposed() -> None:
    types = _types(Metrics())
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"):
        assert name in types, name
    assert "python_info" in types


def test_label_names_match_controller_runtime() -> None:
    metrics = Metrics()
    metrics.reconcile_total.labels("etcd", "success").inc()
    metrics.reconcile_errors.labels("etcd").inc()
    metrics.reconcile_time.labels("etcd").observe(0.2)
    metrics.queue_depth.labels("etcd").set(1)
    metrics.rest_requests.labels("200", "GET", "127.0.0.1").inc()
    metrics.leader.labels("kustos-leader").set(1)
    get = metrics.registry.get_sample_value
    assert get("controller_runtime_reconcile_total", {"controller": "etcd", "result": "success"}) == 1
    assert get("controller_runtime_reconcile_errors_total", {"controller": "etcd"}) == 1
    assert get("controller_runtime_reconcile_time_seconds_count", {"controller": "etcd"}) == 1
    assert get("controller_runtime_reconcile_time_seconds_bucket", {"controller": "etcd", "le": "0.25"}) == 1
    assert get("controller_runtime_reconcile_time_seconds_bucket", {"controller": "etcd", "le": "0.15"}) == 0
    assert get("workqueue_depth", {"name": "etcd"}) == 1
    assert get("rest_client_requests_total", {"code": "200", "method": "GET", "host": "127.0.0.1"}) == 1
    assert get("leader_election_master_status", {"name": "kustos-leader"}) == 1


def test_queue_histograms_span_nanoseconds_to_hours() -> None:
    metrics = Metrics()
    metrics.queue_latency.labels("q").observe(5e-9)
    metrics.queue_latency.labels("q").observe(500.0)
    get = metrics.registry.get_sample_value
    assert get("workqueue_queue_duration_seconds_bucket", {"name": "q", "le": "1e-08"}) == 1
    assert get("workqueue_queue_duration_seconds_bucket", {"name": "q", "le": "100.0"}) == 1
    assert get("workqueue_queue_duration_seconds_bucket", {"name": "q", "le": "1000.0"}) == 2


def test_each_instance_has_its_own_registry() -> None:
    first, second = Metrics(), Metrics()
    first.reconcile_total.labels("etcd", "success").inc()
    labels = {"controller": "etcd", "result": "success"}
    assert first.registry.get_sample_value("controller_runtime_reconcile_total", labels) == 1
    assert second.registry.get_sample_value("controller_runtime_reconcile_total", labels) is None


def test_a_given_registry_is_used_and_cannot_hold_two_sets() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    assert metrics.registry is registry
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        Metrics(registry)


def test_the_exposition_parses() -> None:
    metrics = Metrics()
    metrics.watch_restarts.labels("pods", "expired").inc()
    metrics.cached_objects.labels("pods").set(12)
    families = {
        family.name: family
        for family in text_string_to_metric_families(generate_latest(metrics.registry).decode())
    }
    assert families["kustos_informer_watch_restarts"].samples[0].labels == {
        "resource": "pods",
        "reason": "expired",
    }
    assert families["kustos_informer_cached_objects"].samples[0].value == 12
