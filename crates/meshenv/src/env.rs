//! Reading ztunnel's variables: a lookup that remembers what was asked for (so a value
//! that is not UTF-8 is refused only where it matters) and the forms values take
//! (booleans, durations, bounded numbers, addresses, ports).

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::time::Duration;

use crate::ConfigError;

pub struct Env<'a> {
    pub vars: &'a HashMap<String, String>,
    /// Every variable asked for, so values that could not be read are refused only where
    /// they matter (see [`Config::from_process_env`]).
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
