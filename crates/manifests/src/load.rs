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
        object: None,
        kind: ErrorKind::Read,
        source: source.to_string(),
        position: None,
        field: String::new(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::ErrorKind;

    fn policy(name: &str, service: &str) -> String {
        format!("apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: {name}, namespace: shop}}\nspec:\n  targetRefs: [{{kind: Service, name: {service}}}]\n")
    }

    /// A directory loads its `*.yaml` and `*.yml` files in name order, and nothing else;
    /// a bad or duplicate document is refused with its file's path.
    #[test]
    fn a_directory_loads_its_manifest_files_in_name_order() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| fs::write(dir.path().join(name), text).unwrap();
        write("b.yml", &policy("b", "svc-b"));
        write(
            "a.yaml",
            &format!("{}---\n{}", policy("a", "svc-a"), policy("a2", "svc-a")),
        );
        write("c.yaml", &format!("{}---\nkind: [\n", policy("b", "again")));
        write("notes.txt", &policy("txt", "x"));
        write(".hidden.yaml", &policy("hidden", "x"));
        fs::create_dir(dir.path().join("sub")).unwrap();
        fs::write(dir.path().join("sub/d.yaml"), policy("sub", "x")).unwrap();
        fs::create_dir(dir.path().join("e.yaml")).unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(dir.path().join("b.yml"), dir.path().join("link.yaml")).unwrap();

        let p = load_path(dir.path(), &ParseOptions::default());
        let loaded: Vec<(String, String)> = p
            .policies
            .iter()
            .map(|p| {
                let file = std::path::Path::new(&p.origin.source).file_name().unwrap();
                (
                    file.to_string_lossy().into_owned(),
                    p.value.authorization.name.clone(),
                )
            })
            .collect();
        assert_eq!(
            loaded,
            [("a.yaml", "a"), ("a.yaml", "a2"), ("b.yml", "b")]
                .map(|(f, n)| (f.to_string(), n.to_string()))
        );
        let c = dir.path().join("c.yaml").display().to_string();
        let link = dir.path().join("link.yaml").display().to_string();
        let b = dir.path().join("b.yml").display().to_string();
        let errors: Vec<String> = p.errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            errors,
            [
                format!("{c}:3:18: metadata.name: AuthorizationPolicy shop/b is defined again; the first definition ({b}:1) is kept"),
                format!("{c}:8:1: did not find expected node content, while parsing a flow node"),
                // The link to b.yml is read as a file of its own.
                format!("{link}:3:18: metadata.name: AuthorizationPolicy shop/b is defined again; the first definition ({b}:1) is kept"),
            ]
        );
    }

    #[test]
    fn files_that_cannot_be_read() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.yaml");
        let p = load_path(&missing, &ParseOptions::default());
        assert_eq!(p.errors.len(), 1);
        assert_eq!(p.errors[0].kind, ErrorKind::Read);
        assert!(
            p.errors[0]
                .to_string()
                .starts_with(&format!("{}: cannot read: ", missing.display())),
            "{}",
            p.errors[0]
        );

        // Too large: refused without being held whole.
        let big = dir.path().join("big.yaml");
        let f = fs::File::create(&big).unwrap();
        f.set_len(MAX_FILE_BYTES + 1).unwrap();
        let p = load_path(&big, &ParseOptions::default());
        assert_eq!(
            p.errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [format!(
                "{}: larger than {MAX_FILE_BYTES} bytes; not read",
                big.display()
            )]
        );

        // A single file is read whatever its name.
        let one = dir.path().join("policy.txt");
        fs::write(&one, policy("p", "s")).unwrap();
        let p = load_path(&one, &ParseOptions::default());
        assert_eq!(p.policies.len(), 1);
        assert!(p.errors.is_empty());
    }
}
