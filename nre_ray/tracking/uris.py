"""MLflow tracking URIs, parsed in one place: their scheme, the database file of a local sqlite store, a server's
host. Pure functions of the text (nothing is opened or created); a leaf: it imports nothing of ours."""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path

SQLITE = "sqlite:///"
"""How a sqlite store's URI starts: then the path (relative, or absolute with a fourth slash)."""
MEMORY = "sqlite:///:memory:"
"""A sqlite database in memory (not a file)."""
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")


def scheme(uri: str) -> str:
    """The scheme of ``uri`` in lower case (``sqlite``, ``http``, ``file``, ``postgresql+psycopg2`` ...); "" for a
    path or a store named by a word alone (``databricks``)."""
    match = _SCHEME.match(uri)
    return match.group(1).lower() if match else ""


def sqlite_path(uri: str) -> Path | None:
    """The database file of a sqlite store ``sqlite:///PATH`` (PATH as written: relative stays relative); None for
    another URI and for a database in memory."""
    if not uri.startswith(SQLITE) or uri == MEMORY:
        return None
    return Path(uri[len(SQLITE):])


def sqlite_uri(path: str | Path) -> str:
    """The URI of the sqlite store in the file ``path``."""
    return f"{SQLITE}{path}"


def is_server(uri: str) -> bool:
    """Whether ``uri`` names an MLflow server (``http://`` or ``https://``)."""
    return scheme(uri) in ("http", "https")


def server_host(uri: str) -> str:
    """The host of a server's URI, in lower case ("" when it has none)."""
    return urllib.parse.urlparse(uri).hostname or ""


def file_path(uri: str) -> str:
    """The path of a ``file:`` URI (``file:///x``, ``file://host/x``, ``file:x``), or ``uri`` itself when it is a
    path."""
    return re.sub(r"^file:(//[^/]*)?", "", uri) if uri.lower().startswith("file:") else uri
