"""The Azure provider through azure-mgmt-compute against the local fake, over loopback TLS.

No Kubernetes here (tests/integration/test_cloud_contract.py has what every provider must
do): what is Azure's own. The fake is checked against the URL templates and models the SDK
ships, so the provider is tested against the API's shapes, not the fake's inventions.
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.mgmt.compute import models as az
from azure.mgmt.compute.operations import _operations as sdk_operations

from kustos.devcluster.azurefake import FEDERATION_AUDIENCE, AzureFake, arm_error
from kustos.nodes.cloud.azure import AzureOptions, AzureProvider, VmRef, image_reference
from kustos.runtime.cloud import CapacityError, InstanceState, NotFound, ProviderError, Role, Throttled
from tests.identity_support import Issuer

GALLERY = (
    "/subscriptions/{s}/resourceGroups/images/providers/Microsoft.Compute/galleries/os/images/node/versions/"
)
OLD, NEW = GALLERY + "1.0.0", GALLERY + "2.0.0"


def sdk_routes() -> set[tuple[str, str]]:
    """(method, URL template) of every request builder the SDK has."""
    found: set[tuple[str, str]] = set()
    for name, builder in vars(sdk_operations).items():
        if not (name.startswith("build_") and callable(builder)):
            continue
        source = inspect.getsource(builder)
        url = re.search(r'_url = \(?\s*"([^"]+)"', source)
        method = re.search(r'HttpRequest\(method="(\w+)"', source)
        if url and method:
            found.add((method.group(1).lower(), url.group(1)))
    return found


def unknown_fields(model: Any, raw: Any, where: str = "") -> list[str]:
    """Every key of ``raw`` the model (recursively) has no field for."""
    if isinstance(raw, list) and isinstance(model, list):
        return [u for m, r in zip(model, raw, strict=False) for u in unknown_fields(m, r, where)]
    if not isinstance(raw, dict) or not hasattr(model, "_attr_to_rest_field"):
        return []
    fields = {f._rest_name: attr for attr, f in type(model)._attr_to_rest_field.items()}
    found = []
    for key, value in raw.items():
        if key not in fields:
            found.append(f"{where}{key}")
            continue
        found += unknown_fields(getattr(model, fields[key]), value, f"{where}{key}.")
    return found


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[AzureFake]:
    fake = AzureFake(boot_seconds=0.0, delete_seconds=0.0)
    fake.start(tmp_path)
    yield fake
    fake.api.stop()


def provider_for(fake: AzureFake) -> AzureProvider:
    """A new provider, as a restarted operator has."""
    return AzureProvider.from_options(fake.options(**{"cache-seconds": "0"}))


def image(fake: AzureFake, version: str) -> str:
    return version.format(s=fake.subscription)


def test_every_route_of_the_fake_but_the_operation_status_is_one_the_sdk_calls() -> None:
    known = sdk_routes()
    for route in AzureFake().api.routes:
        # Not ARM's: the URL Azure-AsyncOperation names, and Entra ID's token endpoint and discovery.
        if route.name != "operations.get" and not route.name.startswith("entra."):
            assert (route.method, route.template) in known, route.template


def test_the_fake_answers_in_the_shapes_the_sdk_models_give(fake: AzureFake) -> None:
    uniform = fake.add_scale_set("cp", "control-plane", image(fake, OLD), 1)
    fake.add_scale_set("w", "worker", "Canonical:ubuntu:22_04-lts:1.0", 1, mode="Flexible")
    headers = {"Authorization": f"Bearer {fake.token_file.read_text()}"}
    root = f"/subscriptions/{fake.subscription}/resourceGroups/kustos-rg/providers/Microsoft.Compute"
    checks = [
        (f"{uniform}", az.VirtualMachineScaleSet),
        (f"{root}/virtualMachineScaleSets/cp/virtualMachines/0", az.VirtualMachineScaleSetVM),
    ]
    for path, model in checks:
        raw = fake.api.handle("get", path, b"", headers).body
        assert not unknown_fields(model(raw), raw), path
    [vm] = fake.api.handle("get", f"{root}/virtualMachines", b"", headers).body["value"]
    assert not unknown_fields(az.VirtualMachine(vm), vm)


async def test_uniform_and_flexible_sets_are_found_by_their_role_tag(fake: AzureFake) -> None:
    cp = fake.add_scale_set("cp", "control-plane", image(fake, OLD), 1)
    workers = fake.add_scale_set("workers", "worker", image(fake, OLD), 2, mode="Flexible")
    fake.add_scale_set("db", "database", image(fake, OLD), 1)
    groups = {g.group_id: g for g in await provider_for(fake).groups()}
    assert set(groups) == {cp, workers}
    assert groups[cp].role == Role.CONTROL_PLANE and groups[workers].desired == 2
    [first, _] = await provider_for(fake).instances(workers)
    assert (
        first.provider_id.startswith("azure:///subscriptions/")
        and "/virtualMachines/workers_" in first.provider_id
    )
    assert first.node_name and "_" not in first.node_name  # the computer name, as kubelet registers
    [member] = await provider_for(fake).instances(cp)
    assert member.provider_id.endswith("/virtualMachineScaleSets/cp/virtualMachines/0")
    assert member.node_name == "cp000000" and member.image == image(fake, OLD)


LAZY_TABLES = """
import asyncio, sys
from pathlib import Path
from azure.mgmt.compute._utils.model_base import Model
from kustos.devcluster.azurefake import AzureFake
from kustos.nodes.cloud.azure import AzureProvider

async def main() -> None:
    fake = AzureFake(boot_seconds=0.0, delete_seconds=0.0)
    fake.start(Path(sys.argv[1]))
    provider = AzureProvider.from_options(fake.options(**{"cache-seconds": "0"}))
    image = f"/subscriptions/{fake.subscription}/resourceGroups/i/providers/Microsoft.Compute/images/"
    uniform = fake.add_scale_set("cp", "control-plane", image + "a", 1)
    flexible = fake.add_scale_set("w", "worker", image + "a", 1, mode="Flexible")
    await provider.groups()  # the SDK loads here
    before = set(Model._calculated)
    for group in (uniform, flexible):
        await provider.set_image(group, image + "b")
        await provider.create_instance(group)
        for instance in await provider.instances(group):
            await provider.delete_instance(group, instance.provider_id)
    await provider.groups()
    print(sorted(set(Model._calculated) - before))
    fake.api.stop()

asyncio.run(main())
"""


def test_no_model_is_first_met_after_the_sdk_is_loaded(tmp_path: Path) -> None:
    """The SDK builds a model class's field table at its first object, unsafely across threads
    (azure-sdk-for-python#47426: a scale set's ``properties`` came back a raw dict in CI). The
    provider builds every table its calls can meet when it loads the SDK, so no call of a running
    operator, in any thread, is the first to meet a model. A fresh interpreter: other tests here
    have met them all."""
    run = subprocess.run(
        [sys.executable, "-c", LAZY_TABLES, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "[]", f"tables first built by a call: {run.stdout}"


async def test_a_new_image_is_the_model_updated_once(fake: AzureFake) -> None:
    group = fake.add_scale_set("workers", "worker", image(fake, OLD), 1)
    await provider_for(fake).set_image(group, image(fake, NEW))
    updates = fake.api.calls.count("virtualMachineScaleSets.update")
    await provider_for(fake).set_image(group, image(fake, NEW))  # a restarted operator asks again
    assert fake.api.calls.count("virtualMachineScaleSets.update") == updates == 1
    assert fake.scale_set(group).image == {"id": image(fake, NEW)}
    await provider_for(fake).create_instance(group)
    images = sorted(i.image or "" for i in await provider_for(fake).instances(group))
    assert images == sorted([image(fake, OLD), image(fake, NEW)])
    # A marketplace URN goes in as its four parts.
    await provider_for(fake).set_image(group, "Canonical:ubuntu-24_04-lts:server:24.04.202601010")
    assert fake.scale_set(group).image["offer"] == "ubuntu-24_04-lts"


def test_images_it_cannot_read_are_named() -> None:
    with pytest.raises(ProviderError, match="is no Azure image"):
        image_reference("ami-0123")
    assert image_reference("/SharedGalleries/x/images/y/versions/1").shared_gallery_image_id


async def test_a_creation_not_listed_yet_is_outstanding(fake: AzureFake) -> None:
    group = fake.add_scale_set("workers", "worker", image(fake, OLD), 1)
    fake.hold_creations = True
    await provider_for(fake).create_instance(group)
    with pytest.raises(ProviderError) as refused:
        await provider_for(fake).create_instance(group)
    assert refused.value.reason == "ProviderLaunchOutstanding"
    assert fake.scale_set(group).capacity == 2
    # Its Join's deadline passes: the creation is taken back, once; the running VM stays.
    assert await provider_for(fake).cancel_create(group)
    assert not await provider_for(fake).cancel_create(group)
    assert fake.scale_set(group).capacity == 1 and len(await provider_for(fake).instances(group)) == 1


async def test_quota_and_throttling_are_typed(fake: AzureFake) -> None:
    group = fake.add_scale_set("workers", "worker", image(fake, OLD), 2)
    fake.quota_instances = 2
    with pytest.raises(CapacityError, match="quota"):
        await provider_for(fake).create_instance(group)
    assert fake.scale_set(group).capacity == 2
    fake.api.fail(
        "virtualMachineScaleSets.get", 429,
        {"error": {"code": "OperationNotAllowed", "message": "too many requests for this subscription"}},
        headers={"Retry-After": "17"},
    )  # fmt: skip
    with pytest.raises(Throttled) as throttled:
        await provider_for(fake).create_instance(group)
    assert throttled.value.retry_after == 17.0
    fake.api.fail("virtualMachineScaleSets.get", 403, arm_error(403, "AuthorizationFailed", "no").reply.body)
    with pytest.raises(ProviderError) as denied:
        await provider_for(fake).create_instance(group)
    assert denied.value.reason == "ProviderAccessDenied"


async def test_a_token_over_plain_http_is_refused_by_the_sdk(fake: AzureFake) -> None:
    """Why the fake serves TLS: azure-core will not send a bearer token without it."""
    group = fake.add_scale_set("workers", "worker", image(fake, OLD), 1)
    plain = fake.options(**{"cache-seconds": "0"})
    plain["endpoint"] = plain["endpoint"].replace("https://", "http://")
    with pytest.raises(ProviderError, match="non-TLS protected"):
        await AzureProvider.from_options(plain).instances(group)


async def test_a_deallocated_vm_is_fenced_and_a_deleted_one_is_gone(fake: AzureFake) -> None:
    group = fake.add_scale_set("workers", "worker", image(fake, OLD), 2)
    first, second = await provider_for(fake).instances(group)
    fake.stop(group, "0")
    assert (await provider_for(fake).instance(first.provider_id)).state == InstanceState.STOPPED
    await provider_for(fake).delete_instance(group, second.provider_id)
    assert fake.scale_set(group).capacity == 1
    with pytest.raises(NotFound):
        await provider_for(fake).instance(second.provider_id)


def test_provider_ids_are_parsed_or_refused_by_name() -> None:
    uniform = VmRef.parse("azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/"
                          "virtualMachineScaleSets/set/virtualMachines/3")  # fmt: skip
    assert (uniform.scale_set, uniform.name) == ("set", "3")
    flexible = VmRef.parse(
        "azure:///subscriptions/s/resourcegroups/rg/providers/microsoft.compute/virtualMachines/vm1"
    )
    assert (flexible.scale_set, flexible.name) == (None, "vm1")
    for bad in ("gce://p/z/n", "azure:///subscriptions/s/resourceGroups/rg", "kwok://node"):
        with pytest.raises(ProviderError, match="not an Azure VM"):
            VmRef.parse(bad)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"region": "x", "subscription": "s"}, "unknown Azure cloud option"),
        ({"subscription": "s", "poll-seconds": "-1"}, "poll-seconds"),
        ({"subscription": ""}, "subscription is empty"),
    ],
)
def test_bad_options_are_named(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AzureOptions.parse(options)


def test_the_subscription_comes_from_the_environment_when_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AZURE_SUBSCRIPTION_ID", raising=False)
    with pytest.raises(ValueError, match="AZURE_SUBSCRIPTION_ID"):
        AzureOptions.parse({})
    monkeypatch.setenv("AZURE_SUBSCRIPTION_ID", "sub-1")
    assert AzureOptions.parse({}).subscription == "sub-1"


# ---- credentials: DefaultAzureCredential unchanged, against the fake's Entra ID --------------

SUBJECT = "system:serviceaccount:kustos-system:kustos"
CLIENT = "11111111-2222-3333-4444-555555555555"


def workload_identity(
    fake: AzureFake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, token: str
) -> AzureProvider:
    """A provider that has only what AKS workload identity gives a pod: the environment and
    the projected token file."""
    token_file = tmp_path / "azure-identity-token"
    token_file.write_text(token)
    for key, value in fake.credential_environment(CLIENT, token_file).items():
        monkeypatch.setenv(key, value)
    return AzureProvider.from_options(fake.options(token_file=False, **{"cache-seconds": "0"}))


async def test_workload_identity_gets_a_token_from_entra_id_and_arm_takes_it(
    fake: AzureFake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    issuer = Issuer()
    fake.federate(CLIENT, issuer.url, SUBJECT, issuer.key.public_keys())
    group = fake.add_scale_set("workers", "worker", image(fake, OLD), 1)
    provider = workload_identity(fake, monkeypatch, tmp_path, issuer.token(SUBJECT, FEDERATION_AUDIENCE))
    assert [g.group_id for g in await provider.groups()] == [group]
    await provider.create_instance(group)
    assert fake.scale_set(group).capacity == 2
    assert [t.subject for t in fake.tokens.tokens.values()].count(CLIENT) == 1  # one token, reused


async def test_workload_identity_leaves_the_operators_log_to_failures(
    fake: AzureFake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """azure-identity says at INFO which credentials it tried ("Incomplete environment
    configuration" under workload identity) and each token it got: nothing a user acts on."""
    issuer = Issuer()
    fake.federate(CLIENT, issuer.url, SUBJECT, issuer.key.public_keys())
    group = fake.add_scale_set("workers", "worker", image(fake, OLD), 1)
    provider = workload_identity(fake, monkeypatch, tmp_path, issuer.token(SUBJECT, FEDERATION_AUDIENCE))
    caplog.set_level("INFO")
    assert [g.group_id for g in await provider.groups()] == [group]
    assert [r.getMessage() for r in caplog.records if r.name.startswith("azure")] == []


@pytest.mark.parametrize(
    ("assertion", "message"),
    [
        ("another-subject", "AADSTS70021: No matching federated identity record"),
        ("expired", "AADSTS700024: Client assertion is not within its valid time range"),
        ("another-key", "AADSTS50013: Assertion failed signature validation"),
    ],
)
async def test_a_refused_assertion_is_a_credentials_error_naming_entra_ids_answer(
    fake: AzureFake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, assertion: str, message: str
) -> None:
    issuer = Issuer()
    fake.federate(CLIENT, issuer.url, SUBJECT, issuer.key.public_keys())
    fake.add_scale_set("workers", "worker", image(fake, OLD), 1)
    token = {
        "another-subject": lambda: issuer.token("system:serviceaccount:default:other", FEDERATION_AUDIENCE),
        "expired": lambda: issuer.token(SUBJECT, FEDERATION_AUDIENCE, issued=time.time() - 7200),
        "another-key": lambda: Issuer(url=issuer.url).token(SUBJECT, FEDERATION_AUDIENCE),
    }[assertion]()
    with pytest.raises(ProviderError) as refused:
        await workload_identity(fake, monkeypatch, tmp_path, token).groups()
    assert refused.value.reason == "ProviderCredentials"
    assert message in refused.value.message and "WorkloadIdentityCredential" in refused.value.message
    assert not fake.tokens.tokens or all(t.subject == "token-file" for t in fake.tokens.tokens.values())


async def test_arm_refuses_a_token_it_did_not_issue_or_that_expired(fake: AzureFake, tmp_path: Path) -> None:
    group = fake.add_scale_set("workers", "worker", image(fake, OLD), 1)
    assert len(await provider_for(fake).instances(group)) == 1
    fake.tokens.expire_all()
    with pytest.raises(ProviderError) as expired:
        await provider_for(fake).instances(group)
    assert expired.value.reason == "ProviderCredentials"
    assert "ExpiredAuthenticationToken" in expired.value.message
    forged = tmp_path / "forged"
    forged.write_text("fake.not-issued-here")
    with pytest.raises(ProviderError, match="InvalidAuthenticationToken") as invalid:
        await AzureProvider.from_options(fake.options(**{"token-file": str(forged)})).instances(group)
    assert invalid.value.reason == "ProviderCredentials"


def test_a_client_secret_gets_a_token_arm_takes_as_msal_asks_for_it(fake: AzureFake) -> None:
    """What EnvironmentCredential builds from AZURE_CLIENT_SECRET, against the fake's token
    endpoint. Not through DefaultAzureCredential: MSAL first checks an authority host it
    does not know with login.microsoftonline.com, which only a user's own switch skips."""
    from azure.core.exceptions import ClientAuthenticationError
    from azure.identity import ClientSecretCredential

    fake.add_app(CLIENT, secret="s3cret")
    group = fake.add_scale_set("workers", "worker", image(fake, OLD), 1)

    def credential(secret: str) -> ClientSecretCredential:
        return ClientSecretCredential(
            fake.tenant, CLIENT, secret, authority=fake.api.url, disable_instance_discovery=True,
            connection_verify=str(fake.ca_file),
        )  # fmt: skip

    token = credential("s3cret").get_token("https://management.azure.com/.default").token
    assert fake.api.handle("get", group, b"", {"Authorization": f"Bearer {token}"}).status == 200
    with pytest.raises(ClientAuthenticationError, match="AADSTS7000215: Invalid client secret"):
        credential("wrong").get_token("https://management.azure.com/.default")
