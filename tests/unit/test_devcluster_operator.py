"""The dev cluster's chart install: where the chart is, who leads."""

from __future__ import annotations

from kustos.devcluster import operator as dev_operator


def test_the_chart_is_the_checkouts() -> None:
    chart = dev_operator.chart_dir()

    assert (chart / "Chart.yaml").is_file() and chart.parts[-3:] == ("deploy", "helm", "kustos")


def test_the_leader_is_the_pod_named_by_the_lease_holder() -> None:
    assert dev_operator.holder_pod("kustos-5d897f589-md6jc_0937427e") == "kustos-5d897f589-md6jc"
    assert dev_operator.holder_pod("no-separator") == "no-separator"
