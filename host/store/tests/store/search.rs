//! The operations console's search across merchants (issue 16): exact
//! lookups by every name a payment goes by, filters, a bounded page, and the
//! indexes the lookups go through.

use crate::common::*;
use sluice_core::{CaptureMode, OrderState};
use sluice_store::{PaymentSearch, MAX_SEARCH_PAGE};

fn by(q: &str) -> PaymentSearch {
    PaymentSearch {
        q: Some(q.to_owned()),
        ..PaymentSearch::default()
    }
}

async fn ids(db: &TestDb, search: &PaymentSearch) -> Vec<String> {
    let page = db
        .store
        .search_payments(search, MAX_SEARCH_PAGE, None)
        .await
        .unwrap();
    page.items.into_iter().map(|p| p.id).collect()
}

dual_test! {
    async fn a_payment_is_found_by_its_id_order_number_attempt_reference_or_psp_reference_across_merchants(&db) {
        let store = &db.store;
        let acme = Fixture::new(store, "Acme").await;
        let globex = Fixture::new(store, "Globex").await;
        let (paid, attempt) = acme.succeeded(store, "ORD-1", 500).await;
        let (other, _) = globex.succeeded(store, "ORD-2", 700).await;
        // The same order number at another merchant is another payment.
        let (twin, _) = globex.succeeded(store, "ORD-1", 900).await;

        assert_eq!(ids(db, &by(&paid.id)).await, vec![paid.id.clone()]);
        assert_eq!(ids(db, &by(&attempt.reference)).await, vec![paid.id.clone()]);
        assert_eq!(ids(db, &by("pi_ORD-2")).await, vec![other.id.clone()], "the PSP reference");
        let mut both = ids(db, &by("ORD-1")).await;
        both.sort();
        let mut expected = vec![paid.id.clone(), twin.id.clone()];
        expected.sort();
        assert_eq!(both, expected, "one order number, two merchants");
        let only_acme = PaymentSearch {
            merchant_id: Some(acme.merchant.id.clone()),
            ..by("ORD-1")
        };
        assert_eq!(ids(db, &only_acme).await, vec![paid.id.clone()]);
        assert!(ids(db, &by("nothing-like-it")).await.is_empty());
        // A prefix is not a match: lookups are exact.
        assert!(ids(db, &by("pi_ORD")).await.is_empty());
    }
}

dual_test! {
    async fn the_listing_filters_by_merchant_state_and_age_newest_first_one_bounded_page_at_a_time(&db) {
        let store = &db.store;
        let acme = Fixture::new(store, "Acme").await;
        let globex = Fixture::new(store, "Globex").await;
        let old = acme.payment(store, "OLD", 100, CaptureMode::Automatic).await;
        db.clock.advance(60_000);
        let cutoff = db.clock.now_ms() - 30_000;
        let (done, _) = acme.succeeded(store, "DONE", 100).await;
        let fresh = acme.payment(store, "FRESH", 100, CaptureMode::Automatic).await;
        let elsewhere = globex.payment(store, "ELSE", 100, CaptureMode::Automatic).await;

        let everything = ids(db, &PaymentSearch::default()).await;
        assert_eq!(everything, vec![elsewhere.id.clone(), fresh.id.clone(), done.id.clone(), old.id.clone()]);
        let created = PaymentSearch {
            merchant_id: Some(acme.merchant.id.clone()),
            state: Some(OrderState::Created),
            ..PaymentSearch::default()
        };
        assert_eq!(ids(db, &created).await, vec![fresh.id.clone(), old.id.clone()]);
        let stuck = PaymentSearch {
            created_lte: Some(cutoff),
            ..created.clone()
        };
        assert_eq!(ids(db, &stuck).await, vec![old.id.clone()], "only what is older than the cut-off");
        let succeeded = PaymentSearch {
            state: Some(OrderState::Succeeded),
            ..PaymentSearch::default()
        };
        assert_eq!(ids(db, &succeeded).await, vec![done.id.clone()]);

        let mut seen = Vec::new();
        let mut cursor = None;
        loop {
            let page = store.search_payments(&PaymentSearch::default(), 3, cursor.as_deref()).await.unwrap();
            assert!(page.items.len() <= 3);
            seen.extend(page.items.iter().map(|p| p.id.clone()));
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        assert_eq!(seen, everything, "every payment once, in order");
        let capped = store.search_payments(&PaymentSearch::default(), 10_000, None).await.unwrap();
        assert!(capped.items.len() as i64 <= MAX_SEARCH_PAGE);
    }
}

dual_test! {
    /// Each lookup of a search goes through an index (migration 0018), never
    /// a scan of every order or attempt.
    async fn the_search_lookups_by_order_number_and_psp_reference_use_their_indexes(&db) {
        let store = &db.store;
        Fixture::new(store, "Acme").await.succeeded(store, "IDX-1", 100).await;
        for (sql, index) in [
            ("SELECT id FROM payment_orders WHERE merchant_order_no = 'IDX-1'", "payment_orders_by_order_no"),
            ("SELECT payment_id FROM payment_attempts WHERE psp_reference = 'pi_IDX-1'", "payment_attempts_by_psp_reference"),
            ("SELECT payment_id FROM refunds WHERE psp_reference = 'x'", "refunds_by_psp_reference"),
            ("SELECT payment_id FROM captures WHERE psp_reference = 'x'", "captures_by_psp_reference"),
        ] {
            let plan = query_plan(db, sql).await;
            assert!(plan.iter().any(|line| line.contains(index)), "{sql}: {plan:?}");
        }
    }
}
