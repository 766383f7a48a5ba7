"""hypernodes-dist: function graphs over very large batches, on local, Dask and Daft engines."""
