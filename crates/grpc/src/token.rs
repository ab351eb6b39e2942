//! The bearer token (`AUTH_TOKEN`): a file re-read for every request (Kubernetes rotates
//! projected tokens), or a literal.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::GrpcError;

/// A bearer token's source.
#[derive(Clone, PartialEq, Eq)]
pub enum Token {
    None,
    File(PathBuf),
    Literal(String),
}

/// The token of ztunnel's chart when nothing else is configured.
pub const DEFAULT_TOKEN_PATH: &str = "./var/run/secrets/tokens/istio-token";

impl Token {
    /// `AUTH_TOKEN`'s rules: a value that names an existing file is that file, any other
    /// value is the token itself; unset means the default path if it exists, else none.
    pub fn from_env_value(value: Option<&str>) -> Token {
        match value {
            Some(v) if Path::new(v).is_file() => Token::File(PathBuf::from(v)),
            Some("") => Token::None,
            Some(v) => Token::Literal(v.to_string()),
            None if Path::new(DEFAULT_TOKEN_PATH).is_file() => {
                Token::File(PathBuf::from(DEFAULT_TOKEN_PATH))
            }
            None => Token::None,
        }
    }

    /// The token now. An empty token file is an error, not "no auth": a server would
    /// refuse the request anyway, and the operator should hear why.
    pub fn read(&self) -> Result<Option<String>, GrpcError> {
        match self {
            Token::None => Ok(None),
            Token::Literal(t) => Ok(Some(t.clone())),
            Token::File(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| GrpcError::Token {
                    from: self.to_string(),
                    reason: e.to_string(),
                })?;
                let token = text.trim();
                if token.is_empty() {
                    return Err(GrpcError::Token {
                        from: self.to_string(),
                        reason: "the file is empty".into(),
                    });
                }
                Ok(Some(token.to_string()))
            }
        }
    }
}

/// Never shows a literal token: tokens stay out of logs.
impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::None => f.write_str("(none)"),
            Token::File(p) => write!(f, "file {}", p.display()),
            Token::Literal(_) => f.write_str("(literal, redacted)"),
        }
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_file_is_read_per_call_and_an_empty_one_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "first\n").unwrap();
        let token = Token::from_env_value(Some(path.to_str().unwrap()));
        assert_eq!(token, Token::File(path.clone()));
        assert_eq!(token.read().unwrap().as_deref(), Some("first"));
        std::fs::write(&path, "second").unwrap();
        assert_eq!(token.read().unwrap().as_deref(), Some("second"));
        std::fs::write(&path, "  \n").unwrap();
        let err = token.read().unwrap_err().to_string();
        assert!(err.contains("empty") && err.contains("token"), "{err}");
    }

    #[test]
    fn literal_tokens_are_never_displayed() {
        let token = Token::from_env_value(Some("s3cret-value"));
        assert_eq!(token.read().unwrap().as_deref(), Some("s3cret-value"));
        assert!(!format!("{token} {token:?}").contains("s3cret"));
        assert_eq!(Token::from_env_value(Some("")), Token::None);
    }
}
