#!/usr/bin/env bash
# The whole test suite: installs what it needs, checks formatting and lints, then runs the
# unit tests and the real-mount integration tests (as root: they mount FUSE filesystems).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

bash scripts/setup.sh
cargo fmt --check
cargo clippy --all-targets -- -D warnings
# The Deep Agents reference comparison must run here, not skip.
export AGENTVFS_REQUIRE_REFERENCE=1
cargo test --all-targets
