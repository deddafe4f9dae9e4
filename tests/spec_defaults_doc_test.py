"""docs/job-specs.md's table of defaults against the one the code sets them from
(server/core/specs/spec_defaults.h): the same fields with the same values, neither side with a row the
other lacks."""

import os
import re
import sys
import unittest

import junit_main

RUNFILES = os.path.join(os.environ.get("TEST_SRCDIR", ""), os.environ.get("TEST_WORKSPACE", "fitrun"))


def read(path):
    with open(os.path.join(RUNFILES, path)) as f:
        return f.read()


def header_table():
    header = read("server/core/specs/spec_defaults.h")
    constants = {name: float(value) for name, value in
                 re.findall(r"inline constexpr (?:int|double) (k\w+) = ([0-9.]+);", header)}
    table = header[header.index("kTable[]"):]
    return {field: constants[name] for field, name in re.findall(r'\{"([\w.]+)", (k\w+)\}', table)}


def doc_table():
    doc = read("docs/job-specs.md")
    section = doc[doc.index("## Defaults"):]
    return {field: float(value) for field, value in re.findall(r"^\| `([\w.]+)` \| ([0-9.]+) \|$", section, re.M)}


class SpecDefaultsDocTest(unittest.TestCase):
    def test_the_documented_defaults_are_the_codes(self):
        code, doc = header_table(), doc_table()
        self.assertGreaterEqual(len(code), 12)
        self.assertEqual(doc, code)


if __name__ == "__main__":
    junit_main.main(argv=[sys.argv[0]])
