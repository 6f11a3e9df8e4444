"""test_errors_doc.py - docs/errors.md explains every ferry_status code of
include/ferry.h and every Mooncake number the drop-in can return, and the
pointers in ferry_strerror's texts and the drop-in's messages lead to a
section that exists."""

import os
import re

import ferry
from mooncake import engine as mc

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def read(*path):
    with open(os.path.join(ROOT, *path), encoding="utf-8") as f:
        return f.read()


def anchor(heading):
    """The id GitHub gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def sections():
    """{anchor: body} of the ### sections of docs/errors.md."""
    parts = re.split(r"^### (.+)$", read("docs", "errors.md"), flags=re.M)
    return {anchor(h): body for h, body in zip(parts[1::2], parts[2::2])}


def header_codes():
    enum = re.search(r"typedef enum ferry_status \{(.*?)\} ferry_status;", read("include", "ferry.h"),
                     re.S).group(1)
    return {name: int(value) for name, value in re.findall(r"(FERRY_\w+) = (-?\d+)", enum)}


def test_every_ferry_status_is_explained():
    docs = sections()
    codes = header_codes()
    assert len(codes) > 20
    for name, value in codes.items():
        body = docs.get(name.lower())
        assert body is not None, "docs/errors.md has no section for %s" % name
        assert body.lstrip().startswith("%d" % value), name
        if value != 0:
            for part in ("**Causes:**", "**Fix:**", "**Log line:**"):
                assert part in body, "%s lacks %s" % (name, part)
        text = ferry.strerror(value)
        if value != 0:
            m = re.search(r"\(docs/errors\.md#([\w-]+)\)$", text)
            assert m and m.group(1) == name.lower(), text


def mooncake_codes():
    """Every number the drop-in can return as a failure: the mapping of each
    ferry code, and the literals in mooncake/engine.py."""
    codes = {ferry.to_mooncake(v) for v in header_codes().values()}
    source = read("python", "mooncake", "engine.py")
    codes |= {int(n) for n in re.findall(r"return (-\d+)\b", source)}
    return codes


def test_every_mooncake_code_is_explained():
    docs = sections()
    codes = mooncake_codes()
    assert {-1, -2, -3, -102, -200, -303} <= codes
    for code in codes:
        assert ("mooncake-%d" % code) in docs, "docs/errors.md has no section for Mooncake %d" % code


def test_dropin_message_points_to_its_section():
    te = mc.TransferEngine()
    assert te.get_batch_transfer_status([1]) == -1  # not initialized: refused
    m = re.search(r"see docs/errors\.md#([\w-]+)\]$", te.last_error())
    assert m and m.group(1) in sections(), te.last_error()
