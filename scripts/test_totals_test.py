#!/usr/bin/env python3
"""Tests of test_totals.py on logs recorded from cargo 1.95's `cargo test --no-fail-fast`
(trimmed): passing and failing binaries, a binary killed by SIGKILL, one that aborted, a
harness-less binary printing a fixed "5 passed", a failed doc-test, a build error, and
cargo failing before it builds anything; and logs made up from those: result lines printed
by a test or its child before the real one, and result lines that do not add up to the
"running N tests" before them. Run by test_totals.py itself (and so by
scripts/test), or alone: python3 scripts/test_totals_test.py
"""

import unittest

from test_totals import Totals, add, expected_binaries, parse, summary

OK_LIB = """\
     Running unittests src/lib.rs (target/debug/deps/crash-03ba1bf1918713b3)

running 1 test
test tests::it_works ... ok

test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s

"""

FAILING_LIB = """\
     Running unittests src/lib.rs (target/debug/deps/good-f5028df5795e72cb)

running 3 tests
test tests::ignored ... ignored
test tests::passes ... ok
test tests::fails ... FAILED

failures:

---- tests::fails stdout ----

thread 'tests::fails' (28276) panicked at good/src/lib.rs:9:26:
assertion `left == right` failed

failures:
    tests::fails

test result: FAILED. 1 passed; 1 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.27s

error: test failed, to rerun pass `-p good --lib`
"""

KILLED = """\
     Running tests/abort.rs (target/debug/deps/abort-a5ad6d8632dc38dd)

running 2 tests
test fine ... ok
error: test failed, to rerun pass `-p crash --test abort`

Caused by:
  process didn't exit successfully: `/tmp/ttscratch/target/debug/deps/abort-a5ad6d8632dc38dd` (signal: 9, SIGKILL: kill)
"""

ABORTED = KILLED.replace("(signal: 9, SIGKILL: kill)", "(signal: 6, SIGABRT: process abort signal)")

# A harness = false binary before it reported in libtest's format: a fixed string, then
# exit status 1 (its checks failed).
FIXED_STRING = """\
     Running tests/custom.rs (target/debug/deps/custom-1acbe67bd718678d)
custom: 5 passed
error: test failed, to rerun pass `-p noharness --test custom`

Caused by:
  process didn't exit successfully: `/tmp/ttscratch/target/debug/deps/custom-1acbe67bd718678d` (exit status: 1)
"""

# A binary whose result line says ok but that exits badly afterwards (a crash in an exit
# handler, or a harness that prints the line and then fails).
OK_THEN_EXIT = """\
     Running tests/process.rs (target/debug/deps/process-1acbe67bd718678d)

running 5 tests
test version ... ok

test result: ok. 5 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.52s

error: test failed, to rerun pass `-p ambit-cni --test process`

Caused by:
  process didn't exit successfully: `/work/main/target/debug/deps/process-1acbe67bd718678d` (exit status: 1)
"""

DOC_OK = """\
   Doc-tests crash

running 0 tests

test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s

"""

DOC_FAILED = """\
   Doc-tests good

running 1 test
test good/src/lib.rs - one (line 1) ... FAILED

failures:
    good/src/lib.rs - one (line 1)

test result: FAILED. 0 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.08s

all doctests ran in 0.51s; merged doctests compilation took 0.42s
error: doctest failed, to rerun pass `-p good --doc`
"""

BUILD_ERROR = """\
   Compiling noharness v0.1.0 (/tmp/ttscratch/noharness)
   Compiling broken v0.1.0 (/tmp/ttscratch/broken)
error: expected pattern, found `=`
 --> broken/tests/syntax.rs:1:22
  |
1 | #[test] fn x() { let = ; }
  |                      ^ expected pattern

error: could not compile `broken` (test "syntax") due to 1 previous error
warning: build failed, waiting for other jobs to finish...
"""

LOCKED = """\
error: the lock file /work/main/Cargo.lock needs to be updated but --locked was passed to prevent this
If you want to try to generate the lock file without accessing the network, remove the --locked flag and use --offline instead.
"""


def totals_of(log, expected, status=0, name="workspace"):
    t = Totals()
    add(t, parse(name, log), expected, status)
    return t


class Counting(unittest.TestCase):
    def test_passing_binaries_add_up(self):
        t = totals_of(OK_LIB + DOC_OK + OK_LIB, 3)
        self.assertEqual((t.passed, t.failed, t.ignored, t.not_run, t.ran), (2, 0, 0, 0, 3))
        self.assertEqual(t.problems, [])
        self.assertEqual(
            summary(t), "tests: 2 passed, 0 failed, 0 ignored, 0 not run (3 of 3 test binaries ran)"
        )

    def test_failed_and_ignored_tests_are_counted(self):
        t = totals_of(OK_LIB + FAILING_LIB + "error: 1 target failed:\n    `-p good --lib`\n", 2, 101)
        self.assertEqual((t.passed, t.failed, t.ignored, t.not_run), (2, 1, 1, 0))
        self.assertEqual(t.problems, ["workspace: unittests src/lib.rs (`-p good --lib`): 1 failed"])

    def test_a_binary_killed_by_a_signal_is_a_failure(self):
        t = totals_of(OK_LIB + KILLED + OK_LIB, 3, 101)
        self.assertEqual((t.passed, t.failed, t.not_run), (2, 1, 0))
        self.assertEqual(len(t.problems), 1)
        self.assertIn("`-p crash --test abort`", t.problems[0])
        self.assertIn("signal: 9, SIGKILL: kill", t.problems[0])
        self.assertIn("after 'running 2 tests'", t.problems[0])

    def test_an_aborted_binary_is_a_failure(self):
        t = totals_of(ABORTED, 1, 101)
        self.assertEqual((t.passed, t.failed), (0, 1))
        self.assertIn("SIGABRT", t.problems[0])

    def test_a_fixed_passed_string_is_not_a_result(self):
        t = totals_of(FIXED_STRING, 1, 101)
        self.assertEqual((t.passed, t.failed), (0, 1))
        self.assertIn("exit status: 1", t.problems[0])
        self.assertIn("died before its result", t.problems[0])

    def test_an_ok_result_then_a_bad_exit_is_a_failure(self):
        t = totals_of(OK_THEN_EXIT, 1, 101)
        self.assertEqual((t.passed, t.failed), (5, 1))
        self.assertIn("reported no failure but exited badly (exit status: 1)", t.problems[0])

    def test_a_failed_doc_test_is_counted(self):
        t = totals_of(DOC_OK + DOC_FAILED, 2, 101)
        self.assertEqual((t.passed, t.failed), (0, 1))
        self.assertEqual(t.problems, ["workspace: doc-tests good (`-p good --doc`): 1 failed"])

    def test_a_build_error_fails_and_nothing_runs(self):
        t = totals_of(BUILD_ERROR, 7, 101)
        self.assertEqual((t.passed, t.failed, t.not_run, t.ran), (0, 1, 7, 0))
        self.assertEqual(t.problems[0], 'workspace: could not compile broken (test "syntax"): 1 failed')
        self.assertIn("7 of 7 test binaries did not run", t.problems[1])
        self.assertIn('the build failed: could not compile broken (test "syntax")', t.problems[1])

    def test_cargo_failing_before_the_build_leaves_everything_not_run(self):
        t = totals_of(LOCKED, 4, 101)
        self.assertEqual((t.failed, t.not_run), (0, 4))
        self.assertIn("needs to be updated", t.problems[0])

    def test_a_bad_status_with_a_clean_log_is_a_failure(self):
        t = totals_of(OK_LIB, 1, 101)
        self.assertEqual(t.failed, 1)
        self.assertIn("cargo exited with status 101", t.problems[0])

    def test_more_binaries_than_expected_means_the_count_is_wrong(self):
        t = totals_of(OK_LIB + OK_LIB, 1)
        self.assertEqual(t.failed, 1)
        self.assertIn("the count of binaries is wrong", t.problems[0])

    def test_cargo_listing_more_failed_targets_than_the_log_shows(self):
        t = totals_of(OK_LIB + "error: 2 targets failed:\n    `-p a --lib`\n    `-p b --lib`\n", 1, 101)
        self.assertEqual(t.failed, 2)

    def test_colours_and_stray_output_do_not_hide_lines(self):
        log = (
            "\x1b[1m\x1b[92m     Running\x1b[0m tests/x.rs (target/debug/deps/x-0123456789abcdef)\n"
            "running 4 tests\n"
            "a child's line without its newlinetest result: FAILED. 1 passed; 1 failed; "
            "2 ignored; 0 measured; 0 filtered out; finished in 0.10s\n"
        )
        t = totals_of(log, 1, 101)
        self.assertEqual((t.passed, t.failed, t.ignored, t.ran), (1, 1, 2, 1))

    def test_a_result_line_printed_before_the_real_one_does_not_count(self):
        # A child process (its output is not captured) prints a result-shaped line, at the
        # start of a line and in the middle of one, before libtest's own.
        fake = "test result: ok. 9 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.01s\n"
        log = FAILING_LIB.replace(
            "test tests::ignored ... ignored\n",
            "test tests::ignored ... ignored\n\n" + fake + "child says: " + fake,
        )
        t = totals_of(log, 1, 101)
        self.assertEqual((t.passed, t.failed, t.ignored), (1, 1, 1))
        self.assertEqual(t.problems, ["workspace: unittests src/lib.rs (`-p good --lib`): 1 failed"])
        # The same in a passing binary: the fake would have said 9 passed.
        log = OK_LIB.replace("running 1 test\n", "running 1 test\n" + fake)
        t = totals_of(log, 1)
        self.assertEqual((t.passed, t.failed, t.problems), (1, 0, []))

    def test_a_result_that_does_not_add_up_to_running_n_is_a_failure(self):
        # Announced 3, counted 1: two tests unaccounted for (a harness that lost them, or
        # a stray line taken for the result).
        log = OK_LIB.replace("running 1 test\n", "running 3 tests\n")
        t = totals_of(log, 1)
        self.assertEqual((t.passed, t.failed), (1, 1))
        self.assertEqual(
            t.problems,
            [
                "workspace: unittests src/lib.rs: its result line counts 1 passed, 0 failed, "
                "0 ignored, 0 measured, after 'running 3 tests': 1 failed"
            ],
        )
        # Counted more than announced: as wrong.
        log = OK_LIB.replace("running 1 test\n", "running 0 tests\n")
        self.assertEqual(totals_of(log, 1).failed, 1)

    def test_a_result_without_running_n_is_a_failure(self):
        t = totals_of(OK_LIB.replace("running 1 test\n", ""), 1)
        self.assertEqual((t.passed, t.failed), (1, 1))
        self.assertIn("after no 'running N tests': 1 failed", t.problems[0])

    def test_measured_benchmarks_add_up_with_the_rest(self):
        log = (
            "     Running benches/b.rs (target/debug/deps/b-0123456789abcdef)\n\n"
            "running 3 tests\n"
            "test result: ok. 1 passed; 0 failed; 0 ignored; 2 measured; 0 filtered out; finished in 0.10s\n"
        )
        t = totals_of(log, 1)
        self.assertEqual((t.passed, t.failed, t.problems), (1, 0, []))

    def test_suites_add_up(self):
        t = Totals()
        add(t, parse("workspace", OK_LIB + KILLED), 2, 101)
        add(t, parse("fuzz", OK_LIB + FAILING_LIB), 3, 101)
        self.assertEqual((t.passed, t.failed, t.ignored, t.not_run, t.ran, t.expected), (3, 2, 1, 1, 4, 5))
        self.assertTrue(t.problems[0].startswith("workspace: tests/abort.rs"))
        self.assertTrue(any(p.startswith("fuzz: 1 of 3 test binaries did not run") for p in t.problems))


METADATA = {
    "workspace_members": ["a 0.1.0", "b 0.1.0"],
    "packages": [
        {"id": "a 0.1.0", "name": "a", "targets": [
            {"name": "a", "kind": ["lib"], "test": True, "doctest": True},
            {"name": "a", "kind": ["bin"], "test": True, "doctest": False},
            {"name": "it", "kind": ["test"], "test": True, "doctest": False},
            {"name": "ex", "kind": ["example"], "test": False, "doctest": False},
            {"name": "build-script-build", "kind": ["custom-build"], "test": False, "doctest": False},
        ]},
        {"id": "b 0.1.0", "name": "b", "targets": [
            {"name": "b", "kind": ["lib"], "test": True, "doctest": False},
            {"name": "fuzz_x", "kind": ["bin"], "test": False, "doctest": False},
            {"name": "gated", "kind": ["test"], "test": True, "doctest": False,
             "required-features": ["peer"]},
        ]},
        {"id": "dep 1.0.0", "name": "dep", "targets": [
            {"name": "dep", "kind": ["lib"], "test": True, "doctest": True},
        ]},
    ],
}


class Expected(unittest.TestCase):
    def test_every_tested_target_and_doc_test_of_the_members(self):
        # a: lib, its doc-tests, bin, it; b: lib.
        self.assertEqual(expected_binaries(METADATA), 5)

    def test_limited_to_packages(self):
        self.assertEqual(expected_binaries(METADATA, {"b"}), 1)


if __name__ == "__main__":
    unittest.main()
