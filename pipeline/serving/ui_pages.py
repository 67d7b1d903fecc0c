"""The HTML of the ``/ui`` pages (:mod:`.ui` reads the data): plain strings, every value
escaped with :func:`html.escape` (ids and titles come from users), a little inline CSS, no
script, no URL outside this server.

>>> "&lt;b&gt;" in problem_page(404, "user '<b>' is not known")
True
"""

from __future__ import annotations

from html import escape
from urllib.parse import urlencode

STYLE = (
    "body{font-family:system-ui,sans-serif;margin:1.5em 2em;color:#222;max-width:1200px}"
    "h1{font-size:1.5em;margin:0 0 .3em}h2{font-size:1.15em;margin:1.4em 0 .4em}"
    "table{border-collapse:collapse;margin:.3em 0}"
    "td,th{padding:4px 10px;border-bottom:1px solid #ddd;text-align:left;vertical-align:top}"
    "th{background:#f3f3f3}.num{text-align:right;font-variant-numeric:tabular-nums}"
    ".muted{color:#777}.note{background:#fff6d6;border:1px solid #e8d48a;padding:.5em .8em}"
    ".bar{display:inline-block;height:.7em;margin-right:6px;vertical-align:middle}"
    ".pos{background:#55a868}.neg{background:#c44e52}.why td{border:0;padding:1px 6px}"
    "form{margin:.6em 0 1em}input,select{font-size:1em;padding:2px 4px}"
    "nav a{margin-right:1em}.nw{white-space:nowrap}")

SERVED = {"model": "the trained model", "trivial": "a trivial list: the trained model did "
          "not beat it"}


def e(value) -> str:
    """``value`` as text fit for HTML (quotes too: it may sit in an attribute)."""
    return escape(str(value), quote=True)


def _page(title: str, body: str) -> str:
    return ("<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{e(title)}</title><style>{STYLE}</style></head><body>"
            "<nav><a href='/ui'>models</a><a href='/docs'>API</a></nav>"
            f"{body}</body></html>")


def problem_page(status: int, reason: str) -> str:
    return _page(f"rankstream: {status}", f"<h1>{status}</h1><p class='note'>{e(reason)}</p>")


def _num(x, digits: int = 4) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return e(x)


def _age(seconds) -> str:
    if seconds is None:
        return "—"
    s = int(seconds)
    if s >= 86400:
        return f"{s // 86400} d {s % 86400 // 3600} h ago"
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60} min ago"
    return f"{s // 60} min {s % 60} s ago" if s >= 60 else f"{s} s ago"


def served_as(value: str) -> str:
    """What a version's ``served_as`` means, in words."""
    if value in SERVED:
        return SERVED[value]
    kind, _, name = value.partition("-")
    if kind == "challenger":
        return f"the challenger {name}: it beat the trained model"
    if kind == "blend":
        return f"the blend {name}: it beat each model alone"
    return value


def user_link(model: str, user, text: str | None = None) -> str:
    href = "/ui/users?" + urlencode({"model": model, "user": str(user)})
    return f"<a href='{e(href)}'>{e(text if text is not None else user)}</a>"


def _form(models: list, model: str = "", user: str = "", k: int = 10) -> str:
    if models:
        options = "".join(f"<option{' selected' if m == model else ''}>{e(m)}</option>"
                          for m in models)
        pick = f"<select name='model'>{options}</select>"
    else:
        pick = f"<input name='model' placeholder='model' value='{e(model)}'>"
    return (f"<form action='/ui/users' method='get'>model {pick} user "
            f"<input name='user' value='{e(user)}' required> k "
            f"<input name='k' type='number' min='1' value='{int(k)}' style='width:4em'> "
            "<button>look</button></form>")


def index_page(rows: list, models: list) -> str:
    """``rows``: (model info as ``/v1/models`` answers it, the run that published it)."""
    out = ["<h1>rankstream: served models</h1>"]
    if not rows:
        out.append("<p class='note'>No models are configured for this server (start it "
                   "with --config); a user can still be looked at by model name.</p>")
    else:
        out.append("<table><tr><th>model</th><th>version</th><th>serves</th><th>trained</th>"
                   "<th>metrics</th><th>lookups</th><th>report</th></tr>")
        out += [_model_row(info, run) for info, run in rows]
        out.append("</table>")
    out.append("<h2>Look at a user</h2>" + _form(models))
    return _page("rankstream models", "".join(out))


def _model_row(info: dict, run: dict) -> str:
    name = e(info["model"])
    if info.get("version") is None:
        return f"<tr><td>{name}</td><td colspan='6' class='muted'>never trained (nothing " \
               "published)</td></tr>"
    why = f"<br><span class='muted'>{e(run['reason'])}</span>" if run.get("reason") else ""
    metrics = "<br>".join(f"<span class='nw'>{e(k)} {_num(v)}</span>" for k, v in sorted(
        (info.get("metrics") or {}).items()) if not isinstance(v, (dict, list)))
    share = info.get("fallback_share")
    lookups = f"{info.get('lookups', 0):,}" + (
        "" if share is None else f"<br><span class='muted'>{share:.1%} fallback</span>")
    if run.get("report"):
        report = f"<a href='/ui/reports/{name}/{int(info['version'])}'>report</a>"
    else:
        report = e(run.get("dir") or "—")
    return (f"<tr><td>{name}</td><td class='num'>{int(info['version'])}</td>"
            f"<td>{e(served_as(info.get('served_as', 'model')))} "
            f"<span class='muted'>({e(info.get('algorithm', ''))}, {e(info.get('kind', ''))})"
            f"</span>{why}</td><td class='nw'>{_age(info.get('age_seconds'))}<br>"
            f"<span class='muted'>{e(info.get('trained_at', ''))}</span></td>"
            f"<td>{metrics or '—'}</td>"
            f"<td class='num'>{lookups}</td><td>{report}</td></tr>")


def _item(item, titles: dict) -> str:
    title = titles.get(str(item))
    return f"<span class='muted'>{e(item)}</span> <b>{e(title)}</b>" if title else e(item)


def _plain(expl, titles: dict) -> str:
    """One sentence a product person reads first: the history behind most of the score.

    >>> from types import SimpleNamespace as N
    >>> _plain(N(contributions=[{"item": 7, "term": 0.5, "share": 0.6},
    ...                         {"winner": 3, "loser": 9, "term": 0.2, "share": 0.25}]), {})
    'Mostly because this user met 7 (60%) and preferred 3 to 9 (25%).'
    """
    parts = []
    for c in expl.contributions:
        if c["term"] <= 0 or len(parts) == 2:
            continue
        share = f" ({c['share']:.0%})" if c.get("share") is not None else ""
        parts.append(f"met {_name(c['item'], titles)}{share}" if "item" in c else
                     f"preferred {_name(c['winner'], titles)} to "
                     f"{_name(c['loser'], titles)}{share}")
    if not parts:
        return "Nothing in this user's history speaks for it; it is on the list by its bias."
    return f"Mostly because this user {' and '.join(parts)}."


def _name(item, titles: dict) -> str:
    return titles.get(str(item)) or str(item)


def _why(expl, titles: dict) -> str:
    """One listed item's explanation: a sentence in plain words, its largest terms with bars,
    then the remainder."""
    if expl.note:
        return f"<span class='muted'>{e(expl.note)}</span>"
    rows = []
    for c in expl.contributions:
        share = c.get("share") or 0.0
        width = max(1, min(120, int(abs(share) * 120)))
        what = (_item(c["item"], titles) if "item" in c else
                f"{_item(c['winner'], titles)} &gt; {_item(c['loser'], titles)}")
        rows.append(f"<tr><td><span class='bar {'pos' if c['term'] >= 0 else 'neg'}' "
                    f"style='width:{width}px'></span></td><td class='num'>{c['term']:+.3g}"
                    f"</td><td class='num'>{share:.0%}</td><td>{what}</td></tr>")
    more = expl.n_terms - len(expl.contributions)
    rest = (f"{more} more term{'s' if more != 1 else ''} {expl.rest:+.3g}, "
            f"bias {expl.bias:+.3g}, residual {expl.residual:+.3g}")
    return (f"{e(_plain(expl, titles))}<table class='why'>{''.join(rows)}</table>"
            f"<span class='muted'>{rest}</span>")


def user_page(rec, explained: list, problem: str | None, titles: dict, models: list,
              k: int) -> str:
    """A user's page: their list (``rec``), its items' explanations, their history."""
    head = (f"<h1>user {e(rec.user)} <span class='muted'>on {e(rec.model)} version "
            f"{int(rec.version)}</span></h1>")
    out = [_form(models, rec.model, str(rec.user), k), head]
    first = explained[0] if explained else None
    facts = [f"list source <b>{e(rec.source)}</b>"]
    if first is not None and first.factor:
        facts.append(f"user factor <b>{e(first.factor)}</b>")
    out.append("<p>" + " · ".join(facts) + "</p>")
    if problem:
        out.append(f"<p class='note'>{e(problem)}</p>")
    if first is not None and first.computed:
        out.append(f"<p class='muted'>Why: {e(first.computed)}</p>")
    if not titles:
        out.append("<p class='muted'>Items show as ids: set <code>item_titles</code> in the "
                   "model's config (a file of item id and title) to show their names.</p>")
    out.append(f"<h2>Current list ({len(rec.items)})</h2><table><tr><th>#</th><th>item</th>"
               "<th class='num'>score</th><th>why: the largest terms of the user's history "
               "(term, share of the score)</th></tr>")
    by_item = {x.item: x for x in explained}
    for n, (item, score) in enumerate(rec.items, 1):
        why = _why(by_item[item], titles) if item in by_item else ""
        out.append(f"<tr><td class='num'>{n}</td><td>{_item(item, titles)}</td>"
                   f"<td class='num'>{_num(float(score))}</td><td>{why}</td></tr>")
    out.append("</table>")
    history = first.history if first is not None else []
    out.append(f"<h2>History ({len(history)} met items)</h2>")
    if history:
        shown = history[:500]
        out.append("<table><tr><th>item</th></tr>" + "".join(
            f"<tr><td>{_item(x, titles)}</td></tr>" for x in shown) + "</table>")
        if len(history) > len(shown):
            out.append(f"<p class='muted'>… and {len(history) - len(shown)} more</p>")
    else:
        out.append("<p class='muted'>none kept by this version</p>")
    return _page(f"{rec.user} on {rec.model}", "".join(out))
