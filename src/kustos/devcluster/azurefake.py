"""A local fake of the part of Azure Resource Manager's compute API the Azure provider uses
(dev tool, F-NODE-6).

Virtual machine scale sets (uniform and flexible), their VMs with instance views, and
long-running operations (``Azure-AsyncOperation``), served as JSON over HTTPS on loopback
with the routes and field names of ``Microsoft.Compute`` (each route is one of the SDK's own
URL templates; a unit test checks that). HTTPS because azure-core's bearer token policy
refuses to send a token over plain HTTP: the fake makes a private CA and a certificate for
127.0.0.1 (``ServingCertificate.self_signed``), and the provider trusts it through its
``ca-bundle`` option (the credential, through ``REQUESTS_CA_BUNDLE``).

It is its own Entra ID too, so azure-identity's ``DefaultAzureCredential`` runs unchanged
against it with ``AZURE_AUTHORITY_HOST`` pointing here: ``/<tenant>/oauth2/v2.0/token``
takes the client credentials grant with a client secret or, as AKS workload identity
sends it, a client assertion (a Kubernetes service account token, checked against the
federated credential's issuer keys, subject and audience; workload identity's credential
posts there directly, a client secret's MSAL reads the tenant's OpenID configuration
first). It answers as Entra ID does (``AADSTS...`` errors), and ARM then serves only the
bearer tokens it issued: 401 ``InvalidAuthenticationToken`` or ``ExpiredAuthenticationToken``
otherwise.

Kept as Azure has it: a capacity increase lists the new VM at once (``Creating``, no power
state) and it runs ``boot_seconds`` later; a deleted VM is ``Deleting`` for
``delete_seconds`` and the capacity drops at once; a stopped VM is ``deallocated``;
operations are ``InProgress`` on the first poll and done on the next; ``quota_cores``
refuses a capacity increase beyond it with ARM's 409 ``OperationNotAllowed`` quota error.
"""

from __future__ import annotations

import copy
import itertools
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric import rsa

from kustos.devcluster.fakeapi import ApiError, FakeApi, Reply, Route
from kustos.devcluster.fakeidentity import InvalidToken, TokenIssuer, bearer, jwt_parts, verify_jwt
from kustos.runtime.webhook import ServingCertificate

API = "/subscriptions/{subscriptionId}"
RG = API + "/resourceGroups/{resourceGroupName}/providers/Microsoft.Compute"
LOCATION = "westeurope"
TENANT = "00000000-0000-0000-0000-00000000a11d"
# What AKS workload identity's webhook projects the service account token for.
FEDERATION_AUDIENCE = "api://AzureADTokenExchange"
ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
ARM_AUDIENCES = ("https://management.azure.com", "https://management.core.windows.net")


def arm_error(status: int, code: str, message: str) -> ApiError:
    return ApiError(status, {"error": {"code": code, "message": message}})


def entra_error(status: int, error: str, code: int, description: str) -> ApiError:
    """A token endpoint refusal as Entra ID words it (azure-identity shows ``error_description``)."""
    return ApiError(status, {
        "error": error, "error_description": f"AADSTS{code}: {description}", "error_codes": [code],
        "timestamp": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()),
    })  # fmt: skip


@dataclass
class FakeVm:
    name: str  # uniform: <set>_<instance id>; flexible: the VM name
    instance_id: str
    computer_name: str
    image: dict[str, Any]
    created: float
    provisioning: str = "Creating"
    power: str = ""
    gone_at: float | None = None


@dataclass
class FederatedCredential:
    """An app's trust of another issuer's tokens (Entra ID's federated identity credential)."""

    issuer: str
    subject: str
    keys: dict[str, rsa.RSAPublicKey]  # the issuer's signing keys, by key id
    audience: str = FEDERATION_AUDIENCE


@dataclass
class FakeApp:
    """An app registration (a service principal) of the fake's tenant."""

    client_id: str
    secret: str | None = None
    federated: list[FederatedCredential] = field(default_factory=list)


@dataclass
class FakeScaleSet:
    resource_group: str
    name: str
    mode: str  # Uniform | Flexible
    tags: dict[str, str]
    image: dict[str, Any]
    capacity: int = 0
    vms: dict[str, FakeVm] = field(default_factory=dict)  # by instance id (flexible: VM name)
    next_id: int = 0


class AzureFake:
    """The fake's state for one subscription, and its routes."""

    def __init__(
        self, subscription: str = "00000000-0000-0000-0000-00000000cafe", *, boot_seconds: float = 0.3,
        delete_seconds: float = 0.3, clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self.subscription = subscription
        self.boot_seconds = boot_seconds
        self.delete_seconds = delete_seconds
        self.clock = clock
        self.sets: dict[tuple[str, str], FakeScaleSet] = {}
        self.operations: dict[str, dict[str, Any]] = {}
        self.quota_instances: int | None = None  # at most this many VMs in the subscription
        self.hold_creations = False  # capacity goes up, no VM is listed until ``release``
        self.image_updates = 0  # model updates that changed a set's image
        self._held: list[FakeScaleSet] = []
        self._ids = itertools.count(1)
        self.tenant = TENANT
        self.apps: dict[str, FakeApp] = {}
        self.tokens = TokenIssuer()
        self.api = FakeApi(self._routes())
        self.api.authorize = self._authorize
        self.certificate: ServingCertificate | None = None

    def start(self, directory: Path) -> str:
        """Serve HTTPS with a new private CA; writes ``ca.crt`` (for the client) and a token
        file (a token issued to ``token-file``, for the provider's option of that name)."""
        self.certificate = ServingCertificate.self_signed(["localhost"], ["127.0.0.1"], days=2)
        directory.mkdir(parents=True, exist_ok=True)
        cert, key = directory / "tls.crt", directory / "tls.key"
        cert.write_bytes(self.certificate.cert_pem)
        key.write_bytes(self.certificate.key_pem)
        key.chmod(0o600)
        (directory / "ca.crt").write_bytes(self.certificate.ca_pem)
        token, _ = self.tokens.issue("token-file", ARM_AUDIENCES[0], lifetime=86400.0)
        (directory / "token").write_text(token)
        self.directory = directory
        return self.api.start(tls=(cert, key))

    @property
    def ca_file(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def token_file(self) -> Path:
        return self.directory / "token"

    def options(self, *, token_file: bool = True, **extra: str) -> dict[str, str]:
        """``--cloud-option`` values for the provider against this fake: with ``token-file``,
        or without, for DefaultAzureCredential (``credential_environment``)."""
        token = {"token-file": str(self.token_file)} if token_file else {}
        return {
            "subscription": self.subscription, "endpoint": self.api.url, **token,
            "ca-bundle": str(self.ca_file), "poll-seconds": "0.05", **extra,
        }  # fmt: skip

    # -- for tests: the identities a user set up ---------------------------------------------

    def add_app(self, client_id: str, *, secret: str | None = None) -> FakeApp:
        with self.api.lock:
            app = self.apps.setdefault(client_id, FakeApp(client_id))
            app.secret = secret or app.secret
            return app

    def federate(self, client_id: str, issuer: str, subject: str, keys: dict[str, rsa.RSAPublicKey]) -> None:
        """The app trusts ``issuer``'s tokens for ``subject`` (as ``az identity federated-credential
        create --issuer <cluster's OIDC issuer> --subject system:serviceaccount:<ns>:<sa>``)."""
        app = self.add_app(client_id)
        with self.api.lock:
            app.federated.append(FederatedCredential(issuer, subject, keys))

    def credential_environment(self, client_id: str, token_file: Path) -> dict[str, str]:
        """The environment AKS workload identity gives a pod (its webhook sets these), plus the
        fake as authority host and its CA as the one requests trusts."""
        return {
            "AZURE_CLIENT_ID": client_id, "AZURE_TENANT_ID": self.tenant,
            "AZURE_FEDERATED_TOKEN_FILE": str(token_file), "AZURE_AUTHORITY_HOST": self.api.url,
            "AZURE_SUBSCRIPTION_ID": self.subscription, "REQUESTS_CA_BUNDLE": str(self.ca_file),
        }  # fmt: skip

    # -- for tests: the world as a user made it ----------------------------------------------

    def set_id(self, s: FakeScaleSet) -> str:
        return (
            f"/subscriptions/{self.subscription}/resourceGroups/{s.resource_group}"
            f"/providers/Microsoft.Compute/virtualMachineScaleSets/{s.name}"
        )

    def add_scale_set(
        self, name: str, role: str, image: str, size: int, *, mode: str = "Uniform",
        resource_group: str = "kustos-rg", tags: dict[str, str] | None = None,
    ) -> str:  # fmt: skip
        """A scale set with ``size`` running VMs; its id. ``image``: a gallery id or a URN."""
        scale_set = FakeScaleSet(
            resource_group, name, mode, {"kustos-role": role, **(tags or {})}, _reference(image)
        )
        with self.api.lock:
            self.sets[(resource_group.lower(), name.lower())] = scale_set
            for _ in range(size):
                vm = self._create(scale_set)
                assert vm is not None, "add scale sets before holding creations"
                vm.provisioning, vm.power = "Succeeded", "running"
        return self.set_id(scale_set)

    def scale_set(self, group_id: str) -> FakeScaleSet:
        parts = group_id.strip("/").split("/")
        return self.sets[(parts[3].lower(), parts[7].lower())]

    def stop(self, group_id: str, instance_id: str) -> None:
        """The VM is stopped and deallocated, as ``az vmss deallocate`` does."""
        with self.api.lock:
            self.scale_set(group_id).vms[instance_id].power = "deallocated"

    def release(self) -> None:
        with self.api.lock:
            held, self._held = self._held, []
            for scale_set in held:
                scale_set.capacity -= 1
                self._create(scale_set)

    def vm_count(self) -> int:
        return sum(1 for s in self.sets.values() for vm in s.vms.values() if vm.gone_at is None)

    # -- the simulation ---------------------------------------------------------------------

    def _create(self, s: FakeScaleSet) -> FakeVm | None:
        s.capacity += 1
        if self.hold_creations:
            self._held.append(s)
            return None
        number = s.next_id
        s.next_id += 1
        if s.mode == "Uniform":
            instance_id, name = str(number), f"{s.name}_{number}"
            computer = f"{s.name.lower()}{_base36(number):0>6}"
        else:
            suffix = secrets.token_hex(4)
            instance_id = name = f"{s.name}_{suffix}"
            computer = f"{s.name.lower()}{suffix}"
        vm = FakeVm(name, instance_id, computer, copy.deepcopy(s.image), self.clock())
        s.vms[instance_id] = vm
        return vm

    def _advance(self) -> None:
        now = self.clock()
        for s in self.sets.values():
            for key, vm in list(s.vms.items()):
                if vm.gone_at is not None and now >= vm.gone_at:
                    del s.vms[key]
                elif vm.provisioning == "Creating" and now >= vm.created + self.boot_seconds:
                    vm.provisioning, vm.power = "Succeeded", "running"

    def _operation(self) -> dict[str, str]:
        """A new long operation; the headers that point the client at it."""
        name = f"{next(self._ids):08d}-{secrets.token_hex(4)}"
        self.operations[name] = {"name": name, "status": "InProgress", "polls": 0}
        url = (
            f"{self.api.url}/subscriptions/{self.subscription}/providers/Microsoft.Compute/locations/"
            f"{LOCATION}/operations/{name}?api-version=2026-04-01"
        )
        return {"Azure-AsyncOperation": url, "Location": url, "Retry-After": "0"}

    # -- the API ----------------------------------------------------------------------------

    def _routes(self) -> list[Route]:
        sets = RG + "/virtualMachineScaleSets/{vmScaleSetName}"
        return [
            # Entra ID (not ARM): where azure-identity asks for tokens under AZURE_AUTHORITY_HOST.
            Route("post", "/{tenant}/oauth2/v2.0/token", "entra.token", self._token, public=True),
            # MSAL's tenant discovery (a client secret or certificate), not workload identity's.
            Route("get", "/{tenant}/v2.0/.well-known/openid-configuration", "entra.openidConfiguration",
                  self._openid_configuration, public=True),
            Route("get", API + "/providers/Microsoft.Compute/virtualMachineScaleSets",
                  "virtualMachineScaleSets.listAll", self._list_sets),
            Route("get", RG + "/virtualMachineScaleSets", "virtualMachineScaleSets.list", self._list_sets),
            Route("get", sets, "virtualMachineScaleSets.get", self._get_set),
            Route("patch", sets, "virtualMachineScaleSets.update", self._update_set),
            Route("post", sets + "/delete", "virtualMachineScaleSets.deleteInstances",
                  self._delete_instances),
            Route("get", RG + "/virtualMachineScaleSets/{virtualMachineScaleSetName}/virtualMachines",
                  "virtualMachineScaleSetVMs.list", self._list_uniform),
            Route("get", sets + "/virtualMachines/{instanceId}", "virtualMachineScaleSetVMs.get",
                  self._get_uniform),
            Route("get", RG + "/virtualMachines", "virtualMachines.list", self._list_flexible),
            Route("get", RG + "/virtualMachines/{vmName}", "virtualMachines.get", self._get_flexible),
            # Not an SDK route: where Azure-AsyncOperation points (the client polls the URL it is given).
            Route("get", API + "/providers/Microsoft.Compute/locations/{location}/operations/{operationId}",
                  "operations.get", self._get_operation),
        ]  # fmt: skip

    # -- Entra ID ---------------------------------------------------------------------------

    def _openid_configuration(self, params: dict[str, str], query: dict[str, list[str]], body: Any) -> Reply:
        base = f"{self.api.url}/{params['tenant']}"
        return Reply(200, {
            "token_endpoint": f"{base}/oauth2/v2.0/token",
            "authorization_endpoint": f"{base}/oauth2/v2.0/authorize",
            "issuer": f"{base}/v2.0", "jwks_uri": f"{base}/discovery/v2.0/keys",
            "token_endpoint_auth_methods_supported": ["client_secret_post", "private_key_jwt"],
        })  # fmt: skip

    def _token(self, params: dict[str, str], query: dict[str, list[str]], body: Any) -> Reply:
        form = body if isinstance(body, dict) else {}
        if params["tenant"] != self.tenant:
            raise entra_error(400, "invalid_request", 90002, f"Tenant '{params['tenant']}' not found.")
        if form.get("grant_type") != "client_credentials":
            raise entra_error(
                400, "unsupported_grant_type", 70003, "The app requested an unsupported grant type."
            )
        client_id = str(form.get("client_id", ""))
        app = self.apps.get(client_id)
        if app is None:
            raise entra_error(400, "unauthorized_client", 700016, (
                f"Application with identifier '{client_id}' was not found in the directory "
                f"'{self.tenant}'."))  # fmt: skip
        scope = str(form.get("scope", ""))
        audience = scope.removesuffix("/.default").rstrip("/")
        if form.get("client_assertion_type") == ASSERTION_TYPE:
            self._check_assertion(app, str(form.get("client_assertion", "")))
        elif form.get("client_secret") is not None:
            if app.secret is None or form["client_secret"] != app.secret:
                raise entra_error(401, "invalid_client", 7000215, (
                    "Invalid client secret provided. Ensure the secret being sent in the request is the "
                    "client secret value, not the client secret ID, for a secret added to app "
                    f"'{client_id}'."))  # fmt: skip
        else:
            raise entra_error(400, "invalid_request", 900144, "The request body must contain the following "
                              "parameter: 'client_assertion' or 'client_secret'.")  # fmt: skip
        token, lifetime = self.tokens.issue(client_id, audience)
        return Reply(200, {"token_type": "Bearer", "expires_in": lifetime, "ext_expires_in": lifetime,
                           "access_token": token})  # fmt: skip

    def _check_assertion(self, app: FakeApp, assertion: str) -> None:
        """Entra ID's check of a federated assertion: a credential of the app whose issuer,
        subject and audience it names, signed by that issuer and not expired."""
        try:
            _, claims = jwt_parts(assertion)
        except InvalidToken as err:
            raise entra_error(
                400, "invalid_client", 50027, f"JWT token is invalid or malformed: {err}."
            ) from None
        audiences = claims.get("aud") or []
        audiences = [audiences] if isinstance(audiences, str) else list(audiences)
        found = [f for f in app.federated if f.issuer == claims.get("iss") and f.subject == claims.get("sub")
                 and f.audience in audiences]  # fmt: skip
        if not found:
            raise entra_error(400, "invalid_request", 70021, (
                "No matching federated identity record found for presented assertion. Assertion Issuer: "
                f"'{claims.get('iss')}'. Assertion Subject: '{claims.get('sub')}'. Assertion Audience: "
                f"'{','.join(audiences)}'."))  # fmt: skip
        try:
            verify_jwt(assertion, found[0].keys)
        except InvalidToken as err:
            code, text = (700024, "Client assertion is not within its valid time range") if "expired" in str(
                err) else (50013, "Assertion failed signature validation")  # fmt: skip
            raise entra_error(400, "invalid_client", code, f"{text}: {err}.") from None

    def _authorize(self, headers: dict[str, str] | Any) -> Reply | None:
        """ARM's check of a request's bearer token: one this tenant issued for ARM, not expired."""
        token = bearer(headers)
        if token is None:
            code, message = (
                "AuthenticationFailed",
                "Authentication failed. The 'Authorization' header is missing.",
            )
        else:
            try:
                issued = self.tokens.check(token)
            except InvalidToken as err:
                expired = "expired" in str(err)
                code = "ExpiredAuthenticationToken" if expired else "InvalidAuthenticationToken"
                message = ("The access token expiry UTC time is earlier than current UTC time." if expired
                           else "The access token is invalid.")  # fmt: skip
            else:
                if issued.audience.rstrip("/") in ARM_AUDIENCES:
                    return None
                code, message = "InvalidAuthenticationTokenAudience", (
                    "The access token has been obtained for wrong audience or resource "
                    f"'{issued.audience}'.")  # fmt: skip
        challenge = f'Bearer authorization_uri="{self.api.url}/{self.tenant}", error="invalid_token"'
        return Reply(401, {"error": {"code": code, "message": message}}, {"WWW-Authenticate": challenge})

    def _subscription(self, params: dict[str, str]) -> None:
        if params["subscriptionId"] != self.subscription:
            raise arm_error(
                404,
                "SubscriptionNotFound",
                f"The subscription '{params['subscriptionId']}' could not be found.",
            )

    def _find(self, params: dict[str, str], key: str = "vmScaleSetName") -> FakeScaleSet:
        self._subscription(params)
        self._advance()
        found = self.sets.get((params["resourceGroupName"].lower(), params[key].lower()))
        if found is None:
            raise arm_error(
                404,
                "ResourceNotFound",
                f"The Resource 'Microsoft.Compute/virtualMachineScaleSets/{params[key]}' under resource "
                f"group '{params['resourceGroupName']}' was not found.",
            )
        return found

    def _set_json(self, s: FakeScaleSet) -> dict[str, Any]:
        return {
            "id": self.set_id(s), "name": s.name, "type": "Microsoft.Compute/virtualMachineScaleSets",
            "location": LOCATION, "tags": s.tags,
            "sku": {"name": "Standard_D4s_v5", "tier": "Standard", "capacity": s.capacity},
            "properties": {
                "orchestrationMode": s.mode, "provisioningState": "Succeeded",
                "upgradePolicy": {"mode": "Manual"},
                "virtualMachineProfile": {
                    "storageProfile": {"imageReference": s.image},
                    "osProfile": {"computerNamePrefix": s.name.lower(), "adminUsername": "kustos"},
                },
            },
        }  # fmt: skip

    def _list_sets(self, params: dict[str, str], query: dict[str, list[str]], body: Any) -> Reply:
        self._subscription(params)
        group = params.get("resourceGroupName", "").lower()
        chosen = [s for s in self.sets.values() if not group or s.resource_group.lower() == group]
        return Reply(200, {"value": [self._set_json(s) for s in chosen]})

    def _get_set(self, params: dict[str, str], query: dict[str, list[str]], body: Any) -> Reply:
        return Reply(200, self._set_json(self._find(params)))

    def _update_set(self, params: dict[str, str], query: dict[str, list[str]], body: Any) -> Reply:
        s = self._find(params)
        capacity = ((body or {}).get("sku") or {}).get("capacity")
        profile = ((body or {}).get("properties") or {}).get("virtualMachineProfile") or {}
        image = (profile.get("storageProfile") or {}).get("imageReference")
        if capacity is not None:
            growth = int(capacity) - s.capacity
            if self.quota_instances is not None and self.vm_count() + growth > self.quota_instances:
                raise arm_error(409, "OperationNotAllowed", (
                    "Operation could not be completed as it results in exceeding approved standardDSv5Family "
                    f"Cores quota. Current Limit: {self.quota_instances * 4}"))  # fmt: skip
            for _ in range(max(growth, 0)):
                self._create(s)
            for _ in range(max(-growth, 0)):  # creations not made yet go first, then the highest id
                if s in self._held:
                    self._held.remove(s)
                else:
                    newest = max(
                        (vm for vm in s.vms.values() if vm.gone_at is None), key=lambda vm: vm.created
                    )
                    newest.provisioning, newest.gone_at = "Deleting", self.clock() + self.delete_seconds
                s.capacity -= 1
        if image:
            self.image_updates += 1
            s.image = dict(image)
        return Reply(200, self._set_json(s), self._operation())

    def _delete_instances(self, params: dict[str, str], query: dict[str, list[str]], body: Any) -> Reply:
        s = self._find(params)
        ids = list((body or {}).get("instanceIds") or [])
        unknown = [i for i in ids if i not in s.vms]
        if unknown:
            raise arm_error(
                400,
                "InvalidParameter",
                f"The provided instanceId {unknown[0]} is not an active Virtual Machine Scale Set VM "
                "instanceId.",
            )
        for instance_id in ids:
            vm = s.vms[instance_id]
            if vm.gone_at is None:
                vm.provisioning, vm.gone_at = "Deleting", self.clock() + self.delete_seconds
                s.capacity -= 1
        return Reply(202, None, self._operation())

    def _statuses(self, vm: FakeVm) -> list[dict[str, str]]:
        statuses = [{"code": f"ProvisioningState/{vm.provisioning.lower()}", "level": "Info",
                     "displayStatus": f"Provisioning {vm.provisioning.lower()}"}]  # fmt: skip
        if vm.power:
            statuses.append(
                {"code": f"PowerState/{vm.power}", "level": "Info", "displayStatus": f"VM {vm.power}"}
            )
        return statuses

    def _uniform_json(self, s: FakeScaleSet, vm: FakeVm) -> dict[str, Any]:
        return {
            "id": f"{self.set_id(s)}/virtualMachines/{vm.instance_id}", "name": vm.name,
            "type": "Microsoft.Compute/virtualMachineScaleSets/virtualMachines", "location": LOCATION,
            "instanceId": vm.instance_id,
            "properties": {
                "latestModelApplied": vm.image == s.image, "provisioningState": vm.provisioning,
                "storageProfile": {"imageReference": vm.image},
                "osProfile": {"computerName": vm.computer_name, "adminUsername": "kustos"},
                "instanceView": {"computerName": vm.computer_name, "statuses": self._statuses(vm)},
            },
        }  # fmt: skip

    def _flexible_json(self, s: FakeScaleSet, vm: FakeVm) -> dict[str, Any]:
        return {
            "id": f"/subscriptions/{self.subscription}/resourceGroups/{s.resource_group}/providers/"
                  f"Microsoft.Compute/virtualMachines/{vm.name}",
            "name": vm.name, "type": "Microsoft.Compute/virtualMachines", "location": LOCATION,
            "properties": {
                "virtualMachineScaleSet": {"id": self.set_id(s)}, "provisioningState": vm.provisioning,
                "storageProfile": {"imageReference": vm.image},
                "osProfile": {"computerName": vm.computer_name, "adminUsername": "kustos"},
                "instanceView": {"computerName": vm.computer_name, "statuses": self._statuses(vm)},
            },
        }  # fmt: skip

    def _list_uniform(self, params: dict[str, str], query: dict[str, list[str]], body: Any) -> Reply:
        s = self._find(params, "virtualMachineScaleSetName")
        if s.mode != "Uniform":
            raise arm_error(400, "OperationNotAllowed", "This API is not supported for Flexible scale sets.")
        return Reply(200, {"value": [self._uniform_json(s, vm) for vm in s.vms.values()]})

    def _get_uniform(self, params: dict[str, str], query: dict[str, list[str]], body: Any) -> Reply:
        s = self._find(params)
        vm = s.vms.get(params["instanceId"])
        if vm is None or s.mode != "Uniform":
            raise arm_error(404, "ResourceNotFound", f"VM instance {params['instanceId']} was not found.")
        return Reply(200, self._uniform_json(s, vm))

    def _flexible_vms(self, params: dict[str, str]) -> list[tuple[FakeScaleSet, FakeVm]]:
        self._subscription(params)
        self._advance()
        group = params["resourceGroupName"].lower()
        chosen = [s for s in self.sets.values() if s.mode == "Flexible" and s.resource_group.lower() == group]
        return [(s, vm) for s in chosen for vm in s.vms.values()]

    def _list_flexible(self, params: dict[str, str], query: dict[str, list[str]], body: Any) -> Reply:
        wanted = (query.get("$filter") or [""])[0]
        listed = [self._flexible_json(s, vm) for s, vm in self._flexible_vms(params)
                  if not wanted or self.set_id(s).lower() in wanted.lower()]  # fmt: skip
        return Reply(200, {"value": listed})

    def _get_flexible(self, params: dict[str, str], query: dict[str, list[str]], body: Any) -> Reply:
        for s, vm in self._flexible_vms(params):
            if vm.name.lower() == params["vmName"].lower():
                return Reply(200, self._flexible_json(s, vm))
        raise arm_error(
            404,
            "ResourceNotFound",
            f"The Resource 'Microsoft.Compute/virtualMachines/{params['vmName']}' was not found.",
        )

    def _get_operation(self, params: dict[str, str], query: dict[str, list[str]], body: Any) -> Reply:
        self._subscription(params)
        operation = self.operations.get(params["operationId"])
        if operation is None:
            raise arm_error(404, "NotFound", f"operation {params['operationId']}")
        operation["polls"] += 1
        status = "InProgress" if operation["polls"] < 2 else "Succeeded"
        return Reply(200, {"name": operation["name"], "status": status, "startTime": "2026-01-01T00:00:00Z"})


def _reference(image: str) -> dict[str, Any]:
    if image.startswith("/"):
        return {"id": image}
    publisher, offer, sku, version = image.split(":")
    return {"publisher": publisher, "offer": offer, "sku": sku, "version": version}


def _base36(number: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    text = ""
    while True:
        number, rest = divmod(number, 36)
        text = digits[rest] + text
        if not number:
            return text


__all__ = ["FEDERATION_AUDIENCE", "TENANT", "AzureFake", "arm_error", "entra_error"]
