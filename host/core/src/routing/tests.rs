use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::failure_table::CREDENTIALS_REFUSED_CODE;

fn eur(minor: i64) -> Money {
    Money::positive(minor, Currency::parse("EUR").unwrap()).unwrap()
}

fn weighted(account: &str, weight: u32) -> WeightedAccount {
    WeightedAccount {
        connector_account: account.into(),
        weight,
    }
}

fn config() -> RoutingConfig {
    RoutingConfig {
        rules: vec![
            RouteRule {
                id: "big-eur".into(),
                when: RouteConditions {
                    currencies: vec!["EUR".into()],
                    min_amount_minor: Some(10_000),
                    ..RouteConditions::default()
                },
                accounts: vec![weighted("ca_big", 1)],
            },
            RouteRule {
                id: "split".into(),
                when: RouteConditions::default(),
                accounts: vec![weighted("ca_a", 70), weighted("ca_b", 30)],
            },
        ],
        fallback: vec!["ca_fallback".into(), "ca_a".into()],
        ..RoutingConfig::default()
    }
}

fn input<'a>(
    payment_id: &'a str,
    amount: Money,
    metadata: &'a BTreeMap<String, String>,
) -> RouteInput<'a> {
    RouteInput {
        payment_id,
        amount,
        payment_method_type: Some("card"),
        metadata,
    }
}

fn accounts(plan: &RoutingPlan) -> Vec<&str> {
    plan.entries
        .iter()
        .map(|e| e.connector_account.as_str())
        .collect()
}

#[test]
fn a_default_configuration_and_an_empty_json_object_have_the_same_failover_window() {
    let parsed: RoutingConfig = serde_json::from_str("{}").unwrap();
    assert_eq!(parsed, RoutingConfig::default());
    assert_eq!(parsed.failover_window_ms, DEFAULT_FAILOVER_WINDOW_MS);
}

#[test]
fn the_first_rule_whose_conditions_hold_chooses_then_the_fallback_follows_each_account_once() {
    let none = BTreeMap::new();
    let plan = plan_route(&config(), &input("pay_1", eur(20_000), &none));
    assert_eq!(accounts(&plan), ["ca_big", "ca_fallback", "ca_a"]);
    assert_eq!(plan.entries[0].rule.as_deref(), Some("big-eur"));
    assert_eq!(plan.entries[1].rule, None);
}

#[test]
fn the_volume_split_is_deterministic_by_payment_id_and_follows_the_weights() {
    let none = BTreeMap::new();
    let mut to_a = 0;
    for n in 0..2000 {
        let id = format!("pay_{n:08}");
        let plan = plan_route(&config(), &input(&id, eur(500), &none));
        assert_eq!(plan, plan_route(&config(), &input(&id, eur(500), &none)));
        assert_eq!(plan.entries.len(), 3, "{plan:?}");
        if plan.entries[0].connector_account == "ca_a" {
            to_a += 1;
        }
    }
    // 70 % ± 5 % of 2000.
    assert!((1300..=1500).contains(&to_a), "{to_a} of 2000 went to ca_a");
}

#[test]
fn a_weight_of_zero_is_never_chosen_first_but_stays_a_failover_target() {
    let mut config = config();
    config.rules[1].accounts = vec![weighted("ca_a", 0), weighted("ca_b", 5)];
    let none = BTreeMap::new();
    for n in 0..200 {
        let plan = plan_route(&config, &input(&format!("p{n}"), eur(1), &none));
        assert_eq!(accounts(&plan), ["ca_b", "ca_a", "ca_fallback"]);
    }
}

#[test]
fn conditions_on_currency_amount_method_type_and_metadata_all_must_hold() {
    let mut metadata = BTreeMap::new();
    metadata.insert("channel".to_owned(), "app".to_owned());
    let when = RouteConditions {
        currencies: vec!["EUR".into()],
        min_amount_minor: Some(100),
        max_amount_minor: Some(1000),
        payment_method_types: vec!["card".into()],
        metadata: metadata.clone(),
    };
    assert!(when.hold_for(&input("p", eur(100), &metadata)));
    assert!(when.hold_for(&input("p", eur(1000), &metadata)));
    assert!(!when.hold_for(&input("p", eur(99), &metadata)));
    assert!(!when.hold_for(&input("p", eur(1001), &metadata)));
    assert!(!when.hold_for(&input("p", eur(500), &BTreeMap::new())));
    let usd = Money::positive(500, Currency::parse("USD").unwrap()).unwrap();
    assert!(!when.hold_for(&input("p", usd, &metadata)));
    let mut no_type = input("p", eur(500), &metadata);
    no_type.payment_method_type = None;
    assert!(!when.hold_for(&no_type));
}

#[test]
fn nonsense_configurations_are_refused_with_the_part_they_are_about() {
    let refused = |edit: fn(&mut RoutingConfig)| {
        let mut config = config();
        edit(&mut config);
        config.validate().unwrap_err()
    };
    assert!(config().validate().is_ok());
    assert_eq!(
        refused(|c| c.rules[1].id = "big-eur".into()),
        RoutingConfigError::DuplicateRuleId("big-eur".into())
    );
    assert!(matches!(
        refused(|c| c.rules[0].id.clear()),
        RoutingConfigError::BadRuleId { index: 0 }
    ));
    assert!(matches!(
        refused(|c| c.rules[0].accounts.clear()),
        RoutingConfigError::BadAccounts(_)
    ));
    assert!(matches!(
        refused(|c| c.rules[1].accounts[1].connector_account = "ca_a".into()),
        RoutingConfigError::BadAccounts(_)
    ));
    assert!(matches!(
        refused(|c| c.rules[0].accounts[0].weight = 0),
        RoutingConfigError::BadWeights(_)
    ));
    assert!(matches!(
        refused(|c| c.rules[0].when.max_amount_minor = Some(5)),
        RoutingConfigError::BadAmountRange(_)
    ));
    assert!(matches!(
        refused(|c| c.rules[0].when.min_amount_minor = Some(-1)),
        RoutingConfigError::BadAmountRange(_)
    ));
    assert!(matches!(
        refused(|c| c.rules[0].when.currencies = vec!["euro".into()]),
        RoutingConfigError::BadCurrency { .. }
    ));
    assert_eq!(
        refused(|c| c.fallback.push("ca_fallback".into())),
        RoutingConfigError::BadFallback
    );
    assert_eq!(
        refused(|c| c.failover_window_ms = -1),
        RoutingConfigError::BadWindow
    );
}

fn fact(account: &str, state: AttemptState, code: Option<&str>) -> AttemptFact {
    AttemptFact {
        connector_account: account.into(),
        adapter: "stripe".into(),
        state,
        failure_code: code.map(str::to_owned),
        created_at_ms: 0,
    }
}

fn plan() -> RoutingPlan {
    let none = BTreeMap::new();
    plan_route(&config(), &input("pay_1", eur(20_000), &none))
}

fn step(attempts: &[AttemptFact], ineligible: &BTreeMap<String, String>, now_ms: i64) -> NextStep {
    next_step(&FailoverInput {
        order: OrderState::Processing,
        attempts,
        plan: &plan(),
        overrides: &[],
        ineligible,
        deadline_ms: 1000,
        now_ms,
    })
}

#[test]
fn a_cascadable_decline_fails_over_to_the_next_untried_account_of_the_plan() {
    let attempts = [fact(
        "ca_big",
        AttemptState::Failed,
        Some("issuer_not_available"),
    )];
    let NextStep::Failover {
        connector_account,
        reason,
        ..
    } = step(&attempts, &BTreeMap::new(), 10)
    else {
        panic!("expected a failover");
    };
    assert_eq!(connector_account, "ca_fallback");
    assert!(
        reason.contains("issuer_not_available") && reason.contains("fallback"),
        "{reason}"
    );
}

#[test]
fn credentials_refused_fails_over_and_an_ineligible_account_is_skipped_with_its_reason() {
    let attempts = [fact(
        "ca_big",
        AttemptState::Failed,
        Some(CREDENTIALS_REFUSED_CODE),
    )];
    let mut ineligible = BTreeMap::new();
    ineligible.insert("ca_fallback".to_owned(), "breaker open".to_owned());
    let NextStep::Failover {
        connector_account,
        skipped,
        ..
    } = step(&attempts, &ineligible, 10)
    else {
        panic!("expected a failover");
    };
    assert_eq!(connector_account, "ca_a");
    assert_eq!(
        skipped,
        [("ca_fallback".to_owned(), "breaker open".to_owned())]
    );
}

#[test]
fn insufficient_funds_fraud_and_unknown_codes_never_fail_over() {
    for code in [
        "insufficient_funds",
        "fraudulent",
        "stolen_card",
        "something_new",
    ] {
        let attempts = [fact("ca_big", AttemptState::Failed, Some(code))];
        assert!(
            matches!(
                step(&attempts, &BTreeMap::new(), 10),
                NextStep::Stop(Stop::NotCascadable { .. })
            ),
            "{code}"
        );
    }
}

#[test]
fn an_unknown_or_in_flight_attempt_blocks_any_failover_seed_001_test_e() {
    for state in [
        AttemptState::Unknown,
        AttemptState::Submitted,
        AttemptState::Processing,
        AttemptState::Created,
    ] {
        let attempts = [
            fact("ca_big", AttemptState::Failed, Some("issuer_not_available")),
            fact("ca_fallback", state, None),
        ];
        assert_eq!(
            step(&attempts, &BTreeMap::new(), 10),
            NextStep::Stop(Stop::Unresolved { state })
        );
    }
}

#[test]
fn requires_action_canceled_deadline_and_exhaustion_stop() {
    let none = BTreeMap::new();
    let action = [fact("ca_big", AttemptState::RequiresAction, None)];
    assert_eq!(
        step(&action, &none, 10),
        NextStep::Stop(Stop::CustomerAction)
    );
    let canceled = [fact(
        "ca_big",
        AttemptState::Canceled,
        Some("issuer_not_available"),
    )];
    assert!(matches!(
        step(&canceled, &none, 10),
        NextStep::Stop(Stop::NotFailed { .. })
    ));
    let failed = [fact(
        "ca_big",
        AttemptState::Failed,
        Some("processing_error"),
    )];
    assert_eq!(
        step(&failed, &none, 1000),
        NextStep::Stop(Stop::DeadlinePassed)
    );
    let all = [
        fact("ca_big", AttemptState::Failed, Some("processing_error")),
        fact(
            "ca_fallback",
            AttemptState::Failed,
            Some("processing_error"),
        ),
        fact("ca_a", AttemptState::Failed, Some("processing_error")),
    ];
    assert!(matches!(
        step(&all, &none, 10),
        NextStep::Stop(Stop::Exhausted { .. })
    ));
    assert_eq!(step(&[], &none, 10), NextStep::Stop(Stop::NoAttempt));
}

fn any_state() -> impl Strategy<Value = AttemptState> {
    proptest::sample::select(AttemptState::ALL.to_vec())
}

fn any_code() -> impl Strategy<Value = Option<String>> {
    proptest::option::of(proptest::sample::select(vec![
        "issuer_not_available".to_owned(),
        "processing_error".to_owned(),
        CREDENTIALS_REFUSED_CODE.to_owned(),
        "insufficient_funds".to_owned(),
        "fraudulent".to_owned(),
        "9".to_owned(),
        "weird".to_owned(),
    ]))
}

fn any_account() -> impl Strategy<Value = String> {
    proptest::sample::select(vec![
        "ca_big".to_owned(),
        "ca_fallback".to_owned(),
        "ca_a".to_owned(),
        "ca_x".to_owned(),
    ])
}

proptest! {
    /// Whatever the history, a failover only ever follows a FAILED latest
    /// attempt with a cascadable code, while nothing is unresolved, before the
    /// deadline, to an eligible account of the plan never tried for this payment.
    #[test]
    fn a_failover_never_breaks_the_hard_rule(
        history in proptest::collection::vec((any_account(), any_state(), any_code()), 0..5),
        ineligible in proptest::collection::btree_map(any_account(), Just("paused".to_owned()), 0..3),
        now_ms in 0i64..2000,
    ) {
        let attempts: Vec<AttemptFact> = history
            .iter()
            .map(|(account, state, code)| fact(account, *state, code.as_deref()))
            .collect();
        if let NextStep::Failover { connector_account, .. } = step(&attempts, &ineligible, now_ms) {
            prop_assert!(now_ms < 1000);
            prop_assert!(attempts.iter().all(|a| a.state.is_terminal()));
            let latest = attempts.last().unwrap();
            prop_assert_eq!(latest.state, AttemptState::Failed);
            let code = latest.failure_code.clone().unwrap_or_default();
            prop_assert!(classify_failure("stripe", &code, &[]).cascade);
            prop_assert!(attempts.iter().all(|a| a.state != AttemptState::Succeeded));
            prop_assert!(attempts.iter().all(|a| a.connector_account != connector_account));
            prop_assert!(!ineligible.contains_key(&connector_account));
            prop_assert!(plan().entries.iter().any(|e| e.connector_account == connector_account));
        }
    }

    /// Following the steps from any first decline tries each account at most
    /// once and ends.
    #[test]
    fn repeated_cascadable_declines_walk_the_plan_once_and_stop(codes in proptest::collection::vec(any_code(), 1..6)) {
        let mut attempts = vec![fact("ca_big", AttemptState::Failed, Some("processing_error"))];
        for code in codes {
            match step(&attempts, &BTreeMap::new(), 10) {
                NextStep::Failover { connector_account, .. } => {
                    attempts.push(fact(&connector_account, AttemptState::Failed, code.as_deref()));
                }
                NextStep::Stop(_) => break,
            }
        }
        prop_assert!(attempts.len() <= plan().entries.len());
    }
}
