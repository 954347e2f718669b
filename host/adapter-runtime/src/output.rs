//! Size of what an adapter returned, as the host holds it: every string and list's
//! contents plus the size of each list element. The memory cap already bounds what the
//! guest can produce; this cap bounds what the rest of the host is handed.

use crate::bindings::sluice::psp::types::{
    AdapterInfo, Failure, Header, HttpRequest, HttpResponse, Money, PaymentEvent, SettlementLine,
    WebhookAcceptance, WebhookRejection,
};
use std::mem::size_of;

pub(crate) trait OutputSize {
    /// Heap bytes owned by the value (not counting the value itself).
    fn heap_size(&self) -> usize;

    fn total_size(&self) -> usize
    where
        Self: Sized,
    {
        size_of::<Self>().saturating_add(self.heap_size())
    }
}

impl OutputSize for String {
    fn heap_size(&self) -> usize {
        self.len()
    }
}

impl OutputSize for u8 {
    fn heap_size(&self) -> usize {
        0
    }
}

impl<T: OutputSize> OutputSize for Vec<T> {
    fn heap_size(&self) -> usize {
        self.iter()
            .fold(self.len().saturating_mul(size_of::<T>()), |acc, item| {
                acc.saturating_add(item.heap_size())
            })
    }
}

impl<T: OutputSize> OutputSize for Option<T> {
    fn heap_size(&self) -> usize {
        self.as_ref().map_or(0, OutputSize::heap_size)
    }
}

impl<T: OutputSize, E: OutputSize> OutputSize for Result<T, E> {
    fn heap_size(&self) -> usize {
        match self {
            Ok(v) => v.heap_size(),
            Err(e) => e.heap_size(),
        }
    }
}

macro_rules! sum_fields {
    ($ty:ty => $($field:ident),+) => {
        impl OutputSize for $ty {
            fn heap_size(&self) -> usize {
                0usize $(.saturating_add(self.$field.heap_size()))+
            }
        }
    };
}

sum_fields!(Header => name, value);
sum_fields!(Money => currency);
sum_fields!(Failure => code, message);
sum_fields!(HttpRequest => method, url, headers, body);
sum_fields!(HttpResponse => headers, body);
sum_fields!(WebhookAcceptance => events, ack);
sum_fields!(AdapterInfo => name, version, capabilities, currencies);
sum_fields!(PaymentEvent => attempt_reference, action_reference, psp_reference,
    psp_payment_reference, amount, provider_event_id, raw_status, failure, next_action_url);
sum_fields!(SettlementLine => attempt_reference, action_reference, psp_reference,
    psp_payment_reference, line_id, currency, status);

impl OutputSize for crate::bindings::sluice::psp::types::Capability {
    fn heap_size(&self) -> usize {
        0
    }
}

impl OutputSize for WebhookRejection {
    fn heap_size(&self) -> usize {
        match self {
            WebhookRejection::BadSignature(s)
            | WebhookRejection::StaleTimestamp(s)
            | WebhookRejection::Malformed(s)
            | WebhookRejection::Unsupported(s) => s.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_elements_count_even_when_empty() {
        let response = HttpResponse {
            status: 200,
            headers: vec![
                Header {
                    name: String::new(),
                    value: String::new(),
                };
                1000
            ],
            body: vec![0; 10],
        };
        assert_eq!(response.heap_size(), 1000 * size_of::<Header>() + 10);
    }
}
