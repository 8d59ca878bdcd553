"""A local fake of the part of GCP's Compute API the GCP provider uses (dev tool, F-NODE-6).

Managed instance groups (zonal and regional), global and regional instance templates,
instances and operations, served as JSON over HTTP on loopback with the URIs and field names of
``compute/v1`` (each route is one of the SDK's own URI templates; a unit test checks that).
The provider reaches it through ``google-cloud-compute``'s REST transport with the
``endpoint`` option; nothing in kustos is faked.

Behaviour that matters to the provider and is kept as GCE has it: a resize lists the new
instance at once (``CREATING``, no status yet) and it runs ``boot_seconds`` later; a
deleted instance is ``DELETING`` (``STOPPING``) for ``delete_seconds`` and then gone, and
the target size shrinks at once; ``TERMINATED`` is a stopped instance; operations are
``RUNNING`` when answered and ``DONE`` when polled; ``quota_exhausted`` makes creations
fail as GCE does (the instance stays ``CREATING`` with the error in ``lastAttempt``).
Faults (``FakeApi.fail``) answer one method's next calls with an error.

It is its own Google identity too, so google-auth's Application Default Credentials run
unchanged against it (``GOOGLE_APPLICATION_CREDENTIALS`` naming a file whose token URI is
the fake's ``/token``), and the Compute API serves only credentials it can check (401
``UNAUTHENTICATED`` otherwise, as Google answers):

- a service account key it made (``service_account_key``, as ``gcloud iam service-accounts
  keys create``): google-auth signs its own JWT with it (the Compute client asks for
  self-signed JWTs), checked against the key's public half; a deleted key is refused;
- workload identity federation (``external_account``): ``/token`` is STS's token exchange,
  taking a Kubernetes service account token checked against the pool provider's issuer
  keys, audience and allowed subjects, and issuing an access token.

(An ``authorized_user`` file, from ``gcloud auth application-default login``, cannot be
pointed here: google-auth always sends its refresh token to Google's own token endpoint.)
"""

from __future__ import annotations

import copy
import itertools
import json
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from kustos.devcluster.fakeapi import ApiError, FakeApi, Reply, Route
from kustos.devcluster.fakeidentity import InvalidToken, TokenIssuer, bearer, jwt_parts, verify_jwt

ROOT = "https://compute.googleapis.com/compute/v1/"
V1 = "/compute/v1/projects/{project}"
COMPUTE_SCOPES = frozenset(
    {"https://www.googleapis.com/auth/compute", "https://www.googleapis.com/auth/cloud-platform"}
)
COMPUTE_AUDIENCE = "https://compute.googleapis.com/"
TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
JWT_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:jwt"
PROJECT_NUMBER = "123456789012"


def not_found(what: str) -> ApiError:
    return ApiError(
        404,
        {"error": {"code": 404, "message": f"The resource '{what}' was not found",
                   "errors": [{"reason": "notFound", "domain": "global", "message": f"{what} not found"}]}},
    )  # fmt: skip


def gce_error(status: int, reason: str, message: str) -> dict[str, Any]:
    """A Compute API error body, as ``google.api_core`` parses it."""
    errors = [{"reason": reason, "domain": "usageLimits", "message": message}]
    return {"error": {"code": status, "message": message, "errors": errors}}


def oauth_error(status: int, error: str, description: str) -> ApiError:
    """A token endpoint refusal as Google's OAuth and STS endpoints word it."""
    return ApiError(status, {"error": error, "error_description": description})


def unauthenticated(why: str) -> Reply:
    """The Compute API's answer to a request whose credentials it cannot check."""
    message = ("Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie "
               f"or other valid authentication credential. ({why})")  # fmt: skip
    return Reply(401, {"error": {"code": 401, "message": message, "status": "UNAUTHENTICATED", "errors": [
        {"message": "Invalid Credentials", "domain": "global", "reason": "authError",
         "location": "Authorization", "locationType": "header"}]}},
        {"WWW-Authenticate": 'Bearer realm="https://accounts.google.com/", error="invalid_token"'},
    )  # fmt: skip


@dataclass
class PoolProvider:
    """A workload identity pool provider: whose tokens STS exchanges, and which subjects IAM
    lets use the Compute API (``principal://.../subject/<sub>`` bound to a role)."""

    name: str  # projects/<number>/locations/global/workloadIdentityPools/<pool>/providers/<provider>
    issuer: str
    keys: dict[str, rsa.RSAPublicKey]
    subjects: set[str]

    @property
    def audience(self) -> str:
        """What the credential configuration names (STS's ``audience``)."""
        return f"//iam.googleapis.com/{self.name}"

    @property
    def allowed_audience(self) -> str:
        """What the subject token must be issued for: the provider's default allowed audience."""
        return f"https://iam.googleapis.com/{self.name}"


@dataclass
class FakeInstance:
    name: str
    zone: str
    group: str  # the MIG's relative URL
    template: str  # relative URL
    created: float
    status: str = ""  # "" while CREATING
    action: str = "CREATING"
    gone_at: float | None = None
    errors: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class FakeManager:
    scope: str  # zones | regions
    location: str
    name: str
    template: str  # relative URL
    target_size: int
    base_name: str

    @property
    def path(self) -> str:
        return f"{self.scope}/{self.location}/instanceGroupManagers/{self.name}"


class GcpFake:
    """The fake's state for one project, and its routes."""

    def __init__(
        self, project: str = "kustos-test", *, boot_seconds: float = 0.3, delete_seconds: float = 0.3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self.project = project
        self.boot_seconds = boot_seconds
        self.delete_seconds = delete_seconds
        self.clock = clock
        self.templates: dict[str, dict[str, Any]] = {}
        self.managers: dict[str, FakeManager] = {}
        self.instances: dict[tuple[str, str], FakeInstance] = {}
        self.operations: dict[str, dict[str, Any]] = {}
        self.quota_exhausted = False
        # While set, a resize raises the target size but lists no instance (a creation
        # outstanding, as GCE has it for a moment); ``release`` lists them.
        self.hold_creations = False
        self._held: list[FakeManager] = []
        self.resizes: list[tuple[str, int]] = []  # (group id, size) of every resize asked for
        self._ids = itertools.count(1000)
        self.keys: dict[str, tuple[str, rsa.RSAPublicKey]] = {}  # key id -> (service account, key)
        self.pools: list[PoolProvider] = []
        self.tokens = TokenIssuer()
        self.api = FakeApi(self._routes())
        self.api.authorize = self._authorize

    # -- for tests: the world as a user made it ----------------------------------------------

    def rel(self, path: str) -> str:
        return f"projects/{self.project}/{path}"

    def add_template(self, name: str, image: str, labels: dict[str, str], region: str | None = None) -> str:
        """An instance template (regional when ``region`` is given); its relative name."""
        where = _template_path(name, region)
        regional = {"region": ROOT + self.rel(f"regions/{region}")} if region else {}
        with self.api.lock:
            self.templates[where] = {
                "name": name, "id": str(next(self._ids)), "kind": "compute#instanceTemplate",
                "selfLink": ROOT + self.rel(where), **regional,
                "properties": {
                    "machineType": "e2-standard-4", "labels": labels,
                    "disks": [{"boot": True, "autoDelete": True, "type": "PERSISTENT",
                               "initializeParams": {"sourceImage": ROOT + image}}],
                    "networkInterfaces": [{"network": ROOT + self.rel("global/networks/default")}],
                },
            }  # fmt: skip
        return self.rel(where)

    def add_group(
        self, name: str, role: str, image: str, size: int, *, region: str | None = None,
        zone: str = "us-central1-a", labels: dict[str, str] | None = None, regional_template: bool = False,
    ) -> str:  # fmt: skip
        """A MIG (regional when ``region`` is given) with ``size`` running instances; its id.
        ``regional_template``: its template is a regional one, in the group's region."""
        template = self.add_template(
            f"{name}-tpl", image, {"kustos-role": role, **(labels or {})},
            region=(region or zone.rsplit("-", 1)[0]) if regional_template else None,
        )  # fmt: skip
        scope, location = ("regions", region) if region else ("zones", zone)
        manager = FakeManager(scope, location, name, template, 0, name)
        with self.api.lock:
            self.managers[manager.path] = manager
            for _ in range(size):
                instance = self._create(manager)
                assert instance is not None, "add groups before holding creations"
                instance.status, instance.action = "RUNNING", "NONE"
        return self.rel(manager.path)

    def stop(self, zone: str, name: str) -> None:
        """The instance stops (GCE: TERMINATED), as a user's ``gcloud compute instances stop``."""
        with self.api.lock:
            self.instances[(zone, name)].status = "TERMINATED"

    def group(self, group_id: str) -> FakeManager:
        return self.managers[group_id.split(f"projects/{self.project}/", 1)[1]]

    def members(self, group_id: str) -> list[FakeInstance]:
        with self.api.lock:
            self._advance()
            path = group_id if group_id.startswith("projects/") else self.rel(group_id)
            return [i for i in self.instances.values() if i.group == path]

    def image_of(self, template: str) -> str:
        disks = self.templates[self._where(template)]["properties"]["disks"]
        return str(disks[0]["initializeParams"]["sourceImage"]).split("/compute/v1/", 1)[-1]

    # -- for tests: the identities a user set up ---------------------------------------------

    @property
    def token_uri(self) -> str:
        return f"{self.api.url}/token"

    def service_account_key(self, path: Path, email: str | None = None) -> Path:
        """A new key of service account ``email``, its file written as Google gives it (the
        token URI the fake's); the fake knows the key's public half."""
        email = email or f"kustos@{self.project}.iam.gserviceaccount.com"
        key = rsa.generate_private_key(65537, 2048)
        key_id = secrets.token_hex(20)
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()
        with self.api.lock:
            self.keys[key_id] = (email, key.public_key())
        return _write_private(path, {
            "type": "service_account", "project_id": self.project, "private_key_id": key_id,
            "private_key": pem,
            "client_email": email, "client_id": str(next(self._ids)).rjust(21, "1"),
            "auth_uri": "https://accounts.google.com/o/oauth2/auth", "token_uri": self.token_uri,
        })  # fmt: skip

    def delete_key(self, key_id: str) -> None:
        """As ``gcloud iam service-accounts keys delete``: JWTs it signs are refused from now on."""
        with self.api.lock:
            self.keys.pop(key_id, None)

    def add_pool_provider(
        self, pool: str, provider: str, issuer: str, keys: dict[str, rsa.RSAPublicKey], subjects: set[str]
    ) -> PoolProvider:
        made = PoolProvider(
            f"projects/{PROJECT_NUMBER}/locations/global/workloadIdentityPools/{pool}/providers/{provider}",
            issuer, keys, set(subjects),
        )  # fmt: skip
        with self.api.lock:
            self.pools.append(made)
        return made

    def external_account_file(self, path: Path, pool: PoolProvider, token_file: Path) -> Path:
        """A credential configuration as ``gcloud iam workload-identity-pools create-cred-config``
        writes it, for a token file (a projected service account token); STS is the fake."""
        return _write_private(path, {
            "type": "external_account", "audience": pool.audience, "subject_token_type": JWT_TOKEN_TYPE,
            "token_url": self.token_uri, "credential_source": {"file": str(token_file)},
        })  # fmt: skip

    # -- the identity ------------------------------------------------------------------------

    def _authorize(self, headers: Mapping[str, str]) -> Reply | None:
        token = bearer(headers)
        if token is None:
            return unauthenticated("no Authorization header")
        try:
            if token.count(".") == 2:  # a service account's self-signed JWT
                self._check_self_signed(token)
            else:
                self.tokens.check(token)
        except InvalidToken as err:
            return unauthenticated(str(err))
        return None

    def _check_self_signed(self, token: str) -> None:
        header, claims = jwt_parts(token)
        known = self.keys.get(str(header.get("kid", "")))
        if known is None:
            raise InvalidToken(f"service account key {header.get('kid')!r} does not exist (deleted?)")
        email, key = known
        verify_jwt(token, {str(header["kid"]): key})
        if claims.get("iss") != email or claims.get("sub") != email:
            raise InvalidToken(f"the JWT's issuer {claims.get('iss')!r} is not the key's service account")
        scopes = set(str(claims.get("scope", "")).split())
        if not scopes & COMPUTE_SCOPES and claims.get("aud") != COMPUTE_AUDIENCE:
            raise InvalidToken("the JWT is for neither a Compute scope nor the Compute API's audience")

    def _token(self, params: dict[str, str], query: dict[str, list[str]], body: Any) -> Reply:
        form = body if isinstance(body, dict) else {}
        grant = form.get("grant_type")
        if grant != TOKEN_EXCHANGE:
            raise oauth_error(400, "unsupported_grant_type", f"Invalid grant_type: {grant}")
        token, lifetime = self.tokens.issue(self._exchange(form), COMPUTE_AUDIENCE)
        return Reply(200, {"access_token": token, "expires_in": lifetime, "token_type": "Bearer",
                           "issued_token_type": "urn:ietf:params:oauth:token-type:access_token"})  # fmt: skip

    def _exchange(self, form: Mapping[str, Any]) -> str:
        """STS: a subject token of a pool provider's issuer for an access token; its principal."""
        pool = next((p for p in self.pools if p.audience == form.get("audience")), None)
        if pool is None:
            raise oauth_error(400, "invalid_target", (
                'The target service indicated by the "audience" parameters is invalid. This might '
                "either be because the pool or provider is disabled or deleted or because it doesn't "
                "exist."))  # fmt: skip
        subject_token = str(form.get("subject_token", ""))
        try:
            claims = verify_jwt(subject_token, pool.keys)
        except InvalidToken as err:
            raise oauth_error(400, "invalid_grant", f"The subject token is invalid: {err}.") from None
        audiences = claims.get("aud") or []
        audiences = [audiences] if isinstance(audiences, str) else list(audiences)
        if claims.get("iss") != pool.issuer or pool.allowed_audience not in audiences:
            raise oauth_error(400, "invalid_grant", (
                f"The audience in ID Token [{','.join(audiences)}] does not match the expected audience "
                f"{pool.allowed_audience}, or its issuer {claims.get('iss')} is not the "
                "provider's."))  # fmt: skip
        if claims.get("sub") not in pool.subjects:
            raise oauth_error(403, "access_denied", (
                f"principal://iam.googleapis.com/{pool.name.rsplit('/providers/', 1)[0]}/subject/"
                f"{claims.get('sub')} has no role on project {self.project}."))  # fmt: skip
        return str(claims["sub"])

    # -- the simulation ---------------------------------------------------------------------

    def _zones(self, manager: FakeManager) -> list[str]:
        return [manager.location] if manager.scope == "zones" else [f"{manager.location}-{z}" for z in "abc"]

    def release(self) -> None:
        """The held creations show up."""
        with self.api.lock:
            held, self._held = self._held, []
            for manager in held:
                manager.target_size -= 1
                self._create(manager)

    def _create(self, manager: FakeManager) -> FakeInstance | None:
        if self.hold_creations:
            self._held.append(manager)
            manager.target_size += 1
            return None
        zones = self._zones(manager)
        members = [i for i in self.instances.values() if i.group == self.rel(manager.path)]
        zone = zones[len(members) % len(zones)]
        name = f"{manager.base_name}-{secrets.token_hex(2)}"
        instance = FakeInstance(name, zone, self.rel(manager.path), manager.template, self.clock())
        if self.quota_exhausted:
            instance.errors = [("QUOTA_EXCEEDED", "Quota 'CPUS' exceeded. Limit: 24.0 in region.")]
        self.instances[(zone, name)] = instance
        manager.target_size += 1
        return instance

    def _advance(self) -> None:
        now = self.clock()
        for key, instance in list(self.instances.items()):
            if instance.gone_at is not None and now >= instance.gone_at:
                del self.instances[key]
            elif (
                instance.action == "CREATING"
                and not instance.errors
                and now >= instance.created + self.boot_seconds
            ):
                instance.status, instance.action = "RUNNING", "NONE"

    def _operation(self, kind: str, target: str, scope: str = "global") -> dict[str, Any]:
        name = f"operation-{next(self._ids)}-{secrets.token_hex(4)}"
        where = {"zone": ROOT + self.rel(scope)} if scope.startswith("zones/") else (
            {"region": ROOT + self.rel(scope)} if scope.startswith("regions/") else {})  # fmt: skip
        operation = {
            "kind": "compute#operation", "id": str(next(self._ids)), "name": name, "operationType": kind,
            "status": "RUNNING", "targetLink": ROOT + target, "progress": 0,
            "selfLink": ROOT + self.rel(f"{scope}/operations/{name}"), **where,
        }  # fmt: skip
        self.operations[name] = operation
        return copy.deepcopy(operation)

    # -- the API ----------------------------------------------------------------------------

    def _routes(self) -> list[Route]:
        igm = "/instanceGroupManagers/{instance_group_manager}"
        routes = [
            # Not the Compute API: the token URI of the credential files (OAuth, STS).
            Route("post", "/token", "oauth.token", self._token, public=True),
            Route("get", V1 + "/aggregated/instanceGroupManagers", "instanceGroupManagers.aggregatedList",
                  self._aggregated)
        ]  # fmt: skip
        for scope, param in (("zones", "zone"), ("regions", "region")):
            prefix = V1 + f"/{scope}/{{{param}}}" + igm
            api = "instanceGroupManagers" if scope == "zones" else "regionInstanceGroupManagers"
            routes += [
                Route("get", prefix, f"{api}.get", self._scoped(scope, param, self._get_manager)),
                Route("post", prefix + "/listManagedInstances", f"{api}.listManagedInstances",
                      self._scoped(scope, param, self._list_managed)),
                Route("post", prefix + "/resize", f"{api}.resize", self._scoped(scope, param, self._resize)),
                Route("post", prefix + "/deleteInstances", f"{api}.deleteInstances",
                      self._scoped(scope, param, self._delete_instances)),
                Route("post", prefix + "/setInstanceTemplate", f"{api}.setInstanceTemplate",
                      self._scoped(scope, param, self._set_template)),
                Route("get", V1 + f"/{scope}/{{{param}}}/operations/{{operation}}",
                      "zoneOperations.get" if scope == "zones" else "regionOperations.get",
                      self._get_operation),
            ]  # fmt: skip
        routes += [
            Route("get", V1 + "/global/instanceTemplates/{instance_template}", "instanceTemplates.get",
                  self._get_template),
            Route("post", V1 + "/global/instanceTemplates", "instanceTemplates.insert",
                  self._insert_template),
            Route("get", V1 + "/regions/{region}/instanceTemplates/{instance_template}",
                  "regionInstanceTemplates.get", self._get_template),
            Route("post", V1 + "/regions/{region}/instanceTemplates", "regionInstanceTemplates.insert",
                  self._insert_template),
            Route("get", V1 + "/global/operations/{operation}", "globalOperations.get", self._get_operation),
            Route("get", V1 + "/zones/{zone}/instances/{instance}", "instances.get", self._get_instance),
        ]  # fmt: skip
        return routes

    def _project(self, params: dict[str, str]) -> None:
        if params["project"] != self.project:
            raise ApiError(403, gce_error(403, "forbidden", f"no access to project {params['project']}"))

    def _scoped(
        self, scope: str, param: str, handler: Callable[[FakeManager, dict[str, list[str]], Any], Reply]
    ) -> Callable[[dict[str, str], dict[str, list[str]], Any], Reply]:
        def run(params: dict[str, str], query: dict[str, list[str]], body: Any) -> Reply:
            self._project(params)
            self._advance()
            path = f"{scope}/{params[param]}/instanceGroupManagers/{params['instance_group_manager']}"
            manager = self.managers.get(path)
            if manager is None:
                raise not_found(self.rel(path))
            return handler(manager, query, body)

        return run

    def _manager_json(self, m: FakeManager) -> dict[str, Any]:
        where = {"zone": ROOT + self.rel(f"zones/{m.location}")} if m.scope == "zones" else {
            "region": ROOT + self.rel(f"regions/{m.location}")}  # fmt: skip
        return {
            "kind": "compute#instanceGroupManager", "name": m.name, "id": str(abs(hash(m.path)) % 10**12),
            "selfLink": ROOT + self.rel(m.path), "instanceTemplate": ROOT + m.template,
            "versions": [{"instanceTemplate": ROOT + m.template}], "targetSize": m.target_size,
            "baseInstanceName": m.base_name, **where,
        }  # fmt: skip

    def _aggregated(self, params: dict[str, str], query: dict[str, list[str]], body: Any) -> Reply:
        self._project(params)
        items: dict[str, dict[str, Any]] = {}
        for m in self.managers.values():
            items.setdefault(f"{m.scope}/{m.location}", {"instanceGroupManagers": []})[
                "instanceGroupManagers"
            ].append(self._manager_json(m))
        return Reply(200, {"kind": "compute#instanceGroupManagerAggregatedList", "items": items})

    def _get_manager(self, m: FakeManager, query: dict[str, list[str]], body: Any) -> Reply:
        return Reply(200, self._manager_json(m))

    def _list_managed(self, m: FakeManager, query: dict[str, list[str]], body: Any) -> Reply:
        listed = []
        for i in self.instances.values():
            if i.group != self.rel(m.path):
                continue
            entry: dict[str, Any] = {
                "instance": ROOT + self.rel(f"zones/{i.zone}/instances/{i.name}"), "name": i.name,
                "id": str(abs(hash(i.name)) % 10**12), "currentAction": i.action,
                "version": {"instanceTemplate": ROOT + i.template},
            }  # fmt: skip
            if i.status:
                entry["instanceStatus"] = i.status
            if i.errors:
                entry["lastAttempt"] = {
                    "errors": {"errors": [{"code": c, "message": t} for c, t in i.errors]}
                }
            listed.append(entry)
        return Reply(200, {"managedInstances": listed})

    def _resize(self, m: FakeManager, query: dict[str, list[str]], body: Any) -> Reply:
        size = int(query["size"][0])
        self.resizes.append((self.rel(m.path), size))
        while m.target_size < size:
            self._create(m)
        while m.target_size > size:  # creations not made yet go first, then the newest
            if m in self._held:
                self._held.remove(m)
            else:
                newest = max((i for i in self.instances.values() if i.group == self.rel(m.path)
                              and i.action != "DELETING"), key=lambda i: i.created)  # fmt: skip
                newest.action, newest.status = "DELETING", "STOPPING"
                newest.gone_at = self.clock() + self.delete_seconds
            m.target_size -= 1
        return Reply(200, self._operation("compute.instanceGroupManagers.resize", self.rel(m.path),
                                          f"{m.scope}/{m.location}"))  # fmt: skip

    def _delete_instances(self, m: FakeManager, query: dict[str, list[str]], body: Any) -> Reply:
        for url in (body or {}).get("instances", []):
            parts = url.split("/compute/v1/", 1)[-1].split("/")
            instance = self.instances.get((parts[3], parts[5])) if len(parts) >= 6 else None
            if instance is None or instance.group != self.rel(m.path):
                raise ApiError(400, gce_error(400, "invalid", f"instance {url} is not a member of {m.name}"))
            if instance.action != "DELETING":
                instance.action, instance.status = "DELETING", "STOPPING"
                instance.gone_at = self.clock() + self.delete_seconds
                m.target_size -= 1
        return Reply(200, self._operation("compute.instanceGroupManagers.deleteInstances", self.rel(m.path),
                                          f"{m.scope}/{m.location}"))  # fmt: skip

    def _where(self, template: str) -> str:
        """A template's key: its name relative to the project (``global/...``, ``regions/...``)."""
        return template.split("/compute/v1/", 1)[-1].split(f"projects/{self.project}/", 1)[-1]

    def _set_template(self, m: FakeManager, query: dict[str, list[str]], body: Any) -> Reply:
        template = (body or {}).get("instanceTemplate", "").split("/compute/v1/", 1)[-1]
        where = self._where(template)
        if where not in self.templates:
            raise not_found(template)
        region = m.location if m.scope == "regions" else m.location.rsplit("-", 1)[0]
        if where.startswith("regions/") and where.split("/")[1] != region:
            raise ApiError(400, gce_error(400, "invalid", (
                f"Regional instance template {template} must be in the group's region "
                f"{region}.")))  # fmt: skip
        m.template = template
        return Reply(200, self._operation("compute.instanceGroupManagers.setInstanceTemplate",
                                          self.rel(m.path), f"{m.scope}/{m.location}"))  # fmt: skip

    def _get_template(self, params: dict[str, str], query: dict[str, list[str]], body: Any) -> Reply:
        self._project(params)
        where = _template_path(params["instance_template"], params.get("region"))
        template = self.templates.get(where)
        if template is None:
            raise not_found(self.rel(where))
        return Reply(200, copy.deepcopy(template))

    def _insert_template(self, params: dict[str, str], query: dict[str, list[str]], body: Any) -> Reply:
        self._project(params)
        name, region = str(body["name"]), params.get("region")
        where = _template_path(name, region)
        if where in self.templates:
            raise ApiError(
                409, gce_error(409, "alreadyExists", f"The resource '{self.rel(where)}' already exists")
            )
        template = {**body, "kind": "compute#instanceTemplate", "id": str(next(self._ids)),
                    "selfLink": ROOT + self.rel(where),
                    **({"region": ROOT + self.rel(f"regions/{region}")} if region else {})}  # fmt: skip
        self.templates[where] = template
        kind = "compute.regionInstanceTemplates.insert" if region else "compute.instanceTemplates.insert"
        return Reply(200, self._operation(kind, self.rel(where), f"regions/{region}" if region else "global"))

    def _get_operation(self, params: dict[str, str], query: dict[str, list[str]], body: Any) -> Reply:
        self._project(params)
        operation = self.operations.get(params["operation"])
        if operation is None:
            raise not_found(params["operation"])
        operation["status"], operation["progress"] = "DONE", 100
        return Reply(200, copy.deepcopy(operation))

    def _get_instance(self, params: dict[str, str], query: dict[str, list[str]], body: Any) -> Reply:
        self._project(params)
        self._advance()
        instance = self.instances.get((params["zone"], params["instance"]))
        if instance is None:
            raise not_found(self.rel(f"zones/{params['zone']}/instances/{params['instance']}"))
        return Reply(200, {
            "kind": "compute#instance", "name": instance.name, "id": str(abs(hash(instance.name)) % 10**12),
            "zone": ROOT + self.rel(f"zones/{instance.zone}"), "status": instance.status or "PROVISIONING",
            "selfLink": ROOT + self.rel(f"zones/{instance.zone}/instances/{instance.name}"),
            "metadata": {"items": [{"key": "created-by", "value": instance.group},
                                   {"key": "instance-template", "value": instance.template}]},
        })  # fmt: skip


def _template_path(name: str, region: str | None) -> str:
    return f"regions/{region}/instanceTemplates/{name}" if region else f"global/instanceTemplates/{name}"


def _write_private(path: Path, info: dict[str, Any]) -> Path:
    path.write_text(json.dumps(info, indent=2))
    path.chmod(0o600)
    return path


__all__ = ["COMPUTE_AUDIENCE", "GcpFake", "PoolProvider", "gce_error"]
