# Shared by bin/run and bin/test: a virtualenv with the project installed, and redis-server.

ensure_venv() {  # ensure_venv EXTRAS (e.g. "test" or "")
  local spec="."
  [ -n "$1" ] && spec=".[$1]"
  if [ ! -x .venv/bin/python ]; then
    "${PYTHON:-python3}" -m venv .venv
  fi
  local stamp=".venv/.installed-${1:-base}"
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e "$spec"
    touch "$stamp"
  fi
}

ensure_redis_server() {
  command -v redis-server >/dev/null && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing redis-server (Debian package)" >&2
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  fi
  command -v redis-server >/dev/null || { echo "redis-server is needed: install it (apt-get install redis-server)" >&2; return 1; }
}

ensure_npm() {  # the MCP interop and conformance suites install the official clients, and the Node 22 they run on, with npm
  command -v npm >/dev/null && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing npm (Debian package)" >&2
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >/dev/null
  fi
  command -v npm >/dev/null || {
    echo "npm is needed for tests/interop and tests/conformance (or leave them out:" \
         "--ignore=tests/interop --ignore=tests/conformance)" >&2; return 1; }
}
