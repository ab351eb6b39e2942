//! How many data-plane worker threads: `ZTUNNEL_WORKER_THREADS`, the CPU limit and
//! request variables, and the machine's cores.

use super::ConfigError;
use ambit_process::env::Env;

/// A Kubernetes CPU quantity (`2`, `1.5`, `500m`) as whole cores, rounded up.
pub(super) fn cpu_quantity_cores(s: &str) -> Option<usize> {
    let s = s.trim();
    let millis: u64 = match s.strip_suffix('m') {
        Some(m) => m.parse().ok()?,
        None => {
            let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
            if whole.is_empty() && frac.is_empty() || frac.len() > 3 {
                return None;
            }
            let whole: u64 = if whole.is_empty() {
                0
            } else {
                whole.parse().ok()?
            };
            let frac: u64 = if frac.is_empty() {
                0
            } else {
                format!("{frac:0<3}").parse().ok()?
            };
            whole.checked_mul(1000)?.checked_add(frac)?
        }
    };
    usize::try_from(millis.div_ceil(1000)).ok()
}

/// The most worker threads any setting yields.
const MAX_WORKER_THREADS: usize = 1024;

/// Data-plane worker threads, sized the way ztunnel sizes them from the same variables,
/// except that the default keeps one thread where ztunnel keeps two: ambit's data path
/// never blocks a worker, and on small nodes one worker leaves the cores to the workloads
/// (on 2 cores: 42 % instead of 24 % of the direct new-connection rate, see
/// BENCHMARKS.md). `cores` is the machine's logical core count; `ZTUNNEL_CPU_LIMIT`
/// (set from the pod's limit by the Helm chart) stands in for it when set.
pub(super) fn worker_threads(env: &Env<'_>, cores: usize) -> Result<usize, ConfigError> {
    const THREADS: &str = "a thread count from 1 to 1024 such as 2, a share of the CPUs \
                           such as 50% or 12.5%, or 0 for one thread per CPU";
    let cpus = env
        .parse::<usize>("ZTUNNEL_CPU_LIMIT", "a whole number of cores")?
        .filter(|n| *n > 0)
        .unwrap_or(cores)
        .max(1);
    if let Some(v) = env.get("ZTUNNEL_WORKER_THREADS") {
        let invalid = || ConfigError::Invalid {
            var: "ZTUNNEL_WORKER_THREADS",
            value: v.to_string(),
            expected: THREADS,
        };
        let v = v.trim();
        return match v.strip_suffix('%') {
            Some(pct) => {
                let pct: f64 = pct.trim().parse().map_err(|_| invalid())?;
                if !(pct > 0.0 && pct <= 100.0) {
                    return Err(invalid());
                }
                let threads = (cpus as f64 * pct / 100.0).ceil() as usize;
                Ok(threads.clamp(1, MAX_WORKER_THREADS))
            }
            None => match v.parse::<usize>().map_err(|_| invalid())? {
                0 => Ok(cpus.min(MAX_WORKER_THREADS)),
                n if n <= MAX_WORKER_THREADS => Ok(n),
                _ => Err(invalid()),
            },
        };
    }
    let quantity = |var: &'static str| -> Result<Option<usize>, ConfigError> {
        match env.get(var) {
            None => Ok(None),
            Some(v) => cpu_quantity_cores(v).map(Some).ok_or(ConfigError::Invalid {
                var,
                value: v.to_string(),
                expected: "a CPU quantity such as 2, 1.5 or 500m",
            }),
        }
    };
    let request = quantity("ZTUNNEL_RESOURCE_CPU_REQUEST")?.unwrap_or(0);
    let threads = match quantity("ZTUNNEL_RESOURCE_CPU_LIMIT")? {
        Some(limit) => limit.max(request),
        None => cpus.div_ceil(4).max(request),
    };
    Ok(threads.clamp(1, MAX_WORKER_THREADS))
}

pub(super) fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}
