"""The tables of the Redis layout contract, as code: every key's pattern, type and encoding,
how big its value can get, and the meta hash's fields. ``pipeline/serving/REDIS_LAYOUT.md``
lists exactly these rows (``tests/serving/test_layout.py`` checks); :mod:`.layout` re-exports
them beside the key builders and encodings.
"""

# name -> (key pattern, Redis type, value encoding). The .md table lists exactly these rows;
# <tag> stands for {<namespace>:<model>}, <btag> for {<namespace>:<model>:<bucket>}.
KEY_PATTERNS = {
    "current": ("<tag>:current", "string", "ascii `<version>:<publish_id>:<epoch>`"),
    "epoch": ("<tag>:epoch", "string", "integer counter (INCR) of pointer moves"),
    "pointer": ("<btag>:current", "string",
                "a copy of `current`, the one lookups of the bucket's keys read"),
    "versions": ("<tag>:versions", "list", "ascii version numbers, oldest first"),
    "seq": ("<tag>:seq", "string", "integer counter (INCR) of version numbers"),
    "pending": ("<tag>:pending", "set", "ascii version numbers being written or deleted"),
    "lookups": ("<tag>:lookups", "hash",
                "lookup answers by source, field `<version>:<source>`, added by readers"),
    "lease": ("<tag>:lease", "string",
              "`<token> <holder>` of the retrain holding the model's lease, with a TTL"),
    "lease_seq": ("<tag>:lease_seq", "string", "integer counter (INCR) of lease tokens"),
    "meta": ("<tag>:v<version>:meta", "hash", "utf-8 fields, see the meta table"),
    "items": ("<tag>:v<version>:items:<chunk>", "string",
              "item ids of rows chunk*item_chunk...: int64 LE, or a JSON array of strings"),
    "item_factors": ("<tag>:v<version>:V:<chunk>", "string",
                     "float32 LE, rows x rank, C order; `factor_format` csr: int32 LE count of "
                     "each row, then the rows' (int32 column, float32 value) pairs"),
    "item_bias": ("<tag>:v<version>:b:<chunk>", "string", "float32 LE, one per item"),
    "item_values": ("<tag>:v<version>:val:<chunk>", "string", "float32 LE, one per item"),
    "global_scores": ("<tag>:v<version>:gs:<chunk>", "string",
                      "float32 LE, one per item: the score the global list ranks by"),
    "loser_counts": ("<tag>:v<version>:lc:<chunk>", "string",
                     "int32 LE, one per item: how many users met it, the counts a fold-in "
                     "draws popularity-sampled losers by"),
    "key_index": ("<btag>:v<version>:keys:<chunk>", "string",
                  "JSON array of this version's user/query keys in the bucket"),
    "global": ("<tag>:v<version>:global", "string", "ranked pairs (int32 index, float32 score)"),
    "topk": ("<btag>:v<version>:topk:<key>", "string",
             "ranked pairs (int32 index, float32 score)"),
    "user_factor": ("<btag>:v<version>:u:<key>", "string",
                    "float32 LE, rank values; `factor_format` csr: (int32 column, float32 value) "
                    "pairs of the nonzero ones"),
    "seen": ("<btag>:v<version>:seen:<key>", "string", "int32 LE item indices to exclude"),
    "scorer": ("<tag>:v<version>:scorer", "string", "npz without pickle: the on-demand model"),
}

# The refresher's keys (pipeline.serving.fresh), as KEY_PATTERNS; the .md section "Refreshed
# users" lists exactly these rows. Older readers never read them: no format bump.
FRESH_KEY_PATTERNS = {
    "fresh": ("<btag>:v<version>:fresh:<key>", "string",
              "ascii `<stamp_ms>`: the user's topk/u/seen were rewritten by the refresher"),
    "fresh_keys": ("<btag>:v<version>:fresh_keys", "set",
                   "the keys of the bucket the refresher wrote (deleted with the version)"),
}

# key name -> how big its value can get (the .md section "Value sizes" lists exactly these)
VALUE_BOUNDS = {
    "current": "under 60 bytes", "epoch": "under 20 bytes", "pointer": "under 60 bytes",
    "versions": "one entry per kept version (`keep_versions`)",
    "seq": "under 20 bytes", "pending": "the versions being written or deleted",
    "lookups": "one small field per kept version and source",
    "lease": "a token and the holder's name (host and pid)", "lease_seq": "under 20 bytes",
    "meta": "a few KiB: `bucket_keys` is 1024 counts; `params`, `metrics` and `watermark` are "
            "as the trainer gives them",
    "items": "at most 1 MiB: `item_chunk` ids of 8 bytes (int64) or of the longest JSON id",
    "item_factors": "at most 1 MiB: `item_chunk` x `rank` x 4 bytes (one row of over 1 MiB, "
                    "`rank` > 262,144, would be a chunk of its own); csr: `item_chunk` x (4 + "
                    "8 x the longest row's entries), an item-kNN's k neighbours: 1.6 KB a row "
                    "at k = 200",
    "item_bias": "`item_chunk` x 4 bytes: at most 256 KiB",
    "item_values": "`item_chunk` x 4 bytes: at most 256 KiB",
    "global_scores": "`item_chunk` x 4 bytes: at most 256 KiB",
    "loser_counts": "`item_chunk` x 4 bytes: at most 256 KiB",
    "key_index": "at most 1 MiB: `key_chunk` keys of the longest key's JSON",
    "global": "`top_k` x 8 bytes: at most 1 MiB (publish refuses a `top_k` over 131,072)",
    "topk": "`top_k` x 8 bytes: at most 1 MiB (as `global`)",
    "user_factor": "`rank` x 4 bytes: at most 1 MiB for `rank` up to 262,144 (an EASE blend's "
                   "5,000 columns: 20 KB); csr: 8 bytes per nonzero (an item-kNN's: per item "
                   "the user met)",
    "seen": "4 bytes per item the user met: over 1 MiB only for a user who met over 262,144 "
            "items (not chunked)",
    "scorer": "not bounded: the npz of the on-demand model, e.g. a kernel RankSVM's support "
              "vectors (4 bytes per feature each) and their weights; over 1 MiB for a big "
              "kernel model (one SET when written, one GET when first used)",
}

# meta hash field -> meaning (the .md meta table lists exactly these fields)
META_FIELDS = {
    "format_version": "layout format version (this document: 2)",
    "kind": "user_item | global_list | query_docs | predicted_ratings",
    "model": "model name", "version": "version number",
    "publish_id": "random hex id of this publish; also in `current`",
    "status": "writing | complete | deleting",
    "algorithm": "producing algorithm, e.g. AltSVM",
    "params": "JSON object of training parameters",
    "metrics": "JSON object of evaluation metrics",
    "trained_at": "ISO 8601 UTC time the artifact was trained",
    "published_at": "ISO 8601 UTC time publishing started",
    "served_as": "what the version serves: `model` (the trained model), `trivial` (a trivial "
                 "list: the model did not beat it, and nothing better was served), "
                 "`challenger-NAME` or `blend-NAME` (the gate's challenger, or its blend with "
                 "the model, won); absent means `model`. Lookups of a version that is not "
                 "`model` report it in their `source`",
    "healed_at": "ISO 8601 UTC time a refresher published this version again because Redis "
                 "had lost the model (the last checkpoint's artifact); empty or absent for a "
                 "plain publish",
    "n_items": "number of item (or doc) ids",
    "item_id_type": "int64 | str",
    "item_chunk": "rows per items/V/b/val/gs/lc chunk: a power of two up to 65536, chosen per "
                  "version so that no chunk holds over 1 MiB",
    "n_item_chunks": "number of item chunks", "rank": "factor dimension (0: no factors)",
    "has_item_bias": "1 if b chunks exist",
    "factor_format": "dense | csr: how `V` chunks and `u` keys hold factors (csr: an "
                     "item-kNN's, or a blend with one; absent means dense)",
    "has_item_values": "1 if val chunks exist",
    "has_global_scores": "1 if gs chunks exist",
    "has_loser_counts": "1 if lc chunks exist", "top_k": "longest precomputed list length",
    "n_keys": "user/query keys in the key index",
    "buckets": "number of key buckets (1024 in format 2)",
    "bucket_keys": "JSON array: keys per bucket (each bucket's index has ceil(n / key_chunk) "
                   "chunks)",
    "key_chunk": "keys per key_index chunk: up to 10000, fewer when the keys are long (no "
                 "chunk over 1 MiB)", "n_lists": "keys with a precomputed topk list",
    "n_factor_keys": "keys with a user factor", "n_seen_keys": "keys with a seen list",
    "global": "none | model | fallback: what the global list is",
    "scorer": "none | ordinal_linear | kernel: the kind of the scorer key",
    "fold_in": "JSON object: how a new user is folded in from their items (`solvers.fold_in`); "
               "`{}`: no fold-in",
    "watermark": "JSON object `{\"<topic>/<partition>\": next_offset}`: the event-store "
                 "offsets the version learned from; `{}`: not known",
}
