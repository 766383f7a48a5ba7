"""Dataset maps read and write object-store URIs (``s3://...``) through ``pyarrow.fs``:
an S3-compatible endpoint on 127.0.0.1 (moto's server, an emulator) started by the test."""

from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from hypernodes_dist import Graph, GraphEngine
from tests.conformance import dataset_graphs as D
from tests.fresh import S3_ENV


@pytest.fixture
def s3(monkeypatch):
    """``(uri of a bucket prefix, its pyarrow filesystem)``."""
    server_mod = pytest.importorskip("moto.server")
    for name, value in S3_ENV.items():
        monkeypatch.setenv(name, value)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        fs = pafs.S3FileSystem(endpoint_override=f"http://{host}:{port}", scheme="http",
                               region="us-east-1", allow_bucket_creation=True)
        fs.create_dir("hn-data")
        query = f"?endpoint_override=http://{host}:{port}&scheme=http&region=us-east-1"
        yield (lambda path: f"s3://hn-data/{path}{query}"), fs
    finally:
        server.stop()


def _engines():
    from hypernodes_daft import DaftEngine
    from hypernodes_dask import DaskEngine

    return [GraphEngine(), DaskEngine(scheduler="threads", partition_size=7, num_workers=2),
            DaskEngine(scheduler="processes", partition_size=7, num_workers=2),
            DaftEngine(batch_size=7)]


@pytest.mark.slow
def test_source_and_into_on_an_object_store(s3):
    uri, fs = s3
    texts = D.texts(30)
    for f, (lo, hi) in enumerate([(0, 17), (17, 30)]):
        pq.write_table(pa.table({"body": texts[lo:hi]}), f"hn-data/src/part-{f}.parquet",
                       filesystem=fs, row_group_size=5)
    for k, engine in enumerate(_engines()):
        name = f"{engine.name}-{k}"
        out = uri(f"out-{name}")
        g = Graph(D.ENRICH, engine=engine)
        res = g.map(source=uri("src"), columns={"text": "body"}, into=out)
        table = res.to_arrow().sort_by("_hn_row")
        assert table.column("_hn_row").to_pylist() == list(range(30))
        assert table.column("clean").to_pylist() == [D.expected(t)["clean"] for t in texts]
        names = [i.base_name for i in fs.get_file_info(
            pafs.FileSelector(f"hn-data/out-{name}"))]
        assert "_hn_manifest.json" in names and not any(n.startswith(".hn-tmp") for n in names)
        again = g.map(source=uri("src"), columns={"text": "body"}, into=out)  # all parts kept
        assert again.rows == 30
        engine.close()
