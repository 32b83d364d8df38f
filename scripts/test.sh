#!/usr/bin/env bash
# The whole test suite: installs what it needs, checks formatting and lints, then runs the
# unit tests, the real-mount integration tests and the Python package's tests (as root: they
# mount FUSE filesystems).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

bash scripts/setup.sh
cargo fmt --check
cargo clippy --all-targets -- -D warnings
# The Deep Agents reference comparison must run here, not skip.
export AGENTVFS_REQUIRE_REFERENCE=1
cargo test --all-targets
# The Python package (python/): its Deep Agents backend against the daemon just built
# (target/debug/agentvfs), on real mounts.
python3 -m pytest -q -p no:cacheprovider python/tests
