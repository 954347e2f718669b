//! The master key that seals secrets at rest (`sluice_store::secret_box`).
//!
//! `sluice serve` needs `master_key` (sluice.toml) or `SLUICE_MASTER_KEY`, 32 bytes as
//! 64 hex digits or base64, and refuses to start without one: a gateway must not keep
//! PSP credentials under a key that sits next to the database. `sluice demo` alone
//! (`Config::dev_master_key`) falls back to `<data_dir>/dev-master-key`, created on
//! first use, and says so in a warning. Keys in `previous_master_keys` only open
//! values; start-up re-seals everything under the current key.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sluice_store::{LocalSecretBox, MasterKey, SecretBox, SecretBoxError};

use crate::config::Config;

/// The file `sluice demo` keeps its development master key in.
pub const DEV_MASTER_KEY_FILE: &str = "dev-master-key";

/// Why no secret box could be built. Never carries a key.
#[derive(Debug, thiserror::Error)]
pub enum MasterKeyError {
    #[error(
        "no master key: set master_key in sluice.toml or SLUICE_MASTER_KEY (32 bytes as 64 hex \
         digits or base64, e.g. `openssl rand -hex 32`); secrets at rest are sealed with it"
    )]
    Missing,
    #[error("invalid {name}: {source}")]
    Invalid {
        name: &'static str,
        source: SecretBoxError,
    },
    #[error("cannot read or create the development master key {path}: {source}")]
    DevKey {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The box of the configured master key (see the module documentation).
pub fn secret_box(config: &Config) -> Result<Arc<dyn SecretBox>, MasterKeyError> {
    let previous = config
        .previous_master_keys
        .iter()
        .map(|k| MasterKey::parse(k.expose()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| MasterKeyError::Invalid {
            name: "previous_master_keys",
            source,
        })?;
    let current = match &config.master_key {
        Some(key) => MasterKey::parse(key.expose()).map_err(|source| MasterKeyError::Invalid {
            name: "master_key",
            source,
        })?,
        None if config.dev_master_key => {
            let key = dev_master_key(&config.data_dir)?;
            tracing::warn!(
                key_id = key.id(),
                "no master key configured: secrets at rest are sealed with the development key \
                 in {}; set SLUICE_MASTER_KEY for anything but a demo",
                config.data_dir.join(DEV_MASTER_KEY_FILE).display()
            );
            key
        }
        None => return Err(MasterKeyError::Missing),
    };
    Ok(Arc::new(LocalSecretBox::new(&current, &previous)))
}

/// `<data_dir>/dev-master-key`, created with a random key when missing.
fn dev_master_key(data_dir: &Path) -> Result<MasterKey, MasterKeyError> {
    let path = data_dir.join(DEV_MASTER_KEY_FILE);
    let io = |source| MasterKeyError::DevKey {
        path: path.clone(),
        source,
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(data_dir).map_err(io)?;
            let fresh = MasterKey::generate().to_hex();
            let temp = data_dir.join(format!("{DEV_MASTER_KEY_FILE}.tmp"));
            std::fs::write(&temp, &fresh)
                .and_then(|()| std::fs::rename(&temp, &path))
                .map_err(io)?;
            fresh
        }
        Err(error) => return Err(io(error)),
    };
    MasterKey::parse(&text).map_err(|source| MasterKeyError::Invalid {
        name: "dev-master-key",
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serve_refuses_to_start_without_a_master_key_and_the_demo_keeps_a_dev_key() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::from_parts(None, |_| None).unwrap();
        config.data_dir = dir.path().to_path_buf();
        assert!(matches!(secret_box(&config), Err(MasterKeyError::Missing)));
        config.dev_master_key = true;
        let first = secret_box(&config).unwrap();
        let again = secret_box(&config).unwrap();
        assert_eq!(first.current_key_id(), again.current_key_id());
        assert!(dir.path().join(DEV_MASTER_KEY_FILE).is_file());
        config.master_key = Some(crate::config::Secret::new("ab".repeat(32)));
        let configured = secret_box(&config).unwrap();
        assert_ne!(configured.current_key_id(), first.current_key_id());
    }
}
