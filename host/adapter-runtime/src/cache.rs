//! On-disk cache of compiled components, so a restart does not recompile.
//!
//! Artifacts are keyed by sha256(component bytes) and a hash of the engine's
//! precompile-compatibility hash (wasmtime version, compiler flags, target). A file is
//! `MAGIC ++ sha256(payload) ++ payload`, written to a temp file and renamed into place,
//! so a reader sees either nothing or a whole artifact. Only files with our name scheme
//! in our directory, with a matching checksum, are ever deserialized: deserializing is
//! `unsafe` on bytes we did not produce.

use crate::error::RuntimeError;
use sha2::{Digest, Sha256};
use std::fs;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use wasmtime::component::Component;
use wasmtime::Engine;

const MAGIC: &[u8; 16] = b"sluice-cwasm-v1\n";

pub(crate) struct CompileCache {
    dir: PathBuf,
    engine_key: String,
}

impl CompileCache {
    pub(crate) fn open(dir: &Path, engine: &Engine) -> Result<Self, RuntimeError> {
        let cache_err = |e: std::io::Error| RuntimeError::CacheDir {
            path: dir.to_path_buf(),
            message: e.to_string(),
        };
        fs::create_dir_all(dir).map_err(cache_err)?;
        restrict_permissions(dir).map_err(cache_err)?;
        Ok(CompileCache {
            dir: dir.to_path_buf(),
            engine_key: engine_key(engine),
        })
    }

    fn path_for(&self, digest: &str) -> PathBuf {
        self.dir
            .join(format!("{digest}-{}.cwasm", &self.engine_key[..32]))
    }

    /// The cached component for `digest`, if a valid artifact exists.
    pub(crate) fn get(&self, engine: &Engine, digest: &str) -> Option<Component> {
        let path = self.path_for(digest);
        let bytes = fs::read(&path).ok()?;
        let payload = checked_payload(&bytes)?;
        // SAFETY: `payload` was written by `put` below (our file name scheme, in our
        // directory, created by this process or an earlier run with the same engine
        // compatibility hash) and its checksum matches, so it is an artifact that
        // `Component::serialize` of a compatible engine produced.
        match unsafe { Component::deserialize(engine, payload) } {
            Ok(component) => Some(component),
            Err(err) => {
                tracing::warn!(path = %path.display(), error = ?err, "discarding unusable compile cache entry");
                let _ = fs::remove_file(&path);
                None
            }
        }
    }

    /// Stores `component`; failures only cost a recompile later, so they are logged.
    pub(crate) fn put(&self, digest: &str, component: &Component) {
        if let Err(err) = self.try_put(digest, component) {
            tracing::warn!(digest, error = %err, "cannot write compile cache entry");
        }
    }

    fn try_put(&self, digest: &str, component: &Component) -> Result<(), String> {
        let payload = component.serialize().map_err(|e| format!("{e:?}"))?;
        let path = self.path_for(digest);
        let tmp = self.dir.join(format!(
            ".{digest}.{}.{}.tmp",
            std::process::id(),
            unique_suffix()
        ));
        let write = || -> std::io::Result<()> {
            let mut file = fs::File::create(&tmp)?;
            file.write_all(MAGIC)?;
            file.write_all(&Sha256::digest(&payload))?;
            file.write_all(&payload)?;
            file.sync_all()?;
            fs::rename(&tmp, &path)
        };
        write().map_err(|e| {
            let _ = fs::remove_file(&tmp);
            e.to_string()
        })
    }
}

fn checked_payload(bytes: &[u8]) -> Option<&[u8]> {
    let rest = bytes.strip_prefix(MAGIC.as_slice())?;
    if rest.len() < 32 {
        return None;
    }
    let (checksum, payload) = rest.split_at(32);
    (Sha256::digest(payload).as_slice() == checksum).then_some(payload)
}

/// A stable hex key for the engine's compatibility hash. `Hash` only promises a
/// `Hasher`; feeding it into sha256 (instead of `DefaultHasher`, whose algorithm may
/// change between Rust releases) keeps the key stable across rebuilds.
fn engine_key(engine: &Engine) -> String {
    let mut hasher = Sha256Hasher(Sha256::new());
    engine.precompile_compatibility_hash().hash(&mut hasher);
    hex::encode(hasher.0.finalize())
}

struct Sha256Hasher(Sha256);

impl Hasher for Sha256Hasher {
    fn finish(&self) -> u64 {
        let digest = self.0.clone().finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        u64::from_le_bytes(first)
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

fn unique_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[cfg(unix)]
fn restrict_permissions(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
}

#[cfg(not(unix))]
fn restrict_permissions(_dir: &Path) -> std::io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_truncated_or_altered_artifact_is_never_handed_to_deserialize() {
        let payload = b"compiled bytes";
        let mut file = MAGIC.to_vec();
        file.extend_from_slice(&Sha256::digest(payload));
        file.extend_from_slice(payload);
        assert_eq!(checked_payload(&file), Some(payload.as_slice()));
        let mut altered = file.clone();
        let last = altered.len() - 1;
        altered[last] ^= 1;
        assert_eq!(checked_payload(&altered), None);
        assert_eq!(checked_payload(&file[..20]), None);
        assert_eq!(checked_payload(b"\0asm\x0d\0\x01\0"), None);
    }
}
