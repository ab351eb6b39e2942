#!/usr/bin/env python3
"""The closing line of scripts/test: what ran and what failed, read from cargo's and the
test runners' own output, so that nothing broken can add up to "0 failed".

Every test binary cargo starts says so ("Running ..." or "Doc-tests ...") and, if it gets
to the end, prints libtest's "test result:" line. A binary's counts are its LAST result
line's, the one libtest closes with: a test (or a child process, whose output libtest does
not capture) may print a line of that shape before it. Its passed, failed and ignored (and
measured) must add up to the "running N tests" it opened with; when they do not (or it
never said), that is one failure, named. A binary that started without a result line
died (a signal, an abort, a harness that exited early) and counts as one failure; a binary
cargo reports as failed although its result line shows no failed test (it exited non-zero
after it) counts as one failure too; every "could not compile" is a failure; and the test
binaries the manifests define that never started (cargo builds everything before it runs
anything, so one build error stops them all) are "not run". The expected binaries come
from `cargo metadata`: every target cargo test runs (its `test` flag) and every library's
doc-tests (its `doctest` flag).

Usage: test_totals.py [--packages "P ..."] --suite NAME MANIFEST LOG STATUS [--suite ...]
  NAME      a label for the suite ("workspace", "fuzz")
  MANIFEST  the Cargo.toml whose workspace the suite ran
  LOG       cargo test's output, stdout and stderr together
  STATUS    cargo test's exit status
  --packages  the packages the run was limited to (default: every workspace member)
The helper first runs its own tests (test_totals_test.py) and counts them with the rest.
Exits 1 when anything failed or did not run, else 0.
"""

import argparse
import io
import json
import os
import re
import subprocess
import sys
import unittest
from dataclasses import dataclass, field

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# cargo's status lines are right-aligned in 12 columns.
RUNNING = re.compile(r"^ {0,12}Running (?P<what>\S.*?) \((?P<path>[^()]+)\)$")
DOC_TESTS = re.compile(r"^ {0,12}Doc-tests (?P<crate>\S+)$")
# Searched for anywhere in a line: a child process's unterminated output may precede it.
RESULT = re.compile(
    r"test result: (?P<verdict>ok|FAILED)\. (?P<passed>\d+) passed; (?P<failed>\d+) failed; "
    r"(?P<ignored>\d+) ignored; (?P<measured>\d+) measured; \d+ filtered out"
)
RUNNING_N = re.compile(r"^running (?P<n>\d+) tests?$")
RERUN = re.compile(r"^error: (?:test|doctest) failed, to rerun pass `(?P<args>[^`]*)`")
EXIT = re.compile(r"process didn't exit successfully: `.*` \((?P<how>[^()]*)\)$")
NO_COMPILE = re.compile(r"^error: could not compile `(?P<crate>[^`]+)`(?: \((?P<target>[^)]*)\))?")
TARGETS_FAILED = re.compile(r"^error: (?P<n>\d+) targets? failed:$")
ERROR = re.compile(r"^error(?:\[E\d+\])?: ")


@dataclass
class Binary:
    """One test binary cargo started."""

    name: str
    announced: int | None = None  # "running N tests"
    passed: int = 0
    failed: int = 0
    ignored: int = 0
    measured: int = 0
    finished: bool = False  # printed a result line (the last one counts)
    rerun: str | None = None  # cargo said it failed ("to rerun pass ...")
    exit: str | None = None  # how it ended, when not well


@dataclass
class Suite:
    """One `cargo test` run, as its log shows it."""

    name: str
    binaries: list = field(default_factory=list)
    build_failures: list = field(default_factory=list)  # "crate (target)"
    cargo_failed_targets: int | None = None  # "error: N targets failed:"
    errors: list = field(default_factory=list)  # cargo's and rustc's error lines


def parse(name, text):
    """Reads one `cargo test` log."""
    suite = Suite(name)
    current = None
    for raw in text.splitlines():
        line = ANSI.sub("", raw).rstrip("\r")
        m = RUNNING.match(line)
        if m:
            current = Binary(m["what"])
            suite.binaries.append(current)
            continue
        m = DOC_TESTS.match(line)
        if m:
            current = Binary(f"doc-tests {m['crate']}")
            suite.binaries.append(current)
            continue
        m = RESULT.search(line)
        if m and current is not None:
            # The last one wins: libtest's closes the binary's output.
            current.passed = int(m["passed"])
            current.failed = int(m["failed"])
            current.ignored = int(m["ignored"])
            current.measured = int(m["measured"])
            current.finished = True
            continue
        m = RUNNING_N.match(line)
        if m and current is not None and current.announced is None:
            current.announced = int(m["n"])
            continue
        m = RERUN.match(line)
        if m:
            if current is not None:
                current.rerun = m["args"]
            else:
                suite.errors.append(line)
            continue
        m = EXIT.search(line)
        if m:
            if current is not None:
                current.exit = m["how"]
            continue
        m = NO_COMPILE.match(line)
        if m:
            target = f" ({m['target']})" if m["target"] else ""
            suite.build_failures.append(f"{m['crate']}{target}")
            continue
        m = TARGETS_FAILED.match(line)
        if m:
            suite.cargo_failed_targets = int(m["n"])
            continue
        if ERROR.match(line):
            suite.errors.append(line)
    return suite


def expected_binaries(metadata, packages=None):
    """The test binaries `cargo test` runs for the packages of a `cargo metadata` document
    (all workspace members, or those named)."""
    count = 0
    for package in metadata["packages"]:
        if package["id"] not in metadata["workspace_members"]:
            continue
        if packages is not None and package["name"] not in packages:
            continue
        for target in package["targets"]:
            if target.get("required-features"):
                # Only with features scripts/test does not turn on; none is expected.
                continue
            if target.get("test"):
                count += 1
            if target.get("doctest"):
                count += 1
    return count


@dataclass
class Totals:
    passed: int = 0
    failed: int = 0
    ignored: int = 0
    not_run: int = 0
    ran: int = 0
    expected: int = 0
    problems: list = field(default_factory=list)  # one line each, said before the totals


def add(totals, suite, expected, status):
    """Counts one suite into `totals`."""
    problems_before = len(totals.problems)
    totals.expected += expected
    totals.ran += len(suite.binaries)
    failing = 0
    for b in suite.binaries:
        totals.passed += b.passed
        totals.ignored += b.ignored
        who = f"{suite.name}: {b.name}" + (f" (`{b.rerun}`)" if b.rerun else "")
        if not b.finished:
            totals.failed += 1
            failing += 1
            how = b.exit or "no result line"
            started = f", after 'running {b.announced} tests'" if b.announced is not None else ""
            totals.problems.append(f"{who} died before its result ({how}{started}): 1 failed")
        elif b.failed:
            totals.failed += b.failed
            failing += 1
            totals.problems.append(f"{who}: {b.failed} failed")
        elif b.rerun or b.exit:
            totals.failed += 1
            failing += 1
            how = b.exit or "cargo reports it failed"
            totals.problems.append(f"{who} reported no failure but exited badly ({how}): 1 failed")
        if b.finished and b.announced != b.passed + b.failed + b.ignored + b.measured:
            totals.failed += 1
            said = f"'running {b.announced} tests'" if b.announced is not None else "no 'running N tests'"
            totals.problems.append(
                f"{who}: its result line counts {b.passed} passed, {b.failed} failed, "
                f"{b.ignored} ignored, {b.measured} measured, after {said}: 1 failed"
            )
    for target in suite.build_failures:
        totals.failed += 1
        totals.problems.append(f"{suite.name}: could not compile {target}: 1 failed")
    if suite.cargo_failed_targets is not None and suite.cargo_failed_targets > failing:
        extra = suite.cargo_failed_targets - failing
        totals.failed += extra
        totals.problems.append(
            f"{suite.name}: cargo lists {suite.cargo_failed_targets} failed targets, "
            f"the log shows {failing}: {extra} more failed"
        )
    missing = expected - len(suite.binaries)
    if missing > 0:
        totals.not_run += missing
        if suite.build_failures:
            why = "the build failed: could not compile " + ", ".join(suite.build_failures)
        else:
            why = "; ".join(suite.errors[:3]) or "the log does not say why"
        totals.problems.append(
            f"{suite.name}: {missing} of {expected} test binaries did not run ({why})"
        )
    elif missing < 0:
        # The manifests name fewer binaries than ran: the expected count cannot be trusted.
        totals.failed += 1
        totals.problems.append(
            f"{suite.name}: {len(suite.binaries)} test binaries ran, the manifests define "
            f"{expected}: the count of binaries is wrong (scripts/test_totals.py): 1 failed"
        )
    if status != 0 and len(totals.problems) == problems_before:
        totals.failed += 1
        totals.problems.append(
            f"{suite.name}: cargo exited with status {status} and the log shows no failure: 1 failed"
        )


def self_test(totals):
    """Runs test_totals_test.py and counts its tests as one more binary."""
    totals.expected += 1
    out = io.StringIO()
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path.insert(0, here)
        tests = unittest.defaultTestLoader.loadTestsFromName("test_totals_test")
        result = unittest.TextTestRunner(stream=out, verbosity=0).run(tests)
    except Exception as e:  # an import error is a failure of the helper's tests
        totals.failed += 1
        totals.problems.append(f"scripts/test_totals_test.py did not load ({e}): 1 failed")
        return
    totals.ran += 1
    bad = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    totals.passed += result.testsRun - bad - len(result.skipped)
    totals.ignored += len(result.skipped)
    if bad:
        totals.failed += bad
        totals.problems.append(f"scripts/test_totals_test.py: {bad} failed\n{out.getvalue()}")


def summary(totals):
    return (
        f"tests: {totals.passed} passed, {totals.failed} failed, {totals.ignored} ignored, "
        f"{totals.not_run} not run ({totals.ran} of {totals.expected} test binaries ran)"
    )


def metadata(manifest):
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps", "--manifest-path", manifest],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--packages", default="")
    p.add_argument("--suite", nargs=4, action="append", default=[],
                   metavar=("NAME", "MANIFEST", "LOG", "STATUS"))
    args = p.parse_args(argv)
    packages = set(args.packages.split()) or None
    totals = Totals()
    self_test(totals)
    known = set()
    for name, manifest, log, status in args.suite:
        meta = metadata(manifest)
        names = {pk["name"] for pk in meta["packages"] if pk["id"] in meta["workspace_members"]}
        known |= names
        if packages is not None and not packages & names:
            continue
        with open(log, encoding="utf-8", errors="replace") as f:
            suite = parse(name, f.read())
        add(totals, suite, expected_binaries(meta, packages), int(status))
    if packages is not None and packages - known:
        totals.failed += 1
        totals.problems.append(f"no such package: {' '.join(sorted(packages - known))}: 1 failed")
    if totals.problems:
        print("\nwhat failed or did not run:")
        for line in totals.problems:
            print(f"  {line}")
    print()
    print(summary(totals))
    return 1 if totals.failed or totals.not_run else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
