//! The subset of Adyen's Checkout API and notification messages the adapter writes and
//! reads. Requests are structs, so the JSON field order is fixed by the code (and not by
//! whatever map type serde_json was built with); responses ignore unknown fields.

use serde::{Deserialize, Serialize};

/// `{"currency": "EUR", "value": 1130}`: value in minor units.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Amount {
    pub currency: String,
    pub value: i64,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentMethod {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub stored_payment_method_id: String,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AdditionalData {
    pub manual_capture: &'static str,
}

/// `POST /v71/payments`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentRequest {
    pub amount: Amount,
    pub reference: String,
    pub merchant_account: String,
    pub payment_method: PaymentMethod,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub return_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub merchant_order_reference: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub additional_data: Option<AdditionalData>,
}

/// `POST /v71/payments/{pspReference}/captures|refunds|cancels`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModificationRequest {
    pub merchant_account: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub amount: Option<Amount>,
    pub reference: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Action {
    pub url: Option<String>,
}

/// The answer of `/payments`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentResponse {
    pub psp_reference: Option<String>,
    pub result_code: String,
    pub refusal_reason: Option<String>,
    pub refusal_reason_code: Option<String>,
    pub merchant_reference: Option<String>,
    pub amount: Option<Amount>,
    pub action: Option<Action>,
}

/// The answer of a modification endpoint: `status` is always `received`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModificationResponse {
    pub psp_reference: Option<String>,
    pub payment_psp_reference: Option<String>,
    pub reference: Option<String>,
    pub status: String,
    pub amount: Option<Amount>,
}

/// Adyen's error body: `{"status", "errorCode", "message", "errorType", "pspReference"}`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceError {
    pub error_code: Option<String>,
    pub message: Option<String>,
    pub error_type: Option<String>,
    pub psp_reference: Option<String>,
}
