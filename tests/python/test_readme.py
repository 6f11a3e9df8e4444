"""test_readme.py - the README's Python examples run as written, against the
package installed the way the README says (pip into a fresh target folder):
the two of the quick start, the message handoff in ten lines, and FILE memory."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def python_blocks(heading):
    """Every python block of the README's section heading, verbatim."""
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def readme_examples():
    return (python_blocks("Quick start") +
            python_blocks("Message handoff: send/recv into a receiver's pool") +
            python_blocks("FILE memory: KV blocks to and from local files"))


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation",
         "--no-deps", "--target", str(target), ROOT],
        check=True, timeout=600, stdout=subprocess.DEVNULL)
    return target


def test_readme_has_its_examples():
    examples = readme_examples()
    assert len(examples) == 4
    assert "ferry.Engine" in examples[0] and "TransferEngine" in examples[1]
    handoff = examples[2]
    assert all(call in handoff for call in ("create_pool(", ".send(", ".recv(")), handoff
    assert len(handoff.strip().splitlines()) <= 10, handoff


@pytest.mark.parametrize("index", [0, 1, 2, 3])
def test_readme_example_runs_from_a_pip_install(installed, tmp_path, index):
    script = tmp_path / "example.py"
    script.write_text(readme_examples()[index])
    env = dict(os.environ, PYTHONPATH=str(installed))
    env.pop("FERRY_LOG", None)
    # Run from a folder without the source tree, so the installed copy is used.
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # libferry's lines went to logging (no handler: INFO is dropped), not to stderr.
    assert "ferry[" not in done.stderr, done.stderr
