"""Where map results go: the sink protocols (``base.py``), the Parquet dataset an ``into=``
map writes (``parquet.py``) and the Python -> Arrow output typing (``arrow_types.py``).
Importing this package loads pyarrow; ``import hypernodes_dist`` does not import it."""
