"""``/ui``: pages for the people who run the server, rendered here (plain HTML, a little inline
CSS, no script and no URL outside this server).

* ``/ui``: the configured models: served version, age, what the gate served and why, metrics,
  lookups, and a link to the run's report page when this server knows the runs directory;
* ``/ui/users?model=M&user=U[&k=K]``: one user: their history (the items the version keeps as
  met), their current list with scores and its source, and why each item is on it
  (:meth:`~pipeline.serving.lookup.TopK.explain`);
* ``/ui/reports/{model}/{version}``: the report page of the run that published that version.

What the pages read beyond Redis is a :class:`UiSources`, given by whoever builds the
application (``rankstream serve`` from the model config): item titles per model (the config's
``item_titles``: MovieLens's ``u.item`` or ``movies.csv``, or any file of id and title) and
the runs directory. Every value shown is escaped: user ids and titles are untrusted.
"""

from __future__ import annotations

import csv
import io
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, Response

from pipeline.serving import ui_pages as pages
from pipeline.serving.api_requests import check_k, only, unknown_model_reason
from pipeline.serving.explain import UnknownUserError
from pipeline.serving.item_queries import UnknownItemError
from pipeline.serving.layout import UnknownModelError

log = logging.getLogger(__name__)

REPORT_NAME = "report.html"     # the run's page (pipeline.training.report.REPORT_NAME)
MAX_TITLES_BYTES = 256 << 20    # an item metadata file larger than this is not read
EXPLAINED = 5                   # terms shown per listed item


@dataclass
class UiSources:
    """What the pages read besides Redis: ``titles`` (model → item metadata file) and
    ``runs_dir`` (``<runs_dir>/<model>/<run>/`` with ``published.json``, ``gate.json`` and
    the report page), each optional."""

    titles: dict = field(default_factory=dict)
    runs_dir: Path | None = None
    _loaded: dict = field(default_factory=dict, repr=False)
    _runs: dict = field(default_factory=dict, repr=False)

    def titles_of(self, model: str) -> tuple[dict, str | None]:
        """(item id as text → title, a problem with the file or None); read once."""
        if model not in self._loaded:
            path = self.titles.get(model)
            try:
                self._loaded[model] = ({} if not path else read_titles(path)), None
            except (OSError, ValueError, csv.Error) as err:
                log.warning("item titles of %r (%s): %s", model, path, err)
                self._loaded[model] = {}, f"item titles {path} could not be read: {err}"
        return self._loaded[model]

    def run_of(self, model: str, version: int | None) -> dict:
        """``{"dir", "reason", "report"}`` of the run that published ``version`` ({} when
        unknown): found by the ``version`` its ``published.json`` names."""
        if self.runs_dir is None or version is None:
            return {}
        if (model, version) not in self._runs:
            self._runs[(model, version)] = _find_run(Path(self.runs_dir) / model, version)
        return self._runs[(model, version)]


def _find_run(model_dir: Path, version: int) -> dict:
    try:
        runs = sorted((p for p in model_dir.iterdir() if p.is_dir()), reverse=True)
    except OSError:
        return {}
    for run in runs:                      # newest first: run names start with their time
        published = _json(run / "published.json")
        if published.get("published") and published.get("version") == version:
            gate = _json(run / "gate.json")
            report = run / REPORT_NAME
            return {"dir": str(run), "reason": gate.get("reason") or published.get("reason"),
                    "report": str(report) if report.is_file() else None}
    return {}


def _json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def read_titles(path) -> dict:
    """Item id (as text) → title of an item metadata file: MovieLens 100K's ``u.item``
    (``id|title|date|...``, latin-1), ml-1m's ``movies.dat`` (``id::title::genres``), or a
    CSV/TSV (``movies.csv``: ``movieId,title,genres``) whose header names a ``title`` column
    (the id is the first column whose name ends in ``id``, else the first); UTF-8, else
    latin-1.

    >>> import tempfile, os
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = os.path.join(d, "movies.csv")
    ...     _ = open(p, "w").write('movieId,title,genres\\n1,"Heat, the (1995)",Action\\n')
    ...     read_titles(p)
    {'1': 'Heat, the (1995)'}
    """
    path = Path(path)
    if path.stat().st_size > MAX_TITLES_BYTES:
        raise ValueError(f"{path.stat().st_size:,} bytes, more than {MAX_TITLES_BYTES:,}")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    first = text.split("\n", 1)[0]
    if "::" in first:
        rows = [line.split("::") for line in text.splitlines()]
    else:
        delimiter = "|" if "|" in first and first.count("|") >= first.count(",") else (
            "\t" if "\t" in first else ",")
        rows = list(csv.reader(io.StringIO(text), delimiter=delimiter))
    rows = [r for r in rows if len(r) >= 2]
    if not rows:
        return {}
    header = [c.strip().lower() for c in rows[0]]
    id_col, title_col = 0, 1
    if "title" in header:
        title_col = header.index("title")
        id_col = next((n for n, c in enumerate(header) if c.endswith("id")), 0)
        rows = rows[1:]
    return {r[id_col].strip(): r[title_col].strip() for r in rows
            if len(r) > max(id_col, title_col)}


# ---------------------------------------------------------------------- handlers
async def index(request: Request) -> Response:
    """The served models, and a form to look at a user."""
    only(request.query_params, set())
    state = request.app.state
    rows = []
    for model in state.models:
        try:
            info = state.topk.model_info(model).to_dict()
        except UnknownModelError:
            info = {"model": model, "version": None}
        rows.append((info, state.ui.run_of(model, info.get("version"))))
    return HTMLResponse(pages.index_page(rows, state.models))


async def user(request: Request) -> Response:
    """One user: history, current list with sources and scores, why each item."""
    try:
        return _user_page(request)
    except UnknownModelError:
        return _problem(404, unknown_model_reason(request.query_params.get("model", ""),
                                                  request.app.state.models))
    except UnknownItemError as err:
        return _problem(404, str(err))
    except ValueError as err:            # a bad parameter: a page that says which
        return _problem(400, str(err))


def _user_page(request: Request) -> Response:
    query, state = request.query_params, request.app.state
    only(query, {"model", "user", "k"})
    model, user_id = query.get("model", "").strip(), query.get("user", "")
    if not model or not user_id.strip():
        return _problem(400, "give a model and a user: /ui/users?model=M&user=U")
    k = check_k(query.get("k", "10"), state.max_k)
    topk = state.topk
    rec = topk.recommend(model, user_id, k=k)
    explained, problem = [], None
    for item, _ in rec.items:
        try:
            explained.append(topk.explain(model, user_id, item, k=EXPLAINED))
        except UnknownUserError as err:      # the fallback list: nothing to split
            problem = str(err)
            break
    titles, titles_problem = state.ui.titles_of(model)
    return HTMLResponse(pages.user_page(rec, explained, problem or titles_problem, titles,
                                        state.models, k))


async def report(request: Request) -> Response:
    """The report page of the run that published a version of a configured model."""
    state = request.app.state
    name, version = request.path_params["name"], request.path_params["version"]
    found = (state.ui.run_of(name, int(version))
             if name in state.models and version.isdigit() else {})
    if not found.get("report"):
        return _problem(404, f"no report page of model {name[:100]!r} version "
                             f"{version[:20]!r} is known to this server")
    return FileResponse(found["report"], media_type="text/html")


def _problem(status: int, reason: str) -> HTMLResponse:
    return HTMLResponse(pages.problem_page(status, reason), status_code=status)


# (route name, path, handler): mounted by pipeline.serving.api.create_app beside the API's;
# no {model} in a path: the metrics label requests by it, and these take any text there
ROUTES = [("ui", "/ui", index), ("ui_user", "/ui/users", user),
          ("ui_report", "/ui/reports/{name}/{version}", report)]
