//! Host bindings generated from the adapter contract (`wit/psp-adapter.wit`).

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "psp-adapter",
    additional_derives: [PartialEq, Eq, serde::Serialize, serde::Deserialize],
});
