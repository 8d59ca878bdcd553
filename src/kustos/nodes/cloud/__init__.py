"""Cloud providers behind ``runtime.cloud.CloudProvider``: kwok (dev cluster, tests), AWS, GCP, Azure.

``provider_from(name, options)`` is what ``kustos run --cloud-provider NAME --cloud-option
key=value`` calls. Each provider is imported only when chosen: their SDKs are large (boto3
~20 MiB, google-cloud-compute ~160 MiB, azure-mgmt-compute ~140 MiB resident) and an
operator loads none but its own.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from kustos.runtime.cloud import CloudProvider

PROVIDERS = ("none", "kwok", "aws", "gcp", "azure")
# The module and class of each SDK-backed provider, imported when chosen.
LAZY = {
    "aws": ("kustos.nodes.cloud.aws", "AwsProvider"),
    "gcp": ("kustos.nodes.cloud.gcp", "GcpProvider"),
    "azure": ("kustos.nodes.cloud.azure", "AzureProvider"),
}


@runtime_checkable
class CancelsCreates(Protocol):
    """A provider whose ``create_instance`` raises a size the group then has to meet (AWS,
    GCP, Azure): a creation that never showed up is taken back, or the raised size stays
    (and, read as a launch outstanding, blocks every later one). kwok creates at once."""

    async def cancel_create(self, group_id: str) -> bool:
        """Lower the group's size by one creation not listed yet; False when none was outstanding."""
        ...


def provider_from(name: str, options: Mapping[str, str]) -> CloudProvider | None:
    """The provider called ``name`` ("none": no provider, node rollouts wait), built from options."""
    if name == "none":
        if options:
            raise ValueError("--cloud-option given without --cloud-provider")
        return None
    if name == "kwok":
        from kustos.nodes.cloud.kwok import KwokProvider

        return KwokProvider.from_options(options)
    if name in LAZY:
        module_name, class_name = LAZY[name]
        module: Any = importlib.import_module(module_name)
        provider: CloudProvider = getattr(module, class_name).from_options(options)
        return provider
    raise ValueError(f"unknown cloud provider {name!r}; known: {', '.join(PROVIDERS)}")


def parse_options(pairs: list[str]) -> dict[str, str]:
    """``["region=eu-west-1", ...]`` -> a dict; a pair without ``=`` is an error naming it."""
    options: dict[str, str] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise ValueError(f"--cloud-option {pair!r}: expected key=value")
        options[key.strip()] = value.strip()
    return options


__all__ = ["PROVIDERS", "CancelsCreates", "parse_options", "provider_from"]
