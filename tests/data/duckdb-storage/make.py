"""Write ``written-by-<version>.duckdb.gz``: a DuckDB file made by the DuckDB this runs with.

Each file holds one table, ``notes`` (``id BIGINT``, rows 1, 2, 3), and keeps the storage
version its DuckDB writes (0.8.1: 51; 1.3.0: 64; 2.0.1: 999, its format named in the database
header). Gzipped: a DuckDB file is mostly empty blocks. Run from this folder with the python
of a venv holding that DuckDB, for example:

    python3.11 -m venv /tmp/duckdb-2.0.1 && /tmp/duckdb-2.0.1/bin/pip install duckdb==2.0.1
    /tmp/duckdb-2.0.1/bin/python make.py

The files here were written with duckdb 0.8.1, 1.3.0 and 2.0.1 from PyPI (Python 3.11).
"""

from __future__ import annotations

import gzip
import os
import shutil
import tempfile

import duckdb

folder = tempfile.mkdtemp()
path = os.path.join(folder, "file.duckdb")
conn = duckdb.connect(path)
conn.execute("CREATE TABLE notes (id BIGINT)")
conn.execute("INSERT INTO notes VALUES (1), (2), (3)")
conn.close()
name = f"written-by-{duckdb.__version__}.duckdb.gz"
with open(path, "rb") as raw, gzip.GzipFile(name, "wb", mtime=0) as packed:
    shutil.copyfileobj(raw, packed)
shutil.rmtree(folder)
print(name, os.path.getsize(name), "bytes")
