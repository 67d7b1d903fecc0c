"""The demo's streaming step: a user's new event, and their list a moment later (the refresher
of :mod:`pipeline.refresh`, fed directly: the demo has no Kafka)."""

from __future__ import annotations

import time


def show_fresh(url: str, settings, models: dict, users: list, say, model: str = "movies") -> dict:
    """A known user rates their top item; a new user rates three items: their lists before
    and after one refresh, and how long the refresh took."""
    from pipeline.ingest.open_store import open_store
    from pipeline.refresh.refresher import Refresher
    from pipeline.serving.lookup import TopK
    from pipeline.serving.redis_client import as_client

    topk = TopK(as_client(url), namespace=settings.namespace, timeout=5.0)
    refresher = Refresher(model, models[model], settings, topk, open_store(settings),
                          redis_url=url)
    refresher.watch()
    if refresher.stats.nothing_to_refresh:
        say(f"4. streaming: {refresher.stats.nothing_to_refresh}: nothing to refresh")
        return {"nothing_to_refresh": refresher.stats.nothing_to_refresh}
    user, newbie = users[0], "a-user-who-just-signed-up"
    before = topk.recommend(model, user, k=5)
    top = before.items[0][0]
    liked = [item for item, _ in topk.recommend(model, users[1], k=3).items]
    now = int(time.time() * 1000)
    events = [{"kind": "rating", "event_id": f"demo-fresh-{n}", "ts": now, "user": u,
               "item": item, "rating": 5.0}
              for n, (u, item) in enumerate([(user, top)] + [(newbie, i) for i in liked])]
    started = time.perf_counter()
    refresher.apply_events(events)
    written = refresher.flush()
    seconds = time.perf_counter() - started
    after, new = topk.recommend(model, user, k=5), topk.recommend(model, newbie, k=5)
    say(f"4. streaming: user {user} rated their top item {top} 5 stars; {seconds * 1000:.0f} ms "
        f"later ({written} users refreshed) their list is "
        + ", ".join(str(i) for i, _ in after.items) + f" (source {after.source}; was "
        + ", ".join(str(i) for i, _ in before.items) + ")")
    say(f"   a new user who rated {', '.join(map(str, liked))} gets "
        + ", ".join(str(i) for i, _ in new.items) + f" (source {new.source})")
    return {"user": user, "item": top, "before": [i for i, _ in before.items],
            "after": [i for i, _ in after.items], "after_source": after.source,
            "new_user_items": [i for i, _ in new.items], "new_user_source": new.source,
            "refresh_seconds": round(seconds, 4)}
