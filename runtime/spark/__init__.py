"""pipe's plumbing to Spark, in layers that import only downwards:

- `info`: what a session is and offers (classic or Spark Connect, its settings, its cores);
- `settings`: the settings a JVM of pipe's starts with, handed over in a private file;
- `java`: the Java that Spark runs on, found and checked, and a JVM of pipe's own without Spark;
- `class_archive`: the driver's classes mapped from a CDS archive (a faster JVM start);
- `cluster`: pipe's code and Python shipped to a cluster's executors, and checked there;
- `server`: pipe's own Spark Connect server (`pipe server start`);
- `connect`: a Spark Connect client session, and the step sessions of pipe's own server;
- `session`: the one SparkSession of a process, classic or Connect (`get_spark`);
- `api`: what the rest of pipe asks of any session beyond DataFrames and SQL.

Errors a user acts on are runtime/errors.py's, below all of them."""
