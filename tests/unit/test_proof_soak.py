"""The soak's judge (kustos.proof.soak) and the proof report's action table (catalogue)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kustos.proof.catalogue import (
    ACTIONS,
    NODE_ACTIONS,
    PROCESS_RUNNER_ACTIONS,
    REAL_NODE_ACTIONS,
    action,
    coverage_table,
)
from kustos.proof.check import Linearizability, Verdict
from kustos.proof.soak import MIB, Sample, sample_of, soak_summary, what_grew

PROOF_TESTS = Path(__file__).resolve().parents[1] / "integration" / "test_proof.py"


def flat(n: int = 30, **rising: float) -> list[Sample]:
    """``n`` samples 10 s apart around steady levels; ``rising`` adds that much per sample."""
    samples = []
    for i in range(n):
        wobble = (-1) ** i
        samples.append(Sample(
            at=10.0 * i,
            rss=80 * MIB + wobble * MIB + i * rising.get("rss", 0),
            open_fds=40 + wobble + i * rising.get("open_fds", 0),
            tasks=60 + 3 * wobble + i * rising.get("tasks", 0),
            reconciles=20.0 * i,
            reconcile_seconds=20.0 * i * 0.05 + (i * i * rising.get("latency", 0)),
        ))  # fmt: skip
    return samples


def test_steady_levels_with_noise_are_flat() -> None:
    assert what_grew(flat()) == []


@pytest.mark.parametrize(
    ("quantity", "per_sample", "said"),
    [
        ("rss", 2 * MIB, "RSS grew from"),
        ("open_fds", 2, "open file descriptors grew from"),
        ("tasks", 3, "asyncio tasks grew from"),
        ("latency", 1.0, "mean reconcile time grew from"),
    ],
)
def test_a_steady_rise_is_named(quantity: str, per_sample: float, said: str) -> None:
    grown = what_grew(flat(**{quantity: per_sample}))
    assert len(grown) == 1 and grown[0].startswith(said), grown


def test_a_rise_within_the_margin_is_noise() -> None:
    # +14 MiB over the run: more than 25% of a small process would be, but within 24 MiB.
    assert what_grew(flat(rss=0.5 * MIB)) == []


def test_too_few_samples_are_refused_not_judged() -> None:
    with pytest.raises(ValueError, match="at least 6 samples"):
        what_grew(flat(5))


def test_a_sample_sums_reconciles_over_every_controller() -> None:
    metrics = {
        "process_resident_memory_bytes": 75 * MIB,
        "process_open_fds": 31.0,
        "kustos_asyncio_tasks": 52.0,
        'controller_runtime_reconcile_time_seconds_count{controller="etcdcluster"}': 10.0,
        'controller_runtime_reconcile_time_seconds_count{controller="etcdbackup"}': 5.0,
        'controller_runtime_reconcile_time_seconds_sum{controller="etcdcluster"}': 1.5,
        'controller_runtime_reconcile_time_seconds_sum{controller="etcdbackup"}': 0.5,
        'controller_runtime_reconcile_time_seconds_bucket{controller="etcdcluster",le="0.1"}': 9.0,
    }
    assert sample_of(3.0, metrics) == Sample(3.0, 75 * MIB, 31.0, 52.0, 15.0, 2.0)


def test_the_summary_compares_the_first_and_last_thirds() -> None:
    summary = soak_summary(flat(rss=2 * MIB))
    assert summary.startswith("over 290 s, 30 samples: RSS ") and "mean reconcile" in summary


def verdict(scenario: str, result: str = "Ok") -> Verdict:
    return Verdict(scenario, 100, 4, 50.0, "x", Linearizability(result, 100, 0.1))  # type: ignore[arg-type]


def test_the_action_table_says_what_ran_what_failed_and_what_is_missing() -> None:
    table = coverage_table([
        verdict(action("pod-deleted").title),
        verdict(action("soak").title), verdict(action("soak").title, "Illegal"),
    ])  # fmt: skip
    rows = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines()[2:]}
    assert rows[action("pod-deleted").title].endswith("| linearizable |")
    assert rows[action("soak").title].endswith("| 1 of 2 histories proven |")
    assert rows[action("create").title].endswith("| not run |")
    assert "the documented exception" in rows[action("restore").title]
    assert len(rows) == len(ACTIONS)


def test_every_action_with_a_scenario_names_a_test_that_exists() -> None:
    functions = (ast.AsyncFunctionDef, ast.FunctionDef)
    tests = {
        node.name
        for module in PROOF_TESTS.parent.glob("test_proof*.py")
        for node in ast.walk(ast.parse(module.read_text()))
        if isinstance(node, functions)
    }
    named = {a.test for a in ACTIONS if a.test is not None}
    assert named <= tests, named - tests
    assert all(a.missing for a in ACTIONS if a.test is None)


def test_each_action_is_one_row_and_its_real_node_variant_is_proven_on_real_nodes() -> None:
    """The report finds a history's action by its title, so no two actions share one; and
    each real-node entry names a test of the module that runs on real kubelet nodes."""
    titles = [a.title for a in ACTIONS]
    assert len(set(titles)) == len(titles)
    real_nodes = PROOF_TESTS.parent / "test_proof_real_nodes.py"
    tests = {node.name for node in ast.walk(ast.parse(real_nodes.read_text()))
             if isinstance(node, ast.AsyncFunctionDef)}  # fmt: skip
    assert {a.test for a in REAL_NODE_ACTIONS} <= tests


def test_the_modules_sections_list_every_action_once() -> None:
    """`make proof` writes one section per module, each listing the actions it proves: an
    action listed in another module's section showed there as "not run"."""
    sections = PROCESS_RUNNER_ACTIONS + NODE_ACTIONS + REAL_NODE_ACTIONS
    assert sorted(a.key for a in sections) == sorted(a.key for a in ACTIONS)
    nodes = (PROOF_TESTS.parent / "test_proof_nodes.py").read_text()
    assert all(a.test is not None and a.test in nodes for a in NODE_ACTIONS)
