#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs docs/DEPLOY.md's Spark SQL, as written, on a dataset made by
# `magnet export --format parquet --dataset DIR`, with Apache Spark in local
# mode (pip pyspark and a JRE: apt-get install default-jre-headless). Too
# slow for CI (Spark's start alone takes tens of seconds); run it by hand:
#   scripts/spark-dataset.sh DIR             # a dataset you have
#   scripts/spark-dataset.sh                 # makes one from synthetic traces
# It fails if a statement fails, a query's figures differ from DuckDB's
# on the same dataset, or Spark reads a column as decimal, the timestamps
# otherwise, or the tables without their host and date partitions.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -c 'import pyspark' 2>/dev/null || python3 -m pip install --quiet pyspark 2>/dev/null ||
	python3 -m pip install --quiet --break-system-packages pyspark
command -v java >/dev/null || apt-get install -y -qq default-jre-headless >/dev/null
python3 -c 'import duckdb' 2>/dev/null || python3 -m pip install --quiet duckdb 2>/dev/null ||
	python3 -m pip install --quiet --break-system-packages duckdb

dir=${1:-}
if [ -z "$dir" ]; then
	dir=$(mktemp -d)
	trap 'rm -rf "$dir"' EXIT
	MAGNET_DATASET_KEEP="$dir" go test -count=1 -run 'TestDatasetDuckDB$' ./internal/export/ >/dev/null
fi
dir=$(cd "$dir" && pwd)

python3 - "$dir" <<'PY'
import re, sys, duckdb
from pyspark.sql import SparkSession
d = sys.argv[1]
doc = open("docs/DEPLOY.md").read()
block = doc.split("**Spark or Trino, for the whole site.**", 1)[1].split("```sql\n", 1)[1].split("```", 1)[0]
stmts = [s.strip() for s in block.split(";") if s.strip()]
spark = (SparkSession.builder.master("local[2]").appName("magnet-dataset")
         .config("spark.sql.warehouse.dir", d + "/.spark-warehouse")
         .config("spark.ui.enabled", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
results = []
for s in stmts:
    s = s.replace("DATASET", d)
    print("spark>", s.splitlines()[0][:100])
    rows = spark.sql(s).collect()
    results.append(rows)
# The sums of the first query against DuckDB's on the same files.
sent = {}
for r in results[4]:
    sent[r["host"]] = sent.get(r["host"], 0) + (r["app_bytes_sent"] or 0)
con = duckdb.connect()
want = dict(con.execute(f"SELECT host, sum(size) FROM read_parquet('{d}/events/*/*/*.parquet', hive_partitioning = true) WHERE event = 'sock_send' GROUP BY ALL").fetchall())
assert sent == {k: int(v) for k, v in want.items()}, (sent, want)
# Spark's own reading of the columns: partitioned by host and date, a
# timestamp beside time_ns, and no decimal(20,0) (an unsigned 64-bit column).
for table, stamp in (("magnet_events", "ts"), ("magnet_conns", "open_ts")):
    types = {f.name: f.dataType.simpleString() for f in spark.table(table).schema.fields}
    assert not [c for c, t in types.items() if t.startswith("decimal")], (table, types)
    assert types.get(stamp) == "timestamp" and types.get("host") == "string" and "date" in types, (table, types)
    assert spark.sql(f"SHOW PARTITIONS {table}").count() > 0, table
    print("spark: %s: %d columns, none decimal; %s timestamp; partitions by host and date" % (table, len(types), stamp))
print("spark: %d statements ran; bytes sent per host as DuckDB: %s" % (len(stmts), sent))
PY
