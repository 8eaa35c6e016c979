"""`kind: s3_events`: S3 event notifications read from an SQS queue, for the S3 metadata table.

Hudi's S3EventsSource, declaratively. One run:

1. receives messages (`max_messages_per_batch` per call) until the queue is drained or
   `max_messages_per_run` is reached, keeping every received message invisible to other
   readers (its visibility is extended while the run holds it);
2. parses each message: S3 event JSON (`Records[]`), also inside an SNS envelope; `s3:TestEvent`
   messages carry no record and are simply acknowledged; a message that is not an S3 event
   notification is *malformed*;
3. offers the records as a DataFrame (columns `COLUMNS`) to the one table that reads the source,
   which upserts them (keyed by object key and event name, partitioned by bucket, `event_time`
   as precombine: a redelivered message upserts the same keys again);
4. after that table's commit has completed, deletes the messages it holds from the queue
   (batched, 10 per call). A run that fails deletes nothing: the messages come back after the
   visibility timeout, and nothing was committed.

Malformed messages are reported (count and a sample) and left in the queue; once one has been
received `max_receive_count` times it is written to the source's dead-letter table
(`<lake>/<source>_dead_letter`, a pipe table keyed by message id) and deleted, so one bad message
never blocks the pipeline.

Only SQS messages (metadata) pass through the driver; the objects are read by `s3_incremental`."""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from runtime.sources import Pending, SourceError

COLUMNS = (
    ("bucket", "STRING"),
    ("object_key", "STRING"),
    ("object_size", "BIGINT"),
    ("etag", "STRING"),
    ("sequencer", "STRING"),
    ("version_id", "STRING"),
    ("event_name", "STRING"),
    ("event_time", "TIMESTAMP"),
    ("region", "STRING"),
    ("message_id", "STRING"),
)
DDL = ", ".join(f"{n} {t}" for n, t in COLUMNS)
DEAD_LETTER_SUFFIX = "_dead_letter"
DEAD_LETTER_DDL = "message_id STRING, source STRING, queue_url STRING, receive_count INT, sent_time TIMESTAMP, dead_lettered_at TIMESTAMP, error STRING, body STRING"
# after the first message of a run, receives wait at most this long: a run ends soon after the
# queue is drained instead of waiting a whole long poll for the last, empty answer
DRAIN_WAIT_S = 1


class MalformedMessage(ValueError):
    """A message that is not an S3 event notification."""


@dataclass
class Message:
    id: str
    receipt: str
    body: str
    receive_count: int
    sent_ms: int | None
    records: list[dict] = field(default_factory=list)
    error: str | None = None  # why it is malformed

    @property
    def malformed(self) -> bool:
        return self.error is not None


def _parse_time(text: Any) -> dt.datetime:
    if not isinstance(text, str):
        raise MalformedMessage(f"eventTime {text!r} is not a timestamp")
    try:
        t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise MalformedMessage(f"eventTime {text!r} is not an ISO-8601 timestamp") from exc
    return (t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)).astimezone(dt.timezone.utc)  # aware: Spark keeps the instant


def parse_body(body: str, message_id: str = "") -> list[dict]:
    """The S3 event records of one SQS message body: [] for an `s3:TestEvent`, raises
    MalformedMessage for anything that is not an S3 event notification."""
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise MalformedMessage(f"not JSON ({exc})") from exc
    if isinstance(doc, dict) and doc.get("Type") == "Notification" and "Message" in doc:  # SNS envelope
        try:
            doc = json.loads(doc["Message"])
        except (TypeError, ValueError) as exc:
            raise MalformedMessage(f"SNS notification whose Message is not JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise MalformedMessage("not a JSON object")
    if doc.get("Event") == "s3:TestEvent":
        return []
    records = doc.get("Records")
    if not isinstance(records, list) or not records:
        raise MalformedMessage("no Records[] (not an S3 event notification)")
    out = []
    for i, r in enumerate(records):
        try:
            s3 = r["s3"]
            obj = s3["object"]
            bucket = s3["bucket"]["name"]
            key = urllib.parse.unquote_plus(obj["key"])
            name = r["eventName"]
            when = _parse_time(r["eventTime"])
        except (KeyError, TypeError) as exc:
            raise MalformedMessage(f"record {i} lacks {exc} (needs eventName, eventTime, s3.bucket.name, s3.object.key)") from exc
        size = obj.get("size")
        if size is not None and not isinstance(size, int):
            raise MalformedMessage(f"record {i}: s3.object.size {size!r} is not a number")
        out.append({
            "bucket": str(bucket), "object_key": key, "object_size": size, "etag": obj.get("eTag"),
            "sequencer": obj.get("sequencer"), "version_id": obj.get("versionId"),
            "event_name": str(name), "event_time": when, "region": r.get("awsRegion"), "message_id": message_id,
        })
    return out


def sqs_client(config: Mapping[str, Any]):
    import boto3

    kwargs = {}
    if config.get("region"):
        kwargs["region_name"] = config["region"]
    if config.get("endpoint_url"):
        kwargs["endpoint_url"] = config["endpoint_url"]
    return boto3.client("sqs", **kwargs)


def _aws_error(name: str, action: str, exc: Exception, config: Mapping[str, Any]) -> SourceError:
    code = getattr(exc, "response", {}).get("Error", {}).get("Code") if hasattr(exc, "response") else None
    text = f"{code}: {exc}" if code else str(exc)
    hint = ("check queue_url, region and endpoint_url of the source, and that the credentials may sqs:ReceiveMessage, "
            "sqs:DeleteMessage, sqs:ChangeMessageVisibility and sqs:GetQueueAttributes on the queue")
    if type(exc).__name__ == "NoRegionError":
        hint = "set `region` on the source (or AWS_DEFAULT_REGION)"
    if type(exc).__name__ in ("NoCredentialsError", "PartialCredentialsError"):
        hint = "set AWS credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, a profile or an instance role)"
    return SourceError(f"source {name}: cannot {action} queue {config['queue_url']} ({text})", hint)


class _VisibilityKeeper(threading.Thread):
    """Extends the visibility of the messages a run holds, so none comes back to another reader
    (or to this run's own later receives) while the run is still working on it. Each message is
    renewed once half its timeout has passed since it was received or last renewed, so a sweep
    only touches the messages that need it."""

    def __init__(self, client, queue_url: str, timeout_s: int):
        super().__init__(daemon=True, name="pipe-sqs-visibility")
        self.client, self.queue_url, self.timeout_s = client, queue_url, timeout_s
        self.held: dict[str, list] = {}  # message id -> [latest receipt handle, monotonic time of the last (re)new]
        self.lock = threading.Lock()
        self.stopped = threading.Event()

    def hold(self, messages: list[Message]) -> None:
        now = time.monotonic()
        with self.lock:
            for m in messages:
                self.held[m.id] = [m.receipt, now]

    def release(self, ids) -> None:
        with self.lock:
            for i in ids:
                self.held.pop(i, None)

    def run(self) -> None:
        half = self.timeout_s / 2
        while not self.stopped.wait(min(5.0, max(0.5, half / 4))):
            now = time.monotonic()
            with self.lock:
                due = [(i, r) for i, (r, t) in self.held.items() if now - t >= half]
            for chunk in _chunks(due, 10):
                if self.stopped.is_set():
                    return
                try:
                    self.client.change_message_visibility_batch(
                        QueueUrl=self.queue_url,
                        Entries=[{"Id": str(n), "ReceiptHandle": r, "VisibilityTimeout": self.timeout_s} for n, (_, r) in enumerate(chunk)])
                except Exception:  # noqa: BLE001 - best effort: a message that reappears is upserted again
                    continue
                renewed = time.monotonic()
                with self.lock:
                    for i, r in chunk:
                        if i in self.held and self.held[i][0] == r:
                            self.held[i][1] = renewed

    def stop(self) -> None:
        self.stopped.set()


def _chunks(items: list, n: int):
    for i in range(0, len(items), n):
        yield items[i:i + n]


def receive(client, config: Mapping[str, Any], on_batch: Callable[[list[Message]], None] | None = None) -> list[Message]:
    """Messages until the queue is drained or `max_messages_per_run` is reached. A message
    received twice in one run (its visibility ran out) is kept once, with its newest handle."""
    limit = config.get("max_messages_per_run")
    per_call = int(config.get("max_messages_per_batch") or 5)
    wait = int(config.get("long_poll_wait_s") if config.get("long_poll_wait_s") is not None else 20)
    visibility = int(config.get("visibility_timeout_s") if config.get("visibility_timeout_s") is not None else 30)
    got: dict[str, Message] = {}
    while limit is None or len(got) < limit:
        ask = per_call if limit is None else max(1, min(per_call, limit - len(got)))
        answer = client.receive_message(
            QueueUrl=config["queue_url"], MaxNumberOfMessages=ask, WaitTimeSeconds=wait, VisibilityTimeout=visibility,
            MessageSystemAttributeNames=["ApproximateReceiveCount", "SentTimestamp"])
        batch, again = [], []
        for m in answer.get("Messages", []):
            attrs = m.get("Attributes") or {}
            msg = Message(m["MessageId"], m["ReceiptHandle"], m.get("Body", ""), int(attrs.get("ApproximateReceiveCount", 1)),
                          int(attrs["SentTimestamp"]) if attrs.get("SentTimestamp") else None)
            if msg.id not in got:
                batch.append(msg)
            else:  # its visibility ran out and it came back: only the newest handle deletes it
                got[msg.id].receipt = msg.receipt
                again.append(got[msg.id])
        if on_batch and (batch or again):
            on_batch(batch + again)
        if not batch:
            break  # drained (or only messages this run already holds came back)
        for msg in batch:
            got[msg.id] = msg
        wait = min(wait, DRAIN_WAIT_S)
    return list(got.values())


def approximate_count(client, config: Mapping[str, Any]) -> int:
    attrs = client.get_queue_attributes(QueueUrl=config["queue_url"], AttributeNames=["ApproximateNumberOfMessages"])
    return int(attrs.get("Attributes", {}).get("ApproximateNumberOfMessages", 0))


class S3EventsPending(Pending):
    """The messages one run received. `finish()` must be called once the consuming table's
    write is over, committed or not: it deletes what was committed and lets the rest go."""

    def __init__(self, name: str, config: Mapping[str, Any], client, messages: list[Message], keeper: _VisibilityKeeper | None,
                 dry_run_count: int | None = None):
        records = [r for m in messages if not m.malformed for r in m.records]
        self.messages = messages
        self.records = records
        self.config = config
        self.client = client
        self.keeper = keeper
        self.dry_run_count = dry_run_count
        self.malformed = [m for m in messages if m.malformed]
        self.dead_lettered: list[Message] = []
        self.deleted = 0
        self.delete_failures = 0
        if dry_run_count is not None:
            checkpoint = "?" if dry_run_count else None
            super().__init__(name, checkpoint, dry_run_count)
        else:
            good = [m for m in messages if not m.malformed]
            checkpoint = None
            if records:
                checkpoint = json.dumps({"v": 1, "messages": len(good), "records": len(records),
                                         "last_sent_ms": max((m.sent_ms or 0) for m in good)}, separators=(",", ":"))
            super().__init__(name, checkpoint, len(messages))
            self.rows = len(records)

    def describe(self) -> str:
        if self.dry_run_count is not None:
            return f"about {self.dry_run_count} message{'s' if self.dry_run_count != 1 else ''} waiting in the queue" if self.dry_run_count else "queue empty"
        if not self.messages:
            return "queue empty"
        text = f"{len(self.messages)} message{'s' if len(self.messages) != 1 else ''}, {len(self.records)} event{'s' if len(self.records) != 1 else ''}"
        if self.malformed:
            sample = self.malformed[0]
            text += f"; {len(self.malformed)} malformed (left in the queue), e.g. message {sample.id}: {sample.error}"
        if self.dead_lettered:
            text += f"; {len(self.dead_lettered)} moved to the dead-letter table {self.name}{DEAD_LETTER_SUFFIX}"
        if self.delete_failures:
            text += f"; {self.delete_failures} could not be deleted from the queue (they come back and are upserted again)"
        return text

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        if self.dry_run_count is None:
            d.update({"messages": len(self.messages), "malformed": len(self.malformed), "dead_lettered": len(self.dead_lettered),
                      "deleted": self.deleted, "delete_failures": self.delete_failures})
        return d

    def dataframe(self, spark):
        return spark.createDataFrame(self.records, DDL)

    # --- after the write -----------------------------------------------------------------------

    def finish(self, committed: bool, succeeded: bool, dead_letter: Callable[[list[Message]], None] | None = None) -> None:
        """`committed`: the commit holding the records has completed. `succeeded`: the step did
        not fail (it may have had nothing to commit). Deletes from SQS only what is safe to."""
        try:
            if self.dry_run_count is not None:
                return
            good = [m for m in self.messages if not m.malformed]
            if committed:
                from runtime.table.services import fault

                fault("before_sqs_delete")  # tests: the commit is complete, the queue still holds its messages
                self._delete(good)
            elif succeeded and not self.records:
                self._delete(good)  # only test events: nothing to keep
            elif not succeeded:
                # the step failed before its commit (Spark did not start, a bad input file, ...):
                # the messages go back to the queue now, for the next run, not when their
                # visibility timeout ends
                self._release(good)
            if succeeded and self.malformed:
                limit = int(self.config.get("max_receive_count") or 5)
                due = [m for m in self.malformed if m.receive_count >= limit]
                if due and dead_letter is not None:
                    dead_letter(due)  # raises if the dead-letter table cannot be written: nothing deleted
                    self.dead_lettered = due
                    self._delete(due)
                self._release([m for m in self.malformed if m not in due])
        finally:
            if self.keeper is not None:
                self.keeper.stop()

    def _delete(self, messages: list[Message]) -> None:
        if self.keeper is not None:
            self.keeper.release(m.id for m in messages)
        for chunk in _chunks(messages, 10):
            try:
                answer = self.client.delete_message_batch(
                    QueueUrl=self.config["queue_url"], Entries=[{"Id": str(i), "ReceiptHandle": m.receipt} for i, m in enumerate(chunk)])
                self.deleted += len(answer.get("Successful", []))
                self.delete_failures += len(answer.get("Failed", []))
            except Exception:  # noqa: BLE001 - redelivered messages upsert the same keys again
                self.delete_failures += len(chunk)

    def _release(self, messages: list[Message]) -> None:
        """Malformed messages become visible again at once (their receive count grows each time)."""
        if self.keeper is not None:
            self.keeper.release(m.id for m in messages)
        for chunk in _chunks(messages, 10):
            try:
                self.client.change_message_visibility_batch(
                    QueueUrl=self.config["queue_url"],
                    Entries=[{"Id": str(i), "ReceiptHandle": m.receipt, "VisibilityTimeout": 0} for i, m in enumerate(chunk)])
            except Exception:  # noqa: BLE001 - they come back after the visibility timeout instead
                pass


def pending(name: str, config: Mapping[str, Any], dry_run: bool = False) -> S3EventsPending:
    """Receives this run's messages (a dry run only asks how many wait)."""
    if dry_run:
        try:
            client = sqs_client(config)
            return S3EventsPending(name, config, client, [], None, dry_run_count=approximate_count(client, config))
        except Exception as exc:  # noqa: BLE001 - botocore's errors: unreachable queue, credentials
            raise _aws_error(name, "read the attributes of", exc, config) from exc
    try:
        client = sqs_client(config)
    except Exception as exc:  # noqa: BLE001 - no region, bad endpoint
        raise _aws_error(name, "reach", exc, config) from exc
    visibility = int(config.get("visibility_timeout_s") if config.get("visibility_timeout_s") is not None else 30)
    keeper = _VisibilityKeeper(client, config["queue_url"], visibility) if visibility > 0 else None
    if keeper is not None:
        keeper.start()
    try:
        messages = receive(client, config, on_batch=keeper.hold if keeper is not None else None)
    except Exception as exc:  # noqa: BLE001
        if keeper is not None:
            keeper.stop()
        raise _aws_error(name, "receive messages from", exc, config) from exc
    for m in messages:
        try:
            m.records = parse_body(m.body, m.id)
        except MalformedMessage as exc:
            m.error = str(exc)
    return S3EventsPending(name, config, client, messages, keeper)


def dead_letter_rows(name: str, config: Mapping[str, Any], messages: list[Message]) -> list[dict]:
    now = dt.datetime.now(dt.timezone.utc)
    return [{
        "message_id": m.id, "source": name, "queue_url": config["queue_url"], "receive_count": m.receive_count,
        "sent_time": dt.datetime.fromtimestamp(m.sent_ms / 1000, dt.timezone.utc) if m.sent_ms else None,
        "dead_lettered_at": now, "error": m.error, "body": m.body,
    } for m in messages]

