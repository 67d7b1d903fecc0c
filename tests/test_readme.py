"""The README stays true: its two commands and its Python example."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_opens_with_the_two_commands():
    first_block = re.search(r"```bash\n(.*?)```", README.read_text(), re.S).group(1)
    assert first_block.strip().splitlines() == [
        "./infra/setup.sh && .venv/bin/rankstream demo", ".venv/bin/pytest"]


def test_readme_python_example_runs(tmp_path, monkeypatch, capsys):
    example = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    script = tmp_path / "example.py"
    script.write_text(example)
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(script))
    assert (tmp_path / "altsvm_model" / "manifest.json").exists()
    pos_at_top, n_iter = capsys.readouterr().out.split()
    assert 0.0 <= float(pos_at_top) <= 1.0 and int(n_iter) >= 1
