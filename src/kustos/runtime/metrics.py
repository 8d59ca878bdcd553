"""Prometheus metrics under controller-runtime's names, so existing dashboards and alerts work."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

_TIME_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7,
                 0.8, 0.9, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5, 6, 7, 8, 9, 10, 15,
                 20, 25, 30, 40, 50, 60)  # fmt: skip
_QUEUE_BUCKETS = tuple(10.0**e for e in range(-8, 4))


class Metrics:
    """One registry per operator process; tests may create their own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        r = self.registry
        self.reconcile_total = Counter(
            "controller_runtime_reconcile_total",
            "Total number of reconciliations per controller",
            ["controller", "result"],
            registry=r,
        )
        self.reconcile_errors = Counter(
            "controller_runtime_reconcile_errors_total",
            "Total number of reconciliation errors per controller",
            ["controller"],
            registry=r,
        )
        self.reconcile_time = Histogram(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            ["controller"],
            buckets=_TIME_BUCKETS,
            registry=r,
        )
        self.active_workers = Gauge(
            "controller_runtime_active_workers",
            "Number of currently used workers per controller",
            ["controller"],
            registry=r,
        )
        self.max_concurrent = Gauge(
            "controller_runtime_max_concurrent_reconciles",
            "Maximum number of concurrent reconciles per controller",
            ["controller"],
            registry=r,
        )
        self.queue_depth = Gauge("workqueue_depth", "Current depth of workqueue", ["name"], registry=r)
        self.queue_adds = Counter("workqueue_adds_total", "Total number of adds handled by workqueue",
                                  ["name"], registry=r)  # fmt: skip
        self.queue_latency = Histogram(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
            ["name"],
            buckets=_QUEUE_BUCKETS,
            registry=r,
        )
        self.work_duration = Histogram(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes",
            ["name"],
            buckets=_QUEUE_BUCKETS,
            registry=r,
        )
        self.retries = Counter("workqueue_retries_total", "Total number of retries handled by workqueue",
                               ["name"], registry=r)  # fmt: skip
        self.unfinished_work = Gauge(
            "workqueue_unfinished_work_seconds",
            "How many seconds of work has been done that is in progress and hasn't been observed by "
            "work_duration. Large values indicate stuck threads.",
            ["name"],
            registry=r,
        )
        self.longest_running = Gauge(
            "workqueue_longest_running_processor_seconds",
            "How many seconds has the longest running processor for workqueue been running.",
            ["name"],
            registry=r,
        )
        self.rest_requests = Counter(
            "rest_client_requests_total",
            "Number of HTTP requests, partitioned by status code, method, and host.",
            ["code", "method", "host"],
            registry=r,
        )
        self.leader = Gauge(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, "
            "1 indicates master. 'name' is the string used to identify the lease.",
            ["name"],
            registry=r,
        )
        self.cached_objects = Gauge(
            "kustos_informer_cached_objects",
            "Objects held in an informer's cache",
            ["resource"],
            registry=r,
        )
        self.caches_synced = Gauge(
            "kustos_controller_caches_synced",
            "1 once every cache a controller reads has synced and it runs; 0 while it waits "
            "(for instance for a CRD that is not installed)",
            ["controller"],
            registry=r,
        )
        self.watch_restarts = Counter(
            "kustos_informer_watch_restarts_total",
            "Watches restarted, by reason (closed, expired, inactive, absent, error)",
            ["resource", "reason"],
            registry=r,
        )
        # The soak (docs/proof.md) fails when this grows: a task leaked per reconcile or watch.
        Gauge(
            "kustos_asyncio_tasks",
            "asyncio tasks not yet done in the operator's event loop",
            registry=r,
        ).set_function(_running_tasks)


def _running_tasks() -> float:
    """Read in the loop that serves /metrics; NaN where no loop runs (a test's own registry)."""
    try:
        return float(len(asyncio.all_tasks()))
    except RuntimeError:
        return float("nan")
