#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian machine (run as root):
# shell tools the tests drive, and the pjdfstest POSIX conformance suite.
set -euo pipefail

need_apt=()
for tool in setfattr:attr git:git unshare:util-linux setpriv:util-linux tar:tar; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || need_apt+=("${tool##*:}")
done
# pjdfstest links against libacl.
[[ -e /usr/include/sys/acl.h ]] || need_apt+=(libacl1-dev)
if ((${#need_apt[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q "${need_apt[@]}"
fi

if ! command -v pjdfstest >/dev/null 2>&1 && [[ ! -x "$HOME/.cargo/bin/pjdfstest" ]]; then
  cargo install pjdfstest --version 0.2.2 --locked
fi
