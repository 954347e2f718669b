//! The lifecycles of the aggregates. Each aggregate has its own state; none of
//! them is a "super status" of the others (seed 001 §2).

use serde::{Deserialize, Serialize};

macro_rules! state_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal, terminal = $terminal:literal;)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(rename_all = "SCREAMING_SNAKE_CASE")]
        pub enum $name {
            $($(#[$vmeta])* $variant,)*
        }

        impl $name {
            /// Every state, in declaration order (for exhaustive table tests).
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// The stored, upper-case name of the state.
            pub fn as_str(&self) -> &'static str {
                match self { $($name::$variant => $text,)* }
            }

            /// Parse a stored name; None for anything else.
            pub fn parse(text: &str) -> Option<Self> {
                match text { $($text => Some($name::$variant),)* _ => None }
            }

            /// Terminal states absorb ordinary events and are never left.
            pub fn is_terminal(&self) -> bool {
                match self { $($name::$variant => $terminal,)* }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

state_enum! {
    /// The merchant's payment intent. UNKNOWN never appears here: while an
    /// attempt is UNKNOWN the order stays PROCESSING.
    OrderState {
        Created => "CREATED", terminal = false;
        Processing => "PROCESSING", terminal = false;
        RequiresAction => "REQUIRES_ACTION", terminal = false;
        /// Funds reserved (manual capture); captures and voids move it on.
        Authorized => "AUTHORIZED", terminal = false;
        Succeeded => "SUCCEEDED", terminal = true;
        /// No legal attempt remains.
        Failed => "FAILED", terminal = true;
        Canceled => "CANCELED", terminal = true;
        Expired => "EXPIRED", terminal = true;
    }
}

state_enum! {
    /// One execution of the payment at one PSP.
    AttemptState {
        Created => "CREATED", terminal = false;
        Submitted => "SUBMITTED", terminal = false;
        Processing => "PROCESSING", terminal = false;
        RequiresAction => "REQUIRES_ACTION", terminal = false;
        Authorized => "AUTHORIZED", terminal = false;
        Succeeded => "SUCCEEDED", terminal = true;
        Failed => "FAILED", terminal = true;
        Canceled => "CANCELED", terminal = true;
        /// We did not learn the outcome. Resolved only by a query with the
        /// original reference; never by a new charge.
        Unknown => "UNKNOWN", terminal = false;
    }
}

state_enum! {
    /// A refund: a separate money movement in the reverse direction.
    RefundState {
        Created => "CREATED", terminal = false;
        Processing => "PROCESSING", terminal = false;
        Unknown => "UNKNOWN", terminal = false;
        Succeeded => "SUCCEEDED", terminal = true;
        Failed => "FAILED", terminal = true;
        Canceled => "CANCELED", terminal = true;
    }
}

state_enum! {
    /// One capture of (part of) an authorized attempt.
    CaptureState {
        Created => "CREATED", terminal = false;
        Processing => "PROCESSING", terminal = false;
        Unknown => "UNKNOWN", terminal = false;
        Succeeded => "SUCCEEDED", terminal = true;
        Failed => "FAILED", terminal = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_name_round_trips() {
        for s in OrderState::ALL {
            assert_eq!(OrderState::parse(s.as_str()), Some(*s));
        }
        for s in AttemptState::ALL {
            assert_eq!(AttemptState::parse(s.as_str()), Some(*s));
        }
        for s in RefundState::ALL {
            assert_eq!(RefundState::parse(s.as_str()), Some(*s));
        }
        for s in CaptureState::ALL {
            assert_eq!(CaptureState::parse(s.as_str()), Some(*s));
        }
    }

    #[test]
    fn unknown_is_never_terminal() {
        assert!(!AttemptState::Unknown.is_terminal());
        assert!(!RefundState::Unknown.is_terminal());
    }
}
