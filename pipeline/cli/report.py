"""``rankstream report MODEL``: the latest run's report page (``report.html`` in its run
directory, see :mod:`pipeline.training.report`), written first when the run has none yet (or
with ``--rebuild``); prints its path and opens it in a browser, unless ``--no-open`` or there is
no display to open it on."""

from __future__ import annotations

import os
import sys


def add_arguments(parser) -> None:
    parser.add_argument("model", help="a model with at least one trained run under HOME/runs")
    parser.add_argument("--rebuild", action="store_true",
                        help="write the report again even if the run has one (say, to show "
                        "runs made since)")
    parser.add_argument("--no-open", dest="open", action="store_false",
                        help="print the path only; do not open a browser")
    group = parser.add_argument_group("settings (flags > RANKSTREAM_* environment > TOML file)")
    group.add_argument("--home", help="working directory holding runs/ (default: "
                       "RANKSTREAM_HOME or ~/.local/share/rankstream)")
    group.add_argument("--config", help="TOML file with a [rankstream] table")


def has_display() -> bool:
    """Whether a browser can open a window here: always on macOS and Windows; on Linux and
    the BSDs only with an X11 or Wayland display (a headless server just prints the path)."""
    if sys.platform in ("darwin", "win32"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def run(args) -> int:
    from pipeline.cli._redis import fail
    from pipeline.settings import Settings
    from pipeline.training.report import REPORT_NAME, write_report
    from pipeline.training.report_data import latest_run, models_with_runs
    from pipeline.training.run_store import open_run_store
    from pipeline.training.run_types import KEEP_RUN_DIRS

    try:
        settings = Settings.load({"home": args.home, "config": args.config,
                                  "store": getattr(args, "store", None)})
    except (OSError, ValueError) as err:
        return fail("report", err)
    runs_root = settings.runs_dir
    open_run_store(settings).pull_latest_runs(args.model, KEEP_RUN_DIRS)   # runs of other hosts
    run_dir = latest_run(runs_root, args.model)
    if run_dir is None:
        known = ", ".join(models_with_runs(runs_root)) or "none"
        print(f"rankstream report: model {args.model!r} has no trained run under {runs_root}; "
              f"models with runs: {known}", file=sys.stderr)
        return 2
    path = run_dir / REPORT_NAME
    if args.rebuild or not path.exists():
        try:
            write_report(run_dir, runs_root)
        except Exception as err:     # noqa: BLE001 - one line for the user, not a traceback
            return fail("report", err)
    print(path)
    if args.open and has_display():
        import webbrowser

        webbrowser.open(path.resolve().as_uri())
    return 0
