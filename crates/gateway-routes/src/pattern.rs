//! Regular expressions of routes (`RegularExpression` path, header, query and gRPC
//! method matches): the `regex` crate's dialect (RE2-like, as Envoy's), matched against
//! the whole value, compiled once when a route is translated and bounded in size, so that
//! an expression too large or invalid is refused there and never costs a request.

use std::fmt;

use regex::{Regex, RegexBuilder};

/// The most memory one compiled expression may take (the `regex` crate's size limit, of
/// its compiled program), and the longest expression read. Route values are at most 4096
/// characters by the CRDs; a counted repetition (`a{1000}{1000}`) can still grow far
/// beyond that once compiled, which the size limit refuses.
pub const MAX_COMPILED_BYTES: usize = 32 * 1024;
pub const MAX_PATTERN_CHARS: usize = 4096;

/// A compiled expression, compared (and shown) by its source.
#[derive(Clone)]
pub struct Pattern {
    source: String,
    regex: Regex,
}

/// Why an expression was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("regular expression is longer than {MAX_PATTERN_CHARS} characters")]
    TooLong,
    #[error("regular expression is too large once compiled (limit {MAX_COMPILED_BYTES} bytes); simplify it (fewer or smaller counted repetitions)")]
    TooLarge,
    #[error("invalid regular expression: {0}")]
    Invalid(String),
}

impl Pattern {
    /// Compiles `source` to match whole values.
    pub fn new(source: &str) -> Result<Pattern, PatternError> {
        if source.chars().count() > MAX_PATTERN_CHARS {
            return Err(PatternError::TooLong);
        }
        let anchored = format!("^(?:{source})$");
        let regex = RegexBuilder::new(&anchored)
            .size_limit(MAX_COMPILED_BYTES)
            .dfa_size_limit(MAX_COMPILED_BYTES * 4)
            .build()
            .map_err(|e| match e {
                regex::Error::CompiledTooBig(_) => PatternError::TooLarge,
                // The message quotes the anchored form; say what is wrong in the user's.
                other => PatternError::Invalid(
                    other
                        .to_string()
                        .lines()
                        .last()
                        .unwrap_or_default()
                        .trim_start_matches("error: ")
                        .to_string(),
                ),
            })?;
        Ok(Pattern {
            source: source.to_string(),
            regex,
        })
    }

    /// True if the whole of `value` matches.
    pub fn is_match(&self, value: &str) -> bool {
        self.regex.is_match(value)
    }

    pub fn as_str(&self) -> &str {
        &self.source
    }
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Pattern) -> bool {
        self.source == other.source
    }
}

impl Eq for Pattern {}

impl fmt::Debug for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Pattern({:?})", self.source)
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_whole_values_only() {
        let p = Pattern::new("/v[0-9]+").unwrap();
        assert!(p.is_match("/v12"));
        assert!(!p.is_match("/v12/x"), "not a search: the whole value");
        assert!(!p.is_match("x/v12"));
        // An alternation stays inside the anchors.
        let p = Pattern::new("a|b").unwrap();
        assert!(p.is_match("a") && p.is_match("b") && !p.is_match("ab"));
    }

    #[test]
    fn refuses_invalid_long_and_oversized_expressions() {
        assert!(matches!(Pattern::new("(["), Err(PatternError::Invalid(_))));
        assert_eq!(
            Pattern::new(&"a".repeat(MAX_PATTERN_CHARS + 1)),
            Err(PatternError::TooLong)
        );
        assert_eq!(
            Pattern::new("(?:a{1000}){1000}"),
            Err(PatternError::TooLarge)
        );
        // A backreference is not in the dialect (it could take exponential time).
        assert!(Pattern::new(r"(a)\1").is_err());
    }
}
