"""Turn a container of a pod into a local process invocation (pure logic of F-DEV-2).

A container here runs as a plain process in the pod's network, mount and UTS
namespaces (see ``network``), so two pods can both listen on ``0.0.0.0:2379``. Two
things a kubelet gets from an image and its volumes are emulated by rewriting:

- the image: an allow-listed image maps to local executables put first on ``PATH``
  (so ``etcd`` or ``/usr/local/bin/etcd`` runs it): an etcd image to the binaries
  built from Go modules, the operator's own image (``kustos.images``) to the
  ``kustos`` command of the runner's own Python environment;
- the filesystem: each volume mount's path is replaced by the local directory
  that backs it, in the command, the arguments, the environment and workingDir
  (the service account token is also bind-mounted at its real path).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from kustos.images import ETCD_REPOSITORIES, KUSTOS_IMAGE_REPOSITORY
from kustos.runtime.quantity import in_units, parse_quantity

ETCD_IMAGE_REPOSITORIES = tuple(r.name for r in ETCD_REPOSITORIES)

# Repositories whose images the runner owns; kwok simulates every other image.
RUNNER_IMAGE_PREFIXES = tuple(f"{r}:" for r in (*ETCD_IMAGE_REPOSITORIES, KUSTOS_IMAGE_REPOSITORY))

# image -> the etcd version its tag names.
_ETCD_IMAGE = re.compile(
    r"^(?:" + "|".join(re.escape(r) for r in ETCD_IMAGE_REPOSITORIES) + r")"
    r":v?(?P<version>\d+\.\d+\.\d+)(?:-\d+)?$"
)

# Any tag of the operator's image: the runner's own install stands in for every version.
_KUSTOS_IMAGE = re.compile(re.escape(KUSTOS_IMAGE_REPOSITORY) + r":\S+")


@dataclass(frozen=True)
class ImageMatch:
    """An allow-listed image and the local executables that stand in for it.

    ``binaries`` are Go binaries of ``kustos dev build`` (name -> version);
    ``scripts`` are console scripts next to the runner's own Python interpreter.
    """

    image: str
    binaries: Mapping[str, str] = field(default_factory=dict)
    scripts: tuple[str, ...] = ()


def match_image(image: str, etcd_versions: Sequence[str]) -> ImageMatch | None:
    """The local stand-in for an image, or None when the image is not allow-listed."""
    if _KUSTOS_IMAGE.fullmatch(image):
        return ImageMatch(image, scripts=("kustos",))
    found = _ETCD_IMAGE.match(image)
    if found is None:
        return None
    version = "v" + found.group("version")
    if version not in etcd_versions:
        return None
    return ImageMatch(image, binaries=dict.fromkeys(("etcd", "etcdctl", "etcdutl"), version))


def image_entrypoint(image: str) -> str:
    """What a container of an allow-listed image runs when it names no command."""
    return "kustos" if image.startswith(f"{KUSTOS_IMAGE_REPOSITORY}:") else "etcd"


def is_runner_image(image: str) -> bool:
    """An image of an allow-listed repository, whether or not its version is built."""
    return image.startswith(RUNNER_IMAGE_PREFIXES)


def _all_containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    spec = pod.get("spec") or {}
    return list(spec.get("initContainers") or []) + list(spec.get("containers") or [])


def pod_is_runner_owned(pod: Mapping[str, Any]) -> bool:
    """The runner, not kwok, owns a pod with any allow-listed image (kwokconfig.RUNNER_POD)."""
    return any(is_runner_image(c.get("image", "")) for c in _all_containers(pod))


def pod_is_runnable(pod: Mapping[str, Any], etcd_versions: Sequence[str]) -> bool:
    """A pod runs as real processes only when every one of its containers can."""
    containers = _all_containers(pod)
    return bool(containers) and all(
        match_image(c.get("image", ""), etcd_versions) is not None for c in containers
    )


_VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\$")


def expand_vars(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: unknown references stay, ``$$`` escapes."""

    def replace(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env.get(name, m.group(0))

    return _VAR_REF.sub(replace, text)


def rewrite_paths(text: str, mounts: Mapping[str, Path]) -> str:
    """Replace container mount paths with the local directories that back them."""
    if not mounts:
        return text
    # One pass, longest path first, so a substituted directory is never rewritten again.
    by_path = {m.rstrip("/") or "/": str(local) for m, local in mounts.items()}
    alternatives = "|".join(re.escape(m) for m in sorted(by_path, key=len, reverse=True))
    pattern = re.compile(r"(?<![\w./-])(" + alternatives + r")(?=/|$|[^\w.-])")
    return pattern.sub(lambda m: by_path[m.group(1)], text)


def pod_hostname(pod: Mapping[str, Any]) -> str:
    """A pod's hostname: ``spec.hostname``, else its name (cut to 63 characters, as a kubelet does)."""
    spec = pod.get("spec") or {}
    return str(spec.get("hostname") or pod["metadata"]["name"])[:63].rstrip("-.")


@dataclass(frozen=True)
class Invocation:
    """How to start one container as a local process."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path | None


def field_value(pod: Mapping[str, Any], path: str) -> str:
    """The downward API fields a container can ask for in ``env[].valueFrom.fieldRef``."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": status.get("podIP"),
        "status.hostIP": status.get("hostIP"),
    }
    if path in simple:
        return str(simple[path] or "")
    labelled = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if labelled:
        return str((meta.get(labelled.group(1)) or {}).get(labelled.group(2), ""))
    return ""


def resource_value(pod: Mapping[str, Any], ref: Mapping[str, Any], default_container: str = "") -> str:
    """A downward API ``resourceFieldRef``: a container's request or limit in units of
    ``divisor``, rounded up. An unset limit is the node's capacity, which for these nodes is
    this machine's (CPUs, memory); an unset request is 0 (a kubelet would default it to the
    limit when only the limit is set)."""
    name = ref.get("containerName") or default_container
    containers = [*(pod["spec"].get("initContainers") or []), *pod["spec"]["containers"]]
    container: Mapping[str, Any] = next((c for c in containers if c["name"] == name), {})
    kind, _, resource = str(ref["resource"]).partition(".")
    resources = container.get("resources") or {}
    text = (resources.get(kind) or {}).get(resource)
    if text is None and kind == "requests":
        text = (resources.get("limits") or {}).get(resource)
    if text is not None:
        value = parse_quantity(str(text))
    elif kind == "limits" and resource == "cpu":
        value = Fraction(os.cpu_count() or 1)
    elif kind == "limits" and resource == "memory":
        value = Fraction(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    else:
        value = Fraction(0)
    return str(in_units(value, str(ref.get("divisor") or "1")))


# The names a kubelet accepts from envFrom (a C identifier is the usual case; it also allows
# dots and dashes, but never a leading digit).
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")


def container_env(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    lookup: Mapping[tuple[str, str, str], str] | None = None,
) -> dict[str, str]:
    """The container's environment: ``envFrom`` sources, then plain values, downward API, and
    ConfigMap/Secret keys, a later one winning as with a kubelet.

    ``lookup`` maps (kind, name, key) to a value already read from the API, kind
    being ``configMap`` or ``secret``; a missing optional key is left out. An ``envFrom``
    source brings every key of it found there, with its ``prefix``; a key that is no valid
    variable name is skipped, as a kubelet does (the official etcd operator passes its
    initial-cluster settings this way).
    """
    env: dict[str, str] = {}
    lookup = lookup or {}
    for source in container.get("envFrom") or []:
        for kind in ("configMap", "secret"):
            ref = source.get(f"{kind}Ref")
            if not ref:
                continue
            for (found, name, key), value in lookup.items():
                variable = str(source.get("prefix") or "") + key
                if (found, name) == (kind, ref["name"]) and _ENV_NAME.fullmatch(variable):
                    env[variable] = value
    for item in container.get("env") or []:
        name = item["name"]
        if "value" in item:
            env[name] = expand_vars(str(item.get("value") or ""), env)
            continue
        source = item.get("valueFrom") or {}
        if "fieldRef" in source:
            env[name] = field_value(pod, source["fieldRef"]["fieldPath"])
        if "resourceFieldRef" in source:
            env[name] = resource_value(pod, source["resourceFieldRef"], container["name"])
        for kind in ("configMap", "secret"):
            ref = source.get(f"{kind}KeyRef")
            if ref and (kind, ref["name"], ref["key"]) in lookup:
                env[name] = lookup[(kind, ref["name"], ref["key"])]
    return env


def build_invocation(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    bin_paths: Mapping[str, Path],
    mounts: Mapping[str, Path],
    base_env: Mapping[str, str],
    lookup: Mapping[tuple[str, str, str], str] | None = None,
    own_dir: Path | None = None,
) -> Invocation:
    """Resolve command, args, environment and working directory for one container.

    ``bin_paths`` maps a command's base name (``etcd``) to the local binary; the
    directory holding them goes first on PATH so that shell scripts find them too.
    ``own_dir`` stands in for the container's own filesystem: the working directory when
    the container names none, so what a program writes relative to it (etcd's default
    ``--data-dir``, ``<name>.etcd``) is the pod's own, not shared with every other pod.
    """
    env = container_env(pod, container, lookup)

    def local(text: str) -> str:
        return rewrite_paths(text, mounts)

    env = {k: local(v) for k, v in env.items()}
    command = [local(expand_vars(str(a), env)) for a in container.get("command") or []]
    args = [local(expand_vars(str(a), env)) for a in container.get("args") or []]
    argv = command + args
    if not command:
        # The image's default entrypoint: etcd for the etcd images, kustos for the operator's.
        argv = [image_entrypoint(str(container.get("image") or "")), *args]
    head = Path(argv[0]).name
    if head in bin_paths:
        argv[0] = str(bin_paths[head])
    search_path = [str(p.parent) for p in bin_paths.values()]
    path = ":".join(dict.fromkeys([*search_path, base_env.get("PATH", "/usr/bin:/bin")]))
    full_env = {**base_env, "PATH": path, "HOSTNAME": pod_hostname(pod), **env}
    working_dir = container.get("workingDir")
    cwd = Path(local(working_dir)) if working_dir else own_dir
    return Invocation(argv=argv, env=full_env, cwd=cwd)
