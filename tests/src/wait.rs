//! Waiting for something a background task does, under a deadline.

use std::time::{Duration, Instant};

/// Poll `check` until it returns Some, or fail after `within`. For conditions
/// that background tasks (servers, processors) reach in real time; a test that
/// owns the clock moves it instead.
pub async fn eventually<T, F, Fut>(within: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
