#!/usr/bin/env bash
# Celeris one-click launcher (Linux/macOS).
#
#   ./launch.sh [app args]          start the playground + API (app.py) on http://localhost:7860
#   ./launch.sh test [pytest args]  install the dev requirements and run the whole test suite
#   ./launch.sh --help              the options, at once (installs nothing)
#
# Creates .venv with python3 when it is missing and (re)installs requirements only when
# requirements*.txt changed since the last successful install (a sha256 stamp in .venv/).
# Celeris itself is installed editable (pip install -e .), which gives the `celeris` command
# (.venv/bin/celeris) and `python -m celeris` from any directory. Nothing is downloaded except
# pip packages from PyPI.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

export GRADIO_ANALYTICS_ENABLED=False
export HF_HUB_DISABLE_TELEMETRY=1
export PYTHONUNBUFFERED=1

VENV=".venv"
PY="$VENV/bin/python"
RUNTIME_STAMP="$VENV/.celeris-req-hash"
DEV_STAMP="$VENV/.celeris-req-hash-dev"

# Prints "ok" when the stamp file ($2) holds the current sha256 of requirements*.txt; with
# "write" as $1 it stores that hash instead. Same logic as launch.bat.
HASH_PY='import glob, hashlib, os, sys
h = hashlib.sha256()
for name in sorted(glob.glob("requirements*.txt")):
    h.update(name.encode() + b"\0")
    with open(name, "rb") as f:
        h.update(f.read())
digest = h.hexdigest()
mode, stamp = sys.argv[1], sys.argv[2]
if mode == "write":
    with open(stamp, "w") as f:
        f.write(digest + "\n")
else:
    old = open(stamp).read().strip() if os.path.exists(stamp) else ""
    print("ok" if old == digest else "stale")'

log() { printf '[celeris] %s\n' "$*"; }
die() { printf '[celeris] error: %s\n' "$*" >&2; exit 1; }

usage() {
    cat <<'EOF'
usage: ./launch.sh [OPTIONS]            start the playground and the OpenAI API on one port
       ./launch.sh test [PYTEST ARGS]   install the dev requirements and run the tests
       ./launch.sh --help               this help (installs nothing)

The first start creates .venv and installs requirements.txt (a few minutes); later starts
reuse it. OPTIONS go to app.py; the common ones:

  --port N          port of the playground and the API, 1-65535 (default 7860;
                    env GRADIO_SERVER_PORT)
  --host ADDR       interface to listen on (default 127.0.0.1, this machine only;
                    0.0.0.0: every interface, then set an API key; env GRADIO_SERVER_NAME)
  --model DIR       model directory or hub id (default models/celeris-tiny-bd)
  --models DIR,DIR  the models a visitor may pick in the Model tab
  --api-key KEY     require this key on /v1 and as the playground's password
                    (better: env CELERIS_API_KEY, kept out of the process list)
  --device DEVICE   auto (default), cpu or cuda

Every option: .venv/bin/python app.py --help (once .venv exists).
EOF
}

ensure_venv() {
    if [ -x "$PY" ]; then
        return
    fi
    command -v python3 >/dev/null 2>&1 || die "python3 not found; install Python 3.10 or newer"
    python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
        || die "Python 3.10 or newer is required (found $(python3 -V 2>&1))"
    log "creating virtual environment in $VENV ($(python3 -V 2>&1))"
    python3 -m venv "$VENV" \
        || die "could not create $VENV (on Debian/Ubuntu: apt-get install python3-venv)"
}

# ensure_requirements FILE STAMP...: pip install -r FILE unless the first STAMP is current;
# on success every STAMP given is written (a dev install also satisfies the runtime one).
ensure_requirements() {
    local file="$1"; shift
    if [ "$("$PY" -c "$HASH_PY" check "$1")" = "ok" ]; then
        return
    fi
    log "installing $file into $VENV (only when requirements change; first time takes a minute)"
    "$PY" -m pip install --disable-pip-version-check --progress-bar on -r "$file"
    local stamp
    for stamp in "$@"; do
        "$PY" -c "$HASH_PY" write "$stamp"
    done
    log "requirements up to date"
}

playground_port() {
    local port="${GRADIO_SERVER_PORT:-7860}" prev=""
    for arg in "$@"; do
        case "$arg" in
            --port=*) port="${arg#--port=}" ;;
            *) [ "$prev" = "--port" ] && port="$arg" ;;
        esac
        prev="$arg"
    done
    printf '%s' "$port"
}

# The celeris package, editable: code changes need no reinstall, only a missing command does.
ensure_package() {
    if [ -x "$VENV/bin/celeris" ]; then
        return
    fi
    log "installing the celeris package (editable) into $VENV"
    "$PY" -m pip install --disable-pip-version-check --no-deps -e .
}

run_tests() {
    ensure_requirements requirements-dev.txt "$DEV_STAMP" "$RUNTIME_STAMP"
    ensure_package
    log "running: python -m pytest $*"
    set +e
    "$PY" -m pytest "$@"
    local rc=$?
    set -e
    log "pytest exited with code $rc"
    exit "$rc"
}

run_app() {
    ensure_requirements requirements.txt "$RUNTIME_STAMP"
    ensure_package
    local url="http://localhost:$(playground_port "$@")"
    log "starting Celeris; the playground will be at $url (Ctrl+C to stop)"
    exec "$PY" app.py "$@"
}

# check_app_args ARGS...: --help answers and a bad --port is refused before any install.
check_app_args() {
    local arg port
    for arg in "$@"; do
        case "$arg" in
            -h|--help) usage; exit 0 ;;
        esac
    done
    port="$(playground_port "$@")"
    if ! [[ "$port" =~ ^[0-9]{1,5}$ ]] || [ "$((10#$port))" -lt 1 ] \
            || [ "$((10#$port))" -gt 65535 ]; then
        printf '[celeris] error: --port must be in [1, 65535], got %s\n' "$port" >&2
        exit 2
    fi
}

main() {
    if [ "${1:-}" = "test" ]; then
        ensure_venv
        shift
        run_tests "$@"
    fi
    check_app_args "$@"
    ensure_venv
    run_app "$@"
}

main "$@"
