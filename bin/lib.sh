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

ensure_node() {  # the MCP interop and conformance suites run the official clients with Node.js (>= 20) and npm
  if command -v node >/dev/null && command -v npm >/dev/null; then return 0; fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing nodejs and npm (Debian packages)" >&2
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
  fi
  command -v node >/dev/null && command -v npm >/dev/null || {
    echo "Node.js >= 20 and npm are needed for tests/interop and tests/conformance (or leave them out:" \
         "--ignore=tests/interop --ignore=tests/conformance)" >&2; return 1; }
}
