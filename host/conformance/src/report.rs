//! A kit run's result: a table for a terminal, JUnit XML for CI.

use std::fmt::Write as _;
use std::time::Duration;

use quick_junit::{NonSuccessKind, TestCase, TestCaseStatus, TestSuite};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    Failed(String),
    /// Not applicable to this adapter, with why.
    Skipped(String),
}

#[derive(Debug, Clone)]
pub struct Case {
    /// `standard` or `fixtures`.
    pub suite: String,
    pub name: String,
    pub outcome: Outcome,
    pub elapsed: Duration,
}

#[derive(Debug, Clone)]
pub struct Report {
    pub adapter: String,
    pub cases: Vec<Case>,
}

impl Report {
    pub fn new(adapter: String) -> Report {
        Report {
            adapter,
            cases: Vec::new(),
        }
    }

    pub fn push(&mut self, case: Case) {
        self.cases.push(case);
    }

    /// No case failed (skips are not failures).
    pub fn passed(&self) -> bool {
        !self
            .cases
            .iter()
            .any(|c| matches!(c.outcome, Outcome::Failed(_)))
    }

    pub fn failures(&self) -> impl Iterator<Item = (&Case, &str)> {
        self.cases.iter().filter_map(|c| match &c.outcome {
            Outcome::Failed(reason) => Some((c, reason.as_str())),
            _ => None,
        })
    }

    /// One line per case: verdict, suite, name, and the reason of a failure
    /// or a skip; then the totals.
    pub fn table(&self) -> String {
        let mut out = format!("conformance of adapter {}\n", self.adapter);
        for case in &self.cases {
            let (verdict, reason) = match &case.outcome {
                Outcome::Passed => ("PASS", ""),
                Outcome::Failed(r) => ("FAIL", r.as_str()),
                Outcome::Skipped(r) => ("SKIP", r.as_str()),
            };
            let _ = write!(out, "{verdict:<5}{:<10}{}", case.suite, case.name);
            if !reason.is_empty() {
                let _ = write!(out, "\n          -> {reason}");
            }
            out.push('\n');
        }
        let count = |f: fn(&Outcome) -> bool| self.cases.iter().filter(|c| f(&c.outcome)).count();
        let _ = writeln!(
            out,
            "{} passed, {} failed, {} skipped",
            count(|o| *o == Outcome::Passed),
            count(|o| matches!(o, Outcome::Failed(_))),
            count(|o| matches!(o, Outcome::Skipped(_))),
        );
        out
    }

    /// JUnit XML: one test suite per kit suite.
    pub fn junit(&self) -> Result<String, quick_junit::SerializeError> {
        let mut report = quick_junit::Report::new(format!("sluice adapter test {}", self.adapter));
        for suite_name in ["standard", "fixtures"] {
            let mut suite = TestSuite::new(suite_name);
            for case in self.cases.iter().filter(|c| c.suite == suite_name) {
                let status = match &case.outcome {
                    Outcome::Passed => TestCaseStatus::success(),
                    Outcome::Failed(reason) => {
                        let mut status = TestCaseStatus::non_success(NonSuccessKind::Failure);
                        status.set_message(reason.clone());
                        status
                    }
                    Outcome::Skipped(reason) => {
                        let mut status = TestCaseStatus::skipped();
                        status.set_message(reason.clone());
                        status
                    }
                };
                let mut test = TestCase::new(case.name.clone(), status);
                test.set_classname(format!("{}.{suite_name}", self.adapter));
                test.set_time(case.elapsed);
                suite.add_test_case(test);
            }
            report.add_test_suite(suite);
        }
        report.to_string()
    }
}
