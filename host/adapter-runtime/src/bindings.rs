//! Host bindings generated from the adapter contract (`wit/psp-adapter.wit`).

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "psp-adapter",
    // Exports are called on a fiber (`call_async`), so a guest yields to the scheduler
    // at every epoch tick; the host's own imports stay synchronous.
    exports: { default: async },
    additional_derives: [PartialEq, Eq, serde::Serialize, serde::Deserialize],
});
