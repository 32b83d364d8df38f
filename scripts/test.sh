#!/usr/bin/env bash
# The whole test suite: installs what it needs, checks formatting and lints, then runs the
# unit tests and the real-mount integration tests (as root: they mount FUSE filesystems).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

bash scripts/setup.sh
cargo fmt --check
cargo clippy --all-targets -- -D warnings
cargo test --all-targets
