"""test_data_path_doc.py - docs/data-path.md's diagrams name only functions,
fields and calls that exist in src/, so they cannot drift from the code
unnoticed: a rename there turns this red."""

import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_name_in_the_diagrams_is_in_the_sources():
    text = open(os.path.join(ROOT, "docs", "data-path.md"), encoding="utf-8").read()
    blocks = re.findall(r"```mermaid\n(.*?)```", text, re.S)
    assert len(blocks) == 4, "one common diagram and one per transport (tcp, shm, fabric)"
    names = set()
    for block in blocks:
        names |= set(re.findall(r"\b[a-z]+(?:_[a-z0-9]+)+\b", block))
    sources = "".join(open(f, encoding="utf-8", errors="replace").read()
                      for f in glob.glob(os.path.join(ROOT, "src", "**", "*.[ch]"), recursive=True))
    missing = sorted(n for n in names if not re.search(r"\b%s\b" % n, sources))
    assert not missing, "docs/data-path.md names what src/ does not have: %s" % missing
    assert len(names) >= 15, names
