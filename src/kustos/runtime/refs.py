"""A resource type by its REST coordinates: a plain value, importable without the API client
(the API models derive theirs from their CRD info, runtime.crd)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ResourceRef:
    """A resource type by its REST coordinates."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural
