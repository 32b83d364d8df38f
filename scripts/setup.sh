#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian machine (run as root):
# shell tools the tests drive, PostgreSQL (the tests run a private server of their own, never
# the system's), the pjdfstest POSIX conformance suite, the official MCP Python SDK (the
# control socket's MCP test runs a real MCP client), Deep Agents and pytest (the Python
# package's tests).
set -euo pipefail

need_apt=()
# bwrap: the execute tool's sandbox (with setpriv to drop to its uid); tmux: a real terminal
# for the `agentvfs run` tests.
for tool in setfattr:attr git:git unshare:util-linux setpriv:util-linux tar:tar bwrap:bubblewrap tmux:tmux; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || need_apt+=("${tool##*:}")
done
# The race tests run Python as an unprivileged user: the system's interpreter, not one in root's home.
[[ -x /usr/bin/python3 ]] || need_apt+=(python3)
# The postgres route's tests start a private PostgreSQL server from Debian's packages.
compgen -G '/usr/lib/postgresql/*/bin/pg_ctl' >/dev/null || need_apt+=(postgresql)
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

# pip_install CHECK PACKAGE: installs PACKAGE unless the Python snippet CHECK succeeds.
pip_install() {
  python3 -c "$1" >/dev/null 2>&1 && return 0
  if ! python3 -m pip --version >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q python3 python3-pip
  fi
  # Debian marks its Python as externally managed; these test clients need no isolation.
  python3 -m pip install -q "$2" || python3 -m pip install -q --break-system-packages "$2"
}

# Deep Agents 0.7.32's own file tools are the reference the tool texts are compared with
# (tests/reference/; scripts/test.sh makes that comparison mandatory).
pip_install 'import importlib.metadata as m; assert m.version("deepagents") == "0.7.32"' deepagents==0.7.32
# LangGraph's PostgresStore and its driver: the postgres route's langgraph layout is tested
# against the real store (python/tests/test_langgraph_store.py).
pip_install 'import importlib.metadata as m; assert m.version("langgraph-checkpoint-postgres") == "3.2.0"' langgraph-checkpoint-postgres==3.2.0
pip_install 'import importlib.metadata as m; assert m.version("psycopg") == "3.3.9"; assert m.version("psycopg-binary") == "3.3.9"' 'psycopg[binary]==3.3.9'
# The official MCP Python SDK: the control socket's MCP test runs a real MCP client.
pip_install 'import mcp' mcp
# pytest runs the Python package's tests (python/tests: the Deep Agents backend on a real mount).
pip_install 'import pytest' pytest
