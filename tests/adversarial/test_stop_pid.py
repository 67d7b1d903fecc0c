"""infra/stop_pid.sh stops the process it started, by pid and start time, even when the process
renamed itself (Airflow's api-server does), and leaves any other process alone."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

STOP = Path(__file__).resolve().parents[2] / "infra" / "stop_pid.sh"


def _start_time(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(") ", 1)[1].split()[19]


def _renamed_sleeper():
    """A process whose command line no longer says what was started (exec -a)."""
    proc = subprocess.Popen(["bash", "-c", "exec -a renamed-by-itself sleep 300"])
    for _ in range(50):
        if "renamed-by-itself" in Path(f"/proc/{proc.pid}/cmdline").read_text():
            break
        time.sleep(0.05)
    return proc


def _stop(pidfile: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(STOP), "api-server", str(pidfile), "2",
                           "airflow api-server"], capture_output=True, text=True, timeout=60)


def test_a_renamed_process_with_its_start_time_is_stopped(tmp_path):
    proc = _renamed_sleeper()
    try:
        pidfile = tmp_path / "api-server.pid"
        pidfile.write_text(f"{proc.pid} {_start_time(proc.pid)}\n")
        out = _stop(pidfile)
        assert out.returncode == 0 and "stopped" in out.stdout, out
        assert proc.wait(timeout=10) is not None and not pidfile.exists()
    finally:
        proc.kill()


def test_another_process_on_a_reused_pid_is_left_alone(tmp_path):
    proc = _renamed_sleeper()
    try:
        pidfile = tmp_path / "api-server.pid"
        pidfile.write_text(f"{proc.pid} 1\n")          # the start time of another process
        out = _stop(pidfile)
        assert "another program" in out.stderr and proc.poll() is None
        pidfile.write_text(f"{proc.pid}\n")            # old pid files: the command line decides
        out = _stop(pidfile)
        assert "another program" in out.stderr and proc.poll() is None
    finally:
        proc.kill()
