//! The OpenAPI 3 document, generated from the handlers' annotations and
//! served at `/openapi.json`. The gateway serves one document for every
//! route it mounts: this crate's ([`crate::openapi`]) merged with the
//! descriptions of the routes other crates own ([`crate::openapi_with`],
//! called by `sluice-server`). A copy is committed at `docs/openapi.json`; a
//! test fails when the two differ (`SLUICE_UPDATE_OPENAPI=1 cargo test -p
//! sluice-server --test server openapi` rewrites the copy).
//!
//! The document states every rule the server enforces on its input: the
//! field schemas in [`fields`] are built from the same constants as the
//! checks in [`crate::requests`], and [`complete`] adds what the shared
//! layers (authentication, idempotency, body extraction) do to every route
//! they wrap, in one place, as they are applied in one place.

use std::sync::Arc;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use utoipa::openapi::path::{Operation, Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::schema::{Object, Schema};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{
    ContentBuilder, InfoBuilder, OpenApi, OpenApiBuilder, Ref, RefOr, Required, ResponseBuilder,
};

use crate::idempotency::MAX_KEY_LEN;

/// Title, version and the security schemes the paths refer to.
pub fn base() -> OpenApi {
    let mut doc = OpenApiBuilder::new()
        .info(
            InfoBuilder::new()
                .title("Sluice merchant API")
                .version(env!("CARGO_PKG_VERSION"))
                .description(Some(
                    "Payments, captures, voids and refunds through one API. Every POST under /v1 \
                     accepts an Idempotency-Key. Every error has the shape \
                     {\"error\": {\"type\", \"code\", \"message\", \"param\"}}. Amounts are integer \
                     minor units; times are unix milliseconds.",
                ))
                .build(),
        )
        .build();
    let components = doc.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        "api_key",
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some(
                    "A merchant API key: `Authorization: Bearer <api key>`",
                ))
                .build(),
        ),
    );
    components.add_security_scheme(
        "admin_token",
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some(
                    "The gateway's admin token: `Authorization: Bearer <admin token>`",
                ))
                .build(),
        ),
    );
    components.add_security_scheme(
        "operator_key",
        SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
            "Sluice-Operator-Key",
            "The calling operator's own key (`POST /admin/operators`); the review routes need \
             it together with the admin token",
        ))),
    );
    doc
}

/// `doc` as served (pretty JSON with a final newline).
pub fn render(doc: &OpenApi) -> Arc<String> {
    let text = doc.to_pretty_json().unwrap_or_else(|e| {
        tracing::error!(error = %e, "OpenAPI document does not serialise");
        "{}".to_owned()
    });
    Arc::new(format!("{text}\n"))
}

/// The rendered document, shared by the `/openapi.json` route.
#[derive(Clone)]
pub struct ServedDocument(pub Arc<String>);

/// `GET /openapi.json`: this document.
#[utoipa::path(
    get, path = "/openapi.json", tag = "meta",
    responses((status = 200, description = "This OpenAPI document", content_type = "application/json", body = Object))
)]
pub async fn document(Extension(ServedDocument(spec)): Extension<ServedDocument>) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        spec.as_str().to_owned(),
    )
        .into_response()
}

/// The operations whose body is [`crate::extract::OptionalJson`]: an empty
/// body means every field's default. Every other body is required (a test
/// sends an empty body to every operation of the document).
const OPTIONAL_BODIES: &[&str] = &[
    "/v1/payments/{id}/confirm",
    "/v1/payments/{id}/capture",
    "/v1/payments/{id}/void",
    "/v1/payments/{id}/refunds",
    "/admin/merchants/{merchant_id}/api_keys",
    "/admin/review/proposals/{proposal_id}/approve",
    "/admin/review/proposals/{proposal_id}/reject",
];

/// What the shared layers add to every operation they wrap:
/// - every operation with a JSON body: 400 (malformed JSON, unknown or
///   invalid fields), 413 (over the body limit) and 415 (not JSON);
/// - every operation with a path parameter: 400 (a path that does not
///   decode) and 404;
/// - every authenticated operation: 401;
/// - every `POST /v1/...`: the `Idempotency-Key` header with its format,
///   400 (malformed or reused key) and 409 (the key's first request is
///   still running).
/// - every path parameter: the format its handler accepts (an adapter name,
///   a secret name or an id; anything else is a 404);
/// - `connector_account` and `routing` exclude each other.
pub fn complete(mut doc: OpenApi) -> OpenApi {
    if let Some(components) = doc.components.as_mut() {
        for name in ["CreatePaymentRequest", "ConfirmPaymentRequest"] {
            if let Some(RefOr::T(Schema::Object(object))) = components.schemas.get_mut(name) {
                forbid_together(object, "connector_account", "routing");
            }
        }
    }
    for (path, item) in doc.paths.paths.iter_mut() {
        let v1 = path.starts_with("/v1/");
        if let Some(op) = item.post.as_mut() {
            complete_operation(op, v1);
            if let Some(body) = op.request_body.as_mut() {
                body.required = Some(if OPTIONAL_BODIES.contains(&path.as_str()) {
                    Required::False
                } else {
                    Required::True
                });
            }
        }
        for op in [
            &mut item.get,
            &mut item.put,
            &mut item.delete,
            &mut item.patch,
        ]
        .into_iter()
        .flatten()
        {
            complete_operation(op, false);
        }
    }
    doc
}

fn complete_operation(op: &mut Operation, idempotent_post: bool) {
    let params = op.parameters.get_or_insert_with(Vec::new);
    if idempotent_post {
        params.retain(|p| !p.name.eq_ignore_ascii_case("Idempotency-Key"));
        params.push(idempotency_key_parameter());
    }
    let mut has_path_param = false;
    for param in params.iter_mut() {
        if matches!(param.parameter_in, ParameterIn::Path) {
            has_path_param = true;
            if has_own_pattern(param) {
                continue;
            }
            param.schema = Some(RefOr::T(Schema::Object(match param.name.as_str() {
                "adapter" => fields::adapter_name(),
                "secret_name" => crate::secrets_admin::secret_name_schema(),
                _ => fields::id(false),
            })));
        }
    }
    if op.parameters.as_ref().is_some_and(Vec::is_empty) {
        op.parameters = None;
    }
    let json_body = op
        .request_body
        .as_ref()
        .is_some_and(|b| b.content.contains_key("application/json"));
    let mut errors: Vec<(&str, &str)> = Vec::new();
    if json_body {
        errors.push(("400", "Invalid input; nothing was written"));
        errors.push(("413", "The body is over the size limit"));
        errors.push((
            "415",
            "The body is not JSON (Content-Type: application/json)",
        ));
    }
    if has_path_param {
        errors.push(("400", "Invalid input; nothing was written"));
        errors.push(("404", "No such resource"));
    }
    if op.security.as_ref().is_some_and(|s| !s.is_empty()) {
        errors.push(("401", "Missing or invalid credentials"));
    }
    if idempotent_post {
        errors.push(("400", "Invalid input; nothing was written"));
        errors.push((
            "409",
            "The Idempotency-Key's first request is still running, or the resource's state does not allow this",
        ));
    }
    for (status, description) in errors {
        if !op.responses.responses.contains_key(status) {
            op.responses
                .responses
                .insert(status.to_owned(), RefOr::T(error_response(description)));
        }
    }
    // Every error has the one JSON shape: a 4xx or 5xx an annotation
    // declares without a body gets `ErrorBody`.
    for (status, response) in op.responses.responses.iter_mut() {
        if let RefOr::T(response) = response {
            if (status.starts_with('4') || status.starts_with('5')) && response.content.is_empty() {
                *response = error_response(&response.description);
            }
        }
    }
}

/// A path parameter whose handler states its own format (e.g. the adapter
/// admin API's `{name}`) keeps it.
fn has_own_pattern(param: &Parameter) -> bool {
    matches!(&param.schema, Some(RefOr::T(Schema::Object(object))) if object.pattern.is_some())
}

/// `not: {required: [a, b], properties: {a: {not: null}, b: {not: null}}}`:
/// the two may not both be given (either may be null). utoipa's model has no
/// `not`, so it goes in as an extension, which is serialised verbatim.
fn forbid_together(object: &mut Object, a: &str, b: &str) {
    let given = serde_json::json!({"not": {"type": "null"}});
    let both = serde_json::json!({
        "required": [a, b],
        "properties": {a: given.clone(), b: given},
    });
    object
        .extensions
        .get_or_insert_with(Default::default)
        .insert("not".to_owned(), both);
}

fn error_response(description: &str) -> utoipa::openapi::Response {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build(),
        )
        .build()
}

fn idempotency_key_parameter() -> Parameter {
    ParameterBuilder::new()
        .name("Idempotency-Key")
        .parameter_in(ParameterIn::Header)
        .required(Required::False)
        .description(Some(format!(
            "Makes a retry safe: the first complete response is replayed. 1 to {MAX_KEY_LEN} \
             visible ASCII characters; reusing a key with other parameters is refused (400 \
             `idempotency_key_reused`)"
        )))
        .schema(Some(fields::idempotency_key()))
        .build()
}

/// The JSON Schema of each validated field, from the constants and character
/// classes the checks in [`crate::requests`] use. `schema_with` in the
/// request types points here.
pub mod fields {
    use utoipa::openapi::schema::{
        AdditionalProperties, Object, ObjectBuilder, Schema, SchemaFormat, SchemaType, Type,
    };
    use utoipa::openapi::{KnownFormat, RefOr};

    use crate::requests as req;

    /// Characters `char::is_control` is true for (C0, DEL, C1): refused in
    /// every text ([`req::text`]).
    pub const CONTROL: &str = r"\x00-\x1f\x7f-\x9f";
    /// The white space `str::trim` removes that is not a control character:
    /// a [`req::required_text`] neither starts nor ends with it.
    pub const SPACE: &str = r"\x20\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000";

    /// [`req::text`]: no control character.
    pub fn text_pattern() -> String {
        format!("^[^{CONTROL}]*$")
    }

    /// [`req::required_text`]: non-empty, no control character, no white
    /// space at either end.
    pub fn required_text_pattern() -> String {
        format!("^[^{CONTROL}{SPACE}]([^{CONTROL}]*[^{CONTROL}{SPACE}])?$")
    }

    /// [`req::url`]: `http://` or `https://`, then no white space or control character.
    pub fn url_pattern() -> String {
        format!("^https?://[^{CONTROL}{SPACE}]*$")
    }

    /// [`req::payment_method_type`].
    pub const PAYMENT_METHOD_TYPE_PATTERN: &str = "^[a-z][a-z0-9_]*$";

    /// [`req::looks_like_id`]: visible ASCII.
    pub const ID_PATTERN: &str = r"^[\x21-\x7e]+$";

    /// [`crate::admin::valid_adapter_name`].
    pub const ADAPTER_NAME_PATTERN: &str = "^[a-z0-9-]+$";
    pub const MAX_ADAPTER_NAME_CHARS: usize = 64;

    fn string(nullable: bool) -> ObjectBuilder {
        let kind = if nullable {
            SchemaType::from_iter([Type::String, Type::Null])
        } else {
            SchemaType::Type(Type::String)
        };
        ObjectBuilder::new().schema_type(kind)
    }

    fn integer(nullable: bool, minimum: i64, maximum: i64) -> ObjectBuilder {
        let kind = if nullable {
            SchemaType::from_iter([Type::Integer, Type::Null])
        } else {
            SchemaType::Type(Type::Integer)
        };
        ObjectBuilder::new()
            .schema_type(kind)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
            .minimum(Some(minimum))
            .maximum(Some(maximum))
    }

    /// A [`req::text`] of at most `max` characters.
    pub fn text(max: usize, nullable: bool) -> Object {
        string(nullable)
            .max_length(Some(max))
            .pattern(Some(text_pattern()))
            .build()
    }

    /// A [`req::required_text`] of at most `max` characters.
    pub fn required_text(max: usize, nullable: bool) -> Object {
        string(nullable)
            .min_length(Some(1))
            .max_length(Some(max))
            .pattern(Some(required_text_pattern()))
            .build()
    }

    /// An id ([`req::looks_like_id`]); anything else is a 404.
    pub fn id(nullable: bool) -> Object {
        string(nullable)
            .min_length(Some(1))
            .max_length(Some(req::MAX_ID_CHARS))
            .pattern(Some(ID_PATTERN))
            .build()
    }

    /// The `Idempotency-Key` header.
    pub fn idempotency_key() -> Object {
        string(false)
            .min_length(Some(1))
            .max_length(Some(crate::idempotency::MAX_KEY_LEN))
            .pattern(Some(ID_PATTERN))
            .build()
    }

    /// [`req::amount`]: a positive number of minor units, at most [`req::MAX_AMOUNT_MINOR`].
    pub fn amount_minor(nullable: bool) -> Object {
        integer(nullable, 1, req::MAX_AMOUNT_MINOR).build()
    }

    /// [`req::currency`]: the codes the core knows.
    pub fn currency_code(nullable: bool) -> Object {
        let codes = sluice_core::Currency::known_codes().map(serde_json::Value::from);
        let null = nullable.then_some(serde_json::Value::Null);
        string(nullable)
            .enum_values(Some(codes.chain(null)))
            .build()
    }

    /// [`req::url`], at most [`req::MAX_URL_CHARS`].
    pub fn optional_url() -> Object {
        string(true)
            .max_length(Some(req::MAX_URL_CHARS))
            .pattern(Some(url_pattern()))
            .build()
    }

    /// An adapter name ([`crate::admin::valid_adapter_name`]).
    pub fn adapter_name() -> Object {
        string(false)
            .min_length(Some(1))
            .max_length(Some(MAX_ADAPTER_NAME_CHARS))
            .pattern(Some(ADAPTER_NAME_PATTERN))
            .build()
    }

    /// A connector account's `webhook_burst` or `webhook_per_second`
    /// ([`crate::limits::parse_rate`]).
    pub fn webhook_rate(description: &str) -> Object {
        let mut schema = string(false)
            .min_length(Some(1))
            .max_length(Some(7))
            .pattern(Some(crate::limits::RATE_PATTERN))
            .build();
        schema.description = Some(description.to_owned());
        schema
    }

    /// A map of strings with at most `max_entries` entries, its keys
    /// [`req::required_text`]s of at most `max_key` characters and its
    /// values of at most `max_value` characters (`values_are_text`: and
    /// [`req::text`]s).
    pub fn string_map(
        max_entries: usize,
        max_key: usize,
        max_value: usize,
        values_are_text: bool,
        nullable: bool,
    ) -> Object {
        let kind = if nullable {
            SchemaType::from_iter([Type::Object, Type::Null])
        } else {
            SchemaType::Type(Type::Object)
        };
        let value = if values_are_text {
            text(max_value, false)
        } else {
            string(false).max_length(Some(max_value)).build()
        };
        ObjectBuilder::new()
            .schema_type(kind)
            .max_properties(Some(max_entries))
            .property_names(Some(Schema::Object(required_text(max_key, false))))
            .additional_properties(Some(AdditionalProperties::RefOr(RefOr::T(Schema::Object(
                value,
            )))))
            .build()
    }

    /// Payment metadata ([`req::metadata`]).
    pub fn metadata_map() -> Object {
        string_map(
            req::MAX_METADATA_KEYS,
            req::MAX_METADATA_KEY_CHARS,
            req::MAX_METADATA_VALUE_CHARS,
            true,
            true,
        )
    }

    /// Schema functions without arguments, for `schema_with` (which drops
    /// the field's doc comment, hence the description here).
    macro_rules! field {
        ($($name:ident => $body:expr, $description:expr;)*) => {
            $(pub fn $name() -> Object {
                let mut schema = $body;
                schema.description = Some(String::from($description));
                schema
            })*
        };
    }

    /// `schema` with a description.
    pub fn described(mut schema: Object, description: &str) -> Object {
        schema.description = Some(description.to_owned());
        schema
    }

    field! {
        amount => amount_minor(false), format!(
            "Minor units (cents for EUR), 1 to {}.", req::MAX_AMOUNT_MINOR
        );
        capture_amount => amount_minor(true), "Minor units; default: everything still capturable.";
        refund_amount => amount_minor(true), "Minor units; default: everything still refundable.";
        currency => currency_code(false), "ISO 4217, upper case: a currency Sluice knows the minor unit of.";
        payment_currency => currency_code(true), "If given, must be the payment's currency.";
        order_no => required_text(req::MAX_ORDER_NO_CHARS, false),
            "Unique per merchant: creating again with the same number returns the existing \
             payment if every parameter matches, 409 otherwise.";
        order_no_filter => required_text(req::MAX_ORDER_NO_CHARS, false),
            "Only the payment with this merchant order number.";
        create_connector_account => id(true),
            "The connector account (id) to pay through (used with `confirm`; validated, not \
             stored, without it: name it again on confirm). Not together with `routing`.";
        confirm_connector_account => id(true),
            "The connector account (id) to pay through. Default: the merchant's only active \
             account (of the `routing` adapter, when given). Not together with `routing`.";
        routing_adapter => adapter_name(),
            "Route to the merchant's only active connector account of this adapter.";
        payment_method => required_text(req::MAX_TOKEN_CHARS, true),
            "An opaque payment method token for the PSP.";
        payment_method_type => string(true)
            .min_length(Some(1))
            .max_length(Some(req::MAX_METHOD_TYPE_CHARS))
            .pattern(Some(PAYMENT_METHOD_TYPE_PATTERN))
            .build(),
            "The kind of payment method (`card`, `sepa_debit`, ...), default `card`: what \
             routing rules' `payment_method_types` match and PSP metrics are labelled with.";
        new_payment_method => required_text(req::MAX_TOKEN_CHARS, true),
            "New payment details for this attempt (e.g. after a decline); the payment's own \
             token otherwise.";
        return_url => optional_url(),
            "Where the customer comes back after a redirect: an absolute http(s) URL.";
        description => text(req::MAX_DESCRIPTION_CHARS, true), "Free text.";
        metadata => metadata_map(), format!(
            "Up to {} string pairs; keys up to {}, values up to {} characters.",
            req::MAX_METADATA_KEYS, req::MAX_METADATA_KEY_CHARS, req::MAX_METADATA_VALUE_CHARS
        );
        refund_reason => required_text(req::MAX_REASON_CHARS, true), "Why the money goes back.";
        biz_key => required_text(req::MAX_ORDER_NO_CHARS * 2, false),
            "The merchant's stable business goal; several payments may serve one.";
        attempt_reference => required_text(req::MAX_ID_CHARS, false),
            "The attempt reference the business recorded the goal with (this payment's \
             `attempts[].reference`, or another attempt of the same `biz_key`: then this \
             payment is refunded as `fulfilled_elsewhere`).";
        cursor => id(false), "The `next_cursor` of the previous page.";
        page_limit => integer(false, 1, req::MAX_PAGE).build(), format!(
            "1 to {}, default 20.", req::MAX_PAGE
        );
        timeline_limit => integer(false, 1, req::MAX_TIMELINE_PAGE).build(), format!(
            "History rows per page, 1 to {}, default {}.",
            req::MAX_TIMELINE_PAGE, req::DEFAULT_TIMELINE_PAGE
        );
        timeline_cursor => integer(false, 0, i64::MAX).build(),
            "The `next_cursor` of the previous page: rows recorded after it.";
        recon_period_start => integer(false, 0, i64::MAX).build(),
            "Start of the report's period, Unix milliseconds (inclusive).";
        recon_period_end => integer(false, 1, i64::MAX).build(), format!(
            "End of the period, Unix milliseconds (exclusive): after `period_start`, at most \
             {} ms (92 days) later.", sluice_orchestrator::reconcile::MAX_PERIOD_MS
        );
        report_base64 => string(false)
            .min_length(Some(4))
            .max_length(Some(crate::reconciliation_admin::MAX_REPORT_BASE64_CHARS))
            .pattern(Some("^[A-Za-z0-9+/]+={0,2}$"))
            .build(), format!(
            "The PSP's report file as it was downloaded (CSV), standard base64 with padding; \
             at most {} bytes once decoded.", sluice_orchestrator::reconcile::MAX_REPORT_BYTES
        );
        recon_class => string(false)
            .enum_values(Some(sluice_core::DifferenceClass::ALL.iter().map(|c| c.as_str())))
            .build(), "Only differences of this class.";
        recon_resolved => ObjectBuilder::new().schema_type(SchemaType::Type(Type::Boolean)).build(),
            "`true`: only differences repaired through the door; `false`: only those open or in review.";
        recon_limit => integer(false, 1, crate::reconciliation_admin::MAX_PAGE).build(), format!(
            "Differences per page, 1 to {}, default 100.", crate::reconciliation_admin::MAX_PAGE
        );
        recon_account => id(false), "The connector account (id) whose report it is.";
        recon_cursor => integer(false, 0, i64::MAX).build(),
            "The `next_cursor` of the previous page: differences recorded after it.";
    }
}

#[cfg(test)]
mod tests {
    use super::fields;
    use crate::requests as req;

    fn matcher(pattern: &str) -> impl Fn(&str) -> bool {
        let re = regex::Regex::new(pattern).expect("the pattern compiles");
        move |s| re.is_match(s)
    }

    /// Strings at the edges of every character class the checks use.
    fn samples() -> Vec<String> {
        let mut out: Vec<String> = [
            "",
            "a",
            "order-1",
            " a",
            "a ",
            "a b",
            "\u{a0}a",
            "a\u{3000}",
            "a\u{2009}b",
            "\u{feff}a",
            "a\u{200b}",
            "tab\there",
            "new\nline",
            "\u{7f}",
            "a\u{85}",
            "é",
            "https://shop.example/return",
            "http://",
            "https://a b",
            "javascript:alert(1)",
            "HTTPS://upper",
            "https://x\u{a0}y",
            "https://x/\u{1680}",
            "~!",
            "\u{1f600}",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for c in (0u32..0x250)
            .chain(0x1680..0x1681)
            .chain(0x2000..0x2030)
            .chain([0x205f, 0x3000])
        {
            if let Some(c) = char::from_u32(c) {
                out.push(c.to_string());
                out.push(format!("x{c}x"));
                out.push(format!("x{c}"));
            }
        }
        out
    }

    #[test]
    fn the_text_patterns_accept_exactly_what_the_checks_accept() {
        let text = matcher(&fields::text_pattern());
        let required = matcher(&fields::required_text_pattern());
        let url = matcher(&fields::url_pattern());
        for s in samples() {
            assert_eq!(text(&s), req::text(&s, "x", 10_000).is_ok(), "text {s:?}");
            assert_eq!(
                required(&s),
                req::required_text(&s, "x", 10_000).is_ok(),
                "required text {s:?}"
            );
            assert_eq!(url(&s), req::url(&s, "x").is_ok(), "url {s:?}");
        }
    }

    #[test]
    fn the_id_and_adapter_patterns_accept_exactly_what_the_checks_accept() {
        let id = matcher(fields::ID_PATTERN);
        let adapter = matcher(fields::ADAPTER_NAME_PATTERN);
        for s in samples() {
            let short = s.len() <= req::MAX_ID_CHARS;
            assert_eq!(id(&s) && short, req::looks_like_id(&s), "id {s:?}");
            assert_eq!(
                adapter(&s) && s.len() <= fields::MAX_ADAPTER_NAME_CHARS,
                crate::admin::valid_adapter_name(&s),
                "adapter {s:?}"
            );
        }
    }
}
