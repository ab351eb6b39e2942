//! A small stand-in for libtest in the test binaries that need their own `main` (they
//! re-execute themselves as the plugin, and libtest's `main` would print its own lines on
//! the plugin's stdout). Each check runs on its own, a panic fails that check only, and the
//! binary reports as libtest does: `running N tests`, a `test NAME ... ok|FAILED` line per
//! check and the `test result:` line, with exit status 101 when a check failed, so
//! `scripts/test` counts each check. Arguments: substrings that select checks (as libtest
//! filters), `--exact`, `--list`, and `--ignored` (there are none, so nothing runs).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

/// A named check.
pub type Check<'a> = (&'static str, &'a dyn Fn());

/// What a run of the checks came to.
#[must_use = "exit with the run's status"]
pub struct Outcome {
    failed: usize,
}

impl Outcome {
    /// Ends the process as libtest does: 0 when every check passed, else 101.
    pub fn exit(self) -> ! {
        std::process::exit(if self.failed == 0 { 0 } else { 101 })
    }
}

/// Runs the checks the command line selects, reporting each in libtest's format.
pub fn run(checks: &[Check<'_>]) -> Outcome {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |f: &str| args.iter().any(|a| a == f);
    let exact = flag("--exact");
    // Libtest's flags that take a value; their values are not filters.
    let valued = [
        "--format",
        "--test-threads",
        "--color",
        "-Z",
        "--skip",
        "--logfile",
    ];
    let mut filters = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if valued.contains(&a.as_str()) {
            it.next();
        } else if !a.starts_with('-') {
            filters.push(a.as_str());
        }
    }
    let selected: Vec<&Check<'_>> = checks
        .iter()
        .filter(|(name, _)| {
            !flag("--ignored")
                && (filters.is_empty()
                    || filters
                        .iter()
                        .any(|f| if exact { name == f } else { name.contains(f) }))
        })
        .collect();
    if flag("--list") {
        for (name, _) in &selected {
            println!("{name}: test");
        }
        return Outcome { failed: 0 };
    }
    let start = Instant::now();
    let n = selected.len();
    println!("\nrunning {n} test{}", if n == 1 { "" } else { "s" });
    let mut failed = Vec::new();
    for (name, check) in &selected {
        // The default panic hook prints the message on stderr, as libtest shows a failure.
        let ok = catch_unwind(AssertUnwindSafe(check)).is_ok();
        println!("test {name} ... {}", if ok { "ok" } else { "FAILED" });
        if !ok {
            failed.push(*name);
        }
    }
    if !failed.is_empty() {
        println!("\nfailures:");
        for name in &failed {
            println!("    {name}");
        }
    }
    println!(
        "\ntest result: {}. {} passed; {} failed; 0 ignored; 0 measured; {} filtered out; finished in {:.2}s\n",
        if failed.is_empty() { "ok" } else { "FAILED" },
        selected.len() - failed.len(),
        failed.len(),
        checks.len() - selected.len(),
        start.elapsed().as_secs_f64()
    );
    Outcome {
        failed: failed.len(),
    }
}
