"""Builds, side by side, the environments the tests use and git ignores: the cluster nodes'
Python (.cluster/), Java Hudi's bundles and its pyspark 3.5 venv (.java-hudi/), the s3a jars
(.s3a/), Apache Kafka's, Kafka Connect's with Debezium's, Apicurio Registry (.kafka/). They are
downloads and installs (pip, Maven), not tests: run before `pytest` (the README's test command and
.ci/run do), they overlap one another and leave the test session's time to the tests. Each is also
built on first use by the tests that need it, under the same file lock, so `pytest` alone works on
a fresh machine too; when everything is there this takes a second.

`python -m tests.setup_envs`: exit 1, naming the environment, when one cannot be built."""

from __future__ import annotations

import concurrent.futures
import sys
import time

# imported here, before the threads start: two threads importing modules that share imports can
# see one half initialised ("partially initialized module 'typing'"), as a first CI run did
import pyspark  # noqa: F401 - the cluster's and s3a's set-ups ask it for its version

from tests.cluster import env as cluster_env
from tests.java_hudi import env as java_hudi_env
from tests.kafka import connect as kafka_connect
from tests.kafka import env as kafka_env
from tests.registry import env as registry_env
from tests.s3a import env as s3a_env


def _cluster() -> str:
    cluster_env.ensure()
    return f"executors' Python {cluster_env.PYSPARK_ONLY.python}"


def _java_hudi() -> str:
    bundles = java_hudi_env.ensure()
    return f"Java Hudi {', '.join(b.hudi for b in bundles)} on pyspark {java_hudi_env.PYSPARK}"


def _s3a() -> str:
    return f"{len(s3a_env.jars())} s3a jars in {s3a_env.folder()}"


def _kafka() -> str:
    return f"Apache Kafka {kafka_env.VERSION} in {kafka_env.jars()}"


def _debezium() -> str:
    return (f"Kafka Connect {kafka_connect.KAFKA_VERSION} and Debezium {kafka_connect.DEBEZIUM_VERSION} "
            f"(with Apicurio's Avro converter {kafka_connect.APICURIO_VERSION}) in {kafka_connect.jars()}")


def _registry() -> str:
    return f"Apicurio Registry {registry_env.VERSION} in {registry_env.jars()}"


BUILDS = {"cluster": _cluster, "java-hudi": _java_hudi, "s3a": _s3a, "kafka": _kafka, "debezium": _debezium,
          "registry": _registry}


def main() -> int:
    started = time.monotonic()
    failed = []
    with concurrent.futures.ThreadPoolExecutor(len(BUILDS)) as pool:
        futures = {name: pool.submit(build) for name, build in BUILDS.items()}
        for name, future in futures.items():
            try:
                print(f"{name}: {future.result()}", flush=True)
            except Exception as exc:  # a SetupError of the environment's own module, or what pip/mvn raised
                failed.append(name)
                print(f"{name}: could not be set up: {exc}", file=sys.stderr, flush=True)
    print(f"test environments {'incomplete' if failed else 'ready'} after {time.monotonic() - started:.1f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
