//! On-demand xDS (`XDS_ON_DEMAND=true`): the Address type starts subscribed to nothing,
//! and a lookup that misses the store asks for the name on the live stream and waits,
//! within a bound, until a response that contains or removes it was applied.
//!
//! [`OnDemand`] is the handle shared by the askers (the node proxy's connection
//! handlers) and the xDS client's driver: the askers call [`OnDemand::fetch`]; the
//! driver sends what the [`Book`] has to ask, tells the book what each applied response
//! answered, and sweeps names unused for [`OnDemandConfig::idle`].

pub mod book;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use book::{Admit, Ask, Book, BookLimits, BookStatus};

/// How on-demand lookups behave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OnDemandConfig {
    /// How long an asker waits for the answer before failing closed.
    pub timeout: Duration,
    /// A name not looked up for this long is unsubscribed and its resource removed.
    pub idle: Duration,
    pub limits: BookLimits,
}

impl Default for OnDemandConfig {
    fn default() -> Self {
        OnDemandConfig {
            timeout: Duration::from_secs(5),
            idle: Duration::from_secs(30 * 60),
            limits: BookLimits::default(),
        }
    }
}

/// Why an on-demand lookup gives up (the connection is then refused).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    #[error("no answer from the control plane for {name} within {timeout:?} (on-demand xDS)")]
    Timeout { name: String, timeout: Duration },
    #[error("too many on-demand names pending or held to ask for {name} (on-demand xDS bound)")]
    Full { name: String },
}

struct Inner {
    config: OnDemandConfig,
    book: Arc<Mutex<Book>>,
    /// Wakes the driver: something is in the outbox.
    wake: tokio::sync::Notify,
    /// Bumped each time answers were applied; askers wait on it.
    answered: tokio::sync::watch::Sender<u64>,
}

/// The on-demand handle (cheap to clone).
#[derive(Clone)]
pub struct OnDemand {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for OnDemand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnDemand")
            .field("config", &self.inner.config)
            .finish()
    }
}

fn lock(book: &Mutex<Book>) -> std::sync::MutexGuard<'_, Book> {
    book.lock().unwrap_or_else(|p| p.into_inner())
}

impl OnDemand {
    pub fn new(config: OnDemandConfig) -> Self {
        OnDemand {
            inner: Arc::new(Inner {
                book: Arc::new(Mutex::new(Book::new(config.limits))),
                config,
                wake: tokio::sync::Notify::new(),
                answered: tokio::sync::watch::channel(0).0,
            }),
        }
    }

    pub fn config(&self) -> &OnDemandConfig {
        &self.inner.config
    }

    /// The book, for the delta client's state machine.
    pub(crate) fn book(&self) -> Arc<Mutex<Book>> {
        self.inner.book.clone()
    }

    /// Asks for `name` (`<network>/<ip>`, a workload uid, or `<namespace>/<hostname>`)
    /// and waits until a response containing or removing it was applied to the store,
    /// at most [`OnDemandConfig::timeout`]. `Ok` means: look again (the store has what
    /// the control plane has, which may be nothing).
    pub async fn fetch(&self, name: &str) -> Result<(), FetchError> {
        self.fetch_pinned(name, false).await
    }

    /// As [`OnDemand::fetch`]; a `pin`ned name is never unsubscribed for idleness (the
    /// local workload).
    pub async fn fetch_pinned(&self, name: &str, pin: bool) -> Result<(), FetchError> {
        let mut answered = self.inner.answered.subscribe();
        let ask = lock(&self.inner.book).ask_pinned(name, Instant::now(), pin);
        match ask {
            Ask::Answered => return Ok(()),
            Ask::Full => {
                return Err(FetchError::Full {
                    name: name.to_string(),
                })
            }
            Ask::Send => {
                tracing::debug!(%name, "xDS on-demand: asking for a name");
                self.inner.wake.notify_one();
            }
            Ask::Pending => {}
        }
        let timeout = self.inner.config.timeout;
        let wait = async {
            loop {
                if lock(&self.inner.book).is_answered(name) {
                    return;
                }
                if answered.changed().await.is_err() {
                    // The sender lives as long as `self`: not reached.
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .map_err(|_| FetchError::Timeout {
                name: name.to_string(),
                timeout,
            })
    }

    /// A lookup of `name` hit: if it was asked for, it stays subscribed.
    pub fn touch(&self, name: &str) {
        lock(&self.inner.book).touch(name, Instant::now());
    }

    /// What the book holds.
    pub fn status(&self) -> BookStatus {
        lock(&self.inner.book).status()
    }

    /// The driver: waits for names to ask for.
    pub(crate) async fn woken(&self) {
        self.inner.wake.notified().await
    }

    /// The driver: the names to subscribe to now.
    pub(crate) fn take_outbox(&self) -> Vec<String> {
        lock(&self.inner.book).take_outbox()
    }

    /// The driver: these answers were applied to the store.
    pub(crate) fn applied(&self, answers: &[(String, Option<String>)]) {
        if answers.is_empty() {
            return;
        }
        {
            let mut book = lock(&self.inner.book);
            for (asked, resource) in answers {
                book.answered(asked, resource.as_deref());
            }
        }
        self.inner.answered.send_modify(|g| *g += 1);
    }

    /// The driver: names unused for the idle time, to unsubscribe, and the resources to
    /// remove from the store.
    pub(crate) fn sweep(&self) -> (Vec<String>, Vec<String>) {
        lock(&self.inner.book).sweep(Instant::now(), self.inner.config.idle)
    }
}
