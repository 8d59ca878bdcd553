"""The GCP provider through google-cloud-compute's REST transport against the local fake.

No Kubernetes here (tests/integration/test_cloud_contract.py has what every provider must
do): what is GCP's own. The fake is checked against the API description the SDK ships, so
the provider is tested against the API's shapes, not against the fake's inventions.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.cloud import compute_v1

from kustos.devcluster.gcpfake import COMPUTE_AUDIENCE, ROOT, GcpFake, gce_error
from kustos.nodes.cloud.gcp import (
    GcpOptions,
    GcpProvider,
    GroupRef,
    parse_provider_id,
    template_name_for,
)
from kustos.runtime.cloud import CapacityError, InstanceState, ProviderError, Role, Throttled
from tests.identity_support import Issuer

OLD = "projects/images/global/images/os-v1"
NEW = "projects/images/global/images/os-v2"


def sdk_routes() -> set[tuple[str, str]]:
    """(method, URI template) of every call the SDK's REST transports can make."""
    import importlib
    import pkgutil

    from google.cloud.compute_v1 import services

    found: set[tuple[str, str]] = set()
    for info in pkgutil.iter_modules(services.__path__):
        module = importlib.import_module(f"google.cloud.compute_v1.services.{info.name}.transports.rest_base")
        for transport in vars(module).values():
            if not isinstance(transport, type):
                continue
            for inner in vars(transport).values():
                options = getattr(inner, "_get_http_options", None)
                if options is not None:
                    found.update((o["method"], o["uri"]) for o in options())
    return found


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[GcpFake]:
    """The fake, and Application Default Credentials for it: a service account key file."""
    fake = GcpFake(boot_seconds=0.0, delete_seconds=0.0)
    fake.api.start()
    adc = fake.service_account_key(tmp_path / "key.json")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
    yield fake
    fake.api.stop()


def provider_for(fake: GcpFake) -> GcpProvider:
    """A new provider, as a restarted operator has."""
    return GcpProvider.from_options({"project": fake.project, "endpoint": fake.api.url, "cache-seconds": "0"})


def test_every_route_of_the_fake_is_one_the_sdk_calls() -> None:
    fake = GcpFake()
    known = sdk_routes()
    for route in fake.api.routes:
        if route.name != "oauth.token":  # the credential files' token URI, not the Compute API
            assert (route.method, route.template) in known, route.template


def test_the_fake_answers_in_the_shapes_the_api_description_gives(fake: GcpFake) -> None:
    """Unknown fields are refused: every field the fake sends is one the API has."""
    fake.add_group("w", "worker", OLD, 1)
    zone = f"/compute/v1/projects/{fake.project}/zones/us-central1-a"
    headers = {"Authorization": f"Bearer {fake.tokens.issue('test', COMPUTE_AUDIENCE)[0]}"}
    manager = fake.api.handle("get", f"{zone}/instanceGroupManagers/w", b"", headers).body
    compute_v1.InstanceGroupManager.from_json(_json(manager), ignore_unknown_fields=False)
    listed = fake.api.handle(
        "post", f"{zone}/instanceGroupManagers/w/listManagedInstances", b"", headers
    ).body
    compute_v1.InstanceGroupManagersListManagedInstancesResponse.from_json(
        _json(listed), ignore_unknown_fields=False
    )
    template = fake.api.handle(
        "get", f"/compute/v1/projects/{fake.project}/global/instanceTemplates/w-tpl", b"", headers
    ).body
    compute_v1.InstanceTemplate.from_json(_json(template), ignore_unknown_fields=False)
    name = listed["managedInstances"][0]["name"]
    instance = fake.api.handle("get", f"{zone}/instances/{name}", b"", headers).body
    compute_v1.Instance.from_json(_json(instance), ignore_unknown_fields=False)


def _json(body: object) -> str:
    import json

    return json.dumps(body)


async def test_zonal_and_regional_groups_are_found_by_their_template_labels(fake: GcpFake) -> None:
    cp = fake.add_group("cp", "control-plane", OLD, 1)
    workers = fake.add_group("workers", "worker", OLD, 2, region="us-central1")
    fake.add_group("other", "database", OLD, 1)  # no role kustos knows
    groups = {g.group_id: g for g in await provider_for(fake).groups()}
    assert set(groups) == {cp, workers}
    assert groups[cp].role == Role.CONTROL_PLANE and groups[workers].role == Role.WORKER
    assert groups[workers].image == OLD and groups[workers].desired == 2
    assert workers == "projects/kustos-test/regions/us-central1/instanceGroupManagers/workers"
    zones = {i.provider_id.split("/")[3] for i in await provider_for(fake).instances(workers)}
    assert zones == {"us-central1-a", "us-central1-b"}  # a regional group spreads over zones


@pytest.mark.parametrize("regional_template", [False, True], ids=["global-template", "regional-template"])
async def test_a_new_image_is_a_cloned_template_and_a_retry_makes_no_second(
    fake: GcpFake, regional_template: bool
) -> None:
    group = fake.add_group(
        "workers", "worker", OLD, 1, region="us-central1", regional_template=regional_template
    )
    await provider_for(fake).set_image(group, NEW)
    # The clone is where its source is: a regional template serves its own region's groups only.
    where = "regions/us-central1" if regional_template else "global"
    assert fake.group(group).template.startswith(
        f"projects/{fake.project}/{where}/instanceTemplates/workers-tpl-k"
    )
    templates = set(fake.templates)
    await provider_for(fake).set_image(group, NEW)  # a restarted operator asks again
    assert set(fake.templates) == templates and len(templates) == 2
    [current] = [g for g in await provider_for(fake).groups() if g.group_id == group]
    assert current.image == NEW
    clone = fake.templates[fake.group(group).template.split(f"projects/{fake.project}/", 1)[1]]
    assert clone["properties"]["labels"] == {"kustos-role": "worker"}  # the rest is the source's
    assert clone["properties"]["machineType"] == "e2-standard-4"
    # Running instances keep their image; new ones get the new one.
    await provider_for(fake).create_instance(group)
    images = sorted(i.image or "" for i in await provider_for(fake).instances(group))
    assert images == sorted([OLD, NEW])


def test_template_names_are_derived_and_short() -> None:
    name = template_name_for("projects/p/global/instanceTemplates/" + "a" * 70, NEW)
    assert len(name) <= 63 and re.fullmatch(r"[a-z][-a-z0-9]*", name)
    again = template_name_for(f"projects/p/global/instanceTemplates/{name}", OLD)
    assert again.startswith("a" * 50 + "-k")  # never a suffix on a suffix


async def test_a_creation_not_listed_yet_is_outstanding(fake: GcpFake) -> None:
    group = fake.add_group("workers", "worker", OLD, 1)
    fake.hold_creations = True
    await provider_for(fake).create_instance(group)
    with pytest.raises(ProviderError) as refused:
        await provider_for(fake).create_instance(group)
    assert refused.value.reason == "ProviderLaunchOutstanding"
    assert fake.group(group).target_size == 2  # asked once
    # Its Join's deadline passes: the creation is taken back, once.
    assert await provider_for(fake).cancel_create(group)
    assert not await provider_for(fake).cancel_create(group)
    assert fake.group(group).target_size == 1
    fake.hold_creations = False
    fake.release()
    assert len(await provider_for(fake).instances(group)) == 1


async def test_a_creation_the_group_keeps_failing_for_quota_is_a_capacity_error(fake: GcpFake) -> None:
    group = fake.add_group("workers", "worker", OLD, 1)
    fake.quota_exhausted = True
    await provider_for(fake).create_instance(group)  # GCE accepts the resize
    with pytest.raises(CapacityError, match="QUOTA_EXCEEDED"):
        await provider_for(fake).create_instance(group)
    assert fake.group(group).target_size == 2


async def test_rate_limits_are_throttling_with_the_delay_gce_gives(fake: GcpFake) -> None:
    group = fake.add_group("workers", "worker", OLD, 1)
    fake.api.fail(
        "instanceGroupManagers.resize", 403, gce_error(403, "rateLimitExceeded", "Rate Limit Exceeded")
    )
    with pytest.raises(Throttled) as throttled:
        await provider_for(fake).create_instance(group)
    assert throttled.value.retry_after == 5.0
    fake.api.fail("instanceGroupManagers.get", 429, gce_error(429, "rateLimitExceeded", "slow down"),
                  headers={"Retry-After": "12"})  # fmt: skip
    with pytest.raises(Throttled) as throttled:
        await provider_for(fake).create_instance(group)
    assert throttled.value.retry_after == 12.0
    fake.api.fail(
        "instanceGroupManagers.resize", 403, gce_error(403, "quotaExceeded", "Quota 'CPUS' exceeded")
    )
    with pytest.raises(CapacityError):
        await provider_for(fake).create_instance(group)
    fake.api.fail(
        "instanceGroupManagers.get",
        403,
        gce_error(403, "forbidden", "Required 'compute.instanceGroupManagers.get'"),
    )
    with pytest.raises(ProviderError) as denied:
        await provider_for(fake).create_instance(group)
    assert denied.value.reason == "ProviderAccessDenied" and "nodeimage-gcp.md" in str(denied.value)


async def test_a_stopped_instance_is_fenced_and_a_deleted_one_is_gone(fake: GcpFake) -> None:
    group = fake.add_group("workers", "worker", OLD, 2)
    provider = provider_for(fake)
    first, second = await provider.instances(group)
    _, zone, name = parse_provider_id(first.provider_id)
    fake.stop(zone, name)
    stopped = await provider.instance(first.provider_id)
    assert stopped.state == InstanceState.STOPPED and stopped.group_id == group and stopped.image == OLD
    await provider.delete_instance(group, second.provider_id)
    assert fake.group(group).target_size == 1


def test_provider_ids_and_group_ids_are_parsed_or_refused_by_name() -> None:
    assert parse_provider_id("gce://p/us-central1-a/n-1") == ("p", "us-central1-a", "n-1")
    for bad in ("gce://p/n-1", "aws:///us-east-1a/i-0abc", "gce:///z/n"):
        with pytest.raises(ProviderError, match="not a GCE instance"):
            parse_provider_id(bad)
    ref = GroupRef.parse(ROOT + "projects/p/zones/z/instanceGroupManagers/g")
    assert ref.group_id == "projects/p/zones/z/instanceGroupManagers/g" and not ref.regional
    with pytest.raises(ProviderError, match="not a managed instance group"):
        GroupRef.parse("my-asg")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "project=<project id>"),
        ({"project": "p", "zone": "z"}, "unknown GCP cloud option"),
        ({"project": "p", "credentials": "anonymous"}, "unknown GCP cloud option"),
        ({"project": "p", "cache-seconds": "x"}, "cache-seconds"),
        ({"project": ""}, "project is empty"),
    ],
)
def test_bad_options_are_named(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GcpOptions.parse(options)


async def test_a_retry_after_a_failed_group_update_uses_the_template_made_the_first_time(
    fake: GcpFake,
) -> None:
    group = fake.add_group("workers", "worker", OLD, 1)
    fake.api.fail(
        "instanceGroupManagers.setInstanceTemplate", 503, gce_error(503, "backendError", "try again")
    )
    with pytest.raises(ProviderError):
        await provider_for(fake).set_image(group, NEW)
    assert len(fake.templates) == 2  # made, but not set on the group
    await provider_for(fake).set_image(group, NEW)
    assert len(fake.templates) == 2 and fake.image_of(fake.group(group).template) == NEW


async def test_an_instance_of_another_group_is_never_deleted(fake: GcpFake) -> None:
    workers = fake.add_group("workers", "worker", OLD, 1)
    other = fake.add_group("other", "worker", OLD, 1)
    [stranger] = await provider_for(fake).instances(other)
    with pytest.raises(ProviderError) as refused:
        await provider_for(fake).delete_instance(workers, stranger.provider_id)
    assert refused.value.reason == "ProviderWrongGroup" and fake.group(other).target_size == 1


# ---- credentials: Application Default Credentials unchanged, against the fake ----------------

SUBJECT = "system:serviceaccount:kustos-system:kustos"


async def groups_with(fake: GcpFake, monkeypatch: pytest.MonkeyPatch, adc: Path) -> list[str]:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", fake.project)
    return [g.group_id for g in await provider_for(fake).groups()]


async def test_a_deleted_service_account_key_is_a_credentials_error(
    fake: GcpFake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    group = fake.add_group("w", "worker", OLD, 1)
    adc = fake.service_account_key(tmp_path / "other-key.json")
    assert await groups_with(fake, monkeypatch, adc) == [group]
    fake.delete_key(json.loads(adc.read_text())["private_key_id"])
    with pytest.raises(ProviderError) as refused:
        await provider_for(fake).groups()
    assert refused.value.reason == "ProviderCredentials"
    assert "UNAUTHENTICATED" in refused.value.message or "401" in refused.value.message
    assert "does not exist (deleted?)" in refused.value.message


async def test_workload_identity_federation_exchanges_a_kubernetes_token_at_sts(
    fake: GcpFake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cluster = Issuer()
    pool = fake.add_pool_provider("kubernetes", "cluster", cluster.url, cluster.key.public_keys(), {SUBJECT})
    group = fake.add_group("w", "worker", OLD, 1)
    token = tmp_path / "token"
    token.write_text(cluster.token(SUBJECT, pool.allowed_audience))
    adc = fake.external_account_file(tmp_path / "adc.json", pool, token)
    assert await groups_with(fake, monkeypatch, adc) == [group]
    assert [t.subject for t in fake.tokens.tokens.values()] == [SUBJECT]  # one exchange, shared
    # Another service account's token: STS refuses it, and the error says so.
    token.write_text(cluster.token("system:serviceaccount:default:other", pool.allowed_audience))
    with pytest.raises(ProviderError) as refused:
        await provider_for(fake).groups()
    assert refused.value.reason == "ProviderCredentials"
    assert "subject/system:serviceaccount:default:other has no role" in refused.value.message
    token.write_text(cluster.token(SUBJECT, pool.allowed_audience, issued=time.time() - 7200))
    with pytest.raises(ProviderError, match="The subject token is invalid: expired"):
        await provider_for(fake).groups()


async def test_no_credentials_at_all_are_named(
    fake: GcpFake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    with pytest.raises(ProviderError, match=r"missing\.json") as refused:
        await provider_for(fake).groups()
    assert refused.value.reason == "ProviderCredentials"
    assert "GOOGLE_APPLICATION_CREDENTIALS" in refused.value.message
