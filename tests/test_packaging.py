"""Installing the product adds no top-level import name: it runs from its folder (worker.py,
starter.py, `python -m devstack`), and `pip install .` brings only its dependencies, so a `core` or
`infra` of another package never collides with ours."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_wheel_installs_nothing_but_its_metadata(tmp_path: Path):
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    [wheel] = list(tmp_path.glob("*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names}
    assert len(top) == 1 and top.pop().endswith(".dist-info"), sorted(names)


def test_the_product_runs_from_its_folder():
    """The entry points import from the folder they live in, whatever the working directory."""
    for argv in (["starter.py", "--help"], ["-m", "devstack", "--help"]):
        done = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and "usage" in done.stdout.lower(), (argv, done.stderr[-2000:])
    done = subprocess.run([sys.executable, str(ROOT / "starter.py"), "--help"], cwd="/", capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_starter_is_a_small_cli_on_the_client_library():
    """starter.py builds its parser from cli/ and imports no devstack, directly or not."""
    assert len((ROOT / "starter.py").read_text().splitlines()) < 150
    probe = ("import sys, starter, client, cli.start, cli.decide, cli.inspect, cli.operate; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('devstack', 'tests')))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", (done.stdout, done.stderr[-2000:])
