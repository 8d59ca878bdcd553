"""The operator's HTTP endpoints on 127.0.0.1: probes, metrics, and HTTPS admission webhooks."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from kustos.runtime.metrics import Metrics
from kustos.runtime.server import ProbeServer, WebhookServer, split_address
from kustos.runtime.webhook import AdmissionResponse, ServingCertificate, Webhook

# ---- split_address -----------------------------------------------------------------------


def test_split_address() -> None:
    assert split_address("127.0.0.1:8080") == ("127.0.0.1", 8080)
    assert split_address(":8080") == ("0.0.0.0", 8080)
    assert split_address("localhost:0") == ("localhost", 0)
    assert split_address("9443") == ("0.0.0.0", 9443)


@given(
    host=st.one_of(
        st.just(""), st.ip_addresses(v=4).map(str), st.from_regex(r"[a-z][a-z0-9.-]{0,20}", fullmatch=True)
    ),
    port=st.integers(min_value=0, max_value=65535),
)
def test_split_address_round_trips(host: str, port: int) -> None:
    assert split_address(f"{host}:{port}") == (host or "0.0.0.0", port)


def test_split_address_rejects_a_missing_port() -> None:
    with pytest.raises(ValueError, match="invalid literal"):
        split_address("127.0.0.1:")


def test_split_address_unwraps_ipv6_literals() -> None:
    assert split_address("[::1]:8080") == ("::1", 8080)


# ---- ProbeServer -------------------------------------------------------------------------


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(trust_env=False, timeout=5) as client:
        yield client


async def test_probe_server_binds_a_free_port_and_stops() -> None:
    server = ProbeServer(Metrics(), "127.0.0.1:0")
    await server.start()
    port = server.port
    assert port > 0
    async with httpx.AsyncClient(trust_env=False, timeout=5) as client:
        assert (await client.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200
        await server.stop()
        with pytest.raises(httpx.ConnectError):
            await client.get(f"http://127.0.0.1:{port}/healthz")


@pytest.fixture
async def probes() -> AsyncIterator[tuple[ProbeServer, Metrics]]:
    metrics = Metrics()
    server = ProbeServer(metrics, "127.0.0.1:0")
    await server.start()
    try:
        yield server, metrics
    finally:
        await server.stop()


async def test_healthz(probes: tuple[ProbeServer, Metrics], http: httpx.AsyncClient) -> None:
    server, _ = probes
    response = await http.get(f"http://127.0.0.1:{server.port}/healthz")
    assert response.status_code == 200
    assert response.text == "ok"


async def test_readyz_fails_with_the_failing_checks_until_they_pass(
    probes: tuple[ProbeServer, Metrics], http: httpx.AsyncClient
) -> None:
    server, _ = probes
    state = {"informers": False, "leader": False}
    server.add_readiness_check("informers", lambda: (state["informers"], "3 of 5 caches synced"))
    server.add_readiness_check("leader", lambda: (state["leader"], "no lease yet"))
    server.add_readiness_check("webhooks", lambda: (True, "serving"))
    url = f"http://127.0.0.1:{server.port}/readyz"

    response = await http.get(url)
    assert response.status_code == 503
    assert "informers: 3 of 5 caches synced" in response.text
    assert "leader: no lease yet" in response.text
    assert "webhooks" not in response.text

    state["informers"] = True
    response = await http.get(url)
    assert response.status_code == 503
    assert "informers" not in response.text
    assert "leader: no lease yet" in response.text

    state["leader"] = True
    response = await http.get(url)
    assert response.status_code == 200
    assert response.text == "ok"


async def test_readyz_without_checks_is_ready(
    probes: tuple[ProbeServer, Metrics], http: httpx.AsyncClient
) -> None:
    server, _ = probes
    assert (await http.get(f"http://127.0.0.1:{server.port}/readyz")).status_code == 200


async def test_metrics_exposes_the_registry_in_prometheus_text_format(
    probes: tuple[ProbeServer, Metrics], http: httpx.AsyncClient
) -> None:
    server, metrics = probes
    metrics.reconcile_total.labels("etcd", "success").inc(3)
    metrics.queue_depth.labels("etcd").set(7)
    response = await http.get(f"http://127.0.0.1:{server.port}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }
    assert (
        samples[("controller_runtime_reconcile_total", (("controller", "etcd"), ("result", "success")))] == 3
    )
    assert samples[("workqueue_depth", (("name", "etcd"),))] == 7
    assert "# TYPE controller_runtime_reconcile_total counter" in response.text
    assert any(name == "process_cpu_seconds_total" for name, _ in samples)


async def test_unknown_paths_are_404(probes: tuple[ProbeServer, Metrics], http: httpx.AsyncClient) -> None:
    server, _ = probes
    assert (await http.get(f"http://127.0.0.1:{server.port}/nope")).status_code == 404


# ---- WebhookServer -----------------------------------------------------------------------


async def _validate(request: dict[str, Any]) -> AdmissionResponse:
    replicas = request["object"]["spec"]["replicas"]
    if replicas % 2 == 0:
        return AdmissionResponse.deny(f"spec.replicas: {replicas} is even")
    return AdmissionResponse.allow()


async def _explode(request: dict[str, Any]) -> AdmissionResponse:
    raise RuntimeError("kaboom")


async def test_webhook_server_answers_admission_reviews_over_tls() -> None:
    certificate = ServingCertificate.self_signed(["kustos-webhook.kustos-system.svc"], ["127.0.0.1"])
    server = WebhookServer("127.0.0.1:0", certificate)
    server.register(Webhook("vetcd.kustos.dev", "/validate", "validating", [], _validate))
    server.register(Webhook("vboom.kustos.dev", "/boom", "validating", [], _explode))
    assert [w.path for w in server.webhooks] == ["/validate", "/boom"]
    context = ssl.create_default_context(cadata=certificate.ca_pem.decode())
    context.verify_flags &= (
        ~ssl.VERIFY_X509_STRICT
    )  # see the strict-verification test in test_runtime_webhook
    await server.start()
    try:
        assert server.serving and server.port > 0
        base = f"https://127.0.0.1:{server.port}"
        async with httpx.AsyncClient(verify=context, trust_env=False, timeout=5) as client:

            async def review(path: str, replicas: int) -> dict[str, Any]:
                body = {
                    "apiVersion": "admission.k8s.io/v1",
                    "kind": "AdmissionReview",
                    "request": {"uid": f"uid-{replicas}", "object": {"spec": {"replicas": replicas}}},
                }
                response = await client.post(base + path, json=body)
                assert response.status_code == 200
                return response.json()["response"]

            assert await review("/validate", 3) == {"uid": "uid-3", "allowed": True}
            denied = await review("/validate", 2)
            assert denied["allowed"] is False
            assert denied["status"] == {"code": 403, "message": "spec.replicas: 2 is even"}
            boom = await review("/boom", 1)
            assert boom["status"]["code"] == 500
            assert "vboom.kustos.dev" in boom["status"]["message"]
            assert (await client.post(base + "/unregistered", json={})).status_code == 404
    finally:
        await server.stop()
    assert not server.serving


async def test_readyz_notes_are_said_without_failing(
    probes: tuple[ProbeServer, Metrics], http: httpx.AsyncClient
) -> None:
    server, _ = probes
    waiting = {"text": "controller ghost waits for ghosts.example.kustos.dev"}
    server.add_readiness_note("controllers", lambda: waiting["text"])
    url = f"http://127.0.0.1:{server.port}/readyz"
    response = await http.get(url)
    assert response.status_code == 200
    assert response.text == "ok\ncontrollers: controller ghost waits for ghosts.example.kustos.dev"
    waiting["text"] = ""
    assert (await http.get(url)).text == "ok"


async def test_a_reloaded_certificate_is_presented_on_the_same_port_without_a_restart() -> None:
    names, ips = ["kustos-webhook.kustos-system.svc"], ["127.0.0.1"]
    old, new = ServingCertificate.self_signed(names, ips), ServingCertificate.self_signed(names, ips)
    server = WebhookServer("127.0.0.1:0", old)
    server.register(Webhook("vetcd.kustos.dev", "/validate", "validating", [], _validate))
    await server.start()

    async def presented(ca: ServingCertificate) -> int:
        context = ssl.create_default_context(cadata=ca.ca_pem.decode())
        context.verify_flags &= ~ssl.VERIFY_X509_STRICT
        async with httpx.AsyncClient(verify=context, trust_env=False, timeout=5) as client:
            body = {"request": {"uid": "u", "object": {"spec": {"replicas": 1}}}}
            return (await client.post(f"https://127.0.0.1:{server.port}/validate", json=body)).status_code

    try:
        port = server.port
        assert await presented(old) == 200
        server.reload(new)
        assert server.port == port and server.serving
        assert await presented(new) == 200
        with pytest.raises(httpx.ConnectError):  # the old CA no longer verifies what is served
            await presented(old)
    finally:
        await server.stop()
