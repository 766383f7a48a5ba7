"""``@node(batch_api=True, online_after=...)``: what is checked when the node is made, when
the graph is built and when the map starts (before anything runs)."""

from __future__ import annotations

import shutil

import pyarrow.dataset as ds
import pytest

from hypernodes_dist import DiskCache, Graph, node, resource
from hypernodes_dist.batchapi import UnsupportedClientError
from hypernodes_dist.errors import GraphBuildError
from tests.conformance.batch_api_graphs import label_async, oa_async


@resource
def notaclient():
    return object()


def _f(text: str, notaclient) -> str:
    return text


@pytest.mark.parametrize("options, match", [
    ({"batch_api": True, "online_after": 0}, "online_after must be a number of seconds > 0"),
    ({"batch_api": True, "online_after": "1h"}, "online_after must be"),
    ({"online_after": 60}, "online_after applies to batch_api=True nodes"),
    ({"batch_api": "yes"}, "batch_api must be True or False"),
    ({"batch_api": True, "batch_size": 4}, "no streaming, no batch_size"),
])
def test_bad_options_fail_when_the_node_is_made(options, match):
    with pytest.raises(ValueError, match=match):
        node(_f, output_name="y", **options)


def test_a_batch_api_node_needs_a_client_from_a_resource():
    @node(output_name="y", batch_api=True)
    def alone(text: str) -> str:
        return text

    with pytest.raises(GraphBuildError, match="'alone': batch_api=True .* @resource"):
        Graph([alone])


def test_the_map_checks_its_folder_and_clients_before_anything_runs(tmp_path):
    ran = []

    @node(output_name="y", batch_api=True)
    def label(text: str, notaclient) -> str:
        ran.append(text)
        return text

    with pytest.raises(ValueError, match="into= .* or a cache"):
        Graph([notaclient, label]).map({"text": ["a"]}, map_over="text")
    graph = Graph([notaclient, label], cache=DiskCache(tmp_path / "c"))
    with pytest.raises(UnsupportedClientError, match="node 'label', resource 'notaclient'"):
        graph.map({"text": ["a"]}, map_over="text")
    assert ran == []
    assert node(_f, output_name="y", batch_api=True, online_after=90).online_after == 90.0


def test_a_map_run_again_after_its_folder_is_deleted_starts_afresh(batch_fake, tmp_path):
    """The same process, the same into= folder deleted between two runs: the second run
    records, submits and writes every row again (as a new process would), instead of
    reading answers its process still indexed from files that are gone."""
    graph = Graph([oa_async, label_async])
    texts = [f"afresh {i}" for i in range(12)]
    out = tmp_path / "out"
    for run in (1, 2):
        res = graph.map({"base_url": batch_fake.base_url, "text": texts}, map_over="text",
                        into=str(out))
        assert res.rows == 12 and ds.dataset(out).count_rows() == 12
        assert {r for r, _ in batch_fake.counts().values()} == {run}
        if run == 1:
            shutil.rmtree(out)
