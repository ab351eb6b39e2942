//! The process and runtime families ztunnel exposes beside Istio's: open and maximum file
//! descriptors, and the data-plane runtime's worker count, queue depth, live tasks and
//! per-worker busy time and parks. Read when scraped, so they cost nothing in between.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

#[derive(Debug)]
pub struct ProcessAndRuntime {
    pub runtime: tokio::runtime::Handle,
}

/// Open descriptors of this process (the directory listing itself holds one).
fn open_fds() -> i64 {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count() as i64 - 1)
        .unwrap_or(0)
}

fn max_fds() -> i64 {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map(|(soft, _)| i64::try_from(soft).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, v: i64) -> std::fmt::Result {
    let g = ConstGauge::new(v);
    g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)
}

/// One counter per worker, labelled `worker="<index>"`.
fn per_worker<T: prometheus_client::encoding::EncodeCounterValue>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    workers: usize,
    value: impl Fn(usize) -> T,
) -> std::fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for w in 0..workers {
        let labels = [("worker".to_string(), w.to_string())];
        ConstCounter::new(value(w)).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

impl Collector for ProcessAndRuntime {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        gauge(
            &mut encoder,
            "process_open_fds",
            "Number of open file descriptors",
            open_fds(),
        )?;
        gauge(
            &mut encoder,
            "process_max_fds",
            "Maximum number of file descriptors",
            max_fds(),
        )?;
        let m = self.runtime.metrics();
        let workers = m.num_workers();
        gauge(
            &mut encoder,
            "tokio_num_workers",
            "the number of worker threads used by the runtime",
            workers as i64,
        )?;
        gauge(
            &mut encoder,
            "tokio_global_queue_depth",
            "the number of tasks currently scheduled in the runtime's global queue",
            m.global_queue_depth() as i64,
        )?;
        gauge(
            &mut encoder,
            "tokio_num_alive_tasks",
            "the number of alive tasks in the runtime",
            m.num_alive_tasks() as i64,
        )?;
        per_worker(
            &mut encoder,
            "tokio_worker_total_busy_duration_seconds",
            "the amount of time worker threads have been busy",
            workers,
            |w| m.worker_total_busy_duration(w).as_secs_f64(),
        )?;
        per_worker(
            &mut encoder,
            "tokio_worker_park_count",
            "the total number of times the given worker thread has parked",
            workers,
            |w| m.worker_park_count(w),
        )?;
        per_worker(
            &mut encoder,
            "tokio_worker_park_unpark_count",
            "the total number of times the given worker thread has parked and unparked",
            workers,
            |w| m.worker_park_unpark_count(w),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;

    #[test]
    fn families_and_samples() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        let mut registry = Registry::default();
        registry.register_collector(Box::new(ProcessAndRuntime {
            runtime: rt.handle().clone(),
        }));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        assert!(out.contains("# HELP process_open_fds Number of open file descriptors\n"));
        assert!(out.contains("# TYPE process_open_fds gauge\n"));
        assert!(out.contains("tokio_num_workers 2\n"), "{out}");
        assert!(
            out.contains("tokio_worker_park_count_total{worker=\"1\"} "),
            "{out}"
        );
        assert!(out.contains("tokio_worker_total_busy_duration_seconds_total{worker=\"0\"} "));
        let fds: i64 = out
            .lines()
            .find_map(|l| l.strip_prefix("process_open_fds "))
            .unwrap()
            .parse()
            .unwrap();
        assert!(fds > 0);
        let max: i64 = out
            .lines()
            .find_map(|l| l.strip_prefix("process_max_fds "))
            .unwrap()
            .parse()
            .unwrap();
        assert!(max >= fds);
    }
}
