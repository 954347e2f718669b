//! The timeline read one bounded page at a time (issue 16).

use crate::common::*;

dual_test! {
    async fn a_timeline_page_holds_at_most_its_limit_and_its_cursor_continues_after_the_last_row(&db) {
        let store = &db.store;
        let shop = Fixture::new(store, "Acme").await;
        let (payment, _) = shop.succeeded(store, "H-1", 500).await;
        // Another payment's rows, interleaved in the table, never show up.
        shop.succeeded(store, "H-2", 700).await;
        let all: Vec<i64> = store.timeline(&payment.id).await.unwrap().iter().map(|e| e.id).collect();
        assert!(all.len() >= 3, "{all:?}");

        let mut seen = Vec::new();
        let mut after = None;
        loop {
            let (rows, more) = store.timeline_page(&payment.id, after, 2).await.unwrap();
            assert!(rows.len() <= 2);
            assert!(rows.iter().all(|r| r.payment_id == payment.id));
            seen.extend(rows.iter().map(|r| r.id));
            if !more {
                break;
            }
            after = rows.last().map(|r| r.id);
        }
        assert_eq!(seen, all, "every row once, in order");

        let (rows, more) = store.timeline_page(&payment.id, all.last().copied(), 2).await.unwrap();
        assert!(rows.is_empty() && !more, "nothing after the last row");
        let exact = i64::try_from(all.len()).unwrap();
        let (rows, more) = store.timeline_page(&payment.id, None, exact).await.unwrap();
        assert_eq!((rows.len(), more), (all.len(), false), "a page that fits exactly has no more");
    }
}
