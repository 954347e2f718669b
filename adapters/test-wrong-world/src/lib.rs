//! Test adapter built against a different world (`other:thing@1.0.0`, see `wit/`), so the
//! host refuses it at load time.

wit_bindgen::generate!({
    path: "wit",
    world: "wrong",
});

use exports::other::thing::adapter::Guest;

pub struct WrongWorld;

impl Guest for WrongWorld {
    fn describe() -> String {
        "test-wrong-world".to_string()
    }
}

// Only the wasm build exports the world's symbols, so native builds of several adapters
// can be linked together.
#[cfg(target_arch = "wasm32")]
export!(WrongWorld);
