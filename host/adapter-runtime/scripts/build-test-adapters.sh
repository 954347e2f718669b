#!/usr/bin/env bash
# Builds the test adapters into target/adapters/<dir-name>.wasm, the layout the runtime's
# tests read (same as `cargo xtask` produces). Usage: build-test-adapters.sh [dir-name...]
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
cd "$root"
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for d in adapters/test-*/; do names+=("$(basename "$d")"); done
fi
args=()
for n in "${names[@]}"; do args+=(-p "sluice-adapter-$n"); done
cargo build --target wasm32-wasip2 --profile release-wasm "${args[@]}"
mkdir -p "$target/adapters"
for n in "${names[@]}"; do
  cp "$target/wasm32-wasip2/release-wasm/sluice_adapter_${n//-/_}.wasm" "$target/adapters/$n.wasm"
  echo "$target/adapters/$n.wasm"
done
