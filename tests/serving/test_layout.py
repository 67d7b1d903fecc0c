"""The written contract (pipeline/serving/REDIS_LAYOUT.md) against its code side (layout.py)
and against what publish actually writes."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from pipeline.serving import layout as L
from pipeline.serving.artifact import ModelArtifact
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


def test_format_version_and_kinds_are_documented():
    assert f"format {L.FORMAT_VERSION}" in DOC.splitlines()[0]
    assert f"Format version: **{L.FORMAT_VERSION}**" in DOC
    kinds = [_unquote(r[0].split()[0]) for r in _table("Kinds")]
    assert tuple(kinds) == L.KINDS


def test_documented_pair_example_decodes():
    hexval = re.search(r"is the 8 bytes\s+`([0-9a-f]{16})`", DOC).group(1)
    assert L.unpack_pairs(bytes.fromhex(hexval)) == ([2], [1.0])
    assert L.pack_pairs([2], [1.0]).hex() == hexval
    assert L.PAIR_DTYPE.itemsize == 8


def test_key_builders_follow_the_patterns():
    keys = L.ModelKeys("ns", "model-1")
    vk = keys.version(7)
    built = {"current": keys.current, "versions": keys.versions, "seq": keys.seq,
             "pending": keys.pending, "lookups": keys.lookups, "meta": vk.meta,
             "items": vk.items(3),
             "item_factors": vk.item_factors(3), "item_bias": vk.item_bias(3),
             "item_values": vk.item_values(3), "key_index": vk.key_index(3),
             "global": vk.global_list, "topk": vk.topk("alice"),
             "user_factor": vk.user_factor("alice"), "seen": vk.seen("alice"),
             "scorer": vk.scorer}
    assert set(built) == set(L.KEY_PATTERNS)
    for name, key in built.items():
        expected = (L.KEY_PATTERNS[name][0].replace("<tag>", "{ns:model-1}")
                    .replace("<version>", "7").replace("<chunk>", "3")
                    .replace("<key>", "alice"))
        assert key == expected
        assert key.startswith("{ns:model-1}")  # one Cluster hash tag per model


def test_names_and_values_are_checked():
    with pytest.raises(ValueError, match="model name 'a:b'"):
        L.ModelKeys("ns", "a:b")
    with pytest.raises(ValueError, match="namespace"):
        L.ModelKeys("{x}", "m")
    assert L.parse_current(b"12:00ff00ff", "k") == (12, "00ff00ff")
    for bad in (b"12", b"x:00ff00ff", b"0:00ff00ff", b"7:XYZXYZXY"):
        with pytest.raises(L.LayoutError, match="expected '<version>:<publish_id>'"):
            L.parse_current(bad, "k")
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
    rx = re.escape(pattern.replace("<tag>", tag))
    rx = (rx.replace("<version>", r"[1-9][0-9]*").replace("<chunk>", r"[0-9]+")
          .replace("<key>", r".+"))
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
    for raw in redis_client.scan_iter(match="{contract:*", count=1000):
        key = raw.decode()
        matches = [n for n, (rx, _) in patterns.items() if rx.match(key)]
        assert matches, f"{key} is not in REDIS_LAYOUT.md"
        assert redis_client.type(key).decode() == patterns[matches[0]][1], key
        found.update(matches)
    assert {"current", "versions", "seq", "meta", "items", "key_index"} - found <= (
        {"key_index"} if kind in ("global_list", "predicted_ratings") else set())
    meta = {k.decode(): v.decode() for k, v in redis_client.hgetall(f"{tag}:v2:meta").items()}
    assert set(meta) == set(L.META_FIELDS)
    assert meta["format_version"] == str(L.FORMAT_VERSION)
    assert meta["status"] == "complete" and meta["kind"] == kind
    version, publish_id = L.parse_current(redis_client.get(f"{tag}:current"), "current")
    assert (version, publish_id) == (2, meta["publish_id"])
    assert redis_client.smembers(f"{tag}:pending") == set()
