"""The options of the JVMs the tests start; why each is there: tests/conftest.py."""

SERIAL_GC = "-XX:+UseSerialGC"  # every JVM of the tests
FIRST_TIER_JIT = "-XX:TieredStopAtLevel=1"  # pipe's own, the cluster's daemons, the Hive metastore; not Java Hudi's
SHORT_LIVED = f"{FIRST_TIER_JIT} {SERIAL_GC}"
