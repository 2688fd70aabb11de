# Shared by bin/run and bin/test: a virtualenv with the project installed, and the Debian packages
# the tests need (redis-server; npm and chromium for some suites), installed when missing and root.

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

# Debian packages, as root only; the package lists are updated once per run (a fresh machine lacks
# redis-server, npm and chromium alike, and each update takes seconds).
apt_install() {  # apt_install PACKAGE...; fails when not root or apt-get fails
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null || return 1
  echo "installing $* (Debian packages)" >&2
  if [ -z "${_APT_UPDATED:-}" ]; then
    apt-get update -qq >/dev/null || return 1
    _APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

ensure_redis_server() {
  command -v redis-server >/dev/null && return 0
  apt_install redis-server || true
  command -v redis-server >/dev/null || { echo "redis-server is needed: install it (apt-get install redis-server)" >&2; return 1; }
}

ensure_npm() {  # the MCP interop and conformance suites install the official clients, and the Node 22 they run on, with npm
  command -v npm >/dev/null && return 0
  apt_install npm || true
  command -v npm >/dev/null || {
    echo "npm is needed for tests/interop and tests/conformance (or leave them out:" \
         "--ignore=tests/interop --ignore=tests/conformance)" >&2; return 1; }
}

ensure_chromium() {  # the browser tests (tests/browser) drive Debian's chromium through Playwright, at this path
  local path="${CARMY_CHROMIUM:-/usr/bin/chromium}"
  [ -x "$path" ] && return 0
  if [ -z "${CARMY_CHROMIUM:-}" ]; then apt_install chromium || true; fi
  [ -x "$path" ] || {
    echo "chromium is needed for tests/browser: install Debian's (apt-get install chromium), or set" \
         "CARMY_CHROMIUM to another Chromium's path (or leave them out: --ignore=tests/browser)" >&2; return 1; }
}
