"""JUnit reports in the format of Bazel's test.xml, for what tools/test.sh counts beside Bazel's tests
(tools/test_summary.py --junit): the GPU path's stages (tools/gpu/rehearse.sh) and the GPU check's
figures (tools/gpu/figures.py junit). Standard library only.

  junit.py OUT.xml CLASSNAME NAME                          one passed case
  junit.py OUT.xml CLASSNAME NAME --failure MESSAGE        one failed case
  junit.py OUT.xml CLASSNAME NAME --failure MESSAGE --log FILE   ... with FILE's last 15 lines
"""
import argparse
import sys
from xml.sax.saxutils import quoteattr

PASSED, SKIPPED, FAILED = "passed", "skipped", "failed"


def write(out, suite, cases):
    """cases: (classname, name, outcome, message) tuples; message is why, for a skip or a failure."""
    lines = []
    for classname, name, outcome, message in cases:
        head = f"<testcase classname={quoteattr(classname)} name={quoteattr(name)}"
        if outcome == PASSED:
            lines.append(f"{head}/>")
        else:
            tag = "skipped" if outcome == SKIPPED else "failure"
            lines.append(f"{head}><{tag} message={quoteattr(message)}/></testcase>")
    with open(out, "w") as f:
        f.write(f'<?xml version="1.0" encoding="UTF-8"?>\n<testsuites><testsuite name={quoteattr(suite)}>\n')
        f.write("".join(line + "\n" for line in lines))
        f.write("</testsuite></testsuites>\n")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out"), parser.add_argument("classname"), parser.add_argument("name")
    parser.add_argument("--failure"), parser.add_argument("--log")
    a = parser.parse_args()
    message = a.failure
    if message is not None and a.log:
        with open(a.log, errors="replace") as f:
            message += f"; {a.log} ends:\n" + "".join(f.readlines()[-15:])
    write(a.out, a.classname, [(a.classname, a.name, PASSED if message is None else FAILED, message)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
