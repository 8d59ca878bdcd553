"""Bounds that fuzzing (tests/integration/test_fuzzed_specs.py) found missing from the specs.

Durations are bounded (``api.common.Duration``): a fuzzed ``stepTimeout`` of
820h601001817393167.61m once overflowed in the StorageUpgrade controller, a traceback on every
pass and no status at all. Now the model refuses it naming the field, and the CRD's CEL rule
refuses it at the API server."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kustos.api.common import MAX_DURATION
from kustos.api.etcd import AdoptSpec
from kustos.api.storageupgrade import StorageUpgradeSpec
from kustos.runtime.reconciler import invalid_spec


@pytest.mark.parametrize("text", ["820h601001817393167.61m", "87601h", "99999999999999999999h"])
def test_a_duration_past_ten_years_is_refused_naming_the_field(text: str) -> None:
    with pytest.raises(ValidationError) as refused:
        StorageUpgradeSpec.model_validate({"newImage": "storageos/node:v2", "stepTimeout": text})
    message = invalid_spec(refused.value).message
    assert "stepTimeout" in message and MAX_DURATION in message, message


@pytest.mark.parametrize("text", ["500ms", "1h30m", MAX_DURATION])
def test_durations_up_to_ten_years_are_taken(text: str) -> None:
    assert StorageUpgradeSpec.model_validate({"newImage": "n:v2", "stepTimeout": text}).step_timeout == text


@pytest.mark.parametrize("endpoint", ["http://", "https://", "http://:2379", "http://host:2379/v3/kv"])
def test_an_adopted_endpoint_without_a_host_or_with_a_path_is_refused(endpoint: str) -> None:
    """A fuzzed ``adopt.endpoints: [http://]`` once reached the etcd client, which raised on
    every pass with no condition."""
    with pytest.raises(ValidationError) as refused:
        AdoptSpec.model_validate({"endpoints": [endpoint]})
    assert "endpoints.0" in invalid_spec(refused.value).message


@pytest.mark.parametrize(
    "endpoint", ["http://10.0.0.5:2379", "https://etcd-0.etcd.ns.svc:2379/", "http://[::1]:2379"]
)
def test_client_urls_with_a_host_are_taken(endpoint: str) -> None:
    assert AdoptSpec.model_validate({"endpoints": [endpoint]}).endpoints == [endpoint]
