//! Reading manifests from a file, or from every `*.yaml` / `*.yml` file of a directory, in
//! name order (so the same directory always loads the same way). The only IO here.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use crate::error::{ErrorKind, ManifestError};
use crate::{Collector, ParseOptions, Parsed};

/// The largest manifest file read (a policy file is kilobytes; this bounds what a mistaken
/// path, such as a log file named `.yaml`, makes us hold).
pub const MAX_FILE_BYTES: u64 = 16 << 20;

/// Reads `path`: a file, or a directory whose `*.yaml` and `*.yml` files (not in
/// subdirectories; names starting with `.` left out, such as editors' temporary files and
/// the `..data` of a mounted ConfigMap) are read in byte order of their names. A file that
/// cannot be read is one error; the others still load.
pub fn load_path(path: &Path, options: &ParseOptions) -> Parsed {
    let mut c = Collector::default();
    let shown = path.display().to_string();
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) => {
            c.parsed
                .errors
                .push(read_error(&shown, format!("cannot read: {e}")));
            return c.parsed;
        }
    };
    if !meta.is_dir() {
        read_file(&mut c, path, options);
        return c.parsed;
    }
    let entries = match std::fs::read_dir(path) {
        Ok(d) => d,
        Err(e) => {
            c.parsed
                .errors
                .push(read_error(&shown, format!("cannot list: {e}")));
            return c.parsed;
        }
    };
    let mut files = Vec::new();
    for entry in entries {
        match entry {
            Ok(e) => {
                let name = e.file_name();
                let name = name.as_encoded_bytes();
                let manifest = !name.starts_with(b".")
                    && (name.ends_with(b".yaml") || name.ends_with(b".yml"));
                // Follows symbolic links (a mounted ConfigMap's files are links).
                if manifest && e.path().is_file() {
                    files.push(e.path());
                }
            }
            Err(e) => c
                .parsed
                .errors
                .push(read_error(&shown, format!("cannot list: {e}"))),
        }
    }
    files.sort();
    for f in files {
        read_file(&mut c, &f, options);
    }
    c.parsed
}

fn read_file(c: &mut Collector, path: &Path, options: &ParseOptions) {
    let shown = path.display().to_string();
    let mut bytes = Vec::new();
    let read = File::open(path).and_then(|f| f.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes));
    match read {
        Err(e) => c
            .parsed
            .errors
            .push(read_error(&shown, format!("cannot read: {e}"))),
        Ok(n) if n as u64 > MAX_FILE_BYTES => c.parsed.errors.push(read_error(
            &shown,
            format!("larger than {MAX_FILE_BYTES} bytes; not read"),
        )),
        Ok(_) => c.add_bytes(&shown, &bytes, options),
    }
}

fn read_error(source: &str, message: String) -> ManifestError {
    ManifestError {
        kind: ErrorKind::Read,
        source: source.to_string(),
        position: None,
        field: String::new(),
        message,
    }
}
