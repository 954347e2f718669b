//! Secrets at rest (seed 001 §7, §10): every secret the store keeps (connector account
//! secrets, merchant webhook and fulfillment endpoint secrets, verified raw webhook
//! bodies) is sealed by a [`SecretBox`] before it is written and opened after it is read.
//!
//! A [`SecretBox`] encrypts and decrypts with a named key, so a KMS can implement it
//! later (it would unwrap its data keys once, at start-up; the store calls the box on
//! request paths and needs an answer without a network round trip). The local
//! implementation, [`LocalSecretBox`], is XChaCha20-Poly1305 (RustCrypto) under a
//! 32-byte master key from the configuration, with the previous master keys kept for
//! reading only, so the master key can rotate.
//!
//! The stored text is a versioned envelope: `sbx1:<key id>:<base64url(nonce ‖ ciphertext)>`.
//! The associated data is the value's place (`table.column:row id`), so a sealed value
//! copied onto another row does not open. A stored text without the `sbx1:` prefix is a
//! legacy plaintext row from before encryption: it is read as it is, and
//! [`crate::Store::reseal_secrets`] (run at every start-up) seals it, and re-seals
//! whatever an older master key sealed, under the current key.

use base64::Engine as _;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, OnceLock};

/// The envelope version this code writes (and the only one it reads).
pub const ENVELOPE_PREFIX: &str = "sbx1:";

const NONCE_LEN: usize = 24;
const KEY_LEN: usize = 32;

/// Why a secret could not be sealed or opened. Never carries a secret or a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretBoxError {
    #[error(
        "a stored secret is sealed under master key {key_id}, which this gateway is not \
         configured with (wrong master key, or a previous one missing from previous_master_keys)"
    )]
    UnknownKey { key_id: String },
    #[error(
        "a stored secret sealed under master key {key_id} does not decrypt: the key is wrong \
         or the stored value was altered or moved"
    )]
    Decrypt { key_id: String },
    #[error("a stored secret is not a valid sbx1 envelope: {0}")]
    Malformed(&'static str),
    #[error("invalid master key: {0}")]
    InvalidMasterKey(String),
    #[error("the secret box could not encrypt")]
    Encrypt,
}

/// Encryption with named keys: the interface a KMS can implement.
pub trait SecretBox: Send + Sync + fmt::Debug {
    /// The key new values are sealed under.
    fn current_key_id(&self) -> &str;

    /// Encrypts `plaintext` under the current key, bound to `context` (associated
    /// data). Returns the key id used and the ciphertext (nonce included).
    fn encrypt(
        &self,
        context: &[u8],
        plaintext: &[u8],
    ) -> Result<(String, Vec<u8>), SecretBoxError>;

    /// Decrypts what [`SecretBox::encrypt`] returned under `key_id` for `context`.
    fn decrypt(
        &self,
        key_id: &str,
        context: &[u8],
        ciphertext: &[u8],
    ) -> Result<Vec<u8>, SecretBoxError>;
}

/// A 32-byte master key. `Debug` shows its id only.
#[derive(Clone)]
pub struct MasterKey {
    id: String,
    bytes: [u8; KEY_LEN],
}

impl fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MasterKey({}, <redacted>)", self.id)
    }
}

impl MasterKey {
    /// A key from its text: 64 hex digits or the base64 (standard or URL-safe, padding
    /// optional) of 32 bytes. The error never repeats the text.
    pub fn parse(text: &str) -> Result<MasterKey, SecretBoxError> {
        let text = text.trim();
        let decoded = if text.len() == 2 * KEY_LEN && text.bytes().all(|b| b.is_ascii_hexdigit()) {
            hex::decode(text).ok()
        } else {
            let unpadded = text.trim_end_matches('=');
            base64::engine::general_purpose::STANDARD_NO_PAD
                .decode(unpadded)
                .or_else(|_| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(unpadded))
                .ok()
        };
        let bytes: [u8; KEY_LEN] = decoded.and_then(|b| b.try_into().ok()).ok_or_else(|| {
            SecretBoxError::InvalidMasterKey("expected 32 bytes as 64 hex digits or base64".into())
        })?;
        Ok(MasterKey::from_bytes(bytes))
    }

    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> MasterKey {
        MasterKey {
            id: key_id(&bytes),
            bytes,
        }
    }

    /// A fresh random key.
    pub fn generate() -> MasterKey {
        MasterKey::from_bytes(rand::random())
    }

    /// The key's id: `mk_` + 16 hex digits of a hash of the key. Public, and names the
    /// key in every envelope it seals (a wrong key is recognised by its id).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The key as 64 hex digits, to write it into a file the operator keeps.
    pub fn to_hex(&self) -> String {
        hex::encode(self.bytes)
    }
}

fn key_id(bytes: &[u8; KEY_LEN]) -> String {
    let mut hash = Sha256::new();
    hash.update(b"sluice master key id\0");
    hash.update(bytes);
    format!("mk_{}", &hex::encode(hash.finalize())[..16])
}

/// XChaCha20-Poly1305 under the current master key; previous keys open old values.
pub struct LocalSecretBox {
    current: String,
    keys: BTreeMap<String, XChaCha20Poly1305>,
}

impl fmt::Debug for LocalSecretBox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalSecretBox")
            .field("current", &self.current)
            .field("keys", &self.keys.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl LocalSecretBox {
    /// Seals under `current`; `current` and every key of `previous` open.
    pub fn new(current: &MasterKey, previous: &[MasterKey]) -> LocalSecretBox {
        let keys = std::iter::once(current)
            .chain(previous)
            .map(|k| (k.id.clone(), XChaCha20Poly1305::new(&k.bytes.into())))
            .collect();
        LocalSecretBox {
            current: current.id.clone(),
            keys,
        }
    }

    /// A box whose key lives as long as the process (one per process, shared by every
    /// store it opens). What [`crate::StoreOptions::default`] uses, for tests and
    /// tools; the server always passes its configured box, because values sealed by
    /// this one do not open after a restart.
    pub fn process_ephemeral() -> Arc<dyn SecretBox> {
        static EPHEMERAL: OnceLock<Arc<LocalSecretBox>> = OnceLock::new();
        EPHEMERAL
            .get_or_init(|| Arc::new(LocalSecretBox::new(&MasterKey::generate(), &[])))
            .clone()
    }
}

impl SecretBox for LocalSecretBox {
    fn current_key_id(&self) -> &str {
        &self.current
    }

    fn encrypt(
        &self,
        context: &[u8],
        plaintext: &[u8],
    ) -> Result<(String, Vec<u8>), SecretBoxError> {
        let cipher = self
            .keys
            .get(&self.current)
            .ok_or(SecretBoxError::Encrypt)?;
        let nonce: [u8; NONCE_LEN] = rand::random();
        let sealed = cipher
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: plaintext,
                    aad: context,
                },
            )
            .map_err(|_| SecretBoxError::Encrypt)?;
        let mut out = Vec::with_capacity(NONCE_LEN + sealed.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        Ok((self.current.clone(), out))
    }

    fn decrypt(
        &self,
        key_id: &str,
        context: &[u8],
        ciphertext: &[u8],
    ) -> Result<Vec<u8>, SecretBoxError> {
        let cipher = self
            .keys
            .get(key_id)
            .ok_or_else(|| SecretBoxError::UnknownKey {
                key_id: key_id.to_owned(),
            })?;
        if ciphertext.len() < NONCE_LEN {
            return Err(SecretBoxError::Malformed("shorter than its nonce"));
        }
        let (nonce, sealed) = ciphertext.split_at(NONCE_LEN);
        cipher
            .decrypt(
                XNonce::from_slice(nonce),
                Payload {
                    msg: sealed,
                    aad: context,
                },
            )
            .map_err(|_| SecretBoxError::Decrypt {
                key_id: key_id.to_owned(),
            })
    }
}

/// A value read back from the database.
#[derive(PartialEq, Eq)]
pub struct Opened {
    pub plaintext: Vec<u8>,
    /// The key that sealed it; `None` for a legacy plaintext row.
    pub key_id: Option<String>,
}

impl fmt::Debug for Opened {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Opened")
            .field("plaintext", &"<redacted>")
            .field("key_id", &self.key_id)
            .finish()
    }
}

/// The envelope text of `plaintext` sealed for `context`.
pub fn seal(
    secret_box: &dyn SecretBox,
    context: &str,
    plaintext: &[u8],
) -> Result<String, SecretBoxError> {
    let (key_id, sealed) = secret_box.encrypt(context.as_bytes(), plaintext)?;
    let body = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sealed);
    Ok(format!("{ENVELOPE_PREFIX}{key_id}:{body}"))
}

/// Opens an envelope sealed for `context`; a text without the envelope prefix is a
/// legacy plaintext row and comes back as it is.
pub fn open(
    secret_box: &dyn SecretBox,
    context: &str,
    stored: &str,
) -> Result<Opened, SecretBoxError> {
    let Some(rest) = stored.strip_prefix(ENVELOPE_PREFIX) else {
        return Ok(Opened {
            plaintext: stored.as_bytes().to_vec(),
            key_id: None,
        });
    };
    let (key_id, body) = rest
        .split_once(':')
        .ok_or(SecretBoxError::Malformed("no key id"))?;
    let sealed = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(body)
        .map_err(|_| SecretBoxError::Malformed("the body is not base64url"))?;
    let plaintext = secret_box.decrypt(key_id, context.as_bytes(), &sealed)?;
    Ok(Opened {
        plaintext,
        key_id: Some(key_id.to_owned()),
    })
}

/// True when `stored` must be sealed again: legacy plaintext, or sealed under a key
/// that is not the box's current one.
pub fn needs_reseal(secret_box: &dyn SecretBox, stored: &str) -> bool {
    match stored.strip_prefix(ENVELOPE_PREFIX) {
        None => true,
        Some(rest) => rest
            .split_once(':')
            .is_none_or(|(key_id, _)| key_id != secret_box.current_key_id()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> MasterKey {
        MasterKey::from_bytes([byte; KEY_LEN])
    }

    #[test]
    fn a_sealed_value_opens_for_its_context_only_and_never_shows_the_plaintext() {
        let b = LocalSecretBox::new(&key(1), &[]);
        let sealed = seal(&b, "t.c:row1", b"whsec_top_secret").unwrap();
        assert!(sealed.starts_with("sbx1:mk_"));
        assert!(!sealed.contains("whsec_top_secret"));
        let opened = open(&b, "t.c:row1", &sealed).unwrap();
        assert_eq!(opened.plaintext, b"whsec_top_secret");
        assert_eq!(opened.key_id.as_deref(), Some(b.current_key_id()));
        assert!(matches!(
            open(&b, "t.c:row2", &sealed),
            Err(SecretBoxError::Decrypt { .. })
        ));
        assert_ne!(sealed, seal(&b, "t.c:row1", b"whsec_top_secret").unwrap());
    }

    #[test]
    fn a_wrong_master_key_is_a_typed_error_naming_the_key_id() {
        let sealed = seal(&LocalSecretBox::new(&key(1), &[]), "ctx", b"s").unwrap();
        let wrong = LocalSecretBox::new(&key(2), &[]);
        let err = open(&wrong, "ctx", &sealed).unwrap_err();
        assert_eq!(
            err,
            SecretBoxError::UnknownKey {
                key_id: key(1).id().to_owned()
            }
        );
        let forged = sealed.replace(key(1).id(), key(2).id());
        assert!(matches!(
            open(&wrong, "ctx", &forged),
            Err(SecretBoxError::Decrypt { .. })
        ));
        assert!(matches!(
            open(&wrong, "ctx", "sbx1:nokey"),
            Err(SecretBoxError::Malformed(_))
        ));
        assert!(matches!(
            open(&wrong, "ctx", "sbx1:mk_1:!!"),
            Err(SecretBoxError::Malformed(_))
        ));
        assert!(matches!(
            open(&wrong, "ctx", &format!("sbx1:{}:AAAA", key(2).id())),
            Err(SecretBoxError::Malformed(_))
        ));
    }

    #[test]
    fn a_previous_master_key_still_opens_and_its_values_need_a_reseal() {
        let old = LocalSecretBox::new(&key(1), &[]);
        let sealed = seal(&old, "ctx", b"s").unwrap();
        let rotated = LocalSecretBox::new(&key(3), &[key(1)]);
        assert_eq!(open(&rotated, "ctx", &sealed).unwrap().plaintext, b"s");
        assert!(needs_reseal(&rotated, &sealed));
        assert!(!needs_reseal(&old, &sealed));
        assert!(needs_reseal(&rotated, "{\"api_key\":\"legacy\"}"));
        let legacy = open(&rotated, "ctx", "legacy plaintext").unwrap();
        assert_eq!(legacy.key_id, None);
        assert_eq!(legacy.plaintext, b"legacy plaintext");
    }

    #[test]
    fn master_keys_parse_from_hex_or_base64_and_bad_text_is_refused_without_echo() {
        let hex_text = "ab".repeat(32);
        let from_hex = MasterKey::parse(&hex_text).unwrap();
        let b64 = base64::engine::general_purpose::STANDARD.encode([0xab; 32]);
        assert_eq!(MasterKey::parse(&b64).unwrap().id(), from_hex.id());
        assert_eq!(from_hex.to_hex(), hex_text);
        for bad in [
            "",
            "abcd",
            "not a key at all, not base64 either!!",
            &"ab".repeat(31),
        ] {
            let err = MasterKey::parse(bad).unwrap_err();
            assert!(matches!(err, SecretBoxError::InvalidMasterKey(_)));
            assert!(bad.is_empty() || !err.to_string().contains(bad));
        }
        assert!(!format!("{from_hex:?}").contains(&hex_text));
    }
}
