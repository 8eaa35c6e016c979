"""The runtime half of pipe: everything that touches Spark, files, S3 or SQS.

It reads only the Plan (compiler.plan), never the project's YAML. Importing this package must
not import pyspark; modules that need Spark import it themselves."""
