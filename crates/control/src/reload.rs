//! The mesh directory and the tokens file, watched: a change that loads replaces what is
//! served, one that does not is reported and the last good state stays.

use std::path::PathBuf;
use std::sync::Arc;

use ambit_runtime::file_watch::Watched;
use tokio::sync::watch;

use crate::mesh::{self};
use crate::shared::{lock, stopped, Shared};
use crate::tokens::{Tokens, TokensError};

/// The mesh directory and the tokens file, watched.
pub(crate) struct Watches {
    pub(crate) mesh: Watched,
    pub(crate) tokens: Watched,
}

/// Watches the mesh directory and the tokens file ([`Watched`]: on the kernel's
/// notification, and polled); a change that loads replaces what is served, one that does
/// not is reported and the last good state stays.
pub(crate) async fn watch_loop(
    shared: Arc<Shared>,
    Watches {
        mut mesh,
        mut tokens,
    }: Watches,
    mut last_files: Vec<(PathBuf, String)>,
    mut stop: watch::Receiver<bool>,
) {
    let mut last_tokens = tokens_text(&shared).await.ok();
    let mut last_read_error: Option<String> = None;
    loop {
        let mesh_changed = tokio::select! {
            _ = stopped(&mut stop) => return,
            _ = mesh.changed() => true,
            _ = tokens.changed() => false,
        };
        if !mesh_changed {
            reload_tokens(&shared, &mut last_tokens).await;
            continue;
        }
        let dir = shared.config.mesh_dir.clone();
        let read = tokio::task::spawn_blocking(move || mesh::read_dir(&dir)).await;
        match read {
            Ok(Ok(files)) if files != last_files => {
                last_read_error = None;
                match mesh::build(&files, &shared.config.manifests) {
                    Ok(m) => {
                        lock(&shared.status).mesh_error = None;
                        shared.publish(m);
                        // The previous mesh and what decoding this one used go back.
                        ambit_runtime::memory::release_freed();
                    }
                    Err(e) => {
                        shared.metrics.reload_errors.inc();
                        tracing::error!(
                            "mesh change refused, still serving the last good mesh: {e}"
                        );
                        lock(&shared.status).mesh_error = Some(e.to_string());
                    }
                }
                last_files = files;
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                let text = e.to_string();
                if last_read_error.as_deref() != Some(&text) {
                    shared.metrics.reload_errors.inc();
                    tracing::error!("still serving the last good mesh: {text}");
                    lock(&shared.status).mesh_error = Some(text.clone());
                    last_read_error = Some(text);
                }
            }
            Err(e) => tracing::error!("mesh reader task failed: {e}"),
        }
    }
}

/// Reads the tokens file again after a change: a new list replaces the old one; a file
/// that no longer loads, or cannot be read, refuses every request until it can.
pub(crate) async fn reload_tokens(shared: &Shared, last_tokens: &mut Option<String>) {
    match tokens_text(shared).await {
        Ok(text) if last_tokens.as_deref() != Some(&text) => {
            match Tokens::parse(&shared.config.tokens_file, &text) {
                Ok(t) => {
                    tracing::info!(tokens = t.len(), "loaded the tokens file");
                    shared.set_tokens(t, None);
                }
                Err(e) => {
                    shared.metrics.reload_errors.inc();
                    tracing::error!(
                        "the tokens file no longer loads: refusing every request until it does (no token is valid meanwhile): {e}"
                    );
                    shared.set_tokens(Tokens::default(), Some(e.to_string()));
                }
            }
            *last_tokens = Some(text);
        }
        Ok(_) => {}
        Err(e) => {
            // Deleted or unreadable: the tokens it listed are no longer granted. A
            // revoked credential must not outlive the file that revoked it.
            let text = e.to_string();
            let already = lock(&shared.status).tokens_error.as_deref() == Some(&text);
            if !already {
                shared.metrics.reload_errors.inc();
                tracing::error!(
                    "cannot read the tokens file: refusing every request until it can be read (no token is valid meanwhile): {text}"
                );
                shared.set_tokens(Tokens::default(), Some(text));
            }
            *last_tokens = None;
        }
    }
}

pub(crate) async fn tokens_text(shared: &Shared) -> Result<String, TokensError> {
    let path = shared.config.tokens_file.clone();
    tokio::task::spawn_blocking(move || crate::tokens::read(&path))
        .await
        .unwrap_or_else(|e| {
            Err(TokensError::Read {
                path: shared.config.tokens_file.clone(),
                source: std::io::Error::other(e),
            })
        })
}
