//! Test support shared by the runtime's and the server's tests (not used by the host).

/// `wasm` with every occurrence of the exported interface name
/// `sluice:psp/adapter@{from}` rewritten to `@{to}` (same length, so the binary stays
/// well-formed): the same component as built against another contract version. Panics
/// when the versions differ in length or the name does not occur; test input only.
pub fn with_contract_version(wasm: &[u8], from: &str, to: &str) -> Vec<u8> {
    let from = format!("{}@{from}", crate::CONTRACT_INTERFACE);
    let to = format!("{}@{to}", crate::CONTRACT_INTERFACE);
    assert_eq!(to.len(), from.len(), "same-length versions only");
    let mut out = Vec::with_capacity(wasm.len());
    let mut rest = wasm;
    let mut replaced = 0;
    while let Some(at) = memchr::memmem::find(rest, from.as_bytes()) {
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(to.as_bytes());
        rest = &rest[at + from.len()..];
        replaced += 1;
    }
    out.extend_from_slice(rest);
    assert!(replaced > 0, "export name not found in the component");
    out
}
