//! What the kit looks for in everything an adapter returned or logged: the
//! account's secret values (raw, hex, base64) and card numbers (13 to 19
//! digits that pass the Luhn check).

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use base64::Engine as _;

/// At most this much of the adapters' log is kept for the scan.
const MAX_LOG_BYTES: usize = 4 << 20;

/// The forms a leaked secret may take in an output.
pub fn secret_forms(secret: &str) -> Vec<String> {
    let engine = base64::engine::general_purpose::STANDARD;
    let url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut forms = vec![
        secret.to_owned(),
        hex::encode(secret.as_bytes()),
        engine.encode(secret.as_bytes()),
        url.encode(secret.as_bytes()),
    ];
    // A hex key's bytes, as the keyring would decode them, in base64.
    if let Ok(bytes) = hex::decode(secret) {
        forms.push(engine.encode(&bytes));
    }
    // Short values would match by chance; a secret is longer than this.
    forms.retain(|f| f.len() >= 8);
    forms
}

/// The first leak in `text`, named without repeating the value.
pub fn find_leak(text: &str, secrets: &[String]) -> Option<String> {
    for (i, secret) in secrets.iter().enumerate() {
        if secret_forms(secret).iter().any(|form| text.contains(form)) {
            return Some(format!("the value of secret #{} of the account", i + 1));
        }
    }
    find_card_number(text).map(|masked| format!("a card number ({masked})"))
}

pub use sluice_core::card_number::find_card_number;

/// The adapters' log lines of this process: the guest's `log` import and its
/// captured stdout/stderr reach tracing on the runtime's blocking threads, so
/// only a process-wide subscriber sees them.
#[derive(Clone, Default)]
pub struct LogCapture {
    buffer: Arc<Mutex<Vec<u8>>>,
}

impl LogCapture {
    /// The process's capture, installed as the global subscriber on first use.
    /// None when another global subscriber was installed first: then the
    /// log cannot be checked, and the report says so.
    pub fn global() -> Option<LogCapture> {
        static CAPTURE: OnceLock<Option<LogCapture>> = OnceLock::new();
        CAPTURE
            .get_or_init(|| {
                let capture = LogCapture::default();
                let writer = capture.clone();
                let subscriber = tracing_subscriber::fmt()
                    .with_max_level(tracing::Level::TRACE)
                    .with_ansi(false)
                    .with_writer(move || writer.clone())
                    .finish();
                tracing::subscriber::set_global_default(subscriber)
                    .ok()
                    .map(|()| capture)
            })
            .clone()
    }

    /// How much has been logged so far (a mark to read from later).
    pub fn mark(&self) -> usize {
        self.lock().len()
    }

    /// What was logged since `mark`.
    pub fn since(&self, mark: usize) -> String {
        let buffer = self.lock();
        String::from_utf8_lossy(buffer.get(mark..).unwrap_or_default()).into_owned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        self.buffer.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Write for LogCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut buffer = self.lock();
        let room = MAX_LOG_BYTES.saturating_sub(buffer.len());
        buffer.extend_from_slice(&buf[..buf.len().min(room)]);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_found_raw_in_hex_and_in_base64() {
        let secrets = vec!["sk_test_abcdef123456".to_owned()];
        for text in [
            "Bearer sk_test_abcdef123456",
            &hex::encode("sk_test_abcdef123456"),
            &base64::engine::general_purpose::STANDARD.encode("sk_test_abcdef123456"),
        ] {
            assert!(find_leak(text, &secrets).is_some(), "{text}");
        }
        assert_eq!(find_leak("Bearer {{secret:api_key}}", &secrets), None);
    }
}
