"""Chaos soak: the whole pipeline for N minutes under SIGKILLs, poison messages and Redis restarts.

    .venv/bin/python bench/chaos.py --minutes 3            # --seed S to repeat a schedule
    .venv/bin/python bench/chaos.py --minutes 10 --keep    # keep the state dir for a post-mortem
    .venv/bin/python bench/chaos.py --minutes 10 --store object   # two hosts, one object store
    .venv/bin/python bench/chaos.py --minutes 3 --refreshers 3     # a group of three refreshers

It starts its own servers through ``infra/`` (a Kafka broker and a redis-server on free loopback
ports, and an S3 server with ``--store object``; state in a temp dir under
``~/.cache/rankstream/``; all stopped by process id at the end, Ctrl-C and SIGTERM included) and
runs, all at once:

* a **producer** thread: rating events (``--rate`` per second, users and items with planted
  structure) to ``rankstream.rating`` (2 partitions), ~10% outcome events to
  ``rankstream.outcome``, and ~1% poison messages of several kinds (``--poison``) to both;
* an **ingest child** (``rankstream ingest``, follow mode) SIGKILLed after a random 2-8 s and
  restarted at once (a child that exits by itself is a crash and is counted apart);
* a **retrain loop**: ``rankstream train movies --config CONFIG`` children (a small AltSVM, the
  gate's tolerance wide open so that every new window publishes), a third of them SIGKILLed at a
  random moment;
* a **refresher child** (``rankstream refresh movies``: its own consumer group) SIGKILLed a
  random 5-15 s after it first writes its stats and restarted at once; it rewrites each touched
  user's list with the served version's fold-in from their whole history, heals a model whose
  ``current`` vanished, and writes its stats (``HOME/refresh/movies@*.json``), which a **lag
  watcher** thread reads; with ``--refreshers N``, N - 1 more in its group, never killed (the
  rating topic then has a partition per refresher at least, and every event is keyed by its
  user as ``rankstream produce`` keys it, so a user's events reach one refresher);
* **lookup threads** calling ``TopK.recommend`` (and ``recommend_many`` for 8 users)
  continuously, for known users and unknown ones;
* a **monitor** thread that polls ``current`` every 50 ms and, for each newly current version,
  reads the whole version directly from Redis (every user's list, the fallback list, the item
  ids) and the window it was trained on (the run directory whose ``train.json`` has the
  version's ``trained_at``: its dataset manifest holds the store offsets it was built from);
* **Redis restarts** every ``--redis-every`` seconds on average: ``infra/redis/stop.sh`` and
  ``start.sh`` on the same port. The server has no persistence, so everything published is gone
  and the retrain loop has to publish again; lookups fail meanwhile, and how long is measured.

At the end the producer stops, the follow-mode ingest child is killed and ``rankstream ingest
--until-end`` drains the topics, one last retrain runs unkilled, and the script waits (up to
``--settle`` seconds) for ``current`` to cover every rating event. A last probe restarts Redis
once more with no new event anywhere and runs one retrain: the model must come back although its
window is unchanged (reported, not part of the exit status). Then every known user gets one more
rating (the **final touch**), the refresher (no longer killed) applies them, ingest drains them,
and every user's final list is checked (*missing effects*, below). Then it prints what it saw
and exits with status 1 if any event was lost or duplicated, any lookup answer was torn, any
event's effect is missing or the refresh lag did not come back after a fault (2 if the harness
itself failed, 130 on Ctrl-C; the state directory is kept unless the run passed).

Object-store mode (``--store object``)
--------------------------------------
An S3 server (``infra/s3``, SeaweedFS) is started with the other servers and stopped with them;
every child gets ``RANKSTREAM_STORE=s3://bench/chaos-<uuid>``, so the event store, dead letters,
run directories and checkpoints are all in the object store. Two simulated hosts, A and B, each
with a HOME of its own (its local working copies), take turns: ingest children alternate between
them, and so do retrain runs, so every warm start comes through the object store's committed
checkpoints and a killed run's leftovers on one host are invisible to the other. Every check
below then reads the object store: events, dead letters, and the run directories the monitor
matches versions with (``runs/movies/*/train.json``). Files that a killed ingest child wrote but
never committed are listed (``segments(complete=False)``) and reported, not counted.

Definitions
-----------
lost
    A valid event (one :func:`pipeline.ingest.validate.check_event` accepts; the producer
    classifies every message when it sends it) missing from the event store, or a poison message
    missing from the store's dead letters, after the final drain.
duplicated
    An event id stored more than once, or a poison message dead-lettered more than once, in the
    store (local files, or the object store's committed segments).
torn read
    A lookup answer that is not exactly (item ids and float32 scores, first k) the list the
    monitor read directly for that user in the answer's version (``source == "fallback"``:
    the version's fallback list), or a ``recommend_many`` batch whose answers name more than one
    version. Versions restart at 1 after a Redis restart, so an answer counts as whole when it
    matches the list of any version of that number; an answer of a version the monitor never
    read is *unverified* (reported; a torn-read count is only as good as that number is low).
    A ``fresh`` answer (the refresher's list) is whole when its scores are those of one user
    factor against the version's item factors (least squares over its k items, residual under
    1e-3 relative), in order, and every item that factor scores above the last one shown is an
    item the user met (the refresher left it out).
max staleness of ``current``
    For every valid rating event e: p(e) is when the producer handed it to the Kafka client;
    c(e) is the first moment the monitor saw ``current`` name a version whose training window
    contains e, i.e. whose run's dataset was built from store offsets beyond e's offset in its
    partition (held-out events count as contained: they are in the window). Staleness is
    c(e) - p(e); the maximum over all rating events is printed, with the median. Resolution:
    the 50 ms poll. Events no version ever covered are counted apart with their age at the end.
missing effects
    After the final touch: a user with streamed events whose answer is not ``fresh`` under the
    current version, names an item they met, or is not the fold-in over their whole history (the
    event store after the last drain; :func:`pipeline.refresh.refresher.user_factor`) against
    the current version: the same items, scores within 1e-4 relative.
refresh lag after a fault
    Faults: refresher and ingest SIGKILLs, Redis restarts, versions going live. From the
    refresher's stats (rewritten every 2 s; the lag histogram of the events refreshed between two
    writes), a fault has recovered when a later interval, starting after it, refreshed events
    and all of them within 2 s; it must within 30 s. Faults in the last 30 s of the chaos are
    not judged.
lookup outage
    From the first failed lookup after a success to the next answered one, per lookup thread;
    the longest and the total are printed with the failure types.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline.ingest.codec import decode, encode_json, is_batch  # noqa: E402
from pipeline.ingest.producer import user_key  # noqa: E402
from pipeline.ingest.validate import check_event  # noqa: E402
from pipeline.serving.layout import PAIR_DTYPE, ModelKeys  # noqa: E402

MODEL, NAMESPACE = "movies", "rankstream"
TOPICS = {"rankstream.rating": 2, "rankstream.outcome": 1}
DEAD_LETTER_TOPIC = "rankstream.dead-letter"
N_USERS, N_ITEMS, N_UNKNOWN = 300, 200, 30
CONFIG = """\
[models.movies]
algorithm = "altsvm"
kinds = ["rating"]
window = {}
evaluation = { split = "per_user_last", holdout = 2, k = 10, relevance = 4.0, \
metric = "ndcg@10", seed = 0 }
gate = { tolerance = 1.0, trivial_margin = -1.0 }   # chaos measures the pipeline: publish
publish = { top_k = 20, keep_versions = 3 }

[models.movies.params]
rank = 4
reg_ratio = 0.3
item_bias = true
max_iter = 10
random_state = 0
max_pairs_per_user = 50
"""


def log(msg: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- servers


class Servers:
    """A Kafka broker, a redis-server and (``s3=True``) an S3 server started through
    ``infra/``, stopped by pid."""

    def __init__(self, state: Path, s3: bool = False):
        from tests.servers import free_port, free_port_block

        self.state = state
        self.kafka_port, self.redis_port = free_port(pair=True), free_port()
        self.kafka_env = {**os.environ, "RANKSTREAM_KAFKA_PORT": str(self.kafka_port),
                          "RANKSTREAM_KAFKA_DIR": str(state / "kafka")}
        self.redis_env = {**os.environ, "RANKSTREAM_REDIS_PORT": str(self.redis_port),
                          "RANKSTREAM_REDIS_DIR": str(state / "redis")}
        # the S3 gateway's port and the next three (master, volume, filer), each + 10000 (gRPC)
        self.s3_port = free_port_block(4, offset=10000) if s3 else None
        self.s3_env = {**os.environ, "RANKSTREAM_S3_PORT": str(self.s3_port),
                       "RANKSTREAM_S3_DIR": str(state / "s3")}
        self.aws: dict[str, str] = {}     # AWS_* for clients of the S3 server, once it runs
        self.started: list[str] = []
        self.lock = threading.Lock()       # a Redis restart and the final stop never overlap
        self.closed = False

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    def _run(self, name: str, script: str, env: dict) -> None:
        # a session of its own: Ctrl-C in the terminal reaches this script only, which then
        # stops the servers by pid
        done = subprocess.run([REPO / "infra" / name / script], env=env, capture_output=True,
                              text=True, timeout=300, start_new_session=True)
        if done.returncode != 0:
            raise RuntimeError(f"infra/{name}/{script} failed ({done.returncode}):\n"
                               f"{done.stdout}{done.stderr}")

    @property
    def s3_endpoint(self) -> str | None:
        return None if self.s3_port is None else f"http://127.0.0.1:{self.s3_port}"

    def start(self) -> None:
        log(f"starting Kafka on {self.bootstrap} and Redis on {self.redis_url}"
            + (f" and S3 on {self.s3_endpoint}" if self.s3_port else "") + " (infra/) ...")
        self.started.append("kafka")      # first: an interrupted start is stopped too
        self._run("kafka", "start.sh", self.kafka_env)
        self.started.append("redis")
        self.start_redis()
        if self.s3_port is not None:
            self.started.append("s3")
            self._run("s3", "start.sh", self.s3_env)
            creds = (self.state / "s3" / "credentials.env").read_text().split()
            self.aws = {**dict(line.split("=", 1) for line in creds),
                        "AWS_ENDPOINT_URL": self.s3_endpoint, "AWS_REGION": "us-east-1"}

    def start_redis(self) -> None:
        with self.lock:
            if not self.closed:
                self._run("redis", "start.sh", self.redis_env)

    def stop_redis(self) -> None:
        with self.lock:
            self._run("redis", "stop.sh", self.redis_env)

    def stop(self) -> None:
        with self.lock:
            self.closed = True
        for name, env in (("redis", self.redis_env), ("kafka", self.kafka_env),
                          ("s3", self.s3_env)):
            if name in self.started:
                try:
                    self._run(name, "stop.sh", env)
                except Exception as err:  # keep stopping the others
                    log(f"stopping {name} failed: {err}")


# ---------------------------------------------------------------- children


@dataclass(frozen=True)
class Host:
    """A simulated machine: its own HOME (``--home``), and the environment its children get."""

    name: str
    home: Path
    env: dict

    def args(self) -> list[str]:
        return ["--home", str(self.home)]


class Children:
    """Child processes in sessions of their own, killed by pid on the way out."""

    def __init__(self, state: Path):
        self.state = state
        self.live: set[subprocess.Popen] = set()
        self.lock = threading.Lock()
        self.closed = False

    def start(self, host: Host, args: list[str], log_name: str) -> subprocess.Popen:
        """``rankstream ARGS --home HOME`` on ``host``, its output appended to ``log_name``."""
        with self.lock, open(self.state / log_name, "ab") as out:
            if self.closed:       # after kill_all() no child may start (a loop thread racing)
                raise RuntimeError("shutting down")
            out.write(f"--- {time.strftime('%H:%M:%S')} {args[0]} on host {host.name}\n"
                      .encode())
            out.flush()
            child = subprocess.Popen([sys.executable, "-m", "pipeline.cli", *args,
                                      *host.args()], cwd=REPO, env=host.env,
                                     stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
            self.live.add(child)
        return child

    def kill(self, child: subprocess.Popen, sig=signal.SIGKILL) -> None:
        if child.poll() is None:
            try:
                os.kill(child.pid, sig)
            except ProcessLookupError:
                pass
        child.wait()
        with self.lock:
            self.live.discard(child)

    def forget(self, child: subprocess.Popen) -> None:
        with self.lock:
            self.live.discard(child)

    def kill_all(self) -> None:
        with self.lock:
            self.closed = True
            children = list(self.live)
        for child in children:
            self.kill(child)

    def tail(self, log_name: str, lines: int = 12) -> str:
        try:
            text = (self.state / log_name).read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return ""
        return "\n".join(text[-lines:])


# ---------------------------------------------------------------- producer


@dataclass
class Produced:
    """What the producer sent, as the reference checks classify it."""

    valid: dict = field(default_factory=dict)      # event_id -> (topic, partition, offset, t)
    poison: dict = field(default_factory=dict)     # (topic, partition, offset) -> poison kind
    rating_times: dict = field(default_factory=lambda: defaultdict(list))  # tp -> [(off, t)]
    kinds: Counter = field(default_factory=Counter)
    users: set = field(default_factory=set)        # users of valid rating events (streamed)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _poison(kind: str, i: int, rng: random.Random, now: int) -> bytes | None:
    good = {"kind": "rating", "event_id": f"p-{i}", "ts": now, "user": "u1", "item": "m1",
            "rating": 3}
    if kind == "bad_json":
        return encode_json(good)[:-3]
    if kind == "invalid_utf8":
        return encode_json(good).replace(b'"u1"', b'"u\xff\xfe"')
    if kind == "tombstone":
        return None
    if kind == "empty":
        return b""
    if kind == "unknown_kind":
        return encode_json({**good, "kind": "click"})
    if kind == "bad_rating":
        return encode_json({**good, "rating": "five"})
    if kind == "kind_list":
        return encode_json({**good, "kind": ["rating"]})
    if kind == "huge_int":
        return encode_json({**good, "ts": "HUGE"}).replace(b'"HUGE"', b"7" * 5000)
    if kind == "deep_nesting":
        return b"[" * 3000 + b"]" * 3000
    if kind == "lone_surrogate":
        return json.dumps({**good, "event_id": f"p-{i}\ud800"}).encode()
    if kind == "far_future":
        return encode_json({**good, "ts": "9999-12-31T23:59:59Z"})
    if kind == "nul_id":
        return encode_json({**good, "user": "u\x001"})
    if kind == "msgpack_garbage":
        return b"\x81\xa5event"
    if kind == "bad_batch":
        import msgpack

        return msgpack.packb({"batch": 1, "kind": "rating", "n": 2,
                              "columns": {"event_id": [f"p-{i}"], "ts": [now, now]}})
    if kind == "oversize":
        return encode_json({**good, "pad": "x" * ((1 << 20) + rng.randrange(1, 4096))})
    raise ValueError(f"unknown poison kind {kind!r}")


POISON_KINDS = ("bad_json", "invalid_utf8", "tombstone", "empty", "unknown_kind", "bad_rating",
                "kind_list", "huge_int", "deep_nesting", "lone_surrogate", "far_future",
                "nul_id", "msgpack_garbage", "bad_batch", "oversize")


def _is_valid(value: bytes | None) -> bool:
    """Whether the reference checks accept this one-event message."""
    if value is None or len(value) > (1 << 20):
        return False
    try:
        obj, _ = decode(value)
    except Exception:
        return False
    if type(obj) is not dict or is_batch(obj):
        return False
    try:
        return check_event(obj) is None
    except Exception:
        return False


class Producer(threading.Thread):
    """Rating events at ``rate`` per second (+10% outcomes, +``poison_rate`` poison)."""

    def __init__(self, bootstrap: str, rate: float, poison_kinds: list[str], poison_rate: float,
                 seed: int, stop: threading.Event, keyed: bool = False):
        super().__init__(name="producer", daemon=True)
        self.bootstrap, self.rate, self.stop = bootstrap, rate, stop
        self.keyed = keyed      # each event keyed by its user, as `rankstream produce` sends
        self.poison_kinds, self.poison_rate = poison_kinds, poison_rate
        self.rng = random.Random(seed)
        g = np.random.default_rng(seed)
        self.user_f = g.standard_normal((N_USERS, 3))
        self.item_f = g.standard_normal((N_ITEMS, 3))
        self.out = Produced()
        self.error: BaseException | None = None

    def _rating(self, i: int, now: int) -> dict:
        u, m = self.rng.randrange(N_USERS), self.rng.randrange(N_ITEMS)
        score = 3 + 1.2 * float(self.user_f[u] @ self.item_f[m]) + self.rng.gauss(0, 0.5)
        return {"kind": "rating", "event_id": f"r-{i}", "ts": now, "user": f"u{u}",
                "item": f"m{m}", "rating": int(min(5, max(1, round(score))))}

    def _outcome(self, i: int, now: int) -> dict:
        m = self.rng.randrange(N_ITEMS)
        return {"kind": "outcome", "event_id": f"o-{i}", "ts": now, "item": f"m{m}",
                "label": int(self.rng.random() < 0.2),
                "features": {str(k): round(self.rng.random(), 4)
                             for k in self.rng.sample(range(50), 4)}}

    def run(self) -> None:
        from kafka import KafkaProducer

        # idempotent: a retried send must not store an event twice behind the harness's back
        producer = KafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=5, acks="all",
                                 enable_idempotence=True, max_request_size=4 << 20)
        tick, i = 0.05, 0
        carry = 0.0
        try:
            while not self.stop.is_set():
                started = time.monotonic()
                carry += self.rate * tick
                n, carry = int(carry), carry - int(carry)
                sent = []
                for _ in range(n):
                    i += 1
                    now = int(time.time() * 1000)
                    roll = self.rng.random()
                    if roll < self.poison_rate and self.poison_kinds:
                        kind = self.rng.choice(self.poison_kinds)
                        value, what = _poison(kind, i, self.rng, now), kind
                        topic = self.rng.choice(list(TOPICS))
                    else:
                        event = (self._outcome(i, now) if roll < self.poison_rate + 0.1
                                 else self._rating(i, now))
                        value, what = encode_json(event), event
                        topic = f"rankstream.{event['kind']}"
                    key = (b"tombstone" if value is None else
                           user_key(what) if self.keyed and isinstance(what, dict) else None)
                    sent.append((what, topic, time.time(), value,
                                 producer.send(topic, value=value, key=key)))
                producer.flush(timeout=60)
                self._record(sent)
                self.stop.wait(max(0.0, tick - (time.monotonic() - started)))
        except BaseException as err:   # reported at the end; the run goes on without events
            self.error = err
            log(f"producer failed: {type(err).__name__}: {err}")
        finally:
            producer.close(timeout=10)

    def _record(self, sent) -> None:
        with self.out.lock:
            for what, topic, t, value, future in sent:
                meta = future.get(timeout=60)
                place = (topic, meta.partition, meta.offset)
                if isinstance(what, dict) and _is_valid(value):
                    self.out.valid[what["event_id"]] = (*place, t)
                    self.out.kinds[what["kind"]] += 1
                    if what["kind"] == "rating":
                        self.out.users.add(what["user"])
                        self.out.rating_times[(topic, meta.partition)].append((meta.offset, t))
                elif isinstance(what, str) and _is_valid(value):    # poison the code accepts
                    event = decode(value)[0]
                    self.out.valid[event["event_id"]] = (*place, t)
                    if event["kind"] == "rating":
                        self.out.users.add(str(event["user"]))
                    self.out.kinds[f"{event['kind']} ({what}, accepted)"] += 1
                else:
                    self.out.poison[place] = what if isinstance(what, str) else "invalid"
                    self.out.kinds["poison"] += 1


# ---------------------------------------------------------------- the chaos loops


class ChildLoop(threading.Thread):
    """A thread that starts and kills child processes until ``stop`` is set (a RuntimeError
    from a child it was killing at the stop is no failure); each child on the next of
    ``hosts`` in turn."""

    def __init__(self, name: str, children: Children, hosts: list[Host], args: list[str],
                 rng: random.Random, stop: threading.Event):
        super().__init__(name=name, daemon=True)
        self.children, self.args, self.rng, self.stop = children, args, rng, stop
        self.hosts = hosts
        self.turns = 0
        self.per_host: Counter = Counter()     # host name -> children started there

    def next_host(self) -> Host:
        host = self.hosts[self.turns % len(self.hosts)]
        self.turns += 1
        self.per_host[host.name] += 1
        return host

    def run(self) -> None:
        try:
            self._loop()
        except RuntimeError:
            if not self.stop.is_set():
                raise

    def _loop(self) -> None:
        raise NotImplementedError


class IngestLoop(ChildLoop):
    """``rankstream ingest`` in follow mode, SIGKILLed after a random 2-8 s, restarted."""

    def __init__(self, children: Children, hosts: list[Host], args: list[str],
                 rng: random.Random, stop: threading.Event):
        super().__init__("ingest-loop", children, hosts, args, rng, stop)
        self.kills = self.crashes = 0
        self.kill_times: list[float] = []

    def _loop(self) -> None:
        while not self.stop.is_set():
            child = self.children.start(self.next_host(), ["ingest", *self.args], "ingest.log")
            self.stop.wait(self.rng.uniform(2.0, 8.0))
            if child.poll() is not None:
                self.crashes += 1
                self.children.forget(child)
                self.stop.wait(0.5)
                continue
            self.kill_times.append(time.time())
            self.children.kill(child)
            self.kills += 1


class RetrainLoop(ChildLoop):
    """``rankstream train movies`` over and over; a third of the runs SIGKILLed at random."""

    def __init__(self, children: Children, hosts: list[Host], args: list[str],
                 rng: random.Random, stop: threading.Event, kill_fraction: float = 1 / 3):
        super().__init__("retrain-loop", children, hosts, args, rng, stop)
        self.kill_fraction = kill_fraction
        self.kills = self.runs = self.failures = 0
        self.seconds: list[float] = []        # durations of the runs that were not killed

    def run_once(self, kill_after: float | None) -> int | None:
        child = self.children.start(self.next_host(), ["train", MODEL, *self.args],
                                    "train.log")
        self.runs += 1
        started = time.monotonic()
        deadline = started + (kill_after if kill_after is not None else 300)
        while child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if child.poll() is None:
            self.children.kill(child)
            self.kills += kill_after is not None
            return None
        self.children.forget(child)
        self.failures += child.returncode not in (0, 3)   # 3: the gate rejected the model
        self.seconds.append(time.monotonic() - started)
        return child.returncode

    def _loop(self) -> None:
        while not self.stop.is_set():
            kill = self.rng.random() < self.kill_fraction
            self.run_once(self.rng.uniform(0.3, 6.0) if kill else None)
            self.stop.wait(self.rng.uniform(0.2, 1.5))


class RefreshLoop(ChildLoop):
    """``rankstream refresh movies``, SIGKILLed a random 5-15 s after it is at work (its first
    stats written: reading the store and joining its group take seconds on a loaded machine, and
    a refresher killed before that never does anything), restarted at once; a child that exits
    by itself is counted apart and started again. The last one runs on after ``stop``."""

    def __init__(self, children: Children, hosts: list[Host], args: list[str],
                 rng: random.Random, stop: threading.Event, kill: bool = True):
        super().__init__("refresh-loop", children, hosts, args, rng, stop)
        self.kill = kill        # False: a refresher beside it, never killed (restarted if it exits)
        self.kills = self.crashes = 0
        self.kill_times: list[float] = []
        self.child: subprocess.Popen | None = None

    def start_child(self) -> subprocess.Popen:
        self.child = self.children.start(self.next_host(), ["refresh", MODEL, *self.args],
                                         "refresh.log")
        return self.child

    def running(self) -> bool:
        return self.child is not None and self.child.poll() is None

    def _loop(self) -> None:
        while not self.kill and not self.stop.is_set():
            if not self.running():
                if self.child is not None:
                    self.crashes += 1
                    self.children.forget(self.child)
                self.start_child()
            self.stop.wait(1.0)
        while self.kill and not self.stop.is_set():
            started = time.time()
            child = self.start_child()
            folder = self.hosts[(self.turns - 1) % len(self.hosts)].home / "refresh"
            while (child.poll() is None and not self.stop.is_set()
                   and time.time() - started < 60
                   and not any(_written_since(p, started) for p in _stats_files(folder))):
                self.stop.wait(0.2)
            self.stop.wait(self.rng.uniform(5.0, 15.0))
            if child.poll() is not None:
                self.crashes += 1
                self.children.forget(child)
                continue
            if self.stop.is_set():      # the last one runs on, unkilled, for the final touch
                return
            self.kill_times.append(time.time())
            self.children.kill(child)
            self.kills += 1


def _stats_files(folder: Path) -> list[Path]:
    """The refresher stats files of MODEL in a home's ``refresh`` folder: one per refresher
    (``movies@<member>.json``), or ``movies.json`` from one outside a group."""
    return sorted([*folder.glob(f"{MODEL}@*.json"), *folder.glob(f"{MODEL}.json")])


def _written_since(path: Path, t: float) -> bool:
    try:
        return path.stat().st_mtime > t
    except OSError:
        return False


class LagWatcher(threading.Thread):
    """Reads the refresher's stats file(s) every 0.5 s; each rewrite's lag histogram minus the
    previous one's is the lag of the events refreshed in between (a new process starts at 0)."""

    def __init__(self, homes: list[Path], stop: threading.Event):
        super().__init__(name="lag-watcher", daemon=True)
        self.folders = [h / "refresh" for h in homes]
        self.stop = stop
        self.intervals: list[tuple[float, float, int, int]] = []  # start, end, n, n over 2 s
        self.last: dict = {}
        self.stats: dict = {}
        self.counts: list = []         # the lag histogram of every interval, summed

    def run(self) -> None:
        while not self.stop.wait(0.5):
            for path in [p for folder in self.folders for p in _stats_files(folder)]:
                try:
                    now = json.loads(path.read_text())
                except (OSError, ValueError):
                    continue
                prev = self.last.get(path)
                if prev is not None and now["updated_at"] == prev["updated_at"]:
                    continue
                self.last[path], self.stats = now, now
                counts = now["lag_counts"]
                if prev is not None and all(a >= b for a, b in zip(counts, prev["lag_counts"])):
                    counts = [a - b for a, b in zip(counts, prev["lag_counts"])]
                    start = prev["updated_at"]
                else:            # a new refresher process: its counts start at 0
                    start = now["updated_at"] - 2.0
                edges = [*now["lag_buckets"], float("inf")]
                over = sum(c for c, edge in zip(counts, edges) if edge > 2.0)
                self.edges = edges
                self.counts = [a + b for a, b in zip(self.counts or [0] * len(counts), counts)]
                self.intervals.append((start, now["updated_at"], sum(counts), over))

    def quantile(self, q: float) -> float | None:
        """The bucket edge below which a share ``q`` of all live events' lags fall."""
        total = sum(self.counts)
        if not total:
            return None
        seen = 0
        for edge, c in zip(self.edges, self.counts):
            seen += c
            if seen >= q * total:
                return edge
        return self.edges[-1]

    def recovery(self, faults: list[tuple[str, float]], end: float, within: float = 30.0):
        """Per fault ``(what, time)`` before ``end - within``: seconds until an interval that
        starts after it refreshed events all within 2 s (None: not within ``within``)."""
        out = []
        for what, t in sorted(faults, key=lambda f: f[1]):
            if t > end - within:
                continue
            back = next((e - t for s0, e, n, over in self.intervals
                         if s0 >= t and n and not over), None)
            out.append((what, t, back if back is not None and back <= within else None))
        return out


class RedisRestarts(threading.Thread):
    """Stop and start redis-server on the same port every ``every`` seconds on average."""

    def __init__(self, servers: Servers, every: float, rng: random.Random,
                 stop: threading.Event):
        super().__init__(name="redis-restarts", daemon=True)
        self.servers, self.every, self.rng, self.stop = servers, every, rng, stop
        self.times: list[float] = []        # when each restart began
        self.error: BaseException | None = None

    def run(self) -> None:
        while not self.stop.wait(self.rng.uniform(0.5, 1.5) * self.every):
            self.times.append(time.time())
            try:
                self.servers.stop_redis()
                time.sleep(self.rng.uniform(0.0, 1.0))
                self.servers.start_redis()
            except BaseException as err:
                self.error = err
                log(f"redis restart failed: {err}")
                return


class Lookups(threading.Thread):
    """``TopK.recommend`` (and ``recommend_many``) in a loop; answers kept for checking."""

    def __init__(self, url: str, rng: random.Random, stop: threading.Event):
        super().__init__(name="lookups", daemon=True)
        self.url, self.rng, self.stop = url, rng, stop
        self.answered = 0
        self.failed: Counter = Counter()
        self.before_first = 0             # failures before any version was live
        self.answers: set = set()         # (version, user, source, ids, scores)
        self.mixed_batches: list = []
        self.outages: list[float] = []
        self.failing_since: float | None = None

    def run(self) -> None:
        from pipeline.serving.lookup import TopK

        users = [f"u{u}" for u in range(N_USERS)] + [f"nobody{u}" for u in range(N_UNKNOWN)]
        with TopK(self.url, namespace=NAMESPACE, timeout=0.5, retry_interval=0.2) as topk:
            n = 0
            while not self.stop.is_set():
                n += 1
                try:
                    if n % 4 == 0:
                        recs = topk.recommend_many(MODEL, self.rng.sample(users, 8), k=10)
                        if len({r.version for r in recs}) > 1:
                            self.mixed_batches.append([r.version for r in recs])
                    else:
                        recs = [topk.recommend(MODEL, self.rng.choice(users), k=10)]
                except Exception as err:     # every failure is counted by type
                    if not self.answered:
                        self.before_first += 1
                        time.sleep(0.05)
                        continue
                    self.failed[type(err).__name__] += 1
                    if self.failing_since is None:
                        self.failing_since = time.monotonic()
                    time.sleep(0.01)
                    continue
                if self.failing_since is not None:
                    self.outages.append(time.monotonic() - self.failing_since)
                    self.failing_since = None
                self.answered += len(recs)
                for r in recs:
                    self.answers.add((r.version, r.user, r.source, tuple(i for i, _ in r.items),
                                      tuple(s for _, s in r.items)))
                time.sleep(0.001)


class Monitor(threading.Thread):
    """Polls ``current``; reads each newly current version whole; notes when it went live and
    which store offsets it was trained on."""

    def __init__(self, url: str, home: Path, stop: threading.Event, objects=None):
        super().__init__(name="monitor", daemon=True)
        import redis

        self.client = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
        self.home, self.stop = home, stop
        self.objects = objects        # an ObjectStore: run directories are read from it
        self.read_runs: set[str] = set()              # object-store run keys already read
        self.listed_at = 0.0
        self.keys = ModelKeys(NAMESPACE, MODEL)
        self.snapshots: dict[int, list[dict]] = defaultdict(list)   # version -> snapshots
        self.live: list[tuple[float, bytes]] = []     # (time seen, current value)
        self.windows: dict[bytes, dict] = {}          # current value -> end offsets
        self.runs: dict[str, dict] = {}               # trained_at -> end offsets
        self.missing_since: float | None = None
        self.missing: list[float] = []                # how long current was absent, each time
        self.errors: Counter = Counter()
        self.url, self.topk = url, None

    def run(self) -> None:
        last = None
        while not self.stop.wait(0.05):
            try:
                raw = self.client.get(self.keys.current)
            except Exception as err:
                self.errors[type(err).__name__] += 1
                raw = None
            now = time.time()
            if raw is None:
                if self.missing_since is None and self.live:
                    self.missing_since = now
            elif self.missing_since is not None:
                self.missing.append(now - self.missing_since)
                self.missing_since = None
            if raw is not None and raw != last:
                self.live.append((now, raw))
                try:
                    self._snapshot(raw)
                except Exception as err:
                    self.errors[f"snapshot {type(err).__name__}"] += 1
            last = raw if raw is not None else last
            self._windows()

    def _snapshot(self, raw: bytes) -> None:
        version = int(raw.split(b":")[0])
        vk = self.keys.version(version)
        meta = {k.decode(): v.decode() for k, v in self.client.hgetall(vk.meta).items()}
        if not meta:
            self.errors["version vanished before it was read"] += 1
            return
        ids: list = []
        for c in range(int(meta["n_item_chunks"])):
            chunk = self.client.get(vk.items(c))
            ids += (json.loads(chunk) if meta["item_id_type"] == "str"
                    else np.frombuffer(chunk, "<i8").tolist())
        users = [f"u{u}" for u in range(N_USERS)]
        values = self.client.mget([vk.topk(u) for u in users])

        def pairs(value):
            rec = np.frombuffer(value, PAIR_DTYPE)
            return ([ids[i] for i in rec["index"].tolist()], rec["score"].tolist())

        glob = self.client.get(vk.global_list)
        if self.topk is None:
            from pipeline.serving.lookup import TopK

            self.topk = TopK(self.url, namespace=NAMESPACE, timeout=1.0, load_timeout=5.0)
        st = self.topk.versions.state(self.keys, raw)
        V, b = self.topk.lists.factors(st)
        self.snapshots[version].append({
            "V": np.asarray(V, np.float64), "b": None if b is None else np.asarray(b, np.float64),
            "index": {item: i for i, item in enumerate(st.item_ids)},
            "raw": raw, "trained_at": meta.get("trained_at"),
            "lists": {u: pairs(v) for u, v in zip(users, values) if v is not None},
            "global": pairs(glob) if glob is not None else None})
        self.windows.setdefault(raw, {"trained_at": meta.get("trained_at"), "offsets": None})

    def _windows(self) -> None:
        """Match versions to the run directories they were trained in (by ``trained_at``)."""
        todo = [raw for raw, w in self.windows.items() if w["offsets"] is None]
        if not todo:
            return
        for trained_at, manifest in self._new_runs():
            offsets = {}
            for tp, offset in manifest["window"]["end_offsets"].items():
                topic, partition = tp.rsplit("/", 1)
                offsets[(topic, int(partition))] = int(offset)
            self.runs[trained_at] = offsets
        for raw in todo:
            offsets = self.runs.get(self.windows[raw]["trained_at"])
            if offsets is not None:
                self.windows[raw]["offsets"] = offsets

    def _new_runs(self):
        """``(trained_at, dataset manifest)`` of the run directories not matched yet: under
        ``HOME/runs/``, or in the object store (pushed there when a run ends)."""
        if self.objects is None:
            for train_json in (self.home / "runs" / MODEL).glob("*/train.json"):
                try:
                    trained_at = json.loads(train_json.read_text())["trained_at"]
                    if trained_at in self.runs:
                        continue
                    yield trained_at, json.loads((train_json.parent / "dataset"
                                                  / "manifest.json").read_text())
                except (OSError, ValueError, KeyError):
                    continue
            return
        if time.monotonic() - self.listed_at < 0.5:      # a LIST per half second is enough
            return
        self.listed_at = time.monotonic()
        try:
            listed = self.objects.list(self.objects.key("runs", MODEL) + "/")
        except Exception as err:
            self.errors[f"run listing {type(err).__name__}"] += 1
            return
        for obj in listed:
            run = obj.key.removesuffix("/train.json")
            if run == obj.key or run in self.read_runs:
                continue
            try:    # a run being pushed may have its train.json up before its manifest
                train, manifest = self.objects.get_many([obj.key,
                                                         f"{run}/dataset/manifest.json"])
                if train is None or manifest is None:
                    continue
                self.read_runs.add(run)
                yield json.loads(train)["trained_at"], json.loads(manifest)
            except Exception as err:
                self.errors[f"run read {type(err).__name__}"] += 1


# ---------------------------------------------------------------- final checks


def check_store(store, produced: Produced) -> dict:
    """Lost and duplicated events and dead letters: what ``store`` (an
    :class:`~pipeline.ingest.store.EventStore`, local or on the object store) holds against
    what the producer sent."""
    stored = Counter()
    for kind in ("rating", "outcome", "comparison", "judgment", "ordinal"):
        stored.update(store.read(kind, columns=["event_id"], topics=list(TOPICS))
                      .column("event_id").to_pylist())
    dead = Counter()
    no_reason = 0
    for row in store.read_dead_letters().to_pylist():
        if row["topic"] in TOPICS:
            dead[(row["topic"], row["partition"], row["offset"])] += 1
            no_reason += not (row["reason"] or "").strip()
    valid = Counter(produced.valid)
    lost_events = sorted(set(valid) - set(stored))
    lost_poison = sorted(set(produced.poison) - set(dead))
    lost_by_kind = Counter(produced.poison[p] for p in lost_poison)
    return {"stored": sum(stored.values()), "dead": sum(dead.values()),
            "lost_events": lost_events, "lost_poison": lost_poison,
            "lost_poison_kinds": lost_by_kind,
            "dup_events": sorted(e for e, n in stored.items() if n > 1),
            "dup_dead": sorted(p for p, n in dead.items() if n > 1),
            "unexpected": sorted(set(stored) - set(valid))[:5],
            "dead_not_poison": sorted(set(dead) - set(produced.poison))[:5],
            "no_reason": no_reason,
            "unfinished": len(store.segments(complete=False))}


def fresh_whole(ids, scores, snap: dict, met: set) -> bool | None:
    """Whether a ``fresh`` answer is one user factor's list against the version ``snap`` (see
    the module docstring); None when it cannot tell (too few items, an item it does not know)."""
    idx = [snap["index"].get(i) for i in ids]
    V, b = snap["V"], snap["b"]
    if None in idx or len(idx) <= V.shape[1]:
        return None
    y = np.asarray(scores, np.float64) - (0.0 if b is None else b[idx])
    u = np.linalg.lstsq(V[idx], y, rcond=None)[0]
    tol = 1e-3 * (1.0 + float(np.max(np.abs(scores))))
    if float(np.max(np.abs(V[idx] @ u - y))) > tol or np.any(np.diff(scores) > tol):
        return False
    full = V @ u + (0.0 if b is None else b)
    above = {item for item, i in snap["index"].items() if full[i] > min(scores) + tol}
    return above - set(ids) <= met


def torn_reads(lookups: list[Lookups], monitor: Monitor, met: dict) -> dict:
    """``met``: user -> items of their rating events (the event store after the drain)."""
    torn, unverified, checked, fresh = [], 0, 0, 0
    for thread in lookups:
        for version, user, source, ids, scores in thread.answers:
            snaps = monitor.snapshots.get(version, [])
            if source == "fresh":
                verdicts = [fresh_whole(ids, scores, s, met.get(user, set())) for s in snaps
                            if "V" in s]
                if not any(v is not None for v in verdicts):
                    unverified += 1
                    continue
                checked += 1
                fresh += 1
                if not any(verdicts):
                    torn.append((version, user, source, ids[:3]))
                continue
            wanted = [s["global"] if source == "fallback" else s["lists"].get(user)
                      for s in snaps]
            wanted = [w for w in wanted if w is not None]
            if source not in ("precomputed", "fallback") or not wanted:
                unverified += 1
                continue
            checked += 1
            if not any(list(ids) == w[0][:10] and list(scores) == w[1][:10] for w in wanted):
                torn.append((version, user, source, ids[:3]))
        torn += [("mixed batch", v) for v in thread.mixed_batches]
    return {"torn": torn, "unverified": unverified, "checked": checked, "fresh": fresh}


def met_items(store) -> dict:
    """user -> items of their rating events in the event store."""
    table = store.read("rating", columns=["user", "item"], topics=list(TOPICS))
    met = defaultdict(set)
    for user, item in zip(table.column("user").to_pylist(), table.column("item").to_pylist()):
        met[str(user)].add(item)
    return met


def final_touch(producer: Producer, bootstrap: str, url: str) -> dict:
    """One more rating for every known user, of an item at the top of their list now; then
    wait (up to 60 s) until the refresher has left that item out of each user's answer."""
    from kafka import KafkaProducer

    from pipeline.serving.lookup import TopK

    rng = random.Random(1)
    client = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    touched, sent = {}, []
    with TopK(url, namespace=NAMESPACE, timeout=2.0) as topk:
        for u in range(N_USERS):
            user = f"u{u}"
            try:
                items = [i for i, _ in topk.recommend(MODEL, user, k=1).items]
            except Exception:
                items = []
            item = items[0] if items else f"m{rng.randrange(N_ITEMS)}"
            now = int(time.time() * 1000)
            event = {"kind": "rating", "event_id": f"touch-{u}", "ts": now, "user": user,
                     "item": item, "rating": rng.randint(1, 5)}
            value = encode_json(event)
            key = user_key(event) if producer.keyed else None
            sent.append((event, "rankstream.rating", time.time(), value,
                         client.send("rankstream.rating", value=value, key=key)))
            touched[user] = item
        client.flush(timeout=60)
        with producer.out.lock:     # staleness is about the chaos' events, not these
            before = {tp: len(v) for tp, v in producer.out.rating_times.items()}
        producer._record(sent)
        with producer.out.lock:
            for tp, times in producer.out.rating_times.items():
                del times[before.get(tp, 0):]
        client.close(timeout=10)
        started = time.monotonic()
        left = dict(touched)
        while left and time.monotonic() - started < 60:
            for user, item in list(left.items()):
                try:
                    rec = topk.recommend(MODEL, user, k=10)
                except Exception:
                    continue
                if rec.source == "fresh" and item not in [i for i, _ in rec.items]:
                    del left[user]
            time.sleep(0.2)
    return {"users": len(touched), "not_applied": sorted(left)[:5], "n_not_applied": len(left),
            "seconds": time.monotonic() - started}


def missing_effects(url: str, store, users) -> dict:
    """Each user's final answer against the fold-in over their whole history (see the module
    docstring)."""
    from pipeline.refresh.events import stored_events
    from pipeline.refresh.refresher import user_factor
    from pipeline.serving.layout import key_of
    from pipeline.serving.lookup import TopK

    history = stored_events(store, ["rating"])
    why: Counter = Counter()
    examples = []
    with TopK(url, namespace=NAMESPACE, timeout=5.0) as topk:
        st = topk.versions.current_state(MODEL)
        V, b = topk.lists.factors(st)
        for user in sorted(users):
            events = history.get(key_of(user), [])
            rec = topk.recommend(MODEL, user, k=10)
            ids, scores = [i for i, _ in rec.items], np.array([s for _, s in rec.items])
            made = user_factor(st, (V, b), events, st.fold_in, key_of(user))
            if made is None:
                continue       # none of their items known to the version: nothing to fold in
            factor, seen = made
            want = (np.asarray(V, np.float32) @ factor).astype(np.float32)
            if b is not None:
                want = want + np.asarray(b, np.float32)
            want[seen] = -np.inf
            order = [i for i in np.argsort(-want, kind="stable")[:10] if np.isfinite(want[i])]
            if rec.source != "fresh" or rec.version != st.version:
                problem = f"answered {rec.source} v{rec.version}"
            elif {e.item for e in events} & set(ids):
                problem = "a met item in the list"
            elif ids != [st.item_ids[i] for i in order]:
                problem = "not the whole-history fold-in"
            elif not np.allclose(scores, want[order], rtol=1e-4, atol=1e-4):
                problem = "scores off the fold-in"
            else:
                continue
            why[problem] += 1
            examples.append((user, problem))
    return {"users": len(users), "missing": sum(why.values()), "why": why,
            "examples": examples[:3], "version": st.version}


def staleness(produced: Produced, monitor: Monitor, end: float) -> dict:
    """Per rating event: the first time a live version's window held it, minus when it was
    produced (see the module docstring)."""
    seen = sorted(((t, monitor.windows.get(raw, {}).get("offsets")) for t, raw in monitor.live),
                  key=lambda pair: pair[0])
    unknown_windows = sum(1 for _, offsets in seen if offsets is None)
    values, never, oldest = [], 0, 0.0
    for tp, events in produced.rating_times.items():
        events = sorted(events)
        reach, j = -1, 0             # reach: the largest end offset live so far
        for t, offsets in seen:
            if offsets is None:
                continue
            reach = max(reach, offsets.get(tp, 0))
            while j < len(events) and events[j][0] < reach:
                values.append(t - events[j][1])
                j += 1
        never += len(events) - j
        oldest = max([oldest] + [end - p for _, p in events[j:]])
    return {"max": max(values) if values else None,
            "median": statistics.median(values) if values else None,
            "covered": len(values), "never": never, "oldest_uncovered": oldest,
            "unknown_windows": unknown_windows}


# ---------------------------------------------------------------- main


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, required=True, help="length of the chaos phase")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: clock)")
    parser.add_argument("--rate", type=float, default=150.0, help="rating events per second")
    parser.add_argument("--poison", default=",".join(POISON_KINDS),
                        help=f"poison kinds, comma-separated (default all: {POISON_KINDS})")
    parser.add_argument("--poison-rate", type=float, default=0.01)
    parser.add_argument("--redis-every", type=float, default=45.0,
                        help="mean seconds between Redis restarts (0: none)")
    parser.add_argument("--lookup-threads", type=int, default=2)
    parser.add_argument("--refreshers", type=int, default=1,
                        help="refreshers in the model's group: one SIGKILLed and restarted, "
                             "the others not; with more than one, events are keyed by user")
    parser.add_argument("--settle", type=float, default=120.0,
                        help="seconds to wait at the end for current to cover every event")
    parser.add_argument("--keep", action="store_true", help="keep the state directory")
    parser.add_argument("--store", choices=("local", "object"), default="local",
                        help="where the event store, dead letters, runs and checkpoints live: "
                             "the one host's HOME (local), or an S3 server of this run's own "
                             "shared by two hosts with a HOME each (object)")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else time.time_ns() % 1_000_000
    poison = [p for p in args.poison.split(",") if p]
    unknown = set(poison) - set(POISON_KINDS)
    if unknown:
        parser.error(f"unknown poison kinds {sorted(unknown)}; known: {POISON_KINDS}")
    rng = random.Random(seed)

    root = Path.home() / ".cache" / "rankstream"
    root.mkdir(parents=True, exist_ok=True)
    state = Path(tempfile.mkdtemp(prefix="chaos-", dir=root))
    (state / "models.toml").write_text(CONFIG)
    log(f"seed {seed} (--seed {seed} repeats the schedule); state in {state}")

    def on_sigterm(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)   # even when started with it ignored
    servers, children = Servers(state, s3=args.store == "object"), Children(state)
    stop_chaos, stop_all = threading.Event(), threading.Event()
    code = 2
    try:
        servers.start()
        hosts, store_url = _hosts(args.store, state, servers)
        _create_topics(servers.bootstrap, args.refreshers)
        log("compiling the solver kernels once (solvers.warm_up(), cached for the children)")
        warm = subprocess.run([sys.executable, "-c", "import solvers; solvers.warm_up()"],
                              cwd=REPO, capture_output=True, text=True, start_new_session=True)
        if warm.returncode != 0:
            raise RuntimeError(f"solvers.warm_up() failed:\n{warm.stderr[-2000:]}")
        code = run(args, seed, rng, poison, state, hosts, store_url, servers, children,
                   stop_chaos, stop_all)
    except KeyboardInterrupt:
        log("interrupted: stopping children and servers")
        code = 130
    except Exception:
        import traceback

        traceback.print_exc()
        log("the harness failed (above): stopping children and servers")
        code = 2
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)     # a second Ctrl-C must not cut this short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stop_chaos.set()
        stop_all.set()
        children.kill_all()
        servers.stop()
        if args.keep or code != 0:
            log(f"state kept in {state}")
        else:
            shutil.rmtree(state, ignore_errors=True)
    return code


def _hosts(mode: str, state: Path, servers: Servers) -> tuple[list[Host], str | None]:
    """The hosts the children run on, and the object store's URL (None: the store is in the
    one host's HOME)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANKSTREAM_STORE", "RANKSTREAM_HOME", "AWS_ENDPOINT_URL_S3")}
    if mode == "local":
        (state / "home").mkdir()
        return [Host("local", state / "home", env)], None
    from pipeline.storage import ObjectStore

    url = f"s3://bench/chaos-{uuid.uuid4().hex[:12]}"
    env = {**env, **servers.aws, "RANKSTREAM_STORE": url}
    ObjectStore(url, environ=env).ensure_bucket()
    hosts = [Host(name, state / f"host-{name}", env) for name in ("a", "b")]
    for host in hosts:
        host.home.mkdir()
    log(f"object store {url} at {servers.s3_endpoint}; hosts a and b take turns")
    return hosts, url


def _create_topics(bootstrap: str, refreshers: int = 1) -> None:
    """The chaos' topics; the ratings' with a partition per refresher at least."""
    from kafka.admin import KafkaAdminClient, NewTopic

    partitions = {**TOPICS, "rankstream.rating": max(TOPICS["rankstream.rating"], refreshers)}
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(t, n, 1) for t, n in partitions.items()]
                            + [NewTopic(DEAD_LETTER_TOPIC, 1, 1)])
    finally:
        admin.close()


def run(args, seed, rng, poison, state, hosts, store_url, servers, children, stop_chaos,
        stop_all) -> int:
    ingest_args = ["--bootstrap", servers.bootstrap, "--no-progress",
                   *[a for t in TOPICS for a in ("--topic", t)], "--group", "chaos",
                   "--instance-id", "chaos-ingest", "--dead-letter-topic", DEAD_LETTER_TOPIC,
                   "--flush-events", "2000", "--flush-interval", "0.5", "--no-check-crcs"]
    train_args = ["--config", str(state / "models.toml"), "--redis-url", servers.redis_url]
    objects = None
    if store_url is not None:
        from pipeline.storage import ObjectStore

        objects = ObjectStore(store_url, environ=hosts[0].env)

    producer = Producer(servers.bootstrap, args.rate, poison, args.poison_rate, seed, stop_chaos,
                        keyed=args.refreshers > 1)
    ingest = IngestLoop(children, hosts, ingest_args, random.Random(rng.random()), stop_chaos)
    retrain = RetrainLoop(children, hosts, train_args, random.Random(rng.random()), stop_chaos)
    # XDG_STATE_HOME: the refresher's static member ids are slots per host and group name (as
    # ingest's); a private state dir keeps another refresher of a model "movies" on this
    # machine (another run, a test) from taking slot 0 and changing this run's member id
    refresh_hosts = [Host(h.name, h.home, {**h.env, "RANKSTREAM_KAFKA_BOOTSTRAP":
                                           servers.bootstrap,
                                           "XDG_STATE_HOME": str(state / "xdg")})
                     for h in hosts]
    refresh = RefreshLoop(children, refresh_hosts, [*train_args, "--batch-ms", "200"],
                          random.Random(rng.random()), stop_chaos)
    beside = [RefreshLoop(children, refresh_hosts, [*train_args, "--batch-ms", "200"],
                          random.Random(rng.random()), stop_chaos, kill=False)
              for _ in range(args.refreshers - 1)]
    lag = LagWatcher([h.home for h in hosts], stop_all)
    restarts = RedisRestarts(servers, args.redis_every, random.Random(rng.random()), stop_chaos)
    monitor = Monitor(servers.redis_url, hosts[0].home, stop_all, objects)
    lookups = [Lookups(servers.redis_url, random.Random(rng.random()), stop_all)
               for _ in range(args.lookup_threads)]
    threads = [producer, ingest, retrain, refresh, *beside, lag, monitor, *lookups]
    threads += [restarts] if args.redis_every > 0 else []
    started = time.time()
    for thread in threads:
        thread.start()
    log(f"chaos for {args.minutes:g} min: producing {args.rate:g} ratings/s "
        f"(+{args.poison_rate:.0%} poison: {', '.join(poison) or 'none'})")
    deadline = time.monotonic() + args.minutes * 60
    while time.monotonic() < deadline:
        time.sleep(min(10.0, max(0.0, deadline - time.monotonic())))
        with producer.out.lock:
            n_valid, n_poison = len(producer.out.valid), len(producer.out.poison)
        log(f"{time.time() - started:5.0f} s: produced {n_valid:,} valid + {n_poison} poison; "
            f"versions seen {len(monitor.live)}; lookups {sum(t.answered for t in lookups):,} "
            f"answered, {sum(sum(t.failed.values()) for t in lookups):,} failed; kills: ingest "
            f"{ingest.kills} (+{ingest.crashes} crashes), train {retrain.kills}, refresh "
            f"{refresh.kills} (+{refresh.crashes} exits); redis restarts {len(restarts.times)}; "
            f"refresh lag max {lag.stats.get('lag_max', 0):.1f} s")
    chaos_seconds = time.time() - started

    log("chaos over: stopping the producer, the kills and the restarts; draining")
    stop_chaos.set()
    for thread in (producer, ingest, retrain, refresh, *beside, restarts):
        if thread.ident is not None:
            thread.join(timeout=360)
    if not _redis_up(servers):
        servers.start_redis()
    drain = _drain(children, ingest, ingest_args)
    final = retrain.run_once(None)
    log(f"final retrain exited {final}; waiting up to {args.settle:g} s for current to cover "
        "every rating event")
    settle_deadline = time.monotonic() + args.settle
    while time.monotonic() < settle_deadline:
        st = staleness(producer.out, monitor, time.time())
        if st["never"] == 0 and st["covered"]:
            break
        time.sleep(0.5)
    republish = _republish_probe(servers, retrain, restarts)
    for loop in (refresh, *beside):     # the final touch needs every refresher running
        if not loop.running():
            loop.start_child()
    touch = final_touch(producer, servers.bootstrap, servers.redis_url)
    log(f"final touch: {touch['users']} users, applied by the refresher in "
        f"{touch['seconds']:.1f} s ({touch['n_not_applied']} not)")
    drain2 = _drain(children, ingest, ingest_args)
    drain = {"exit codes": drain["exit codes"] + drain2["exit codes"],
             "ok": drain["ok"] and drain2["ok"], "log": drain["log"] or drain2["log"]}
    time.sleep(1.0)      # a last second of lookups on the final version
    stop_all.set()
    for thread in [monitor, *lookups]:
        thread.join(timeout=30)
    end = time.time()

    if objects is None:
        from pipeline.ingest.local_store import LocalEventStore

        event_store = LocalEventStore(hosts[0].home / "store", hosts[0].home / "dead-letter")
    else:
        from pipeline.ingest.object_store import ObjectEventStore

        event_store = ObjectEventStore(store_url, objects=objects)
    store = check_store(event_store, producer.out)
    torn = torn_reads(lookups, monitor, met_items(event_store))
    st = staleness(producer.out, monitor, end)
    effects = missing_effects(servers.redis_url, event_store, producer.out.users)
    faults = ([("refresh kill", t) for t in refresh.kill_times]
              + [("ingest kill", t) for t in ingest.kill_times]
              + [("redis restart", t) for t in restarts.times]
              + [("version live", t) for t, _ in monitor.live])
    recovery = lag.recovery(faults, started + chaos_seconds)
    freshness = {"refresh": refresh, "beside": beside, "lag": lag, "touch": touch,
                 "effects": effects, "recovery": recovery}
    where = (f"in HOME {hosts[0].home} (one host)" if objects is None else
             f"{store_url}, S3 endpoint {servers.s3_endpoint}")
    report = _report(args, seed, state, chaos_seconds, producer, store, torn, st, lookups,
                     ingest, retrain, restarts, monitor, drain, children, republish, where,
                     freshness)
    print(report, flush=True)
    bad = (len(store["lost_events"]) + len(store["lost_poison"]) + len(store["dup_events"])
           + len(store["dup_dead"]) + len(torn["torn"]) + effects["missing"]
           + sum(back is None for _, _, back in recovery))
    return 1 if bad else 0


def _republish_probe(servers: Servers, retrain: RetrainLoop, restarts: RedisRestarts,
                     wait: float = 30.0) -> str:
    """Restart Redis once more when no event is new, run one retrain: the retrain loop must
    republish what it last published (the window is unchanged, but Redis lost it)."""
    import redis

    log("probe: one more Redis restart with no new events, then one retrain")
    restarts.times.append(time.time())
    servers.stop_redis()
    servers.start_redis()
    started = time.monotonic()
    code = retrain.run_once(None)
    client = redis.Redis.from_url(servers.redis_url, socket_timeout=1.0)
    key = ModelKeys(NAMESPACE, MODEL).current
    while time.monotonic() - started < wait:
        try:
            if client.get(key) is not None:
                return f"yes (current back {time.monotonic() - started:.1f} s after the restart)"
        except Exception:
            pass
        time.sleep(0.1)
    return (f"NO: current still absent {wait:g} s after the restart (the retrain exited {code}; "
            "lookups fail until new events arrive)")


def _redis_up(servers: Servers) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(servers.redis_url, socket_timeout=1).ping())
    except Exception:
        return False


def _drain(children: Children, ingest: IngestLoop, ingest_args: list[str],
           attempts: int = 3) -> dict:
    """``rankstream ingest --until-end`` until it succeeds (at most ``attempts`` times), on the
    ingest loop's next host."""
    results = []
    for _ in range(attempts):
        child = children.start(ingest.next_host(), ["ingest", "--until-end", *ingest_args],
                               "drain.log")
        try:
            code = child.wait(timeout=600)
        except subprocess.TimeoutExpired:
            children.kill(child)
            code = "timeout"
        children.forget(child)
        results.append(code)
        if code == 0:
            break
    return {"exit codes": results, "ok": results[-1] == 0,
            "log": "" if results[-1] == 0 else children.tail("drain.log")}


def _freshness_lines(f: dict) -> list[str]:
    refresh, lag, touch, effects, recovery = (f["refresh"], f["lag"], f["touch"],
                                              f["effects"], f["recovery"])
    stats = lag.stats
    backs = [back for _, _, back in recovery if back is not None]
    late = [(what, time.strftime("%H:%M:%S", time.localtime(t))) for what, t, back in recovery
            if back is None]
    kinds = Counter(what for what, _, _ in recovery)
    n_lag = sum(stats.get("lag_counts", []))
    return [
        f"  refresher       SIGKILLs {refresh.kills} (and {refresh.crashes} exits by itself); "
        + (f"{len(f['beside'])} more in its group, never killed ("
           f"{sum(b.crashes for b in f['beside'])} exits by themselves); " if f["beside"] else "")
        + f"last process: {stats.get('events', 0):,} events, {stats.get('users_refreshed', 0):,} "
        f"users written, {stats.get('flips', 0)} flips, {stats.get('heals', 0)} heals, lag "
        f"max {stats.get('lag_max', 0):.2f} s, mean "
        f"{stats.get('lag_sum', 0) / max(1, n_lag):.3f} s",
        f"  refresh lag     {sum(lag.counts):,} live events: p50 <= "
        f"{_fmt_edge(lag.quantile(0.5))}, "
        f"p90 <= {_fmt_edge(lag.quantile(0.9))}, p99 <= {_fmt_edge(lag.quantile(0.99))}; "
        f"{sum(1 for i in lag.intervals if i[2] and not i[3])} of "
        f"{sum(1 for i in lag.intervals if i[2])} 2-s intervals all within 2 s",
        f"  lag recovery    back under 2 s within 30 s after {len(backs)} of {len(recovery)} "
        f"faults ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))}); slowest "
        f"{_fmt_s(max(backs) if backs else None)}, median {_fmt_s(_median(backs))}"
        + (f"; NOT after {late[:4]}" if late else ""),
        f"  missing effects {effects['missing']}  (of {effects['users']} users with streamed "
        f"events, final lists against the whole-history fold-in under version "
        f"{effects['version']}"
        + (f": {dict(effects['why'])}, e.g. {effects['examples']}" if effects["missing"] else "")
        + f"; final touch of {touch['users']} users applied in {touch['seconds']:.1f} s"
        + (f", {touch['n_not_applied']} not" if touch["n_not_applied"] else "") + ")",
    ]


def _per_host(loop: ChildLoop) -> str:
    return " / ".join(f"{name} {loop.per_host[name]}" for name in sorted(loop.per_host))


def _median(values):
    return statistics.median(values) if values else None


def _fmt_s(x) -> str:
    return "n/a" if x is None else f"{x:.1f} s"


def _fmt_edge(x) -> str:
    return "n/a" if x is None else f"{x:g} s"


def _report(args, seed, state, chaos_seconds, producer, store, torn, st, lookups, ingest,
            retrain, restarts, monitor, drain, children, republish, where,
            freshness) -> str:
    out = producer.out
    n_rating = out.kinds.get("rating", 0)
    kinds = ", ".join(f"{k} {n:,}" for k, n in sorted(out.kinds.items()) if k != "poison")
    poison_kinds = Counter(out.poison.values())
    failed = Counter()
    for t in lookups:
        failed.update(t.failed)
    outages = [o for t in lookups for o in t.outages]
    answered = sum(t.answered for t in lookups)
    lost = len(store["lost_events"]) + len(store["lost_poison"])
    dup = len(store["dup_events"]) + len(store["dup_dead"])
    lines = [
        "",
        f"rankstream chaos: {chaos_seconds / 60:.1f} min of chaos (seed {seed}, "
        f"{args.rate:g} ratings/s, {args.poison_rate:.0%} poison)",
        f"  store           {args.store}: {where}"
        + ("" if len(ingest.hosts) == 1 else
           f"; ingest children per host {_per_host(ingest)} (final drain included), "
           f"train runs per host {_per_host(retrain)}"),
        f"  produced        {len(out.valid):,} valid events ({kinds}) + {len(out.poison):,} "
        f"poison messages ({', '.join(f'{k} {n}' for k, n in sorted(poison_kinds.items()))})",
        f"  stored          {store['stored']:,} events",
        f"  dead-lettered   {store['dead']:,} messages (of {len(out.poison):,} poison; "
        f"{store['no_reason']} without a reason)",
        f"  lost            {lost}  ({len(store['lost_events'])} valid events, "
        f"{len(store['lost_poison'])} poison messages"
        + (f": {dict(store['lost_poison_kinds'])}" if store["lost_poison"] else "")
        + (f"; e.g. {store['lost_events'][:3]}" if store["lost_events"] else "") + ")",
        f"  duplicated      {dup}  ({len(store['dup_events'])} event ids stored twice, "
        f"{len(store['dup_dead'])} dead letters twice)",
        f"  torn reads      {len(torn['torn'])}  (of {torn['checked']:,} distinct answers, "
        f"{torn['fresh']:,} of them fresh, "
        f"checked against {sum(map(len, monitor.snapshots.values()))} version snapshots; "
        f"{torn['unverified']:,} unverified)"
        + (f"; e.g. {torn['torn'][:3]}" if torn["torn"] else ""),
        f"  lookups         {answered:,} answered, {sum(failed.values()):,} failed "
        f"({', '.join(f'{k} {n:,}' for k, n in failed.most_common()) or 'none'}; not counted: "
        f"{sum(t.before_first for t in lookups):,} before the first version); "
        f"outages: {len(outages)}, longest {_fmt_s(max(outages) if outages else None)}, "
        f"total {_fmt_s(sum(outages))} (summed over {len(lookups)} threads)",
        f"  SIGKILLs        ingest {ingest.kills} (and {ingest.crashes} exits by itself), "
        f"train {retrain.kills} (of {retrain.runs} runs, {retrain.failures} failed; the "
        f"unkilled ones took {_fmt_s(_median(retrain.seconds))} median)",
        f"  redis restarts  {len(restarts.times)}; current absent {len(monitor.missing)} times, "
        f"longest {_fmt_s(max(monitor.missing) if monitor.missing else None)}; republished "
        f"after a restart with no new events: {republish}",
        f"  versions        {len(monitor.live)} went live; "
        f"{st['unknown_windows']} with no run directory found",
        f"  max staleness   {_fmt_s(st['max'])} (median {_fmt_s(st['median'])}) over "
        f"{st['covered']:,} of {n_rating:,} rating events; {st['never']:,} never covered"
        + (f" (oldest {st['oldest_uncovered']:.1f} s old at the end)" if st["never"] else ""),
        f"  final drain     {'ok' if drain['ok'] else 'FAILED'} (exit codes "
        f"{drain['exit codes']})",
        *_freshness_lines(freshness),
    ]
    if args.store == "object":
        n = store["unfinished"]
        lines.append(f"  uncommitted     {n} segment file{'' if n == 1 else 's'} that no commit "
                     "names (left by killed ingest children: never read, not counted)")
    unfinished = store["unfinished"] if args.store == "local" else 0
    if store["unexpected"] or store["dead_not_poison"] or unfinished:
        lines.append(f"  also            stored but never produced as valid: "
                     f"{store['unexpected']}; dead letters of valid events: "
                     f"{store['dead_not_poison']}; unfinished segment groups: "
                     f"{unfinished}")
    if monitor.errors:
        lines.append(f"  monitor         polls that failed (Redis down): {dict(monitor.errors)}")
    if producer.error or restarts.error:
        lines.append(f"  harness errors  producer: {producer.error!r}; restarts: "
                     f"{restarts.error!r}")
    if not drain["ok"]:
        lines.append("  drain log tail:\n    " + drain["log"].replace("\n", "\n    "))
    if ingest.crashes:
        lines.append("  ingest log tail:\n    "
                     + children.tail("ingest.log", 8).replace("\n", "\n    "))
    effects, recovery = freshness["effects"], freshness["recovery"]
    late = sum(back is None for _, _, back in recovery)
    verdict = ("FAIL" if lost or dup or torn["torn"] or effects["missing"] or late
               else "ok")
    lines.append(f"  verdict         {verdict} (lost, duplicated, torn reads, missing effects "
                 f"and faults the refresh lag did not recover from in 30 s must be 0); "
                 f"state: {state}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
