"""Pod image overrides (issue #16 item 6): the pure part. No I/O.

``spec.podImageOverrides`` is a list of ``original=override`` entries (EKCO's format and its
matching rule: a container's image is rewritten only when it is exactly ``original``, as
written in the pod: ``nginx`` does not match ``docker.io/library/nginx:latest``). The mutating
webhook rewrites the images of containers and init containers of new pods; on an update it
rewrites only an image the update itself sets to an original (EKCO rewrites on every update,
which would swap the image of a running pod created before the override, and restart it, on
any unrelated change such as a label).

What is refused here, naming the entry: an image reference Docker's grammar refuses (on either
side), the same original twice, and chains (``a=b`` with ``b=c``: whether ``c`` is reached
would depend on whether the API server calls the webhook again; write ``a=c``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kustos.runtime.steps import WARNING, Done, Note, Wait

# distribution/reference's grammar (the one container runtimes parse image names with).
_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_NAME = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_REFERENCE = re.compile(rf"^(?P<name>{_NAME})(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?$")
NAME_MAX = 255

FIELD = "spec.podImageOverrides"


def reference_problem(image: str) -> str | None:
    """Why ``image`` is not a valid image reference (None when it is)."""
    found = _REFERENCE.match(image)
    if found is None:
        if image != image.lower() and _REFERENCE.match(image.lower()):
            return f"{image!r} is not a valid image reference (repository names are lowercase)"
        return f"{image!r} is not a valid image reference ([registry/]repository[:tag][@digest])"
    if len(found.group("name")) > NAME_MAX:
        return f"{image!r}: the repository name is longer than {NAME_MAX} characters"
    return None


@dataclass(frozen=True)
class Overrides:
    """The usable rewrites (original -> override) and what is wrong with the other entries."""

    images: Mapping[str, str]
    problems: tuple[str, ...] = ()


def parse(entries: Sequence[str]) -> Overrides:
    """Every entry checked; the valid ones kept (a bad entry never stops the good ones)."""
    images: dict[str, str] = {}
    where: dict[str, int] = {}
    problems: list[str] = []
    pairs: list[tuple[int, str, str]] = []
    for index, entry in enumerate(entries):
        path = f"{FIELD}[{index}]"
        original, sep, override = entry.partition("=")
        if not sep or not original or not override or "=" in override:
            problems.append(f"{path}: {entry!r} is not original=override")
            continue
        bad = [p for p in (reference_problem(original), reference_problem(override)) if p]
        if bad:
            problems.append(f"{path}: " + "; ".join(bad))
            continue
        if original in where:
            problems.append(f"{path}: {original!r} is already overridden by {FIELD}[{where[original]}]")
            continue
        where[original] = index
        pairs.append((index, original, override))
    overrides = {override: index for index, _, override in pairs}
    for index, original, override in pairs:
        if original == override:
            continue  # a rewrite to itself: harmless, kept
        if original in overrides and overrides[original] != index:
            problems.append(
                f"{FIELD}[{index}]: {original!r} is the override of {FIELD}[{overrides[original]}]; "
                "chains are not followed, override the first image directly"
            )
            continue
        images[original] = override
    return Overrides(images, tuple(problems))


def _containers(pod: Mapping[str, Any], kind: str) -> list[Mapping[str, Any]]:
    return list((pod.get("spec") or {}).get(kind) or [])


def mutation(
    pod: Mapping[str, Any], images: Mapping[str, str], old: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The JSON patch (RFC 6902) that rewrites ``pod``'s images; empty when none matches.

    ``old`` (an update): only images the update changes are rewritten, never one the pod
    already ran with.
    """
    patch: list[dict[str, Any]] = []
    for kind in ("initContainers", "containers"):
        before = {c.get("name"): c.get("image") for c in _containers(old or {}, kind)}
        for index, container in enumerate(_containers(pod, kind)):
            image = container.get("image")
            if not isinstance(image, str) or image not in images:
                continue
            if old is not None and before.get(container.get("name")) == image:
                continue
            patch.append({"op": "replace", "path": f"/spec/{kind}/{index}/image", "value": images[image]})
    return patch


def rewritten(patch: Sequence[Mapping[str, Any]], pod: Mapping[str, Any]) -> list[str]:
    """``old -> new`` for each rewrite of ``patch`` (for the warning the API returns)."""
    result = []
    for op in patch:
        _, _, kind, index, _ = str(op["path"]).split("/")
        container = _containers(pod, kind)[int(index)]
        result.append(f"{container.get('name')}: {container.get('image')} -> {op['value']}")
    return result


# ---- the configuration's planner ------------------------------------------------------------

RESYNC = 300.0  # seconds: the configuration is applied again (a renewed CA, a hand deletion)
STARTING = 1.0  # seconds: the next look while the webhook server is not serving yet


@dataclass(frozen=True)
class ConfigurationView:
    """What decides the mutating webhook's configuration."""

    overrides: Overrides
    """The policy's usable overrides and the problems of the rest (none: no policy)."""
    serving: bool
    """The API server can reach the webhook (kustos run has a webhook URL or Service)."""
    server_ready: bool
    """The webhook server serves, so its configuration (with the CA) can be built."""


@dataclass(frozen=True)
class ApplyConfiguration:
    images: int


@dataclass(frozen=True)
class RemoveConfiguration:
    """No usable override: no pod goes through kustos."""


@dataclass(frozen=True)
class Unavailable:
    """Overrides asked for while the webhook cannot be reached: pods keep their images."""


ConfigurationStep = ApplyConfiguration | RemoveConfiguration | Unavailable | Wait | Done


def plan_configuration(o: ConfigurationView) -> ConfigurationStep:
    """The configuration exists exactly while there is a usable override and a webhook to call."""
    if not o.serving:
        # Never made a configuration to remove (nor may: no RBAC for it without a webhook).
        return Unavailable() if o.overrides.images else Done()
    if not o.overrides.images:
        return RemoveConfiguration()
    if not o.server_ready:
        return Wait("the webhook server is starting", seconds=STARTING)
    return ApplyConfiguration(len(o.overrides.images))


def configuration_notes(o: ConfigurationView, step: ConfigurationStep) -> list[Note]:
    """The Events a pass owes the policy: skipped entries, and overrides that cannot apply."""
    notes = []
    if o.overrides.problems:
        notes.append(
            Note("InvalidImageOverrides", "entries skipped: " + "; ".join(o.overrides.problems), WARNING)
        )
    if isinstance(step, Unavailable):
        message = (
            f"{FIELD}: the webhook is off (kustos run has no --webhook-url or webhook Service), "
            "so pods keep their images"
        )
        notes.append(Note("ImageOverridesUnavailable", message, WARNING))
    return notes


def configuration_requeue(step: ConfigurationStep) -> float | None:
    match step:
        case ApplyConfiguration():
            return RESYNC
        case Wait(seconds=seconds):
            return seconds
    return None


__all__ = [
    "FIELD",
    "ApplyConfiguration",
    "ConfigurationStep",
    "ConfigurationView",
    "Overrides",
    "RemoveConfiguration",
    "Unavailable",
    "configuration_notes",
    "configuration_requeue",
    "mutation",
    "parse",
    "plan_configuration",
    "reference_problem",
    "rewritten",
]
