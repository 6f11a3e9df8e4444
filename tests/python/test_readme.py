"""test_readme.py - the README's Python example runs as written, against the
package installed the way the README says (pip into a fresh target folder)."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def readme_example():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    section = text.split("### Example", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation",
         "--no-deps", "--target", str(target), ROOT],
        check=True, timeout=600, stdout=subprocess.DEVNULL)
    return target


def test_readme_example_runs_from_a_pip_install(installed, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(readme_example())
    env = dict(os.environ, PYTHONPATH=str(installed), FERRY_LOG="warn")
    # Run from a folder without the source tree, so the installed copy is used.
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
