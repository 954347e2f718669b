//! The connector account's secrets, on the host side of the sandbox.
//!
//! Adapters never see a secret (contract `sluice:psp@0.2.0`). They reach the secrets in
//! three ways only, all implemented here:
//!
//! - [`Keyring::hmac`] backs the `keyring.hmac` import: MACs with every valid version of
//!   a key, newest first; the key bytes stay in the host.
//! - [`Keyring::substitute`] replaces the credential placeholders `{{secret:NAME}}` and
//!   `{{basic:USER:PASSWORD}}` in a request the host is about to send. The orchestrator
//!   calls it only after the request passed the destination check, and only on the
//!   copy that goes on the wire.
//! - [`Keyring::redact`] removes the secret values (and their usual encodings) from
//!   anything the host hands to a guest, so a PSP that echoes a credential back (or a
//!   hostile adapter that asked it to) cannot bring it into the sandbox.

use base64::Engine as _;
use hmac::{Hmac, Mac};
use memchr::memmem::Finder;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, OnceLock};

/// The hash of an HMAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HmacHash {
    Sha256,
    Sha512,
}

/// How a secret's stored text becomes key bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyText {
    Utf8,
    Hex,
    Base64,
}

/// Why the keyring computed no MAC. Never carries a key's value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyringFailure {
    #[error("the connector account has no secret `{0}`")]
    UnknownKey(String),
    #[error("the secret `{name}` is not usable as {encoding} key bytes")]
    UnusableKey {
        name: String,
        encoding: &'static str,
    },
    #[error("{size} bytes of data exceed the keyring's limit of {limit} bytes")]
    TooLarge { size: usize, limit: usize },
}

/// Why a request's credential placeholders could not be substituted. A configuration
/// error of that one call: nothing is sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlaceholderError {
    #[error("the request names the secret `{0}`, which the connector account does not have")]
    UnknownSecret(String),
    #[error("the request has a malformed credential placeholder: {0}")]
    Malformed(&'static str),
    #[error("the substituted value of header {0} is not a valid header value")]
    InvalidHeaderValue(String),
}

/// Data one `hmac` call may cover (webhook bodies are far smaller).
pub const MAX_HMAC_DATA_BYTES: usize = 8 << 20;

/// What replaces a secret value the host found in data bound for a guest.
pub const REDACTED: &str = "[redacted]";

/// Secret values shorter than this are not searched for by [`Keyring::redact`] (they
/// would match ordinary text everywhere); no real credential is that short.
const MIN_REDACTED_LEN: usize = 6;

const SECRET_OPEN: &[u8] = b"{{secret:";
const BASIC_OPEN: &[u8] = b"{{basic:";
const CLOSE: &[u8] = b"}}";
const MAX_NAME_LEN: usize = 64;

/// The secrets of one connector account: each name with its valid versions, newest
/// first. `Debug` shows the names only.
#[derive(Clone, Default)]
pub struct Keyring {
    keys: BTreeMap<String, Vec<String>>,
    /// The searchers of [`Keyring::redact`], built on its first use and shared by the
    /// clones of this keyring (a call hands the guest a clone). Every encoding of every
    /// version, each with its searcher: about 30 of them for a few secrets, which cost
    /// more to build than to run over a webhook body, and one webhook is redacted
    /// once per header and once for its body. A change to the keys starts a new one.
    redaction: Arc<OnceLock<Vec<Finder<'static>>>>,
}

/// Two keyrings are equal when they hold the same keys (the searchers follow from them).
impl PartialEq for Keyring {
    fn eq(&self, other: &Self) -> bool {
        self.keys == other.keys
    }
}

impl Eq for Keyring {}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: BTreeMap<&str, String> = self
            .keys
            .iter()
            .map(|(k, v)| (k.as_str(), format!("<{} version(s) redacted>", v.len())))
            .collect();
        f.debug_map().entries(names).finish()
    }
}

impl Keyring {
    /// Sets `name` to one version. An empty value removes the key.
    pub fn insert(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.insert_versions(name, vec![value.into()]);
    }

    /// Sets `name` to `versions`, newest first (the first one is used for requests;
    /// all of them verify). Empty versions are dropped; none left removes the key.
    pub fn insert_versions(&mut self, name: impl Into<String>, versions: Vec<String>) {
        let name = name.into();
        let versions: Vec<String> = versions.into_iter().filter(|v| !v.is_empty()).collect();
        self.redaction = Arc::default();
        if versions.is_empty() {
            self.keys.remove(&name);
        } else {
            self.keys.insert(name, versions);
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        self.keys.contains_key(name)
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.keys.keys().map(String::as_str)
    }

    /// The newest version of `name`, for the host's own use (never for a guest).
    pub fn current(&self, name: &str) -> Option<&str> {
        self.keys
            .get(name)
            .and_then(|v| v.first())
            .map(String::as_str)
    }

    /// `HMAC(key, data)` for every version of `name`, newest first.
    pub fn hmac(
        &self,
        name: &str,
        hash: HmacHash,
        encoding: KeyText,
        data: &[u8],
    ) -> Result<Vec<Vec<u8>>, KeyringFailure> {
        if data.len() > MAX_HMAC_DATA_BYTES {
            return Err(KeyringFailure::TooLarge {
                size: data.len(),
                limit: MAX_HMAC_DATA_BYTES,
            });
        }
        let versions = self
            .keys
            .get(name)
            .ok_or_else(|| KeyringFailure::UnknownKey(name.to_string()))?;
        versions
            .iter()
            .map(|text| {
                let key = decode_key(text, encoding).ok_or(KeyringFailure::UnusableKey {
                    name: name.to_string(),
                    encoding: encoding_name(encoding),
                })?;
                Ok(mac(hash, &key, data))
            })
            .collect()
    }

    /// `input` with every credential placeholder replaced by the newest version of the
    /// secrets it names. Text without placeholders comes back unchanged.
    pub fn substitute(&self, input: &[u8]) -> Result<Vec<u8>, PlaceholderError> {
        let mut out = Vec::with_capacity(input.len());
        let mut rest = input;
        while let Some(at) = find(rest, b"{{") {
            out.extend_from_slice(&rest[..at]);
            let tail = &rest[at..];
            let (value, used) = if let Some(body) = tail.strip_prefix(SECRET_OPEN) {
                let (names, used) = placeholder_body(body, 1)?;
                (
                    self.secret_value(names[0])?.as_bytes().to_vec(),
                    SECRET_OPEN.len() + used,
                )
            } else if let Some(body) = tail.strip_prefix(BASIC_OPEN) {
                let (names, used) = placeholder_body(body, 2)?;
                let pair = format!(
                    "{}:{}",
                    self.secret_value(names[0])?,
                    self.secret_value(names[1])?
                );
                let encoded = base64::engine::general_purpose::STANDARD.encode(pair);
                (encoded.into_bytes(), BASIC_OPEN.len() + used)
            } else {
                (b"{{".to_vec(), 2)
            };
            out.extend_from_slice(&value);
            rest = &tail[used..];
        }
        out.extend_from_slice(rest);
        Ok(out)
    }

    /// [`Keyring::substitute`] for a header value; the result must still be a valid
    /// header value (a secret with a line break must not add a header).
    pub fn substitute_header(&self, name: &str, value: &str) -> Result<String, PlaceholderError> {
        let bytes = self.substitute(value.as_bytes())?;
        let valid = bytes
            .iter()
            .all(|&b| b == b'\t' || (b' '..0x7f).contains(&b) || b >= 0x80);
        match String::from_utf8(bytes) {
            Ok(text) if valid => Ok(text),
            _ => Err(PlaceholderError::InvalidHeaderValue(name.to_string())),
        }
    }

    /// An empty placeholder name stands for the empty string (`{{basic:api_key:}}`).
    fn secret_value(&self, name: &str) -> Result<&str, PlaceholderError> {
        if name.is_empty() {
            return Ok("");
        }
        self.current(name)
            .ok_or_else(|| PlaceholderError::UnknownSecret(name.to_string()))
    }

    /// Replaces every secret value found in `data` (raw, hex, base64, percent-encoded,
    /// and the bytes of a hex or base64 key) with [`REDACTED`]. Returns how many
    /// occurrences were replaced.
    pub fn redact(&self, data: &mut Vec<u8>) -> usize {
        let searchers = self.redaction.get_or_init(|| {
            self.redaction_patterns()
                .iter()
                .map(|pattern| Finder::new(pattern).into_owned())
                .collect()
        });
        searchers
            .iter()
            .map(|searcher| replace_all(data, searcher))
            .sum()
    }

    /// [`Keyring::redact`] on a string (a redacted string stays valid UTF-8 only where
    /// the pattern was; a pattern cut inside a character is replaced lossily).
    pub fn redact_str(&self, text: &mut String) -> usize {
        if self.keys.is_empty() {
            return 0;
        }
        let mut bytes = std::mem::take(text).into_bytes();
        let count = self.redact(&mut bytes);
        *text = String::from_utf8(bytes)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
        count
    }

    /// Every form in which a secret value could plausibly travel, longest first so a
    /// long encoding is replaced before a shorter form inside it.
    fn redaction_patterns(&self) -> Vec<Vec<u8>> {
        let b64 = &base64::engine::general_purpose::STANDARD;
        let b64_url = &base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let mut patterns: Vec<Vec<u8>> = Vec::new();
        for value in self.keys.values().flatten() {
            let mut forms = vec![value.as_bytes().to_vec()];
            for bytes in [
                Some(value.as_bytes().to_vec()),
                decode_key(value, KeyText::Hex),
                decode_key(value, KeyText::Base64),
            ]
            .into_iter()
            .flatten()
            {
                forms.push(hex::encode(&bytes).into_bytes());
                forms.push(hex::encode_upper(&bytes).into_bytes());
                forms.push(b64.encode(&bytes).trim_end_matches('=').as_bytes().to_vec());
                forms.push(b64_url.encode(&bytes).into_bytes());
                forms.push(bytes);
            }
            forms.push(percent_encode(value.as_bytes()));
            patterns.extend(forms.into_iter().filter(|f| f.len() >= MIN_REDACTED_LEN));
        }
        patterns.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        patterns.dedup();
        patterns
    }
}

/// The names of a placeholder's body (`NAME}}` or `USER:PASSWORD}}`) and the bytes it
/// used, closing braces included.
fn placeholder_body(body: &[u8], names: usize) -> Result<(Vec<&str>, usize), PlaceholderError> {
    let end = find(body, CLOSE).ok_or(PlaceholderError::Malformed("no closing }}"))?;
    let inner = std::str::from_utf8(&body[..end])
        .map_err(|_| PlaceholderError::Malformed("a name is not text"))?;
    let parts: Vec<&str> = inner.split(':').collect();
    if parts.len() != names {
        return Err(PlaceholderError::Malformed(if names == 1 {
            "{{secret:NAME}} takes one name"
        } else {
            "{{basic:USER:PASSWORD}} takes two names"
        }));
    }
    let valid = |name: &str| {
        name.len() <= MAX_NAME_LEN
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    };
    if !parts.iter().all(|p| valid(p)) || (names == 1 && parts[0].is_empty()) {
        return Err(PlaceholderError::Malformed(
            "a secret name is 1-64 characters of a-z, 0-9 and _",
        ));
    }
    if parts.iter().all(|p| p.is_empty()) {
        return Err(PlaceholderError::Malformed("{{basic::}} names no secret"));
    }
    Ok((parts, end + CLOSE.len()))
}

fn decode_key(text: &str, encoding: KeyText) -> Option<Vec<u8>> {
    let bytes = match encoding {
        KeyText::Utf8 => Some(text.as_bytes().to_vec()),
        KeyText::Hex => hex::decode(text.trim()).ok(),
        KeyText::Base64 => {
            let trimmed = text.trim().trim_end_matches('=');
            base64::engine::general_purpose::STANDARD_NO_PAD
                .decode(trimmed)
                .ok()
        }
    }?;
    (!bytes.is_empty()).then_some(bytes)
}

fn encoding_name(encoding: KeyText) -> &'static str {
    match encoding {
        KeyText::Utf8 => "utf-8",
        KeyText::Hex => "hex",
        KeyText::Base64 => "base64",
    }
}

fn mac(hash: HmacHash, key: &[u8], data: &[u8]) -> Vec<u8> {
    // HMAC takes keys of any length, so `new_from_slice` cannot fail.
    match hash {
        HmacHash::Sha256 => {
            let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(key)
                .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
            mac.update(data);
            mac.finalize().into_bytes().to_vec()
        }
        HmacHash::Sha512 => {
            let mut mac = <Hmac<sha2::Sha512> as Mac>::new_from_slice(key)
                .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
            mac.update(data);
            mac.finalize().into_bytes().to_vec()
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(haystack, needle)
}

fn replace_all(data: &mut Vec<u8>, searcher: &Finder<'_>) -> usize {
    let pattern = searcher.needle();
    let hits: Vec<usize> = searcher.find_iter(data).collect();
    if hits.is_empty() {
        return 0;
    }
    let mut out = Vec::with_capacity(data.len());
    let mut from = 0;
    let mut count = 0;
    for at in hits {
        if at < from {
            continue; // overlapping with the previous occurrence
        }
        out.extend_from_slice(&data[from..at]);
        out.extend_from_slice(REDACTED.as_bytes());
        from = at + pattern.len();
        count += 1;
    }
    out.extend_from_slice(&data[from..]);
    *data = out;
    count
}

/// Percent-encoding of everything but RFC 3986's unreserved characters (what form and
/// query encoders produce, give or take `+` for a space).
fn percent_encode(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    for &b in bytes {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b);
        } else {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keyring() -> Keyring {
        let mut k = Keyring::default();
        k.insert("api_key", "sk_test_abc123");
        k.insert_versions(
            "webhook_secret",
            vec!["whsec_new_0001".into(), "whsec_old_0002".into()],
        );
        k.insert(
            "hmac_key",
            "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056",
        );
        k
    }

    #[test]
    fn hmac_returns_one_mac_per_version_newest_first() {
        let k = keyring();
        let macs = k
            .hmac("webhook_secret", HmacHash::Sha256, KeyText::Utf8, b"data")
            .unwrap();
        assert_eq!(macs.len(), 2);
        assert_eq!(macs[0], mac(HmacHash::Sha256, b"whsec_new_0001", b"data"));
        assert_eq!(macs[1], mac(HmacHash::Sha256, b"whsec_old_0002", b"data"));
        let long = k
            .hmac("api_key", HmacHash::Sha512, KeyText::Utf8, b"data")
            .unwrap();
        assert_eq!(long[0].len(), 64);
    }

    #[test]
    fn hmac_decodes_the_key_as_the_adapter_says_and_refuses_what_does_not_decode() {
        let k = keyring();
        let hex = k
            .hmac("hmac_key", HmacHash::Sha256, KeyText::Hex, b"x")
            .unwrap();
        let raw = hex::decode("44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056")
            .unwrap();
        assert_eq!(hex[0], mac(HmacHash::Sha256, &raw, b"x"));
        let err = k
            .hmac("api_key", HmacHash::Sha256, KeyText::Hex, b"x")
            .unwrap_err();
        assert!(matches!(err, KeyringFailure::UnusableKey { .. }));
        assert!(!err.to_string().contains("sk_test_abc123"));
        assert_eq!(
            k.hmac("nope", HmacHash::Sha256, KeyText::Utf8, b"x"),
            Err(KeyringFailure::UnknownKey("nope".into()))
        );
    }

    #[test]
    fn placeholders_become_the_newest_secret_and_basic_credentials() {
        let k = keyring();
        let out = k
            .substitute(b"Bearer {{secret:api_key}} and {{secret:webhook_secret}}")
            .unwrap();
        assert_eq!(out, b"Bearer sk_test_abc123 and whsec_new_0001");
        let basic = k.substitute(b"Basic {{basic:api_key:}}").unwrap();
        let expected = base64::engine::general_purpose::STANDARD.encode("sk_test_abc123:");
        assert_eq!(basic, format!("Basic {expected}").into_bytes());
        let plain = br#"{"a":{"b":"{{not a placeholder}}"}}"#;
        assert_eq!(k.substitute(plain).unwrap(), plain.to_vec());
    }

    #[test]
    fn unknown_or_malformed_placeholders_are_refused() {
        let k = keyring();
        assert_eq!(
            k.substitute(b"{{secret:password}}"),
            Err(PlaceholderError::UnknownSecret("password".into()))
        );
        for bad in [
            &b"{{secret:api_key"[..],
            b"{{secret:}}",
            b"{{secret:API_KEY}}",
            b"{{secret:a:b}}",
            b"{{basic:api_key}}",
            b"{{basic::}}",
        ] {
            assert!(
                matches!(k.substitute(bad), Err(PlaceholderError::Malformed(_))),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn a_secret_that_would_break_a_header_is_refused() {
        let mut k = Keyring::default();
        k.insert("api_key", "abc\r\nX-Evil: 1");
        assert_eq!(
            k.substitute_header("Authorization", "Bearer {{secret:api_key}}"),
            Err(PlaceholderError::InvalidHeaderValue("Authorization".into()))
        );
    }

    #[test]
    fn redaction_removes_every_encoding_of_every_version() {
        let k = keyring();
        let b64 = base64::engine::general_purpose::STANDARD.encode("whsec_old_0002");
        let mut data = format!(
            "a sk_test_abc123 b {} c {} d {b64} e 44782def547aaa06c910c43932b1eb0c71fc68d9d0c057550c48ec2acf6ba056",
            hex::encode("sk_test_abc123"),
            "whsec%5Fnew_0001".replace("%5F", "_"),
        )
        .into_bytes();
        let count = k.redact(&mut data);
        let text = String::from_utf8(data).unwrap();
        assert_eq!(count, 5, "{text}");
        assert!(!text.contains("sk_test"), "{text}");
        assert!(!text.contains("whsec"), "{text}");
        assert!(!text.to_lowercase().contains("44782def"), "{text}");
    }

    #[test]
    fn a_keyring_changed_after_it_redacted_redacts_its_new_secrets_and_its_clones_keep_theirs() {
        let mut k = Keyring::default();
        k.insert("api_key", "sk_live_first_key");
        let mut data = b"sk_live_first_key".to_vec();
        assert_eq!(k.redact(&mut data), 1);
        let before = k.clone();
        k.insert("api_key", "sk_live_second_key");
        let mut both = b"sk_live_first_key sk_live_second_key".to_vec();
        assert_eq!(k.redact(&mut both), 1);
        assert_eq!(both, b"sk_live_first_key [redacted]".to_vec());
        let mut both = b"sk_live_first_key sk_live_second_key".to_vec();
        assert_eq!(before.redact(&mut both), 1);
        assert_eq!(both, b"[redacted] sk_live_second_key".to_vec());
        k.insert_versions("api_key", Vec::new());
        let mut gone = b"sk_live_second_key".to_vec();
        assert_eq!(k.redact(&mut gone), 0);
        assert_ne!(k, before);
    }

    #[test]
    fn debug_shows_names_only() {
        let printed = format!("{:?}", keyring());
        assert!(printed.contains("api_key"));
        assert!(!printed.contains("sk_test_abc123"));
        assert!(!printed.contains("whsec_"));
    }
}
