"""SVMlight, LIBSVM and LETOR text files as events.

A line is ``LABEL [qid:QUERY] INDEX:VALUE ... [# COMMENT]``; blank lines and lines that start
with ``#`` are no records. Features become a sparse map ``{INDEX: VALUE}`` with the indices as
written (LIBSVM's start at 1). A gzip or bzip2 file is read as it is.

- A line **with** ``qid`` is a **judgment** (the ``search`` model's kind): ``query`` is the qid,
  ``doc`` the id in the trailing comment (``# docid = GX000-00 ...`` as in LETOR, or else the
  comment's first token) or, without one, the line's position within its query (1, 2, ...),
  ``label`` the relevance grade. A file with qids is a file of judgments: a line without one
  is a dead letter.
- A line **without** ``qid`` is an **outcome** (``ads``: labels ±1 or 0/1, -1 stored as 0) or an
  **ordinal** event (``reviews``: integer labels 1..K), as ``--kind`` says; ``item`` is the
  comment's id or, without one, ``NAME:LINE``, the file's name and the line number (1-based):
  the rows of ``a9a`` and ``a9a.t`` are other items, and a renamed copy of a file holds other
  items too. Without ``--kind`` the labels decide: -1 or 0 among them is outcome, three or
  more levels from 1 up is ordinal, anything else (1 and 2 only: two classes or two grades?)
  is refused with what to pass. A label that the stated kind cannot take (3 with ``--kind
  outcome``) refuses the file before anything is stored (:func:`file_kind`).

Event ids come from each line's identity in the file (its query and doc, or its item, and for
an id that a comment repeats, which repetition), so reading a file again gives the same ids,
and an edited line keeps its id and replaces the old version (stored later, it is the latest).
The format has no time: events get the file's modification time, as a CSV without ``ts`` does
(the time of reading if that is before 1990, as a file unpacked with zeroed times has).

Odd input never stops a file: a token that is not ``INDEX:VALUE``, a repeated index, a byte
that is not ASCII before the comment, or a line over :data:`MAX_LINE_BYTES` (skipped without
being held in memory) is a dead letter with its line number; NaN, infinite or huge values and
indices over ``RANKSTREAM_MAX_FEATURE_INDEX`` are refused by validation with its reasons.

Examples
--------
>>> reader = LineReader("judgment", ts=1_767_225_600_000)
>>> content, event = reader.record(0, b"2 qid:10 1:0.03 7:0.7 # docid = GX000-00 inc = 1")
>>> event["query"], event["doc"], event["label"], event["features"]
('10', 'GX000-00', 2, {1: 0.03, 7: 0.7})
>>> reader.record(1, b"0 qid:10 1:0.5 2:x")[1]["features"]
{1: 0.5, 2: 'x'}
>>> reader.record(2, b"1 qid:10 3:1 3:2")[1].reason
'svmlight line 3: index 3 appears twice'
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from hashlib import blake2b
from pathlib import Path

from pipeline.ingest.dead_letters import Malformed
from pipeline.ingest.events import MIN_EVENT_TIME
from pipeline.timestamps import parse_iso_ts

MAX_LINE_BYTES = 1 << 20     # a longer line is a dead letter: a LETOR line is ~2 KB
MAX_LABELS_KEPT = 1000       # distinct labels remembered by the kind check
_RAW_KEPT = 4096             # bytes of an over-long line kept in its dead letter
_INTEGER = re.compile(r"[+-]?\d{1,18}")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|[+-]?(nan|inf|infinity)", re.I)
_COMMENT_ID = re.compile(r"(?:^|\s)(?:docid|id)\s*=\s*(\S+)")
_SNIFF = re.compile(rb"[+-]?[\d.eE+-]+(\s+qid:\S+)?(\s+\S+:\S+)*\s*(#.*)?")
OUTCOME_LABELS = {-1: 0, 0: 0, 1: 1}


def lines(path: str | Path) -> Iterator[tuple[int, bytes, bool]]:
    """``(0-based line number, line without its end, too_long)`` of each line that is neither
    blank nor a comment; a line over :data:`MAX_LINE_BYTES` comes as its first bytes with
    ``too_long`` set, and the rest of it is skipped a piece at a time."""
    with open_maybe_compressed(path) as fh:
        number = -1
        while True:
            line = fh.readline(MAX_LINE_BYTES + 1)
            if not line:
                return
            number += 1
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                head = line[:_RAW_KEPT]
                while line and not line.endswith(b"\n"):
                    line = fh.readline(MAX_LINE_BYTES)
                yield number, head, True
                continue
            stripped = line.strip()
            if stripped and not stripped.startswith(b"#"):
                yield number, line.rstrip(b"\r\n"), False


def open_maybe_compressed(path: str | Path):
    """The file's bytes, decompressed as they are read when it is gzip or bzip2 (as LIBSVM's
    and LETOR's files are often shipped), told by its first bytes, not its name."""
    with open(path, "rb") as fh:
        magic = fh.read(3)
    if magic[:2] == b"\x1f\x8b":
        import gzip

        return gzip.open(path, "rb")
    if magic == b"BZh":
        import bz2

        return bz2.open(path, "rb")
    return open(path, "rb")


def looks_like_svmlight(path: str | Path) -> bool:
    """Whether the file's first record reads as an SVMlight line (for a file whose name does
    not say its format: LETOR's ``train.txt``, LIBSVM's ``a9a``)."""
    try:
        for _, line, too_long in lines(path):
            return not too_long and _SNIFF.fullmatch(line.strip()) is not None
    except (OSError, EOFError, ValueError):      # unreadable, or a truncated archive
        return False
    return False


def parse_label(token: str):
    """An integer label as ``int`` (``+1``, ``2``, ``1.0``), else a float, else the token (for
    validation to name)."""
    if _INTEGER.fullmatch(token):
        return int(token)
    if not _NUMBER.fullmatch(token):
        return token
    value = float(token)
    if math.isfinite(value) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def comment_id(comment: str) -> str | None:
    """The id a trailing comment names: ``docid = X`` / ``id = X``, else its first token.

    >>> comment_id(" docid = GX008-86-4444840 inc = 1"), comment_id(" p17 great"), comment_id("")
    ('GX008-86-4444840', 'p17', None)
    """
    match = _COMMENT_ID.search(comment)
    if match:
        return match.group(1)
    tokens = comment.split()
    return tokens[0] if tokens else None


# ---------------------------------------------------------------------------------- the kind


@dataclass
class LabelScan:
    """What the kind check needs of a file: lines with and without qid, and its labels."""

    with_qid: int = 0
    without_qid: int = 0
    labels: dict = field(default_factory=dict)     # int label -> [lines, first line number]
    not_integer: tuple | None = None               # (label, line number) of the first one

    def add(self, label, number: int) -> None:
        if type(label) is not int:
            if type(label) is float and self.not_integer is None:
                self.not_integer = (label, number)
            return                              # an unreadable label is the line's dead letter
        seen = self.labels.get(label)
        if seen is not None:
            seen[0] += 1
        elif len(self.labels) < MAX_LABELS_KEPT:
            self.labels[label] = [1, number]

    def describe(self) -> str:
        values = sorted(self.labels)
        shown = ", ".join(map(str, values)) if len(values) <= 6 else \
            f"{len(values)} values from {values[0]} to {values[-1]}"
        return f"labels {shown}"

    def first(self, labels) -> str:
        """``label L on line N`` of the first of ``labels`` in the file."""
        label = min(labels, key=lambda value: self.labels[value][1])
        return f"label {label} on line {self.labels[label][1] + 1}"


def scan_labels(path: str | Path) -> LabelScan:
    """One pass over the file's labels and qids (the rest of each line is not parsed)."""
    scan = LabelScan()
    for number, line, too_long in lines(path):
        tokens = [] if too_long else line.split(b"#", 1)[0].split(None, 2)
        if not tokens:
            continue
        if len(tokens) > 1 and tokens[1].startswith(b"qid:"):
            scan.with_qid += 1
        else:
            scan.without_qid += 1
        scan.add(parse_label(tokens[0].decode("ascii", "replace")), number)
    return scan


def file_kind(path: str | Path, kind: str | None) -> str | None:
    """The kind of a file's events (module docstring), or ``ValueError`` saying in one line
    what to pass when ``kind`` does not fit its labels or they do not tell."""
    scan = scan_labels(path)
    if scan.with_qid:
        if kind not in (None, "judgment"):
            raise ValueError(f"{path}: its lines have qid: (LETOR), so they are judgment "
                             f"events: drop --kind {kind} (or pass --kind judgment)")
        return "judgment"
    if kind == "judgment":
        raise ValueError(f"{path}: no line has a qid:, which judgments need: pass --kind "
                         "outcome (binary labels) or --kind ordinal (graded labels)")
    if kind not in (None, "outcome", "ordinal"):
        raise ValueError(f"{path}: SVMlight lines without qid: are outcome or ordinal events, "
                         f"not {kind}: pass --kind outcome or --kind ordinal")
    if scan.not_integer is not None:
        label, number = scan.not_integer
        raise ValueError(f"{path}: label {label} on line {number + 1} is not an integer: "
                         "outcome and ordinal labels are classes or grades (a regression "
                         "file has no event kind)")
    if not scan.labels:
        if kind is None and scan.without_qid:
            raise ValueError(f"{path}: no line starts with a number label to tell the kind "
                             "by: pass --kind outcome or --kind ordinal")
        return kind
    labels = set(scan.labels)
    binary = labels <= {-1, 1} or labels <= {0, 1}
    graded = min(labels) >= 1
    if kind == "outcome" and labels <= {-1, 0, 1} and not binary:
        raise ValueError(f"{path}: --kind outcome takes labels ±1 or 0/1, and the file has "
                         f"{scan.describe()} ({scan.first({0})}, {scan.first({-1})}): one of "
                         "the two conventions, please: relabel 0 as -1 or -1 as 0")
    if kind == "outcome" and not binary:
        odd = labels - ({0, 1} if 0 in labels else {-1, 1})
        raise ValueError(f"{path}: --kind outcome takes labels ±1 or 0/1, and the file has "
                         f"{scan.describe()} ({scan.first(odd)}): pass --kind ordinal for "
                         "graded labels, or relabel the classes ±1")
    if kind == "ordinal" and not graded:
        raise ValueError(f"{path}: --kind ordinal takes integer labels from 1, and the file "
                         f"has {scan.describe()} ({scan.first({v for v in labels if v < 1})})"
                         ": shift the labels to start at 1, or pass --kind outcome for ±1 "
                         "or 0/1 classes")
    if kind is not None:
        return kind
    if binary and not graded:
        return "outcome"
    if graded and len(labels) >= 3:
        return "ordinal"
    if binary or graded:
        raise ValueError(f"{path}: {scan.describe()} could be two classes or two grades: "
                         "pass --kind ordinal for grades (for classes, outcome events, "
                         "relabel them ±1 or 0/1)")
    raise ValueError(f"{path}: {scan.describe()} fit neither outcome events (±1 or 0/1) nor "
                     "ordinal ones (1..K): relabel them, then pass --kind")


# ---------------------------------------------------------------------------------- the lines


def file_time(path: str | Path) -> int:
    """The events' time (epoch ms): the file's modification time, or now if that is before
    the earliest event time accepted."""
    ms = int(Path(path).stat().st_mtime * 1000)
    return ms if ms >= parse_iso_ts(MIN_EVENT_TIME) else int(time.time() * 1000)


class LineReader:
    """Events from a file's lines, in order (positions within queries and repeated comment ids
    are counted across the lines it is given).

    Parameters
    ----------
    kind : str
        ``"judgment"``, ``"outcome"`` or ``"ordinal"`` (:func:`file_kind`).
    ts : int
        The events' time (epoch ms).
    name : str
        The file's name, in the item ids of lines without one (``NAME:LINE``).
    """

    def __init__(self, kind: str, ts: int, name: str = "line"):
        self.kind = kind
        self.ts = ts
        self.name = name
        self.positions: dict[str, int] = {}         # qid -> lines of that query so far
        self.repeats: dict[tuple, int] = {}         # id from a comment -> times seen

    def record(self, number: int, line: bytes, too_long: bool = False) -> tuple[bytes, object]:
        """``(content, event)`` of line ``number`` (0-based), or ``(content, Malformed)``:
        the content keys the line in the file ledger."""
        where = f"svmlight line {number + 1}"
        if too_long:
            return self._bad(f"{where}: longer than {MAX_LINE_BYTES:,} bytes", line)
        data, _, comment = line.partition(b"#")
        try:
            tokens = [token.decode("ascii") for token in data.split()]
        except UnicodeDecodeError:
            return self._bad(f"{where}: a byte that is not ASCII before the comment (only the "
                             "comment after # may hold other text)", line)
        if not tokens:
            return self._bad(f"{where}: no label", line)
        event = {"kind": self.kind, "label": parse_label(tokens[0])}
        rest = tokens[1:]
        qid = rest.pop(0)[4:] if rest and rest[0].startswith("qid:") else None
        named = comment_id(comment.decode("utf-8", "replace"))
        if self.kind == "judgment":
            if not qid:
                return self._bad(f"{where}: no qid: (or an empty one) in a file of judgments",
                                 line)
            self.positions[qid] = position = self.positions.get(qid, 0) + 1
            event.update(query=qid, doc=named or str(position))
            identity = ["judgment", qid, event["doc"]]
        else:
            if self.kind == "outcome" and type(event["label"]) is int:
                event["label"] = OUTCOME_LABELS.get(event["label"], event["label"])
            event["item"] = named or f"{self.name}:{number + 1}"
            identity = [self.kind, event["item"]]
        features = _features(rest)
        if type(features) is str:
            return self._bad(f"{where}: {features}", line)
        event["features"] = features
        if named is not None:              # a comment may name one id on several lines
            key = tuple(identity)
            self.repeats[key] = seen = self.repeats.get(key, 0) + 1
            identity.append(seen)
        event["event_id"] = "svm-" + blake2b(json.dumps(identity).encode(),
                                             digest_size=8).hexdigest()
        # keys of either type (an index that did not parse stays text) cannot be sorted as is
        pairs = sorted((str(k), v) for k, v in features.items())
        content = json.dumps([event[k] for k in sorted(event) if k != "features"] + [pairs],
                             default=str).encode()
        event["ts"] = self.ts
        return content, event

    def _bad(self, reason: str, line: bytes) -> tuple[bytes, Malformed]:
        return reason.encode() + b"|" + line[:_RAW_KEPT], Malformed(reason, line)


def _features(tokens: list[str]) -> dict | str:
    """``{index: value}`` of ``INDEX:VALUE`` tokens (an index or value that does not parse is
    kept as text, for validation to name), or the reason the tokens are no features."""
    features: dict = {}
    for token in tokens:
        index, sep, value = token.partition(":")
        if not (sep and index and value) or index == "qid":
            shown = token if len(token) <= 40 else token[:37] + "..."
            if index == "qid":
                return f"{shown!r}: qid must come right after the label"
            return f"{shown!r} is not INDEX:VALUE"
        key = int(index) if _INTEGER.fullmatch(index) else index
        if key in features:
            return f"index {key} appears twice"
        features[key] = float(value) if _NUMBER.fullmatch(value) else value
    return features


def read_records(path: Path, kind: str | None) -> Iterator[tuple[int, bytes, object]]:
    """``(line number, content, event or Malformed)`` of each record, as the file sources
    yield them (:mod:`pipeline.ingest.sources`); ``kind`` from :func:`file_kind`."""
    if kind is None:        # a file without labels to tell the kind by holds no records
        return
    reader = LineReader(kind, file_time(path), Path(path).name)
    for number, line, too_long in lines(path):
        content, record = reader.record(number, line, too_long)
        yield number, content, record
