//! Loading, validating, caching and versioning adapter components.

use crate::bindings::{PspAdapter, PspAdapterPre};
use crate::bulkhead::Bulkhead;
use crate::cache::CompileCache;
use crate::engine::{build_engine, EpochTicker};
use crate::error::{describe_wasm_error, AdapterError, LoadError, RuntimeError};
use crate::handle::{run_call, AdapterHandle};
use crate::limits::{RuntimeConfig, SandboxLimits};
use crate::release::{CanaryPolicy, CanaryStatus, Rollout};
use crate::sandbox::CallState;
use crate::warm::WarmPool;
use crate::{AdapterInfo, ConnectorAccountScope, CONTRACT_INTERFACE, SUPPORTED_CONTRACT};
use arc_swap::ArcSwap;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::Engine;

/// Components larger than this are refused before compilation.
pub const MAX_COMPONENT_BYTES: usize = 64 << 20;

/// Who an adapter version is: its name, its self-reported version and its digest.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AdapterIdentity {
    pub name: String,
    /// The version `describe()` reported at load time.
    pub version: String,
    /// sha256 of the component bytes, lower-case hex. This is what identifies a version.
    pub digest: String,
}

/// One loaded version of an adapter.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AdapterVersionInfo {
    pub name: String,
    pub version: String,
    pub digest: String,
    pub loaded_at: SystemTime,
    /// Time to compile the component, or to read it from the compile cache.
    pub compile_time: Duration,
    pub from_cache: bool,
    pub limits: SandboxLimits,
    /// What `describe()` answered during validation.
    pub describe: AdapterInfo,
}

/// One adapter: its active version, every loaded version and what rollback returns to.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AdapterStatus {
    pub name: String,
    pub active: Option<AdapterVersionInfo>,
    pub versions: Vec<AdapterVersionInfo>,
    /// Digest of the version `rollback` would activate.
    pub rollback_to: Option<String>,
    /// The version repeating the active one's work off the request path, if any.
    pub shadow: Option<AdapterVersionInfo>,
    /// The version taking a share of the new attempts, if any.
    pub canary: Option<CanaryStatus>,
}

pub(crate) struct LoadedVersion {
    pub(crate) info: AdapterVersionInfo,
    pub(crate) identity: AdapterIdentity,
    pub(crate) pre: PspAdapterPre<CallState>,
}

/// A version serving a share of the new attempts.
#[derive(Clone)]
struct Canary {
    version: Arc<LoadedVersion>,
    rollout: Rollout,
    policy: CanaryPolicy,
}

impl Canary {
    fn status(&self) -> CanaryStatus {
        CanaryStatus {
            digest: self.version.info.digest.clone(),
            version: self.version.info.version.clone(),
            rollout: self.rollout.clone(),
            policy: self.policy,
        }
    }
}

/// An adapter's versions; immutable, replaced as a whole on every change.
#[derive(Clone, Default)]
struct Slot {
    versions: Vec<Arc<LoadedVersion>>,
    active: Option<Arc<LoadedVersion>>,
    /// Previously active digests, most recent last.
    history: Vec<String>,
    shadow: Option<Arc<LoadedVersion>>,
    canary: Option<Canary>,
}

impl Slot {
    fn find(&self, digest: &str) -> Option<&Arc<LoadedVersion>> {
        self.versions.iter().find(|v| v.info.digest == digest)
    }

    fn make_active(&mut self, version: Arc<LoadedVersion>) {
        if let Some(current) = &self.active {
            if current.info.digest == version.info.digest {
                return;
            }
            self.history.push(current.info.digest.clone());
        }
        self.active = Some(version);
        self.unstage_active();
    }

    /// A version that becomes active is no longer staged beside itself: activating the
    /// canary's version promotes it, activating the shadow's ends the shadow.
    fn unstage_active(&mut self) {
        let Some(active) = self.active.as_ref().map(|v| v.info.digest.clone()) else {
            return;
        };
        if self
            .shadow
            .as_ref()
            .is_some_and(|v| v.info.digest == active)
        {
            self.shadow = None;
        }
        if self
            .canary
            .as_ref()
            .is_some_and(|c| c.version.info.digest == active)
        {
            self.canary = None;
        }
    }

    /// A loaded version that is not the active one, to run beside it.
    fn stageable(&self, name: &str, digest: &str) -> Result<Arc<LoadedVersion>, LoadError> {
        let version = self
            .find(digest)
            .cloned()
            .ok_or_else(|| LoadError::UnknownVersion {
                name: name.to_string(),
                digest: digest.to_string(),
            })?;
        if self
            .active
            .as_ref()
            .is_some_and(|a| a.info.digest == digest)
        {
            return Err(LoadError::AlreadyActive {
                name: name.to_string(),
                digest: digest.to_string(),
            });
        }
        Ok(version)
    }
}

type Registry = BTreeMap<String, Arc<Slot>>;

pub(crate) struct Shared {
    pub(crate) engine: Engine,
    pub(crate) linker: Linker<CallState>,
    pub(crate) config: RuntimeConfig,
    /// The instance slots, shared fairly across (adapter, account) keys.
    pub(crate) slots: Arc<Bulkhead>,
    /// Idle instances of finished calls, per (version, account).
    pub(crate) warm: WarmPool,
    cache: Option<CompileCache>,
    /// Readers (every call) load this without locking; writers replace it whole.
    registry: ArcSwap<Registry>,
    /// Serialises registry changes so no update is lost between load and store.
    write_lock: Mutex<()>,
    /// Serialises loads: validation uses the pool's reserved slots, and two loads of
    /// the same bytes must not compile twice.
    load_lock: Mutex<()>,
    _ticker: EpochTicker,
}

/// The adapter runtime. Cheap to clone: all clones share one engine and registry.
#[derive(Clone)]
pub struct AdapterRuntime {
    shared: Arc<Shared>,
}

impl AdapterRuntime {
    pub fn new(config: RuntimeConfig) -> Result<Self, RuntimeError> {
        config
            .default_limits
            .validate()
            .map_err(|e| RuntimeError::Engine(e.to_string()))?;
        config.bulkhead.validate()?;
        config.warm.validate().map_err(RuntimeError::Engine)?;
        let engine = build_engine(config.max_concurrent_instances, config.warm.max_idle)?;
        let linker = build_linker(&engine)?;
        let cache = match &config.cache_dir {
            Some(dir) => Some(CompileCache::open(dir, &engine)?),
            None => None,
        };
        let ticker = EpochTicker::start(engine.clone(), config.epoch_tick)?;
        let permits = usize::try_from(config.max_concurrent_instances.max(1)).unwrap_or(1);
        Ok(AdapterRuntime {
            shared: Arc::new(Shared {
                engine,
                linker,
                slots: Arc::new(Bulkhead::new(permits, config.bulkhead)),
                warm: WarmPool::new(config.warm),
                config,
                cache,
                registry: ArcSwap::from_pointee(Registry::new()),
                write_lock: Mutex::new(()),
                load_lock: Mutex::new(()),
                _ticker: ticker,
            }),
        })
    }

    /// Validates `wasm`, compiles it (or takes it from the compile cache) and registers
    /// it as a version of `name`; with `activate`, makes it the active version in one
    /// atomic step. Loading bytes that are already loaded is a no-op apart from
    /// `activate` (the version keeps the limits it was first loaded with). On any error
    /// nothing changes.
    ///
    /// This blocks for the compilation (hundreds of milliseconds for a typical adapter);
    /// async callers should run it with `tokio::task::spawn_blocking`.
    pub fn load(
        &self,
        name: &str,
        wasm: &[u8],
        limits: Option<SandboxLimits>,
        activate: bool,
    ) -> Result<AdapterVersionInfo, LoadError> {
        validate_name(name)?;
        let limits = limits.unwrap_or(self.shared.config.default_limits);
        limits.validate()?;
        if wasm.len() > MAX_COMPONENT_BYTES {
            return Err(LoadError::InvalidComponent(format!(
                "component is {} bytes, the limit is {MAX_COMPONENT_BYTES}",
                wasm.len()
            )));
        }
        let digest = hex::encode(Sha256::digest(wasm));
        let _loading = self
            .shared
            .load_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(existing) = self.slot(name).and_then(|s| s.find(&digest).cloned()) {
            return if activate {
                self.activate(name, &digest)
            } else {
                Ok(existing.info.clone())
            };
        }
        let version = Arc::new(self.prepare(name, &digest, wasm, limits)?);
        let info = version.info.clone();
        self.update(name, true, |slot| {
            slot.versions.push(Arc::clone(&version));
            if activate {
                slot.make_active(version);
            }
            Ok(())
        })?;
        tracing::info!(adapter = name, version = %info.version, digest = %info.digest,
            from_cache = info.from_cache, compile_ms = info.compile_time.as_millis() as u64,
            activate, "adapter version loaded");
        Ok(info)
    }

    /// Loads every `<name>.wasm` in `dir` (the file stem is the adapter name) and
    /// activates each. Returns one result per file, in file name order.
    pub fn load_dir(&self, dir: &Path) -> Vec<(PathBuf, Result<AdapterVersionInfo, LoadError>)> {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) => return vec![(dir.to_path_buf(), Err(io_error(dir, &e)))],
        };
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "wasm"))
            .collect();
        paths.sort();
        paths
            .into_iter()
            .map(|path| {
                let result = self.load_file(&path);
                (path, result)
            })
            .collect()
    }

    fn load_file(&self, path: &Path) -> Result<AdapterVersionInfo, LoadError> {
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .ok_or_else(|| LoadError::InvalidName(path.display().to_string()))?;
        let bytes = std::fs::read(path).map_err(|e| io_error(path, &e))?;
        self.load(name, &bytes, None, true)
    }

    /// Every loaded adapter with its active version and all its versions.
    pub fn list(&self) -> Vec<AdapterStatus> {
        self.shared
            .registry
            .load()
            .iter()
            .map(|(name, slot)| AdapterStatus {
                name: name.clone(),
                active: slot.active.as_ref().map(|v| v.info.clone()),
                versions: slot.versions.iter().map(|v| v.info.clone()).collect(),
                rollback_to: slot.history.last().cloned(),
                shadow: slot.shadow.as_ref().map(|v| v.info.clone()),
                canary: slot.canary.as_ref().map(Canary::status),
            })
            .collect()
    }

    /// Makes the loaded version `digest` of `name` the active one. Calls already running
    /// finish on the version they started with.
    pub fn activate(&self, name: &str, digest: &str) -> Result<AdapterVersionInfo, LoadError> {
        self.update(name, false, |slot| {
            let version = slot.find(digest).cloned().ok_or_else(|| LoadError::UnknownVersion {
                name: name.to_string(),
                digest: digest.to_string(),
            })?;
            let info = version.info.clone();
            slot.make_active(version);
            Ok(info)
        })
        .inspect(|info| tracing::info!(adapter = name, version = %info.version, digest = %info.digest, "adapter version activated"))
    }

    /// Re-activates the version that was active before the current one.
    pub fn rollback(&self, name: &str) -> Result<AdapterVersionInfo, LoadError> {
        self.update(name, false, |slot| {
            let digest = slot
                .history
                .pop()
                .ok_or_else(|| LoadError::NothingToRollBackTo(name.to_string()))?;
            // Versions are never removed, so every digest in the history is loaded.
            let version = slot.find(&digest).cloned().ok_or_else(|| LoadError::UnknownVersion {
                name: name.to_string(),
                digest,
            })?;
            let info = version.info.clone();
            slot.active = Some(version);
            slot.unstage_active();
            Ok(info)
        })
        .inspect(|info| tracing::info!(adapter = name, version = %info.version, digest = %info.digest, "adapter rolled back"))
    }

    /// A handle on the active version of `name`. Calls made through it keep using that
    /// version even if another one is activated meanwhile.
    pub fn active(&self, name: &str) -> Option<AdapterHandle> {
        let version = self.slot(name)?.active.clone()?;
        Some(AdapterHandle::new(Arc::clone(&self.shared), version))
    }

    /// Instances at rest between calls, kept warm for their (version, account).
    pub fn warm_idle(&self) -> usize {
        self.shared.warm.idle_len()
    }

    /// A handle on a specific loaded version, active or not.
    pub fn version(&self, name: &str, digest: &str) -> Option<AdapterHandle> {
        let version = self.slot(name)?.find(digest).cloned()?;
        Some(AdapterHandle::new(Arc::clone(&self.shared), version))
    }

    /// Stages the loaded version `digest` as `name`'s shadow: it repeats the active
    /// version's work off the request path and never affects state. Replaces any
    /// previous shadow.
    pub fn stage_shadow(&self, name: &str, digest: &str) -> Result<AdapterVersionInfo, LoadError> {
        self.update(name, false, |slot| {
            let version = slot.stageable(name, digest)?;
            let info = version.info.clone();
            slot.shadow = Some(version);
            Ok(info)
        })
        .inspect(|info| tracing::info!(adapter = name, version = %info.version, digest = %info.digest, "adapter shadow staged"))
    }

    /// Ends `name`'s shadow; what it was, if any.
    pub fn clear_shadow(&self, name: &str) -> Result<Option<AdapterVersionInfo>, LoadError> {
        self.update(name, false, |slot| {
            Ok(slot.shadow.take().map(|v| v.info.clone()))
        })
    }

    /// A handle on `name`'s shadow version, if one is staged.
    pub fn shadow(&self, name: &str) -> Option<AdapterHandle> {
        let version = self.slot(name)?.shadow.clone()?;
        Some(AdapterHandle::new(Arc::clone(&self.shared), version))
    }

    /// Makes the loaded version `digest` a canary of `name`: it builds the requests of
    /// the new attempts its rollout takes. Replaces any previous canary (attempts already
    /// started on that one keep their version).
    pub fn start_canary(
        &self,
        name: &str,
        digest: &str,
        rollout: Rollout,
        policy: CanaryPolicy,
    ) -> Result<CanaryStatus, LoadError> {
        rollout.validate()?;
        policy.validate()?;
        self.update(name, false, |slot| {
            let version = slot.stageable(name, digest)?;
            let canary = Canary {
                version,
                rollout,
                policy,
            };
            let status = canary.status();
            slot.canary = Some(canary);
            Ok(status)
        })
        .inspect(|c| tracing::info!(adapter = name, version = %c.version, digest = %c.digest, percent = c.rollout.percent, accounts = c.rollout.accounts.len(), "adapter canary started"))
    }

    /// Stops `name`'s canary, taking no new attempts. With `only_digest`, only when the
    /// canary is still that version (an automatic rollback must not stop a newer one).
    /// What was stopped, if anything.
    pub fn stop_canary(
        &self,
        name: &str,
        only_digest: Option<&str>,
    ) -> Result<Option<CanaryStatus>, LoadError> {
        self.update(name, false, |slot| {
            let matches = match (&slot.canary, only_digest) {
                (Some(canary), Some(digest)) => canary.version.info.digest == digest,
                (Some(_), None) => true,
                (None, _) => false,
            };
            Ok(if matches {
                slot.canary.take().map(|c| c.status())
            } else {
                None
            })
        })
    }

    /// The version that builds the requests of a new attempt `reference` of `account`:
    /// the canary when its rollout takes the attempt, the active version otherwise.
    pub fn for_new_attempt(
        &self,
        name: &str,
        account: &str,
        reference: &str,
    ) -> Option<AdapterHandle> {
        let slot = self.slot(name)?;
        let version = match &slot.canary {
            Some(canary) if canary.rollout.takes(account, reference) => Arc::clone(&canary.version),
            _ => slot.active.clone()?,
        };
        Some(AdapterHandle::new(Arc::clone(&self.shared), version))
    }

    /// `name`'s canary, if one is running.
    pub fn canary(&self, name: &str) -> Option<CanaryStatus> {
        self.slot(name)?.canary.as_ref().map(Canary::status)
    }

    fn slot(&self, name: &str) -> Option<Arc<Slot>> {
        self.shared.registry.load().get(name).cloned()
    }

    /// Applies `change` to a copy of `name`'s slot and publishes it atomically. Only a
    /// load (`create`) may create the slot.
    fn update<R>(
        &self,
        name: &str,
        create: bool,
        change: impl FnOnce(&mut Slot) -> Result<R, LoadError>,
    ) -> Result<R, LoadError> {
        let _writing = self
            .shared
            .write_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let current = self.shared.registry.load_full();
        let mut slot = match current.get(name) {
            Some(slot) => Slot::clone(slot),
            None if create => Slot::default(),
            None => return Err(LoadError::UnknownAdapter(name.to_string())),
        };
        let result = change(&mut slot)?;
        let mut next = Registry::clone(&current);
        next.insert(name.to_string(), Arc::new(slot));
        self.shared.registry.store(Arc::new(next));
        Ok(result)
    }

    /// Compiles and validates a new version; nothing is registered yet.
    fn prepare(
        &self,
        name: &str,
        digest: &str,
        wasm: &[u8],
        limits: SandboxLimits,
    ) -> Result<LoadedVersion, LoadError> {
        let (component, compile_time, from_cache) = self.compile(digest, wasm)?;
        check_contract_exports(&self.shared.engine, &component)?;
        let instance_pre = self
            .shared
            .linker
            .instantiate_pre(&component)
            .map_err(|e| LoadError::WrongWorld(describe_wasm_error(&e)))?;
        let pre = PspAdapterPre::new(instance_pre)
            .map_err(|e| LoadError::WrongWorld(describe_wasm_error(&e)))?;
        let describe = self.validation_describe(name, digest, &pre, &limits)?;
        if describe.name != name {
            return Err(LoadError::NameMismatch {
                expected: name.to_string(),
                got: describe.name,
            });
        }
        let identity = AdapterIdentity {
            name: name.to_string(),
            version: describe.version.clone(),
            digest: digest.to_string(),
        };
        let info = AdapterVersionInfo {
            name: name.to_string(),
            version: describe.version.clone(),
            digest: digest.to_string(),
            loaded_at: SystemTime::now(),
            compile_time,
            from_cache,
            limits,
            describe,
        };
        Ok(LoadedVersion {
            info,
            identity,
            pre,
        })
    }

    fn compile(&self, digest: &str, wasm: &[u8]) -> Result<(Component, Duration, bool), LoadError> {
        let started = Instant::now();
        if let Some(component) = self
            .shared
            .cache
            .as_ref()
            .and_then(|c| c.get(&self.shared.engine, digest))
        {
            return Ok((component, started.elapsed(), true));
        }
        let component = Component::new(&self.shared.engine, wasm)
            .map_err(|e| LoadError::InvalidComponent(describe_wasm_error(&e)))?;
        let compile_time = started.elapsed();
        if let Some(cache) = &self.shared.cache {
            cache.put(digest, &component);
        }
        Ok((component, compile_time, false))
    }

    /// Runs `describe()` under the version's limits, on a thread of its own: WASI's
    /// synchronous host functions drive a tokio runtime internally and must not run on
    /// an async worker thread, which a caller of `load` may be on.
    fn validation_describe(
        &self,
        name: &str,
        digest: &str,
        pre: &PspAdapterPre<CallState>,
        limits: &SandboxLimits,
    ) -> Result<AdapterInfo, LoadError> {
        let span = tracing::info_span!(
            "adapter_validate",
            adapter = name,
            digest,
            operation = "describe"
        );
        let shared = &*self.shared;
        let scope = ConnectorAccountScope::default();
        std::thread::scope(|s| {
            let worker = std::thread::Builder::new()
                .name("sluice-adapter-validate".into())
                .spawn_scoped(s, || {
                    let _entered = span.enter();
                    futures::executor::block_on(run_call(
                        shared,
                        pre,
                        limits,
                        &scope,
                        None,
                        crate::calls::Describe,
                    ))
                })
                .map_err(|e| {
                    AdapterError::Internal(format!("cannot start validation thread: {e}"))
                })?;
            worker.join().unwrap_or_else(|_| {
                Err(AdapterError::Internal("validation thread panicked".into()))
            })
        })
        .map_err(LoadError::DescribeFailed)
    }
}

fn build_linker(engine: &Engine) -> Result<Linker<CallState>, RuntimeError> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)
        .map_err(|e| RuntimeError::Engine(format!("cannot link WASI: {e:?}")))?;
    PspAdapter::add_to_linker::<CallState, HasSelf<CallState>>(&mut linker, |state| state)
        .map_err(|e| RuntimeError::Engine(format!("cannot link host imports: {e:?}")))?;
    Ok(linker)
}

/// Checks the component exports `sluice:psp/adapter@0.2.x` before anything else, so a
/// component built for another contract version gets a precise error.
fn check_contract_exports(engine: &Engine, component: &Component) -> Result<(), LoadError> {
    let ty = component.component_type();
    let exports: Vec<String> = ty
        .exports(engine)
        .map(|(name, _)| name.to_string())
        .collect();
    let prefix = format!("{CONTRACT_INTERFACE}@");
    let versions: Vec<&str> = exports
        .iter()
        .filter_map(|name| name.strip_prefix(&prefix))
        .collect();
    if versions.iter().any(|v| is_supported_contract(v)) {
        return Ok(());
    }
    if !versions.is_empty() || exports.iter().any(|n| n == CONTRACT_INTERFACE) {
        return Err(LoadError::UnsupportedContractVersion(format!(
            "component exports {exports:?}; this host supports {CONTRACT_INTERFACE}@{SUPPORTED_CONTRACT}"
        )));
    }
    Err(LoadError::WrongWorld(format!(
        "component exports {exports:?}; expected {CONTRACT_INTERFACE}@{SUPPORTED_CONTRACT}"
    )))
}

fn is_supported_contract(version: &str) -> bool {
    let mut parts = version.splitn(3, '.');
    matches!((parts.next(), parts.next(), parts.next()), (Some("0"), Some("2"), Some(patch))
        if patch.split(['-', '+']).next().is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())))
}

/// Names are URL path segments (`/webhooks/{adapter}/...`) and file stems.
fn validate_name(name: &str) -> Result<(), LoadError> {
    let ok = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(LoadError::InvalidName(name.to_string()))
    }
}

fn io_error(path: &Path, err: &std::io::Error) -> LoadError {
    LoadError::Io {
        path: path.to_path_buf(),
        message: err.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_contract_versions_0_2_x_are_supported() {
        assert!(is_supported_contract("0.2.0"));
        assert!(is_supported_contract("0.2.7"));
        assert!(is_supported_contract("0.2.2-rc.1"));
        assert!(!is_supported_contract("0.1.0"));
        assert!(!is_supported_contract("0.3.0"));
        assert!(!is_supported_contract("1.2.0"));
        assert!(!is_supported_contract("0.2"));
        assert!(!is_supported_contract("0.20.0"));
    }

    #[test]
    fn adapter_names_must_be_route_safe() {
        assert!(validate_name("test-well-behaved").is_ok());
        assert!(validate_name("stripe_v2").is_ok());
        for bad in ["", "Stripe", "a/b", "..", "a b", &"x".repeat(65)] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
    }
}
