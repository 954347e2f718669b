//! Shadow runs (issue 15): while a shadow version of an adapter is staged, every
//! `build-request`, `parse-response`, `handle-webhook` and `parse-settlement` the
//! serving version performs is repeated on the shadow with the same input, off the
//! request path, and the two outputs are compared. The shadow's output is never applied and its request never
//! sent: it cannot change state.
//!
//! Off the request path means: the live call has its answer before the shadow starts;
//! at most [`SHADOW_CONCURRENCY`] shadow calls run at once and a call beyond that is
//! shed (counted), never queued behind live work. Outputs are normalised before the
//! comparison (free-text messages dropped, header names lower-cased, JSON bodies
//! parsed) so only meaning differs: events, kinds, amounts, references, failure
//! categories, the request's method, URL, headers and body. A difference is stored
//! with the operation, the input's digest (never the input) and the differing fields,
//! each side an excerpt with the account's secret values and card numbers masked.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use serde::Serialize;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use sluice_adapter_runtime::{
    AdapterHandle, Failure, HttpRequest, HttpResponse, Keyring, OperationContext, PaymentEvent,
    SettlementLine, WebhookAcceptance, WebhookRejection, WebhookRequest,
};
use sluice_store::{NewShadowDiff, Store};
use tokio::sync::Semaphore;

use crate::call::Connector;

/// At most this many shadow calls run at once; more are shed.
pub const SHADOW_CONCURRENCY: usize = 4;
/// At most this many differing fields are kept per diff.
pub const MAX_DIFF_FIELDS: usize = 20;
/// Each side of a differing field is kept to this many characters.
pub const MAX_EXCERPT_CHARS: usize = 160;

/// The adapter operations a shadow repeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ShadowOperation {
    BuildRequest,
    ParseResponse,
    HandleWebhook,
    ParseSettlement,
}

impl ShadowOperation {
    pub fn as_str(self) -> &'static str {
        match self {
            ShadowOperation::BuildRequest => "build-request",
            ShadowOperation::ParseResponse => "parse-response",
            ShadowOperation::HandleWebhook => "handle-webhook",
            ShadowOperation::ParseSettlement => "parse-settlement",
        }
    }
}

/// What the shadow runs of one version and operation showed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ShadowTally {
    /// Same meaning as the serving version's output.
    pub agreed: u64,
    /// A difference, stored.
    pub differed: u64,
    /// The shadow failed (trap, timeout, shed by its own bulkhead) where the serving
    /// version answered.
    pub failed: u64,
    /// Not run: the shadow queue was full.
    pub shed: u64,
}

/// The shadow runs of this process: a bound on concurrency and the tallies.
#[derive(Debug)]
pub(crate) struct Shadows {
    permits: Arc<Semaphore>,
    /// (adapter, shadow digest, operation) → tally.
    tallies: Mutex<BTreeMap<(String, String, ShadowOperation), ShadowTally>>,
}

impl Default for Shadows {
    fn default() -> Self {
        Shadows {
            permits: Arc::new(Semaphore::new(SHADOW_CONCURRENCY)),
            tallies: Mutex::new(BTreeMap::new()),
        }
    }
}

impl Shadows {
    fn note(
        &self,
        adapter: &str,
        digest: &str,
        operation: ShadowOperation,
        bump: impl FnOnce(&mut ShadowTally),
    ) {
        let mut tallies = self.tallies.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (adapter.to_owned(), digest.to_owned(), operation);
        bump(tallies.entry(key).or_default());
    }

    /// The tallies of `adapter`'s shadow version `digest`, per operation.
    pub(crate) fn tallies(
        &self,
        adapter: &str,
        digest: &str,
    ) -> BTreeMap<&'static str, ShadowTally> {
        let tallies = self.tallies.lock().unwrap_or_else(PoisonError::into_inner);
        tallies
            .iter()
            .filter(|((a, d, _), _)| a == adapter && d == digest)
            .map(|((_, _, op), tally)| (op.as_str(), *tally))
            .collect()
    }
}

impl crate::Orchestrator {
    /// What the shadow runs of `adapter`'s version `digest` showed in this process,
    /// per operation.
    pub fn shadow_tallies(
        &self,
        adapter: &str,
        digest: &str,
    ) -> BTreeMap<&'static str, ShadowTally> {
        self.inner.shadows.tallies(adapter, digest)
    }
}

/// A staged shadow version, carried by a connector, with what a comparison needs.
#[derive(Clone)]
pub(crate) struct ShadowTap {
    pub handle: AdapterHandle,
    pub shadows: Arc<Shadows>,
    pub store: Store,
}

/// One comparison: the serving version's normalised output and the call's context.
pub(crate) struct Comparison<'a> {
    pub operation: ShadowOperation,
    pub serving_digest: &'a str,
    pub account_id: &'a str,
    pub keyring: &'a Keyring,
    /// sha256 of the input both versions got.
    pub input_digest: String,
    pub serving: Value,
}

impl<'a> Comparison<'a> {
    /// A comparison of a call `connector` served.
    fn of(
        connector: &'a Connector,
        operation: ShadowOperation,
        input_digest: String,
        serving: Value,
    ) -> Self {
        Comparison {
            operation,
            serving_digest: &connector.adapter.identity().digest,
            account_id: &connector.account_id,
            keyring: &connector.scope.secrets,
            input_digest,
            serving,
        }
    }
}

impl ShadowTap {
    /// Runs `shadow_call` on the shadow version in a task of its own and stores what
    /// differs from `c.serving`. `shadow_call` answers the shadow's normalised output,
    /// or `None` when the shadow failed.
    pub(crate) fn compare<F, Fut>(&self, c: Comparison<'_>, shadow_call: F)
    where
        F: FnOnce(AdapterHandle) -> Fut + Send + 'static,
        Fut: Future<Output = Option<Value>> + Send + 'static,
    {
        let identity = self.handle.identity().clone();
        let operation = c.operation;
        let Ok(permit) = Arc::clone(&self.shadows.permits).try_acquire_owned() else {
            self.shadows
                .note(&identity.name, &identity.digest, operation, |t| t.shed += 1);
            crate::metrics::shadow_compared(&identity.name, operation.as_str(), "shed");
            return;
        };
        let diff = NewShadowDiff {
            adapter: identity.name.clone(),
            active_digest: c.serving_digest.to_owned(),
            shadow_digest: identity.digest.clone(),
            operation: operation.as_str().to_owned(),
            account_id: c.account_id.to_owned(),
            input_digest: c.input_digest,
            fields: Value::Null,
        };
        let keyring = c.keyring.clone();
        let serving = c.serving;
        let tap = self.clone();
        tokio::spawn(async move {
            let shadow = shadow_call(tap.handle.clone()).await;
            tap.settle(diff, operation, &serving, shadow, &keyring)
                .await;
            drop(permit);
        });
    }

    async fn settle(
        &self,
        mut diff: NewShadowDiff,
        operation: ShadowOperation,
        serving: &Value,
        shadow: Option<Value>,
        keyring: &Keyring,
    ) {
        let (adapter, digest) = (diff.adapter.clone(), diff.shadow_digest.clone());
        let Some(shadow) = shadow else {
            self.shadows
                .note(&adapter, &digest, operation, |t| t.failed += 1);
            crate::metrics::shadow_compared(&adapter, operation.as_str(), "failed");
            return;
        };
        let fields = differing_fields(serving, &shadow, keyring);
        if fields.is_empty() {
            self.shadows
                .note(&adapter, &digest, operation, |t| t.agreed += 1);
            crate::metrics::shadow_compared(&adapter, operation.as_str(), "agreed");
            return;
        }
        self.shadows
            .note(&adapter, &digest, operation, |t| t.differed += 1);
        crate::metrics::shadow_compared(&adapter, operation.as_str(), "differed");
        diff.fields = Value::Array(fields);
        tracing::info!(adapter = %adapter, shadow_digest = %digest, operation = operation.as_str(),
            "shadow adapter version disagreed with the serving one");
        if let Err(error) = self.store.insert_shadow_diff(&diff).await {
            tracing::error!(adapter = %adapter, error = %error, "shadow diff not stored");
        }
    }
}

/// The three repeated operations, each with the serving version's output.
impl ShadowTap {
    pub(crate) fn repeat_build_request(
        &self,
        connector: &Connector,
        ctx: OperationContext,
        built: &Result<HttpRequest, Failure>,
    ) {
        let scope = connector.scope.clone();
        let comparison = Comparison::of(
            connector,
            ShadowOperation::BuildRequest,
            input_digest(&ctx),
            normalise_request(built),
        );
        self.compare(comparison, move |shadow| async move {
            let built = shadow.build_request(&scope, ctx).await.ok()?;
            Some(normalise_request(&built))
        });
    }

    pub(crate) fn repeat_parse_response(
        &self,
        connector: &Connector,
        ctx: OperationContext,
        response: HttpResponse,
        parsed: &Result<Vec<PaymentEvent>, Failure>,
    ) {
        let scope = connector.scope.clone();
        let comparison = Comparison::of(
            connector,
            ShadowOperation::ParseResponse,
            input_digest(&(&ctx, &response)),
            normalise(parsed),
        );
        self.compare(comparison, move |shadow| async move {
            let parsed = shadow.parse_response(&scope, ctx, response).await.ok()?;
            Some(normalise(&parsed))
        });
    }

    pub(crate) fn repeat_handle_webhook(
        &self,
        connector: &Connector,
        request: WebhookRequest,
        verdict: &Result<WebhookAcceptance, WebhookRejection>,
    ) {
        let scope = connector.scope.clone();
        let comparison = Comparison::of(
            connector,
            ShadowOperation::HandleWebhook,
            input_digest(&request),
            normalise(verdict),
        );
        self.compare(comparison, move |shadow| async move {
            let verdict = shadow.handle_webhook(&scope, request).await.ok()?;
            Some(normalise(&verdict))
        });
    }
}

impl ShadowTap {
    pub(crate) fn repeat_parse_settlement(
        &self,
        connector: &Connector,
        report: Vec<u8>,
        parsed: &Result<Vec<SettlementLine>, Failure>,
    ) {
        let scope = connector.scope.clone();
        let comparison = Comparison::of(
            connector,
            ShadowOperation::ParseSettlement,
            hex::encode(Sha256::digest(&report)),
            normalise(parsed),
        );
        self.compare(comparison, move |shadow| async move {
            let parsed = shadow.parse_settlement(&scope, report).await.ok()?;
            Some(normalise(&parsed))
        });
    }
}

/// sha256 (hex) of an input's JSON form: what identifies the input in a diff.
pub(crate) fn input_digest(input: &impl Serialize) -> String {
    let bytes = serde_json::to_vec(input).unwrap_or_default();
    hex::encode(Sha256::digest(bytes))
}

/// An adapter's output in the form compared: JSON with free-text `message` fields
/// dropped (wording is not meaning).
pub(crate) fn normalise(output: &impl Serialize) -> Value {
    let mut value = serde_json::to_value(output).unwrap_or(Value::Null);
    drop_messages(&mut value);
    value
}

/// A built request (or the adapter's refusal) in the form compared: method, URL,
/// headers by lower-cased name, and the body as JSON when it is JSON.
pub(crate) fn normalise_request(built: &Result<HttpRequest, Failure>) -> Value {
    let request = match built {
        Ok(request) => request,
        Err(failure) => return serde_json::json!({ "failure": normalise(failure) }),
    };
    let headers: BTreeMap<String, &str> = request
        .headers
        .iter()
        .map(|h| (h.name.to_ascii_lowercase(), h.value.as_str()))
        .collect();
    let body = serde_json::from_slice::<Value>(&request.body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&request.body).into_owned()));
    serde_json::json!({
        "method": normalise(&request.method),
        "url": request.url,
        "headers": headers,
        "body": body,
    })
}

fn drop_messages(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.remove("message");
            map.values_mut().for_each(drop_messages);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_messages),
        _ => {}
    }
}

/// The fields where `serving` and `shadow` differ, at most [`MAX_DIFF_FIELDS`], each
/// `{path, serving, shadow}` with redacted excerpts (absent side: null).
pub(crate) fn differing_fields(serving: &Value, shadow: &Value, keyring: &Keyring) -> Vec<Value> {
    let mut found = Vec::new();
    walk("$", Some(serving), Some(shadow), &mut found);
    found
        .into_iter()
        .take(MAX_DIFF_FIELDS)
        .map(|(path, a, b)| {
            serde_json::json!({
                "path": path,
                "serving": a.map(|v| excerpt(v, keyring)),
                "shadow": b.map(|v| excerpt(v, keyring)),
            })
        })
        .collect()
}

type Found<'a> = Vec<(String, Option<&'a Value>, Option<&'a Value>)>;

fn walk<'a>(path: &str, a: Option<&'a Value>, b: Option<&'a Value>, found: &mut Found<'a>) {
    if found.len() >= MAX_DIFF_FIELDS || a == b {
        return;
    }
    match (a, b) {
        (Some(Value::Object(x)), Some(Value::Object(y))) => walk_objects(path, x, y, found),
        (Some(Value::Array(x)), Some(Value::Array(y))) => {
            for i in 0..x.len().max(y.len()) {
                walk(&format!("{path}[{i}]"), x.get(i), y.get(i), found);
            }
        }
        _ => found.push((path.to_owned(), a, b)),
    }
}

fn walk_objects<'a>(
    path: &str,
    x: &'a Map<String, Value>,
    y: &'a Map<String, Value>,
    found: &mut Found<'a>,
) {
    let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
    for key in keys {
        walk(&format!("{path}.{key}"), x.get(key), y.get(key), found);
    }
}

/// One side of a differing field as stored: short, with secret values and card
/// numbers masked.
fn excerpt(value: &Value, keyring: &Keyring) -> String {
    let mut text: String = value.to_string().chars().take(MAX_EXCERPT_CHARS).collect();
    keyring.redact_str(&mut text);
    sluice_core::card_number::mask_card_numbers(&text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn outputs_that_differ_only_in_wording_agree() {
        let a = normalise(&json!({"events": [{"kind": "payment-failed", "message": "Declined"}]}));
        let b =
            normalise(&json!({"events": [{"kind": "payment-failed", "message": "card declined"}]}));
        assert!(differing_fields(&a, &b, &Keyring::default()).is_empty());
    }

    #[test]
    fn one_differing_amount_is_reported_with_its_path_and_both_values() {
        let a = json!({"events": [{"amount": {"minor": 1000}, "kind": "payment-succeeded"}]});
        let b = json!({"events": [{"amount": {"minor": 1001}, "kind": "payment-succeeded"}]});
        let fields = differing_fields(&a, &b, &Keyring::default());
        assert_eq!(
            fields,
            vec![json!({"path": "$.events[0].amount.minor", "serving": "1000", "shadow": "1001"})]
        );
    }

    #[test]
    fn a_card_number_or_a_secret_in_a_differing_field_is_masked() {
        let mut keyring = Keyring::default();
        keyring.insert("api_key", "sk_live_secret_value");
        let a = json!({"body": "number=4242424242424242&key=sk_live_secret_value"});
        let b = json!({"body": "number=4242424242424242"});
        let text = serde_json::to_string(&differing_fields(&a, &b, &keyring)).unwrap();
        assert!(!text.contains("4242424242424242"), "{text}");
        assert!(!text.contains("sk_live_secret_value"), "{text}");
    }

    #[test]
    fn a_diff_keeps_at_most_its_field_limit() {
        let a = json!((0..50).collect::<Vec<_>>());
        let b = json!((100..150).collect::<Vec<_>>());
        assert_eq!(
            differing_fields(&a, &b, &Keyring::default()).len(),
            MAX_DIFF_FIELDS
        );
    }
}
