//! The installer side of istio-cni's `install-cni` (istio-cni reference §1.2 step 5, §4.1):
//! puts the CNI plugin on the node and keeps it there.
//!
//! - copies the plugin binary to the host's CNI bin dir as `istio-cni`;
//! - writes the plugin's kubeconfig (`<CNI_AGENT_RUN_DIR>/istio-cni-kubeconfig`) from the
//!   service account, rewritten when the token rotates;
//! - adds our entry to the primary CNI config (or writes the istio-owned copy, or a
//!   standalone file when not chained);
//! - then watches the three and repairs drift ([`Installer::run`]); readiness is false
//!   while it repairs;
//! - on shutdown, either keeps everything (an upgrade) or removes it all ([`upgrade`],
//!   [`Installer::shutdown`]).
//!
//! Modules: [`config`] (env, sans IO), [`conflist`] (the config edits, sans IO),
//! [`files`] (atomic writes, the binary, the kubeconfig), [`upgrade`] (the shutdown rule).

pub mod conflist;
pub mod files;
pub mod settings;
pub mod upgrade;

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

pub use settings::{ConfigError, InstallConfig};
pub use upgrade::{ShutdownAction, ShutdownDecision};

use conflist::{ConfError, ConfFile};
use files::ServerTrust;

/// How often the installer looks for drift.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// At most one repair per this long.
pub const THROTTLE: Duration = Duration::from_secs(5);
/// Throttled repairs in a row before we say another component fights us.
pub const FIGHT_WARNING_AFTER: u32 = 5;

/// Why an install step failed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("no CNI network config in {dir} yet{}: waiting for the primary CNI plugin to write one", .named.as_ref().map(|n| format!(" (CNI_CONF_NAME={n})")).unwrap_or_default())]
    NoPrimary { dir: PathBuf, named: Option<String> },
    #[error("cannot edit the CNI config: {0}")]
    Conf(#[from] ConfError),
    #[error("no service account token at {0}: is automountServiceAccountToken off for the istio-cni pod?")]
    NoToken(PathBuf),
    #[error("no CA bundle at {0}: set KUBE_CA_FILE, or SKIP_TLS_VERIFY=true to not check the API server")]
    NoCa(PathBuf),
    #[error("KUBERNETES_SERVICE_HOST is not set: the plugin's kubeconfig needs the API server's address")]
    NoApiServer,
}

/// What one install (or uninstall) pass changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Changes {
    /// The plugin binary was (re)copied.
    pub binary: bool,
    /// The kubeconfig was (re)written.
    pub kubeconfig: bool,
    /// Conf files written.
    pub conf_written: Vec<PathBuf>,
    /// Files removed.
    pub removed: Vec<PathBuf>,
    /// Things the admin should know (another config outranks ours, ...).
    pub warnings: Vec<String>,
}

impl Changes {
    /// Nothing was touched.
    pub fn is_empty(&self) -> bool {
        !self.binary && !self.kubeconfig && self.conf_written.is_empty() && self.removed.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum ConfAction {
    Write {
        path: PathBuf,
        content: Vec<u8>,
        mode: u32,
    },
    Remove(PathBuf),
}

/// The installer of one node.
#[derive(Debug)]
pub struct Installer {
    cfg: InstallConfig,
    poll: Duration,
    throttle: Duration,
    /// The installed binary's size and mtime after our last copy: a cheap drift check
    /// (comparing a multi-megabyte binary every second is not).
    binary_stamp: Mutex<Option<(u64, SystemTime)>>,
}

fn stamp(path: &Path) -> Option<(u64, SystemTime)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.len(), m.modified().ok()?))
}

impl Installer {
    pub fn new(cfg: InstallConfig) -> Installer {
        Installer::with_timing(cfg, POLL_INTERVAL, THROTTLE)
    }

    /// With another poll interval and throttle (tests).
    pub fn with_timing(cfg: InstallConfig, poll: Duration, throttle: Duration) -> Installer {
        Installer {
            cfg,
            poll,
            throttle,
            binary_stamp: Mutex::new(None),
        }
    }

    pub fn config(&self) -> &InstallConfig {
        &self.cfg
    }

    /// The kubeconfig the plugin should have now.
    pub fn desired_kubeconfig(&self) -> Result<String, InstallError> {
        let c = &self.cfg;
        if c.kubernetes_service_host.is_empty() {
            return Err(InstallError::NoApiServer);
        }
        let token_path = c.service_account_dir.join("token");
        let token = files::read_limited(&token_path, files::MAX_SECRET_BYTES)?
            .ok_or_else(|| InstallError::NoToken(token_path.clone()))?;
        let token = String::from_utf8_lossy(&token).trim().to_owned();
        let trust = if c.skip_tls_verify {
            ServerTrust::Insecure
        } else {
            let ca = c
                .kube_ca_file
                .clone()
                .unwrap_or_else(|| c.service_account_dir.join("ca.crt"));
            ServerTrust::Ca(
                files::read_limited(&ca, files::MAX_SECRET_BYTES)?.ok_or(InstallError::NoCa(ca))?,
            )
        };
        let server = files::server_url(
            &c.kubernetes_service_protocol,
            &c.kubernetes_service_host,
            &c.kubernetes_service_port,
        );
        Ok(files::kubeconfig(&server, &trust, &token))
    }

    fn kubeconfig_current(&self, want: &str) -> io::Result<bool> {
        let path = self.cfg.kubeconfig_path();
        let have = files::read_limited(&path, files::MAX_SECRET_BYTES)?;
        Ok(have.as_deref() == Some(want.as_bytes())
            && files::mode_of(&path)? == Some(self.cfg.kubeconfig_mode))
    }

    fn primary<'a>(&self, files: &'a [ConfFile]) -> Result<&'a ConfFile, InstallError> {
        let c = &self.cfg;
        let no_primary = || InstallError::NoPrimary {
            dir: c.cni_net_dir.clone(),
            named: c.cni_conf_name.clone(),
        };
        let name = match &c.cni_conf_name {
            Some(n) => {
                // A named .conf we wrapped earlier lives on as .conflist.
                let wrapped = conflist::conflist_name(n);
                let found = [n.as_str(), wrapped.as_str()]
                    .into_iter()
                    .find(|n| files.iter().any(|f| f.name == *n))
                    .map(str::to_owned);
                found.ok_or_else(no_primary)?
            }
            None => {
                let sel = conflist::select_primary(files, &[&c.owned_file_name]);
                for skipped in &sel.skipped {
                    tracing::debug!(%skipped, "not a usable CNI config, skipped");
                }
                sel.primary.ok_or_else(no_primary)?
            }
        };
        files.iter().find(|f| f.name == name).ok_or_else(no_primary)
    }

    fn conf_plan(&self) -> Result<(Vec<ConfAction>, Vec<String>), InstallError> {
        let c = &self.cfg;
        let entry = c.plugin_entry();
        let dir = &c.cni_net_dir;
        let mut warnings = Vec::new();
        let write_if_changed =
            |name: &str, content: Vec<u8>, mode: u32| -> io::Result<Option<ConfAction>> {
                let path = dir.join(name);
                // Larger than what we would write: different (and not worth reading).
                let have = match files::read_limited(&path, content.len() as u64) {
                    Ok(h) => h,
                    Err(e) if e.kind() == io::ErrorKind::InvalidData => None,
                    Err(e) => return Err(e),
                };
                let same =
                    have.as_deref() == Some(&content[..]) && files::mode_of(&path)? == Some(mode);
                Ok((!same).then_some(ConfAction::Write {
                    path,
                    content,
                    mode,
                }))
            };
        if !c.chained {
            let out = conflist::standalone(c.standalone_name(), &entry);
            let path = dir.join(&out.name);
            let mode = files::mode_of(&path)?.unwrap_or(files::DEFAULT_CONF_MODE);
            return Ok((
                write_if_changed(&out.name, out.content, mode)?
                    .into_iter()
                    .collect(),
                warnings,
            ));
        }
        let all = files::list_conf_dir(dir)?;
        let primary = self.primary(&all)?;
        if c.owns_config() {
            let out = conflist::chain_into(&primary.name, &primary.content, &entry)?;
            let ahead = conflist::outranking(&all, &c.owned_file_name);
            if !ahead.is_empty() {
                warnings.push(format!(
                    "{} sort(s) before our {} in {}: the runtime uses them instead, and pods are not captured",
                    ahead.join(", "),
                    c.owned_file_name,
                    dir.display()
                ));
            }
            return Ok((
                write_if_changed(&c.owned_file_name, out.content, c.owned_mode())?
                    .into_iter()
                    .collect(),
                warnings,
            ));
        }
        if conflist::is_installed(&primary.name, &primary.content, &entry) {
            return Ok((Vec::new(), warnings));
        }
        let out = conflist::chain_into(&primary.name, &primary.content, &entry)?;
        let old = dir.join(&primary.name);
        let mode = files::mode_of(&old)?.unwrap_or(files::DEFAULT_CONF_MODE);
        let mut actions = vec![ConfAction::Write {
            path: dir.join(&out.name),
            content: out.content,
            mode,
        }];
        if out.name != primary.name {
            actions.push(ConfAction::Remove(old));
        }
        Ok((actions, warnings))
    }

    /// One install pass: binary, kubeconfig, CNI config. Writes only what differs.
    pub fn install_once(&self) -> Result<Changes, InstallError> {
        let c = &self.cfg;
        let mut ch = Changes::default();
        let target = c.plugin_path();
        ch.binary = files::install_binary(&c.plugin_source, &target)?;
        *self.binary_stamp.lock().unwrap_or_else(|e| e.into_inner()) = stamp(&target);

        let want = self.desired_kubeconfig()?;
        if !self.kubeconfig_current(&want)? {
            // The node agent's directory (its plugin socket): 0700 when made here too.
            use std::os::unix::fs::DirBuilderExt as _;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&c.cni_agent_run_dir)?;
            files::write_atomic(&c.kubeconfig_path(), want.as_bytes(), c.kubeconfig_mode)?;
            ch.kubeconfig = true;
        }

        let (actions, warnings) = self.conf_plan()?;
        ch.warnings = warnings;
        for a in actions {
            match a {
                ConfAction::Write {
                    path,
                    content,
                    mode,
                } => {
                    files::write_atomic(&path, &content, mode)?;
                    ch.conf_written.push(path);
                }
                ConfAction::Remove(path) => {
                    if files::remove_if_exists(&path)? {
                        ch.removed.push(path);
                    }
                }
            }
        }
        Ok(ch)
    }

    /// What is out of place since the last install, if anything (cheap: no binary read).
    pub fn drift(&self) -> Option<String> {
        let c = &self.cfg;
        let target = c.plugin_path();
        let recorded = *self.binary_stamp.lock().unwrap_or_else(|e| e.into_inner());
        let now = stamp(&target);
        if now.is_none() || now != recorded {
            return Some(format!("the plugin binary {} changed", target.display()));
        }
        match self.desired_kubeconfig() {
            Ok(want) => match self.kubeconfig_current(&want) {
                Ok(true) => {}
                _ => return Some("the kubeconfig or the service account token changed".into()),
            },
            Err(e) => return Some(e.to_string()),
        }
        match self.conf_plan() {
            Ok((actions, _)) if actions.is_empty() => None,
            Ok(_) => Some(format!(
                "the CNI config in {} changed",
                c.cni_net_dir.display()
            )),
            Err(e) => Some(e.to_string()),
        }
    }

    /// Installs, sets `install_ready`, then repairs drift until `shutdown` completes.
    /// Readiness is false while an install is pending or failing. Returns when
    /// `shutdown` does; the caller then calls [`Installer::shutdown`].
    pub async fn run(
        self: Arc<Self>,
        install_ready: Arc<AtomicBool>,
        shutdown: impl Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        let mut last_repair: Option<Instant> = None;
        let mut fights = 0u32;
        let mut failing = false;
        loop {
            let me = self.clone();
            let result = match tokio::task::spawn_blocking(move || me.install_once()).await {
                Ok(r) => r,
                Err(e) => Err(InstallError::Io(io::Error::other(format!(
                    "the install task failed: {e}"
                )))),
            };
            match result {
                Ok(ch) => {
                    failing = false;
                    for w in &ch.warnings {
                        tracing::warn!("{w}");
                    }
                    if !ch.is_empty() {
                        tracing::info!(
                            binary = ch.binary,
                            kubeconfig = ch.kubeconfig,
                            written = ?ch.conf_written,
                            removed = ?ch.removed,
                            "istio-cni plugin installed"
                        );
                    }
                    install_ready.store(true, Ordering::SeqCst);
                }
                Err(e) => {
                    install_ready.store(false, Ordering::SeqCst);
                    if !failing {
                        tracing::warn!("cannot install the CNI plugin yet: {e}");
                    }
                    failing = true;
                }
            }
            // Wait for drift (or, while failing, for the next attempt).
            loop {
                tokio::select! {
                    _ = &mut shutdown => return,
                    _ = tokio::time::sleep(self.poll) => {}
                }
                if failing {
                    break;
                }
                let me = self.clone();
                if let Ok(Some(why)) = tokio::task::spawn_blocking(move || me.drift()).await {
                    install_ready.store(false, Ordering::SeqCst);
                    tracing::info!("repairing the CNI install: {why}");
                    break;
                }
            }
            if failing {
                continue;
            }
            if let Some(t) = last_repair {
                let since = t.elapsed();
                if since < self.throttle {
                    fights += 1;
                    if fights > FIGHT_WARNING_AFTER {
                        tracing::warn!(
                            repairs = fights,
                            "another component keeps changing the CNI config or plugin; \
                             with Cilium set cni.exclusive=false"
                        );
                    }
                    tokio::select! {
                        _ = &mut shutdown => return,
                        _ = tokio::time::sleep(self.throttle - since) => {}
                    }
                } else {
                    fights = 0;
                }
            }
            last_repair = Some(Instant::now());
        }
    }

    /// Removes what [`Installer::install_once`] put in place: our config entry (or the
    /// owned or standalone file), the kubeconfig and the binary. Other plugins' configs
    /// stay as they were.
    pub fn uninstall(&self) -> Result<Changes, InstallError> {
        let c = &self.cfg;
        let mut ch = Changes::default();
        let remove = |p: PathBuf, ch: &mut Changes| -> io::Result<()> {
            if files::remove_if_exists(&p)? {
                ch.removed.push(p);
            }
            Ok(())
        };
        if !c.chained {
            remove(c.cni_net_dir.join(c.standalone_name()), &mut ch)?;
        } else if c.owns_config() {
            remove(c.cni_net_dir.join(&c.owned_file_name), &mut ch)?;
        } else {
            match files::list_conf_dir(&c.cni_net_dir) {
                Ok(all) => {
                    for f in all {
                        if conflist::kind_of(&f.name) != Some(conflist::Kind::List) {
                            continue;
                        }
                        if let Ok(Some(content)) = conflist::remove_from(&f.name, &f.content) {
                            let path = c.cni_net_dir.join(&f.name);
                            files::write_keeping_mode(&path, &content, files::DEFAULT_CONF_MODE)?;
                            ch.conf_written.push(path);
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
        }
        remove(c.kubeconfig_path(), &mut ch)?;
        remove(c.plugin_path(), &mut ch)?;
        Ok(ch)
    }

    /// The shutdown rule (§1.7): decides upgrade vs cleanup with `client` (none: we cannot
    /// ask, so keep everything unless safe upgrade is disabled) and, on cleanup,
    /// uninstalls. The caller removes the host rules when the action is
    /// [`ShutdownAction::Cleanup`].
    pub async fn shutdown(
        self: Arc<Self>,
        client: Option<&ambit_k8s::kube::Client>,
    ) -> (ShutdownDecision, Result<Changes, InstallError>) {
        let c = &self.cfg;
        let retries = if c.istio_owned { 2 } else { 0 };
        let decision = match client {
            Some(client) => {
                upgrade::lookup_and_decide(
                    client,
                    c.disable_safe_upgrade,
                    &c.pod_namespace,
                    ambit_k8s::labels::CNI_DAEMONSET,
                    &c.node_name,
                    retries,
                )
                .await
            }
            None => upgrade::decide(
                c.disable_safe_upgrade,
                &upgrade::DaemonSetLookup::Failed("no API client".into()),
                &c.node_name,
                None,
            ),
        };
        let result = match decision.action {
            ShutdownAction::Upgrade => Ok(Changes::default()),
            ShutdownAction::Cleanup => {
                let me = self.clone();
                tokio::task::spawn_blocking(move || me.uninstall())
                    .await
                    .unwrap_or_else(|e| {
                        Err(InstallError::Io(io::Error::other(format!(
                            "the uninstall task failed: {e}"
                        ))))
                    })
            }
        };
        (decision, result)
    }
}
