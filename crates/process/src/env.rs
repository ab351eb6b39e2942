//! Reading Istio's variables, the one way every ambit process reads them: the process's
//! environment taken whole ([`ProcessEnv`]), a lookup that remembers what was asked for
//! ([`Env`], so a value that is not UTF-8 is refused exactly where it is read, and nowhere
//! else), and the forms values take (booleans, durations, bounded numbers, addresses,
//! ports).

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::ffi::OsString;
use std::net::SocketAddr;
use std::time::Duration;

use crate::ConfigError;

/// The process's environment: its UTF-8 variables, and the names of those whose value is
/// not UTF-8 (a variable whose name is not UTF-8 is none of ours).
#[derive(Debug, Default, Clone)]
pub struct ProcessEnv {
    vars: HashMap<String, String>,
    unreadable: BTreeSet<String>,
}

impl ProcessEnv {
    /// This process's environment (never `std::env::vars()`, which panics on a value that
    /// is not UTF-8).
    pub fn capture() -> ProcessEnv {
        ProcessEnv::from_os(std::env::vars_os())
    }

    /// An environment of these pairs.
    pub fn from_os(vars: impl IntoIterator<Item = (OsString, OsString)>) -> ProcessEnv {
        let mut env = ProcessEnv::default();
        for (k, v) in vars {
            match (k.into_string(), v.into_string()) {
                (Ok(k), Ok(v)) => {
                    env.vars.insert(k, v);
                }
                (Ok(k), Err(_)) => {
                    env.unreadable.insert(k);
                }
                (Err(_), _) => {}
            }
        }
        env
    }

    /// The UTF-8 variables.
    pub fn vars(&self) -> &HashMap<String, String> {
        &self.vars
    }

    /// Runs a configuration reader over the variables; a variable it asked for whose value
    /// is not UTF-8 is refused by name (a path must never silently become no path), whatever
    /// the reader made of its absence.
    pub fn read<T>(
        &self,
        reader: impl FnOnce(&Env<'_>) -> Result<T, ConfigError>,
    ) -> Result<T, ConfigError> {
        let env = Env::new(&self.vars);
        let result = reader(&env);
        if let Some(var) = env
            .read
            .borrow()
            .iter()
            .find(|v| self.unreadable.contains(**v))
        {
            return Err(ConfigError::Invalid {
                var,
                value: "(not UTF-8)".into(),
                expected: "a UTF-8 value",
            });
        }
        result
    }
}

pub struct Env<'a> {
    pub vars: &'a HashMap<String, String>,
    /// Every variable asked for, so values that could not be read are refused only where
    /// they matter (see [`ProcessEnv::read`]).
    pub read: RefCell<BTreeSet<&'static str>>,
}

impl<'a> Env<'a> {
    pub fn new(vars: &'a HashMap<String, String>) -> Env<'a> {
        Env {
            vars,
            read: RefCell::default(),
        }
    }

    pub fn get(&self, var: &'static str) -> Option<&str> {
        self.read.borrow_mut().insert(var);
        self.vars.get(var).map(String::as_str)
    }

    pub fn parse<T: std::str::FromStr>(
        &self,
        var: &'static str,
        expected: &'static str,
    ) -> Result<Option<T>, ConfigError> {
        match self.get(var) {
            None => Ok(None),
            Some(v) => v
                .trim()
                .parse()
                .map(Some)
                .map_err(|_| ConfigError::Invalid {
                    var,
                    value: v.to_string(),
                    expected,
                }),
        }
    }

    pub fn bool(&self, var: &'static str, default: bool) -> Result<bool, ConfigError> {
        Ok(self.parse::<bool>(var, "true or false")?.unwrap_or(default))
    }

    pub fn duration(&self, var: &'static str) -> Result<Option<Duration>, ConfigError> {
        match self.get(var) {
            None => Ok(None),
            Some(v) => parse_duration(v).map(Some).ok_or(ConfigError::Invalid {
                var,
                value: v.to_string(),
                expected: "a duration such as 500ms, 30s, 5m, 1h or 1h30m",
            }),
        }
    }

    pub fn u32_in(
        &self,
        var: &'static str,
        default: u32,
        range: std::ops::RangeInclusive<u32>,
        expected: &'static str,
    ) -> Result<u32, ConfigError> {
        match self.parse::<u32>(var, expected)? {
            None => Ok(default),
            Some(v) if range.contains(&v) => Ok(v),
            Some(v) => Err(ConfigError::Invalid {
                var,
                value: v.to_string(),
                expected,
            }),
        }
    }

    /// A keepalive time or interval: whole seconds as the kernel takes them, 1 to 32767.
    pub fn keepalive_seconds(
        &self,
        var: &'static str,
        default: u64,
    ) -> Result<Duration, ConfigError> {
        // The kernel counts keepalive in whole seconds: a fraction is dropped, as it would
        // be by the socket option, but less than a second would mean "never" and is refused.
        let d = self.duration(var)?.unwrap_or(Duration::from_secs(default));
        if !(1..=32_767).contains(&d.as_secs()) {
            return Err(ConfigError::Invalid {
                var,
                value: self.get(var).unwrap_or_default().to_string(),
                expected: "a duration from 1s to 32767s, such as 180s or 3m (whole seconds count)",
            });
        }
        Ok(Duration::from_secs(d.as_secs()))
    }

    pub fn addr(&self, var: &'static str, default: &str) -> Result<SocketAddr, ConfigError> {
        Ok(self
            .parse::<SocketAddr>(var, "an address such as 127.0.0.1:15000 or [::]:15020")?
            .unwrap_or_else(|| default.parse().expect("default address")))
    }

    pub fn port(&self, var: &'static str, default: u16) -> Result<u16, ConfigError> {
        Ok(self
            .parse::<u16>(var, "a TCP port number 0-65535")?
            .unwrap_or(default))
    }
}

/// Durations as ztunnel accepts them: a sequence of `<number><unit>`, unit one of
/// `ns us ms s m h d`; a bare number means seconds.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    if let Ok(secs) = s.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return None;
        }
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = match &rest[..unit_len] {
            "ns" => Duration::from_nanos(n),
            "us" | "µs" => Duration::from_micros(n),
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n.checked_mul(60)?),
            "h" => Duration::from_secs(n.checked_mul(3600)?),
            "d" => Duration::from_secs(n.checked_mul(86400)?),
            _ => return None,
        };
        total = total.checked_add(unit)?;
        rest = &rest[unit_len..];
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use std::os::unix::ffi::OsStringExt;

    use super::*;

    fn env(pairs: &[(&str, &[u8])]) -> ProcessEnv {
        ProcessEnv::from_os(
            pairs
                .iter()
                .map(|(k, v)| (OsString::from(*k), OsString::from_vec(v.to_vec()))),
        )
    }

    /// A value that is not UTF-8 is refused by name exactly where it is read, whatever the
    /// reader made of its absence (a required variable missing, or an optional one that
    /// would silently have been left unset); one no reader asks for is none of ours.
    #[test]
    fn a_value_not_utf8_is_refused_where_it_is_read() {
        let e = env(&[
            ("POLICY", b"/etc/\xffpolicies"),
            ("OTHER", b"\xfe"),
            ("A", b"1"),
        ]);
        let optional = |env: &Env<'_>| Ok(env.get("POLICY").map(str::to_string));
        assert_eq!(
            e.read(optional),
            Err(ConfigError::Invalid {
                var: "POLICY",
                value: "(not UTF-8)".into(),
                expected: "a UTF-8 value",
            })
        );
        let required = |env: &Env<'_>| {
            env.get("POLICY")
                .map(str::to_string)
                .ok_or(ConfigError::Missing {
                    var: "POLICY",
                    because: "testing",
                })
        };
        assert!(matches!(
            e.read(required),
            Err(ConfigError::Invalid { var: "POLICY", .. })
        ));
        // `OTHER` is not UTF-8 either, but nothing reads it.
        assert_eq!(
            e.read(|env| Ok(env.get("A").map(str::to_string))),
            Ok(Some("1".into()))
        );
        assert_eq!(e.vars().len(), 1);
    }

    #[test]
    fn durations_read_as_ztunnel_reads_them() {
        let cases = [
            ("30", Some(Duration::from_secs(30))),
            ("500ms", Some(Duration::from_millis(500))),
            ("1h30m", Some(Duration::from_secs(5400))),
            ("1d", Some(Duration::from_secs(86400))),
            ("", None),
            ("5x", None),
            ("ms", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse_duration(text), want, "{text:?}");
        }
    }
}
