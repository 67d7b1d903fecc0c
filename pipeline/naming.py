"""The one rule for model and namespace names, without heavy imports (the DAG file uses it).

A name is 1-100 characters from ``A-Z a-z 0-9 _ . -``, starting with a letter or digit: it
becomes part of Redis keys (inside the hash tag, where ``:`` and braces are reserved), of
Airflow DAG ids (``rankstream_<model>``) and of directory names.

Examples
--------
>>> check_name("model", "movies-v2")
'movies-v2'
>>> is_valid_name("m\\n"), is_valid_name("my model")
(False, False)
"""

from __future__ import annotations

import re

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}")


def is_valid_name(name) -> bool:
    return isinstance(name, str) and NAME.fullmatch(name) is not None


def check_name(what: str, name) -> str:
    """``name`` if it follows the rule, else ``ValueError`` naming ``what`` and the value."""
    if not is_valid_name(name):
        raise ValueError(f"{what} {name!r} is not valid: use 1-100 letters, digits, '_', '.' or "
                         "'-', starting with a letter or digit (':', braces, spaces and line "
                         "breaks are reserved)")
    return name
