"""The written contract (pipeline/serving/REDIS_LAYOUT.md) against its code side (layout.py)
and against what publish actually writes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from pipeline.serving import layout as L
from pipeline.serving.artifact import ModelArtifact
from pipeline.serving.artifact_kinds import KINDS
from pipeline.serving.publish import publish
from tests.serving.helpers import user_model

DOC = Path(L.__file__).with_name("REDIS_LAYOUT.md").read_text()


def _table(heading: str) -> list[list[str]]:
    section = DOC.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if line.startswith("|") and not line.startswith("| ---"):
            cells = [c.strip().replace("\\|", "|") for c in
                     re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            rows.append(cells)
    return rows[1:]  # without the header row


def _unquote(cell: str) -> str:
    return cell.strip("`")


def test_key_table_matches_code():
    rows = _table("Keys")
    doc = {_unquote(r[0]): (_unquote(r[1]), r[2]) for r in rows}
    code = {name: (pattern, rtype) for name, (pattern, rtype, _) in L.KEY_PATTERNS.items()}
    assert doc == code


def test_meta_table_matches_code():
    doc = {_unquote(r[0]): r[1] for r in _table("Meta hash fields")}
    assert doc == L.META_FIELDS


def test_value_sizes_table_matches_code_and_covers_every_key():
    doc = {_unquote(r[0]): r[1] for r in _table("Value sizes")}
    assert doc == L.VALUE_BOUNDS
    assert set(L.VALUE_BOUNDS) == set(L.KEY_PATTERNS)
    assert L.MAX_VALUE_BYTES == 1 << 20 and "at most 1 MiB" in DOC


def test_format_version_and_kinds_are_documented():
    assert f"format {L.FORMAT_VERSION}" in DOC.splitlines()[0]
    assert f"Format version: **{L.FORMAT_VERSION}**" in DOC
    kinds = [_unquote(r[0].split()[0]) for r in _table("Kinds")]
    assert tuple(kinds) == tuple(KINDS)   # every registered serving shape is documented


def test_documented_pair_example_decodes():
    hexval = re.search(r"is the 8 bytes\s+`([0-9a-f]{16})`", DOC).group(1)
    assert L.unpack_pairs(bytes.fromhex(hexval)) == ([2], [1.0])
    assert L.pack_pairs([2], [1.0]).hex() == hexval
    assert L.PAIR_DTYPE.itemsize == 8


def test_key_builders_follow_the_patterns():
    keys = L.ModelKeys("ns", "model-1")
    vk = keys.version(7)
    bucket = L.bucket_of("alice")
    built = {"current": keys.current, "epoch": keys.epoch, "pointer": keys.pointer(bucket),
             "versions": keys.versions, "seq": keys.seq,
             "pending": keys.pending, "lookups": keys.lookups, "lease": keys.lease,
             "lease_seq": keys.lease_seq, "meta": vk.meta,
             "items": vk.items(3),
             "item_factors": vk.item_factors(3), "item_bias": vk.item_bias(3),
             "item_values": vk.item_values(3), "global_scores": vk.global_scores(3),
             "loser_counts": vk.loser_counts(3),
             "key_index": vk.key_index(bucket, 3),
             "global": vk.global_list, "topk": vk.topk("alice"),
             "user_factor": vk.user_factor("alice"), "seen": vk.seen("alice"),
             "scorer": vk.scorer}
    assert set(built) == set(L.KEY_PATTERNS)
    for name, key in built.items():
        pattern = L.KEY_PATTERNS[name][0]
        expected = (pattern.replace("<tag>", "{ns:model-1}")
                    .replace("<btag>", "{ns:model-1:" + str(bucket) + "}")
                    .replace("<version>", "7").replace("<chunk>", "3")
                    .replace("<key>", "alice"))
        assert key == expected
        # model-level keys share the model's Cluster hash tag, per-key keys their bucket's
        tag = "{ns:model-1:" + str(bucket) + "}" if "<btag>" in pattern else "{ns:model-1}"
        assert key.startswith(tag)


def test_buckets_spread_keys_evenly_and_are_stable():
    """bucket = top 10 bits of crc32(utf-8 key) * 2654435761 mod 2**32, as documented (other
    clients must agree); structured ids fill the buckets like random ones."""
    import zlib

    assert "(crc32(<key> as UTF-8) × 2654435761 mod 2³²)\n  >> 22" in DOC
    assert re.search(r"`alice` → (\d+), `42` → (\d+)", DOC).groups() == (
        str(L.bucket_of("alice")), str(L.bucket_of("42")))
    for key in ("alice", "é", "42", "user-123456789"):
        assert L.bucket_of(key) == ((zlib.crc32(key.encode()) * 2654435761) % 2**32) >> 22
    for ids in (range(200_000), range(1, 2_000_000, 10), [f"u{i}" for i in range(200_000)]):
        counts = np.bincount([L.bucket_of(str(u)) for u in ids], minlength=L.BUCKETS)
        mean = counts.mean()   # Poisson-like: within 5 standard deviations everywhere
        assert np.abs(counts - mean).max() < 5 * np.sqrt(mean), (ids, counts.min(), counts.max())
    used = len({L.bucket_of(str(10 * i + 1)) for i in range(2000)})   # plain CRC-32: 769
    assert used > 850, used


def test_names_and_values_are_checked():
    with pytest.raises(ValueError, match="model name 'a:b'"):
        L.ModelKeys("ns", "a:b")
    with pytest.raises(ValueError, match="namespace"):
        L.ModelKeys("{x}", "m")
    assert L.parse_current(b"12:00ff00ff:3", "k") == (12, "00ff00ff")
    assert L.parse_pointer(b"12:00ff00ff:3", "k") == (12, "00ff00ff", 3)
    for bad in (b"12", b"x:00ff00ff:1", b"0:00ff00ff:1", b"7:XYZXYZXY:1", b"7:00ff00ff:0",
                b"7:00ff00ff:"):
        with pytest.raises(L.LayoutError, match="expected '<version>:<publish_id>:<epoch>'"):
            L.parse_current(bad, "k")
    with pytest.raises(L.LayoutError, match="format 1 publisher"):
        L.parse_current(b"12:00ff00ff", "k")
    with pytest.raises(L.LayoutError, match="not a multiple of 8"):
        L.decode_pairs(b"1234567", "k")
    with pytest.raises(L.LayoutError, match="outside the version's 3 items"):
        L.decode_pairs(L.pack_pairs([5], [1.0]), "k", n_items=3)
    ids = np.array([3, -4, 2**40])
    assert L.unpack_ids(L.pack_ids(ids), "int64", "k") == ids.tolist()
    assert L.unpack_ids(L.pack_ids(np.array(["a", "é"])), "str", "k") == ["a", "é"]
    with pytest.raises(L.LayoutError, match="does not hold int64 ids"):
        L.unpack_ids(b"123", "int64", "k")
    assert L.key_of(np.int64(5)) == "5"
    with pytest.raises(TypeError):
        L.key_of(True)


def _pattern_regex(pattern: str, tag: str) -> re.Pattern:
    btag = tag[:-1] + ":<bucket>}"
    rx = re.escape(pattern.replace("<tag>", tag).replace("<btag>", btag))
    rx = (rx.replace("<version>", r"[1-9][0-9]*").replace("<chunk>", r"[0-9]+")
          .replace("<key>", r"(?P<key>.+)").replace("<bucket>", r"(?P<bucket>0|[1-9][0-9]*)"))
    return re.compile("^" + rx + "$")


@pytest.mark.parametrize("kind", ["user_item", "global_list", "query_docs",
                                  "predicted_ratings"])
def test_published_keys_and_meta_follow_the_contract(redis_client, kind):
    if kind == "user_item":
        art = user_model(1, n_users=20, n_items=30, precompute=np.arange(20) % 3 > 0)
    elif kind == "global_list":
        art = ModelArtifact.global_list(item_ids=["a", "b", "c"], scores=[1.0, 3.0, 2.0])
    elif kind == "predicted_ratings":
        art = ModelArtifact.predicted_ratings(item_ids=[1, 2, 3], ratings=[4, 5, 1])
    else:
        art = ModelArtifact.query_docs(query_ids=["q1", "q2"], doc_ids=["d1", "d2", "d3"],
                                       indptr=[0, 2, 3], docs=[0, 2, 1], scores=[0.1, 0.5, 1.0])
    publish("m", art, redis_client, top_k=5, namespace="contract")
    publish("m", art, redis_client, top_k=5, namespace="contract")
    tag = "{contract:m}"
    patterns = {name: (_pattern_regex(p, tag), rtype)
                for name, (p, rtype, _) in L.KEY_PATTERNS.items()}
    found = set()
    buckets = set()
    for raw in redis_client.scan_iter(match="{contract:*", count=1000):
        key = raw.decode()
        matches = [(n, m) for n, (rx, _) in patterns.items() if (m := rx.match(key))]
        assert matches, f"{key} is not in REDIS_LAYOUT.md"
        name, m = matches[0]
        assert redis_client.type(key).decode() == patterns[name][1], key
        if "key" in m.groupdict():   # a per-key key lies in its key's bucket
            assert int(m.group("bucket")) == L.bucket_of(m.group("key")), key
        if "bucket" in m.groupdict():
            buckets.add(int(m.group("bucket")))
        found.add(name)
    assert {"current", "epoch", "pointer", "versions", "seq", "meta", "items",
            "key_index"} - found <= (
        {"key_index"} if kind in ("global_list", "predicted_ratings") else set())
    assert set(range(L.BUCKETS)) <= buckets   # every bucket has its pointer
    meta = {k.decode(): v.decode() for k, v in redis_client.hgetall(f"{tag}:v2:meta").items()}
    assert set(meta) == set(L.META_FIELDS)
    assert meta["format_version"] == str(L.FORMAT_VERSION)
    assert meta["status"] == "complete" and meta["kind"] == kind
    assert meta["buckets"] == str(L.BUCKETS)
    assert sum(json.loads(meta["bucket_keys"])) == int(meta["n_keys"]) == art.n_keys
    current = redis_client.get(f"{tag}:current")
    version, publish_id, epoch = L.parse_pointer(current, "current")
    assert (version, publish_id) == (2, meta["publish_id"]) and epoch == 2
    pointers = redis_client.mget([L.ModelKeys("contract", "m").pointer(b)
                                  for b in range(L.BUCKETS)])
    assert set(pointers) == {current}   # every bucket pointer copies `current`
    assert redis_client.smembers(f"{tag}:pending") == set()
