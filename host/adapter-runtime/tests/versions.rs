//! Loading, validation, the compile cache, activation, rollback and hot swap.

mod common;

use common::*;
use sluice_adapter_runtime::{AdapterRuntime, LoadError, RuntimeConfig};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const WELL: &str = "test-well-behaved";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_uploads_are_refused_and_the_previous_version_keeps_serving() {
    let rt = runtime_with(&[WELL]);
    let active_digest = rt.active(WELL).unwrap().identity().digest.clone();

    let garbage = rt
        .load(WELL, b"definitely not wasm", None, true)
        .unwrap_err();
    assert!(
        matches!(garbage, LoadError::InvalidComponent(_)),
        "{garbage:?}"
    );

    let core_module = rt.load(WELL, b"\0asm\x01\0\0\0", None, true).unwrap_err();
    assert!(
        matches!(core_module, LoadError::InvalidComponent(_)),
        "{core_module:?}"
    );

    let wrong_world = rt
        .load(WELL, &adapter_bytes("test-wrong-world"), None, true)
        .unwrap_err();
    assert!(
        matches!(wrong_world, LoadError::WrongWorld(_)),
        "{wrong_world:?}"
    );

    let mismatch = rt
        .load(WELL, &adapter_bytes("test-panic"), None, true)
        .unwrap_err();
    assert_eq!(
        mismatch,
        LoadError::NameMismatch {
            expected: WELL.into(),
            got: "test-panic".into()
        }
    );

    // describe() itself must answer within the limits: a version whose describe cannot
    // run in 1 ms of CPU... is hard to build, so use a memory cap it cannot start with.
    let tiny = sluice_adapter_runtime::SandboxLimits {
        memory_bytes: 4096,
        ..Default::default()
    };
    let starved = rt
        .load(
            WELL,
            &with_custom_section(&adapter_bytes(WELL), "v", b"2"),
            Some(tiny),
            true,
        )
        .unwrap_err();
    assert_eq!(
        starved,
        LoadError::DescribeFailed(sluice_adapter_runtime::AdapterError::MemoryLimit)
    );

    let bad_name = rt
        .load("../etc", &adapter_bytes(WELL), None, true)
        .unwrap_err();
    assert!(matches!(bad_name, LoadError::InvalidName(_)));

    // Nothing changed: same active version, one version loaded, and it serves.
    let status = rt.list();
    assert_eq!(status.len(), 1);
    assert_eq!(status[0].versions.len(), 1);
    let handle = rt.active(WELL).unwrap();
    assert_eq!(handle.identity().digest, active_digest);
    let body = payment_succeeded_body("evt_v");
    let accepted = handle
        .handle_webhook(
            &account("a", "k", "whsec"),
            signed_webhook("whsec", NOW_SECS, &body),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(accepted.events.len(), 1);
}

#[test]
fn the_compile_cache_is_used_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let config = || RuntimeConfig {
        cache_dir: Some(dir.path().to_path_buf()),
        ..config()
    };
    let bytes = adapter_bytes(WELL);

    let first = AdapterRuntime::new(config()).unwrap();
    let cold = first.load(WELL, &bytes, None, true).unwrap();
    assert!(!cold.from_cache);
    drop(first);

    let restarted = AdapterRuntime::new(config()).unwrap();
    let warm = restarted.load(WELL, &bytes, None, true).unwrap();
    assert!(
        warm.from_cache,
        "restart recompiled instead of using the cache"
    );
    assert_eq!(warm.digest, cold.digest);
    assert_eq!(warm.version, cold.version);
    eprintln!(
        "cold load {:?}, warm load {:?}",
        cold.compile_time, warm.compile_time
    );
    let handle = restarted.active(WELL).unwrap();
    let acct = account("a", "k", "whsec");
    let body = payment_succeeded_body("evt_c");
    let accepted = handle
        .handle_webhook_blocking(&acct, &signed_webhook("whsec", NOW_SECS, &body))
        .unwrap()
        .unwrap();
    assert_eq!(accepted.events.len(), 1);

    // A damaged cache entry is never deserialized: the next start recompiles.
    let entries: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "cwasm"))
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    let mut damaged = std::fs::read(&entries[0]).unwrap();
    let middle = damaged.len() / 2;
    damaged[middle] ^= 0xff;
    std::fs::write(&entries[0], damaged).unwrap();
    drop(restarted);
    let third = AdapterRuntime::new(config()).unwrap();
    let recompiled = third.load(WELL, &bytes, None, true).unwrap();
    assert!(!recompiled.from_cache);
    assert!(third.active(WELL).is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activate_and_rollback_switch_versions_and_handles_keep_their_version() {
    let rt = runtime();
    let v1 = adapter_bytes(WELL);
    let v2 = with_custom_section(&v1, "sluice-test-version", b"2");
    let info1 = rt.load(WELL, &v1, None, true).unwrap();
    let before_swap = rt.active(WELL).unwrap();
    let info2 = rt.load(WELL, &v2, None, false).unwrap();
    assert_ne!(info1.digest, info2.digest);
    assert_eq!(
        rt.active(WELL).unwrap().identity().digest,
        info1.digest,
        "load without activate"
    );

    assert_eq!(
        rt.activate(WELL, &info2.digest).unwrap().digest,
        info2.digest
    );
    assert_eq!(rt.active(WELL).unwrap().identity().digest, info2.digest);
    // A handle taken before the swap still runs the version it was taken on.
    assert_eq!(before_swap.identity().digest, info1.digest);
    let acct = account("a", "k", "whsec");
    let body = payment_succeeded_body("evt_r");
    assert!(before_swap
        .handle_webhook(&acct, signed_webhook("whsec", NOW_SECS, &body))
        .await
        .unwrap()
        .is_ok());

    let status = &rt.list()[0];
    assert_eq!(status.active.as_ref().unwrap().digest, info2.digest);
    assert_eq!(status.versions.len(), 2);
    assert_eq!(status.rollback_to.as_deref(), Some(info1.digest.as_str()));

    assert_eq!(rt.rollback(WELL).unwrap().digest, info1.digest);
    assert_eq!(rt.active(WELL).unwrap().identity().digest, info1.digest);
    assert_eq!(
        rt.rollback(WELL).unwrap_err(),
        LoadError::NothingToRollBackTo(WELL.into())
    );

    // Loading known bytes again does not add a version; with activate it switches.
    let again = rt.load(WELL, &v2, None, true).unwrap();
    assert_eq!(again.digest, info2.digest);
    assert_eq!(rt.list()[0].versions.len(), 2);
    assert_eq!(rt.active(WELL).unwrap().identity().digest, info2.digest);

    assert!(matches!(
        rt.activate(WELL, "00ff").unwrap_err(),
        LoadError::UnknownVersion { .. }
    ));
    assert_eq!(
        rt.activate("nope", &info1.digest).unwrap_err(),
        LoadError::UnknownAdapter("nope".into())
    );
    assert_eq!(
        rt.rollback("nope").unwrap_err(),
        LoadError::UnknownAdapter("nope".into())
    );
    assert!(rt.active("nope").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hot_swapping_under_a_stream_of_concurrent_calls_fails_no_call() {
    let rt = runtime();
    let v1 = adapter_bytes(WELL);
    let v2 = with_custom_section(&v1, "sluice-test-version", b"2");
    let d1 = rt.load(WELL, &v1, None, true).unwrap().digest;
    let d2 = rt.load(WELL, &v2, None, false).unwrap().digest;

    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicUsize::new(0));
    let swapper = {
        let rt = rt.clone();
        let (stop, swaps) = (Arc::clone(&stop), Arc::clone(&swaps));
        let (d1, d2) = (d1.clone(), d2.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let next = if swaps.load(Ordering::Relaxed) % 2 == 0 {
                    &d2
                } else {
                    &d1
                };
                rt.activate(WELL, next).expect("activate");
                swaps.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };

    let tasks = 8;
    let calls_per_task = 250;
    let mut handles = Vec::new();
    for t in 0..tasks {
        let rt = rt.clone();
        handles.push(tokio::spawn(async move {
            let acct = account("a", "k", "whsec");
            let mut failures = 0usize;
            let mut seen = BTreeSet::new();
            for i in 0..calls_per_task {
                let adapter = rt.active(WELL).expect("always an active version");
                seen.insert(adapter.identity().digest.clone());
                let body = payment_succeeded_body(&format!("evt_{t}_{i}"));
                match adapter
                    .handle_webhook(&acct, signed_webhook("whsec", NOW_SECS, &body))
                    .await
                {
                    Ok(Ok(accepted)) if accepted.events.len() == 1 => {}
                    other => {
                        eprintln!("call failed: {other:?}");
                        failures += 1;
                    }
                }
            }
            (failures, seen)
        }));
    }
    let mut failures = 0;
    let mut seen = BTreeSet::new();
    for handle in handles {
        let (f, s) = handle.await.unwrap();
        failures += f;
        seen.extend(s);
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    let swaps = swaps.load(Ordering::Relaxed);
    eprintln!(
        "{} calls, {swaps} swaps, versions seen {seen:?}",
        tasks * calls_per_task
    );
    assert_eq!(failures, 0);
    assert!(swaps >= 10, "only {swaps} swaps happened during the calls");
    assert_eq!(
        seen,
        BTreeSet::from([d1, d2]),
        "calls did not see both versions"
    );
}

#[test]
fn load_dir_loads_and_activates_every_component_and_reports_each_failure() {
    let dir = tempfile::tempdir().unwrap();
    for name in [WELL, "test-panic", "test-wrong-world"] {
        std::fs::copy(adapter_path(name), dir.path().join(format!("{name}.wasm"))).unwrap();
    }
    std::fs::write(dir.path().join("README.txt"), "not an adapter").unwrap();
    let rt = runtime();
    let results = rt.load_dir(dir.path());
    assert_eq!(results.len(), 3, "{results:?}");
    let by_name = |name: &str| {
        results
            .iter()
            .find(|(p, _)| p.file_stem().unwrap() == name)
            .map(|(_, r)| r.clone())
            .unwrap()
    };
    assert!(by_name(WELL).is_ok());
    assert!(by_name("test-panic").is_ok());
    assert!(matches!(
        by_name("test-wrong-world"),
        Err(LoadError::WrongWorld(_))
    ));
    let names: Vec<_> = rt.list().into_iter().map(|s| s.name).collect();
    assert_eq!(names, vec!["test-panic".to_string(), WELL.to_string()]);
    assert!(rt.active(WELL).is_some() && rt.active("test-panic").is_some());

    let missing = rt.load_dir(&dir.path().join("missing"));
    assert!(matches!(missing[0].1, Err(LoadError::Io { .. })));
}

/// The well-behaved component as built against contract `version`.
fn with_contract_version(wasm: &[u8], version: &str) -> Vec<u8> {
    sluice_adapter_runtime::testing::with_contract_version(wasm, "0.2.0", version)
}

#[test]
fn contract_versions_other_than_0_2_x_are_refused_and_0_2_patches_accepted() {
    let rt = runtime();
    let bytes = adapter_bytes(WELL);
    let future = rt
        .load(WELL, &with_contract_version(&bytes, "9.1.0"), None, true)
        .unwrap_err();
    assert!(
        matches!(future, LoadError::UnsupportedContractVersion(_)),
        "{future:?}"
    );
    let minor = rt
        .load(WELL, &with_contract_version(&bytes, "0.3.0"), None, true)
        .unwrap_err();
    assert!(
        matches!(minor, LoadError::UnsupportedContractVersion(_)),
        "{minor:?}"
    );
    // A component of the previous contract (it read secrets through `get-secret`) is
    // refused with a message naming the version this host serves.
    let previous = rt
        .load(WELL, &with_contract_version(&bytes, "0.1.0"), None, true)
        .unwrap_err();
    let LoadError::UnsupportedContractVersion(message) = &previous else {
        panic!("expected an unsupported contract version, got {previous:?}");
    };
    assert!(message.contains("sluice:psp/adapter@0.1.0"), "{message}");
    assert!(message.contains("0.2.x"), "{message}");
    assert!(rt.list().is_empty());

    let patch = rt
        .load(WELL, &with_contract_version(&bytes, "0.2.7"), None, true)
        .expect("a 0.2.x patch release of the contract is compatible");
    let handle = rt.active(WELL).unwrap();
    assert_eq!(handle.identity().digest, patch.digest);
    let body = payment_succeeded_body("evt_patch");
    let accepted = handle
        .handle_webhook_blocking(
            &account("a", "k", "whsec"),
            &signed_webhook("whsec", NOW_SECS, &body),
        )
        .unwrap()
        .unwrap();
    assert_eq!(accepted.events.len(), 1);
}
