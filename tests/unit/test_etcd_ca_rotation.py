"""The etcd CA rotation planner: trust both, reissue under the new CA, drop the old one."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta

from kustos.etcd import carotation, tls
from kustos.etcd.carotation import CARecord, DropOld, Finish, MemberTrust, Phase, Promote, Start, Timing, Wait
from kustos.etcd.certs import (
    POD_UID_ANNOTATION,
    MemberPod,
    ca_bundle,
    ca_record,
    member_renewal_reason,
    member_trust,
    rotated_ca_data,
)

NOW = datetime(2026, 11, 26, 4, 0, tzinfo=UTC)
DAY = timedelta(days=1)
OLD, NEW = "old", "new"


def member(name: str, bundle: set[str], leaf: str, settled: bool = True) -> MemberTrust:
    return MemberTrust(name, settled, frozenset(bundle), leaf)


def test_nothing_happens_without_a_request_or_an_expiring_ca() -> None:
    record = CARecord(OLD)
    assert record.phase is None
    assert carotation.plan(record, [member("e-0", {OLD}, OLD)], "", None) is None


def test_a_new_request_or_an_expiring_ca_starts_a_rotation_an_answered_request_does_not() -> None:
    record = CARecord(OLD)
    step = carotation.plan(record, [], "2026-11-26T04:00:00Z", None)
    assert isinstance(step, Start) and "kustos.dev/rotate-ca=2026-11-26T04:00:00Z" in step.reason
    answered = CARecord(OLD, timing=Timing(request="r1", started="t", completed="t2"))
    assert answered.phase is None
    assert carotation.plan(answered, [], "r1", None) is None
    assert carotation.plan(answered, [], "r1", "the CA expires") == Start("the CA expires")


def test_a_rotation_is_due_before_leaves_are_cut_short_or_with_little_of_the_ca_left() -> None:
    ten_years = timedelta(days=3650)
    assert carotation.rotation_due(NOW, NOW + ten_years, NOW, 90 * DAY, 33) is None
    short = carotation.rotation_due(NOW - ten_years, NOW + 150 * DAY, NOW, 90 * DAY, 33)
    assert short is not None and "two certificate lifetimes" in short
    late = carotation.rotation_due(NOW - 8 * 365 * DAY, NOW + 2 * 365 * DAY, NOW, 90 * DAY, 33)
    assert late is not None and "33%" in late


def test_trust_waits_for_every_member_to_trust_both_then_the_new_ca_signs() -> None:
    record = CARecord(OLD, next=NEW, timing=Timing(started="t"))
    assert record.phase is Phase.TRUST and record.bundle == {OLD, NEW}
    rolling = [member("e-0", {OLD, NEW}, OLD), member("e-1", {OLD}, OLD), member("e-2", {OLD}, OLD)]
    assert carotation.plan(record, rolling, "", None) == Wait(("e-1", "e-2"))
    # A member whose new pod has not started on its Secret yet is not done either.
    waiting = [member("e-0", {OLD, NEW}, OLD), member("e-1", {OLD, NEW}, OLD, settled=False)]
    assert carotation.plan(record, waiting, "", None) == Wait(("e-1",))
    done = [member(f"e-{i}", {OLD, NEW}, OLD) for i in range(3)]
    assert carotation.plan(record, done, "", None) == Promote()


def test_reissue_waits_for_every_leaf_of_the_new_ca_then_the_old_ca_goes() -> None:
    record = CARecord(NEW, previous=OLD, timing=Timing(started="t"))
    assert record.phase is Phase.REISSUE and record.bundle == {OLD, NEW}
    rolling = [member("e-0", {OLD, NEW}, NEW), member("e-1", {OLD, NEW}, OLD)]
    assert carotation.plan(record, rolling, "", None) == Wait(("e-1",))
    done = [member(f"e-{i}", {OLD, NEW}, NEW) for i in range(3)]
    assert carotation.plan(record, done, "", None) == DropOld()


def test_drop_waits_for_every_member_to_trust_the_new_ca_only_then_finishes() -> None:
    record = CARecord(NEW, timing=Timing(started="t", old_ca_dropped="t2"))
    assert record.phase is Phase.DROP and record.bundle == {NEW}
    rolling = [member("e-0", {NEW}, NEW), member("e-1", {OLD, NEW}, NEW)]
    assert carotation.plan(record, rolling, "", None) == Wait(("e-1",))
    assert carotation.plan(record, [member("e-0", {NEW}, NEW)], "", None) == Finish()


def test_a_request_during_a_rotation_waits_for_it_to_end() -> None:
    record = CARecord(OLD, next=NEW, timing=Timing(request="r1", started="t"))
    assert carotation.plan(record, [member("e-0", {OLD}, OLD)], "r2", None) == Wait(("e-0",))


def test_timing_records_start_phases_drop_and_end() -> None:
    t = [NOW + timedelta(minutes=i) for i in range(4)]
    timing = carotation.timing_after(Start("asked"), Timing(), "r1", t[0])
    assert timing.request == "r1" and timing.started == timing.phase_started == "2026-11-26T04:00:00Z"
    timing = carotation.timing_after(Promote(), timing, "r1", t[1])
    assert timing.phase_started == "2026-11-26T04:01:00Z" and not timing.old_ca_dropped
    timing = carotation.timing_after(DropOld(), timing, "r1", t[2])
    assert timing.old_ca_dropped == "2026-11-26T04:02:00Z"
    timing = carotation.timing_after(Finish(), timing, "r1", t[3])
    assert carotation.duration(timing) == timedelta(minutes=3)
    assert Timing.load(timing.dump()) == timing and Timing.load("not json") == Timing()


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def test_the_ca_secret_walks_through_the_phases_and_the_bundle_follows() -> None:
    old, new = tls.new_ca("old", NOW), tls.new_ca("new", NOW)
    secret = {"metadata": {}, "data": {"ca.crt": _b64(old.cert), "ca.key": _b64(old.key)}}
    assert ca_record(secret).phase is None and ca_bundle(secret) == old.cert

    def step(s: carotation.Step, ca: tls.KeyPair | None = None) -> None:
        for key, value in rotated_ca_data(s, secret, ca).items():
            if value is None:
                del secret["data"][key]
            else:
                secret["data"][key] = value

    step(Start("asked"), new)
    assert tls.bundle_ids(ca_bundle(secret)) == {tls.ca_id(old.cert), tls.ca_id(new.cert)}
    assert base64.b64decode(secret["data"]["ca.crt"]) == old.cert  # the old CA still signs
    step(Promote())
    record = ca_record(secret)
    assert record.phase is Phase.REISSUE and record.current == tls.ca_id(new.cert)
    assert base64.b64decode(secret["data"]["ca.key"]) == new.key
    step(DropOld())
    assert ca_bundle(secret) == new.cert


def test_a_member_restarts_when_the_cas_it_must_trust_change() -> None:
    old, new = tls.new_ca("old", NOW), tls.new_ca("new", NOW)
    pod = MemberPod("e-0", "u0", "127.1.1.1", running=True, deleting=False)
    leaf = tls.issue(old, "e-0", NOW, DAY)
    data = {"tls.crt": _b64(leaf.cert), "tls.key": _b64(leaf.key), "ca.crt": _b64(old.cert)}
    secret = {"metadata": {"annotations": {POD_UID_ANNOTATION: "u0"}}, "data": data}
    both = old.cert + new.cert
    assert "CA rotation" in str(member_renewal_reason(secret, pod, old.cert, "", NOW, 33, both))
    secret["data"]["ca.crt"] = _b64(new.cert + old.cert)  # the order does not matter
    assert member_renewal_reason(secret, pod, old.cert, "", NOW, 33, both) is None
    assert "not signed" in str(member_renewal_reason(secret, pod, new.cert, "", NOW, 33, both))
    trust = member_trust(pod, secret, tls.split_bundle(both))
    assert trust.settled and trust.leaf_issuer == tls.ca_id(old.cert) and len(trust.bundle) == 2
