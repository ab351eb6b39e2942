//! The tokens file: who may ask the CA for which identities.
//!
//! A YAML list; each entry binds a bearer token either to a node (it may ask for the
//! identities of the workloads configured on that node, as istiod authorizes a ztunnel) or
//! to one identity:
//!
//! ```yaml
//! - token: 3f1c9a...        # a node proxy's token
//!   node: node1
//! - token: 9b2e07...        # one workload's token
//!   identity: spiffe://cluster.local/ns/default/sa/web
//! ```
//!
//! Tokens are kept only as SHA-256 digests and shown in logs as the first 8 hex digits of
//! the digest.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use ambit_identity::SpiffeId;
use serde::Deserialize;

/// Bytes of the tokens file read at most.
pub const MAX_TOKENS_FILE: u64 = 4 * 1024 * 1024;

/// What a token may ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Binding {
    /// The identities of the workloads on this node.
    Node(String),
    /// This identity only.
    Identity(SpiffeId),
}

impl std::fmt::Display for Binding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Binding::Node(n) => write!(f, "node {n}"),
            Binding::Identity(id) => write!(f, "identity {id}"),
        }
    }
}

/// Why the tokens file was refused; the operator's to fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokensError {
    #[error("cannot read the tokens file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the tokens file {path} is larger than {MAX_TOKENS_FILE} bytes")]
    TooLarge { path: PathBuf },
    #[error("{path}: {message} (expected a list of {{token, node}} or {{token, identity}})")]
    Parse { path: PathBuf, message: String },
    #[error("{path}: entry {index}: {message}")]
    Entry {
        path: PathBuf,
        index: usize,
        message: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    token: String,
    #[serde(default)]
    node: Option<String>,
    #[serde(default)]
    identity: Option<String>,
}

/// The loaded tokens.
#[derive(Debug, Default, Clone)]
pub struct Tokens {
    by_digest: HashMap<[u8; 32], Binding>,
}

pub(crate) fn digest(token: &str) -> [u8; 32] {
    let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, token.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// How logs name a token: the first 8 hex digits of its SHA-256.
pub fn token_tag(token: &str) -> String {
    digest(token)[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Tokens {
    /// Parses the file's text; `path` names it in errors.
    pub fn parse(path: &Path, text: &str) -> Result<Tokens, TokensError> {
        let entries: Option<Vec<Entry>> =
            yaml_serde::from_str(text).map_err(|e| TokensError::Parse {
                path: path.to_path_buf(),
                // The message may quote the text it failed on; never echo a token.
                message: match e.location() {
                    Some(l) => format!("not a valid tokens list at line {}", l.line()),
                    None => "not a valid tokens list".to_string(),
                },
            })?;
        let mut by_digest = HashMap::new();
        for (index, e) in entries.unwrap_or_default().into_iter().enumerate() {
            let bad = |message: String| TokensError::Entry {
                path: path.to_path_buf(),
                index,
                message,
            };
            if e.token.trim().is_empty() {
                return Err(bad("token is empty".into()));
            }
            let binding = match (e.node, e.identity) {
                (Some(node), None) if !node.is_empty() => Binding::Node(node),
                (None, Some(id)) => Binding::Identity(
                    SpiffeId::parse(&id).map_err(|err| bad(format!("identity: {err}")))?,
                ),
                _ => return Err(bad("give exactly one of node and identity".into())),
            };
            if by_digest.insert(digest(&e.token), binding).is_some() {
                return Err(bad(format!(
                    "token {} is listed twice",
                    token_tag(&e.token)
                )));
            }
        }
        Ok(Tokens { by_digest })
    }

    /// Reads and parses the tokens file.
    pub fn load(path: &Path) -> Result<Tokens, TokensError> {
        Self::parse(path, &read(path)?)
    }

    /// What `token` may ask for, if it is known.
    pub fn lookup(&self, token: &str) -> Option<&Binding> {
        self.by_digest.get(&digest(token))
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.by_digest.len()
    }

    /// True with no token at all.
    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }
}

/// The file's text, bounded.
pub fn read(path: &Path) -> Result<String, TokensError> {
    let err = |source| TokensError::Read {
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(err)?;
    if meta.len() > MAX_TOKENS_FILE {
        return Err(TokensError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o044 != 0 {
            tracing::warn!(
                "the tokens file {} has mode {mode:04o}: others can read the tokens and obtain certificates with them; run `chmod 600 {}`",
                path.display(),
                path.display()
            );
        }
    }
    std::fs::read_to_string(path).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_kinds() {
        let t = Tokens::parse(
            Path::new("t.yaml"),
            "- token: aaa\n  node: n1\n- token: bbb\n  identity: spiffe://td/ns/a/sa/b\n",
        )
        .unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t.lookup("aaa"), Some(&Binding::Node("n1".into())));
        assert_eq!(
            t.lookup("bbb").unwrap().to_string(),
            "identity spiffe://td/ns/a/sa/b"
        );
        assert_eq!(t.lookup("ccc"), None);
        assert!(Tokens::parse(Path::new("t"), "").unwrap().is_empty());
    }

    #[test]
    fn refuses_bad_entries_without_echoing_tokens() {
        for (text, want) in [
            ("- token: secret1\n", "exactly one"),
            (
                "- token: secret1\n  node: a\n  identity: spiffe://td/ns/a/sa/b\n",
                "exactly one",
            ),
            ("- token: \"\"\n  node: a\n", "empty"),
            ("- token: secret1\n  identity: http://x\n", "identity"),
            (
                "- token: secret1\n  node: a\n- token: secret1\n  node: b\n",
                "twice",
            ),
            ("- token: secret1\n  nod: a\n", "line"),
            ("token: secret1\n", "line"),
        ] {
            let err = Tokens::parse(Path::new("t.yaml"), text)
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{text:?}: {err}");
            assert!(!err.contains("secret1"), "{text:?} leaks the token: {err}");
        }
    }

    #[test]
    fn tags_are_short_and_stable() {
        assert_eq!(token_tag("x"), token_tag("x"));
        assert_ne!(token_tag("x"), token_tag("y"));
        assert_eq!(token_tag("x").len(), 8);
    }
}
