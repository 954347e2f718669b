//! The adapter control plane: start-up loading, uploads, activation and rollback, with
//! uploads and activations persisted under the data directory so they survive a restart.
//!
//! Layout of `<data>/adapters/<name>/`:
//! - `<digest>.wasm`: every component uploaded for `name` (the file name is its sha256);
//! - `active`: the digest of the active version;
//! - `history`: previously active digests, oldest first (what `rollback` walks back through).
//!
//! Start-up: the adapters directory is loaded first (each file activated), then every
//! persisted version of every adapter, then the persisted history and active version are
//! replayed, so the gateway comes back serving what it served before.
//!
//! Changes are durable first: the markers are written before the runtime switches, so a
//! failed write leaves the previous version serving. All changes are serialised by one
//! lock; compilation runs on the blocking pool, never on an async worker.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use sha2::{Digest, Sha256};
use sluice_adapter_runtime::{
    AdapterRuntime, AdapterStatus, AdapterVersionInfo, CanaryPolicy, CanaryStatus, LoadError,
    Rollout, SandboxLimits,
};
use tokio::sync::Mutex;

use crate::config::{Config, LimitsConfig};

const ACTIVE_FILE: &str = "active";
const HISTORY_FILE: &str = "history";

/// Why an admin change failed.
#[derive(Debug, thiserror::Error)]
pub enum ManageError {
    /// The runtime refused (validation failure, unknown adapter or version, ...). Nothing
    /// changed.
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("invalid adapter name {0:?}: use 1-64 characters of a-z, 0-9, '-' and '_'")]
    InvalidName(String),
    #[error("invalid digest {0:?}: expected 64 lower-case hex characters (sha256)")]
    InvalidDigest(String),
    /// The change could not be made durable; the previous version keeps serving.
    #[error("cannot persist adapter state at {path}: {message}")]
    Persist { path: PathBuf, message: String },
    #[error("adapter compilation task failed: {0}")]
    Task(String),
}

/// What happened to one file or version during start-up loading.
#[derive(Debug, Clone)]
pub struct StartupItem {
    pub source: PathBuf,
    pub result: Result<AdapterVersionInfo, String>,
}

/// The outcome of start-up loading, for logs and `sluice demo`.
#[derive(Debug, Clone, Default)]
pub struct StartupReport {
    pub items: Vec<StartupItem>,
    /// Adapters as they serve once loading finished.
    pub adapters: Vec<AdapterStatus>,
}

/// Activation histories mirrored from the runtime (which keeps them in memory only).
#[derive(Default)]
struct ControlState {
    histories: BTreeMap<String, Vec<String>>,
}

/// The control plane over one [`AdapterRuntime`].
pub struct AdapterManager {
    runtime: AdapterRuntime,
    uploads_dir: PathBuf,
    default_limits: LimitsConfig,
    adapter_limits: BTreeMap<String, LimitsConfig>,
    control: Mutex<ControlState>,
}

impl AdapterManager {
    pub fn new(runtime: AdapterRuntime, config: &Config) -> Self {
        AdapterManager {
            runtime,
            uploads_dir: config.uploaded_adapters_dir(),
            default_limits: config.default_limits.clone(),
            adapter_limits: config.adapter_limits.clone(),
            control: Mutex::new(ControlState::default()),
        }
    }

    pub fn runtime(&self) -> &AdapterRuntime {
        &self.runtime
    }

    pub fn list(&self) -> Vec<AdapterStatus> {
        self.runtime.list()
    }

    pub fn status(&self, name: &str) -> Option<AdapterStatus> {
        self.runtime.list().into_iter().find(|a| a.name == name)
    }

    pub fn active_count(&self) -> usize {
        self.runtime
            .list()
            .iter()
            .filter(|a| a.active.is_some())
            .count()
    }

    /// Validates and loads an uploaded component; with `activate`, makes it serve.
    pub async fn upload(
        self: &Arc<Self>,
        name: &str,
        wasm: Bytes,
        activate: bool,
    ) -> Result<AdapterVersionInfo, ManageError> {
        check_name(name)?;
        let mut control = self.control.lock().await;
        let info = self.load_blocking(name, wasm.clone()).await?;
        let dir = self.uploads_dir.join(name);
        write_atomically(&dir.join(format!("{}.wasm", info.digest)), &wasm)?;
        if activate {
            self.activate_locked(&mut control, name, &info.digest)
        } else {
            Ok(info)
        }
    }

    /// Makes the loaded version `digest` of `name` serve new calls.
    pub async fn activate(
        &self,
        name: &str,
        digest: &str,
    ) -> Result<AdapterVersionInfo, ManageError> {
        check_name(name)?;
        check_digest(digest)?;
        let mut control = self.control.lock().await;
        self.activate_locked(&mut control, name, digest)
    }

    /// Re-activates the version that was active before the current one.
    pub async fn rollback(&self, name: &str) -> Result<AdapterVersionInfo, ManageError> {
        check_name(name)?;
        let mut control = self.control.lock().await;
        if self.status(name).is_none() {
            return Err(LoadError::UnknownAdapter(name.to_string()).into());
        }
        let mut history = control.histories.get(name).cloned().unwrap_or_default();
        let Some(previous) = history.pop() else {
            return Err(LoadError::NothingToRollBackTo(name.to_string()).into());
        };
        self.persist_markers(name, &previous, &history)?;
        let info = self.runtime.rollback(name)?;
        if info.digest != previous {
            // The runtime's history is the truth; record what it actually did.
            tracing::warn!(adapter = name, expected = %previous, got = %info.digest,
                "rollback went to another version than the persisted history said");
            self.persist_markers(name, &info.digest, &history)?;
        }
        control.histories.insert(name.to_string(), history);
        Ok(info)
    }

    /// Stages the loaded version `digest` as `name`'s shadow (not persisted: a restart
    /// serves the active version alone).
    pub async fn stage_shadow(
        &self,
        name: &str,
        digest: &str,
    ) -> Result<AdapterVersionInfo, ManageError> {
        check_name(name)?;
        check_digest(digest)?;
        let _control = self.control.lock().await;
        Ok(self.runtime.stage_shadow(name, digest)?)
    }

    /// Ends `name`'s shadow; what it was, if any.
    pub async fn clear_shadow(
        &self,
        name: &str,
    ) -> Result<Option<AdapterVersionInfo>, ManageError> {
        check_name(name)?;
        let _control = self.control.lock().await;
        Ok(self.runtime.clear_shadow(name)?)
    }

    /// Starts a canary of the loaded version `digest` (not persisted, like a shadow).
    pub async fn start_canary(
        &self,
        name: &str,
        digest: &str,
        rollout: Rollout,
        policy: CanaryPolicy,
    ) -> Result<CanaryStatus, ManageError> {
        check_name(name)?;
        check_digest(digest)?;
        let _control = self.control.lock().await;
        Ok(self.runtime.start_canary(name, digest, rollout, policy)?)
    }

    /// Stops `name`'s canary; what it was, if any.
    pub async fn stop_canary(&self, name: &str) -> Result<Option<CanaryStatus>, ManageError> {
        check_name(name)?;
        let _control = self.control.lock().await;
        Ok(self.runtime.stop_canary(name, None)?)
    }

    /// Start-up: the adapters directory, then persisted uploads and activations.
    pub async fn load_startup(&self, adapters_dir: Option<&Path>) -> StartupReport {
        let mut control = self.control.lock().await;
        let mut items = Vec::new();
        if let Some(dir) = adapters_dir {
            for (name, path) in wasm_files(dir, &mut items) {
                let item = self.load_startup_file(&mut control, &name, &path).await;
                items.push(item);
            }
        }
        for name in persisted_adapter_names(&self.uploads_dir, &mut items) {
            self.restore_persisted(&mut control, &name, &mut items)
                .await;
        }
        for item in &items {
            match &item.result {
                Ok(info) => tracing::info!(adapter = %info.name, version = %info.version,
                    digest = %info.digest, from_cache = info.from_cache,
                    source = %item.source.display(), "adapter loaded at start-up"),
                Err(error) => tracing::error!(source = %item.source.display(), %error,
                    "adapter could not be loaded at start-up"),
            }
        }
        StartupReport {
            items,
            adapters: self.runtime.list(),
        }
    }

    async fn load_startup_file(
        &self,
        control: &mut ControlState,
        name: &str,
        path: &Path,
    ) -> StartupItem {
        let result = async {
            check_name(name)?;
            let bytes = read_file(path)?;
            let info = self.load_blocking(name, bytes).await?;
            // Directory adapters serve at start-up; this is not persisted (the directory
            // is read again at every start).
            let previous = self.current_active(name);
            self.runtime.activate(name, &info.digest)?;
            note_activation(control, name, previous, &info.digest);
            Ok::<_, ManageError>(info)
        }
        .await;
        StartupItem {
            source: path.to_path_buf(),
            result: result.map_err(|e| e.to_string()),
        }
    }

    /// Loads every persisted version of `name`, then replays its history and activation.
    async fn restore_persisted(
        &self,
        control: &mut ControlState,
        name: &str,
        items: &mut Vec<StartupItem>,
    ) {
        let dir = self.uploads_dir.join(name);
        for (digest, path) in wasm_files(&dir, items) {
            let result = async {
                check_digest(&digest)?;
                let bytes = read_file(&path)?;
                if hex::encode(Sha256::digest(&bytes)) != digest {
                    return Err(ManageError::Persist {
                        path: path.clone(),
                        message: "content does not match the digest in its file name".into(),
                    });
                }
                self.load_blocking(name, bytes).await
            }
            .await;
            items.push(StartupItem {
                source: path,
                result: result.map_err(|e| e.to_string()),
            });
        }

        let history = read_lines(&dir.join(HISTORY_FILE));
        let active = read_lines(&dir.join(ACTIVE_FILE)).into_iter().next();
        for digest in history.iter().chain(active.iter()) {
            if self.runtime.version(name, digest).is_none() {
                tracing::warn!(adapter = name, %digest,
                    "persisted activation refers to a version that is no longer available");
                continue;
            }
            let previous = self.current_active(name);
            if self.runtime.activate(name, digest).is_ok() {
                note_activation(control, name, previous, digest);
            }
        }
        // Make disk match what the replay produced.
        if let Some(active) = self.current_active(name) {
            let history = control.histories.get(name).cloned().unwrap_or_default();
            if let Err(error) = self.persist_markers(name, &active, &history) {
                tracing::error!(adapter = name, %error, "cannot rewrite adapter markers");
            }
        }
    }

    fn activate_locked(
        &self,
        control: &mut ControlState,
        name: &str,
        digest: &str,
    ) -> Result<AdapterVersionInfo, ManageError> {
        if self.status(name).is_none() {
            return Err(LoadError::UnknownAdapter(name.to_string()).into());
        }
        if self.runtime.version(name, digest).is_none() {
            return Err(LoadError::UnknownVersion {
                name: name.to_string(),
                digest: digest.to_string(),
            }
            .into());
        }
        let previous = self.current_active(name);
        let mut history = control.histories.get(name).cloned().unwrap_or_default();
        push_history(&mut history, previous.as_deref(), digest);
        self.persist_markers(name, digest, &history)?;
        let info = self.runtime.activate(name, digest)?;
        control.histories.insert(name.to_string(), history);
        Ok(info)
    }

    fn current_active(&self, name: &str) -> Option<String> {
        self.status(name).and_then(|s| s.active).map(|a| a.digest)
    }

    fn persist_markers(
        &self,
        name: &str,
        active: &str,
        history: &[String],
    ) -> Result<(), ManageError> {
        let dir = self.uploads_dir.join(name);
        let mut history_text = history.join("\n");
        if !history_text.is_empty() {
            history_text.push('\n');
        }
        write_atomically(&dir.join(HISTORY_FILE), history_text.as_bytes())?;
        write_atomically(&dir.join(ACTIVE_FILE), format!("{active}\n").as_bytes())
    }

    /// Compiles and validates on the blocking pool: compilation takes hundreds of
    /// milliseconds and must not stall the async workers serving traffic.
    async fn load_blocking(
        &self,
        name: &str,
        wasm: impl AsRef<[u8]> + Send + 'static,
    ) -> Result<AdapterVersionInfo, ManageError> {
        let runtime = self.runtime.clone();
        let limits = self.limits_for(name);
        let name = name.to_string();
        tokio::task::spawn_blocking(move || runtime.load(&name, wasm.as_ref(), limits, false))
            .await
            .map_err(|e| ManageError::Task(e.to_string()))?
            .map_err(ManageError::from)
    }

    /// Per-adapter limits from the config, on top of the runtime's defaults. `None` when
    /// nothing is configured (the runtime's defaults apply).
    fn limits_for(&self, name: &str) -> Option<SandboxLimits> {
        let configured = match self.adapter_limits.get(name) {
            Some(own) => own.over(&self.default_limits),
            None => self.default_limits.clone(),
        };
        if configured.is_empty() {
            return None;
        }
        Some(sandbox_limits(&configured, SandboxLimits::default()))
    }
}

/// Configured limits on top of `base`, field by field.
pub fn sandbox_limits(configured: &LimitsConfig, base: SandboxLimits) -> SandboxLimits {
    SandboxLimits {
        memory_bytes: configured.memory_bytes.unwrap_or(base.memory_bytes),
        cpu_deadline: configured.cpu_deadline().unwrap_or(base.cpu_deadline),
        max_output_bytes: configured.max_output_bytes.unwrap_or(base.max_output_bytes),
        max_log_bytes: configured.max_log_bytes.unwrap_or(base.max_log_bytes),
    }
}

/// The runtime's rule: activating another version pushes the current one on the history.
fn push_history(history: &mut Vec<String>, previous: Option<&str>, next: &str) {
    if let Some(previous) = previous {
        if previous != next {
            history.push(previous.to_string());
        }
    }
}

fn note_activation(control: &mut ControlState, name: &str, previous: Option<String>, next: &str) {
    let history = control.histories.entry(name.to_string()).or_default();
    push_history(history, previous.as_deref(), next);
}

/// Adapter names are URL path segments and directory names.
pub fn check_name(name: &str) -> Result<(), ManageError> {
    let ok = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(ManageError::InvalidName(name.to_string()))
    }
}

/// Digests become file names; accept only what sha256 hex looks like.
pub fn check_digest(digest: &str) -> Result<(), ManageError> {
    let ok = digest.len() == 64
        && digest
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ManageError::InvalidDigest(digest.to_string()))
    }
}

/// `(stem, path)` of every `*.wasm` file in `dir`, sorted; unreadable dirs are reported.
fn wasm_files(dir: &Path, items: &mut Vec<StartupItem>) -> Vec<(String, PathBuf)> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            items.push(StartupItem {
                source: dir.to_path_buf(),
                result: Err(format!("cannot read directory: {e}")),
            });
            return Vec::new();
        }
    };
    let mut files: Vec<(String, PathBuf)> = entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.is_file() && path.extension().is_some_and(|x| x == "wasm"))
        .filter_map(|path| {
            let stem = path.file_stem()?.to_str()?.to_string();
            Some((stem, path))
        })
        .collect();
    files.sort();
    files
}

/// Names of adapters with persisted state (sub-directories of the uploads dir).
fn persisted_adapter_names(uploads_dir: &Path, items: &mut Vec<StartupItem>) -> Vec<String> {
    let entries = match std::fs::read_dir(uploads_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            items.push(StartupItem {
                source: uploads_dir.to_path_buf(),
                result: Err(format!("cannot read directory: {e}")),
            });
            return Vec::new();
        }
    };
    let mut names: Vec<String> = entries
        .filter_map(|entry| entry.ok())
        .filter(|entry| entry.path().is_dir())
        .filter_map(|entry| entry.file_name().to_str().map(str::to_string))
        .filter(|name| check_name(name).is_ok())
        .collect();
    names.sort();
    names
}

fn read_file(path: &Path) -> Result<Vec<u8>, ManageError> {
    std::fs::read(path).map_err(|e| ManageError::Persist {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// Non-empty trimmed lines of a marker file; a missing file is empty.
fn read_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .map(|text| {
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && check_digest(l).is_ok())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Write to a temporary file in the same directory, fsync, then rename over the target,
/// so a crash never leaves a half-written component or marker.
fn write_atomically(path: &Path, contents: &[u8]) -> Result<(), ManageError> {
    let persist_error = |e: std::io::Error| ManageError::Persist {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(persist_error)?;
    let file_name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("marker");
    let tmp = dir.join(format!(".{file_name}.{}.tmp", rand::random::<u64>()));
    let result = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(contents)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(persist_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_could_escape_the_data_directory_are_refused() {
        for bad in ["", "..", "a/b", "A", "a b", "a\\b", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_name("test-well-behaved").is_ok());
    }

    #[test]
    fn only_sha256_hex_is_a_digest() {
        assert!(check_digest(&"a".repeat(64)).is_ok());
        assert!(check_digest(&"A".repeat(64)).is_err());
        assert!(check_digest(&"a".repeat(63)).is_err());
        assert!(check_digest("../../etc/passwd").is_err());
    }

    #[test]
    fn activating_another_version_pushes_the_current_one_once() {
        let mut history = Vec::new();
        push_history(&mut history, None, "a");
        push_history(&mut history, Some("a"), "a");
        assert!(history.is_empty());
        push_history(&mut history, Some("a"), "b");
        push_history(&mut history, Some("b"), "c");
        assert_eq!(history, vec!["a".to_string(), "b".to_string()]);
    }

    #[test]
    fn atomic_writes_replace_the_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested").join("active");
        write_atomically(&path, b"first\n").unwrap();
        write_atomically(&path, b"second\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "second\n");
        let leftovers: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty());
    }
}
