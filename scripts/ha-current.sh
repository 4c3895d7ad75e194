#!/usr/bin/env bash
# The integration's tests (tests_ha/) and its strict type check on the newest Home Assistant.
#
# Home Assistant 2026.3 and later need Python 3.14, which neither pip nor pyenv offer on most
# hosts. This script makes a Debian sid chroot (sid ships python3.14), one venv in it per Home
# Assistant release, and runs `mypy` and `pytest` there as `make typecheck-ha` and `make unit-ha`
# do. The project, the server's venv (the tests start the real server) and the model cache are
# bind-mounted at their own paths, in a private mount namespace that ends with the script.
#
# Usage: sudo scripts/ha-current.sh [PYTEST_ARGS...]     (from the project; `make test-ha-current`)
#   PYTEST_ARGS replace the default selection `tests_ha`, e.g. tests_ha/test_init.py -x
#
# Environment:
#   HA_VERSION          the release to test (default: the newest on PyPI)
#   HA_CHROOT           where the chroot lives (default: /srv/fairlane-ha-current)
#   DEBIAN_MIRROR       (default: http://deb.debian.org/debian)
#   HA_CURRENT_OUT      logs: one folder per run (default: /var/tmp/fairlane-ha-current)
#   FAIRLANE_MODEL_DIR  the server's model cache (default: ~/.cache/fairlane/models)
#   HA_SKIP_TYPECHECK=1, HA_SKIP_TESTS=1
#
# What it takes: root (debootstrap, chroot, mounts), apt (for debootstrap if missing), the
# Debian mirror and PyPI, and `make install` done (.venv). First run: ~3 min for the chroot and
# ~3 min for the release's venv (2 GB of disk in all); later runs reuse both. The tests take
# ~11 min on 2 idle cores. Exit status: 0 passed, 1 mypy or pytest failed, 2 set-up failed.
#
# The pins (scripts/ha_current/pins.py): tests_ha/requirements.txt as it is, except that what
# Home Assistant pins is taken at its version and what its integrations the tests use require
# now is added, each change printed. The test helper (pytest-homeassistant-custom-component) is
# the release made for this Home Assistant; when none is out yet, the newest one made for an
# earlier release, with scripts/ha_current/helper_first.py loaded before it (says what it did).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
PROJECT=$(cd "$HERE/.." && pwd)
CHROOT=${HA_CHROOT:-/srv/fairlane-ha-current}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
OUT=${HA_CURRENT_OUT:-/var/tmp/fairlane-ha-current}
PACKAGES="python3.14 python3.14-venv python3.14-dev build-essential pkg-config ca-certificates"
VENVS=/opt/ha-venvs
RECIPE=1  # bump when the way a venv is made changes: every venv is made again

say() { printf '\n==> [%s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { printf '\nERROR: %s\n' "$*" >&2; exit 2; }

# --- 1. On the host: root, tools, one run at a time, then a private mount namespace. --------------
if [ "${_FAIRLANE_HA_NS:-}" != 1 ]; then
    [ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot, mounts): sudo $0 $*"
    [ -x "$PROJECT/.venv/bin/fairlane" ] || die "no $PROJECT/.venv: run make install first"
    for tool in debootstrap unshare flock; do
        command -v "$tool" >/dev/null && continue
        say "Installing debootstrap and util-linux"
        apt-get update -q >/dev/null && apt-get install -y -q debootstrap util-linux >/dev/null
    done
    mkdir -p "$(dirname "$CHROOT")" "$OUT"
    exec 9>>"$CHROOT.lock"
    flock 9
    export _FAIRLANE_HA_NS=1
    exec unshare --mount --propagation private bash "$0" "$@"
fi

in_chroot() {  # a command in the chroot with a clean environment (and the host's proxy, CAs)
    chroot "$CHROOT" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 \
        DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_PROGRESS_BAR=off \
        SSL_CERT_FILE=/etc/ssl/host-ca.crt PIP_CERT=/etc/ssl/host-ca.crt \
        ${https_proxy:+https_proxy=$https_proxy} ${http_proxy:+http_proxy=$http_proxy} \
        ${PIP_INDEX_URL:+PIP_INDEX_URL=$PIP_INDEX_URL} "$@"
}

# shellcheck disable=SC2329  # (the EXIT trap calls it)
stop_leftovers() {  # a server a test left running in the chroot
    local pid
    for pid in /proc/[0-9]*; do
        [ "$(readlink "$pid/root" 2>/dev/null)" = "$CHROOT" ] && kill -KILL "${pid#/proc/}" 2>/dev/null
    done
    return 0
}
trap stop_leftovers EXIT

# --- 2. The chroot: Debian sid with python3.14. ---------------------------------------------------
START=$SECONDS
if [ ! -f "$CHROOT/.debootstrapped" ]; then
    say "Making the chroot $CHROOT (debootstrap of Debian sid, ~2 min)"
    rm -rf --one-file-system "$CHROOT"
    debootstrap --variant=minbase sid "$CHROOT" "$MIRROR" > "$OUT/debootstrap.log" 2>&1 ||
        { tail -20 "$OUT/debootstrap.log" >&2; die "debootstrap failed ($OUT/debootstrap.log)"; }
    touch "$CHROOT/.debootstrapped"
fi
mount -t proc proc "$CHROOT/proc"
# /sys too: ONNX Runtime and llama.cpp read the CPU's topology from it.
mount --rbind /sys "$CHROOT/sys" && mount --make-rslave "$CHROOT/sys"
mount --rbind /dev "$CHROOT/dev" && mount --make-rslave "$CHROOT/dev"
cp /etc/resolv.conf "$CHROOT/etc/resolv.conf"
mkdir -p "$CHROOT/etc/ssl"
cp -L /etc/ssl/certs/ca-certificates.crt "$CHROOT/etc/ssl/host-ca.crt" 2>/dev/null ||
    ln -sf certs/ca-certificates.crt "$CHROOT/etc/ssl/host-ca.crt"
# Sid's mirror may serve a Release file past its Valid-Until for a while: its packages are fine.
echo 'Acquire::Check-Valid-Until "false";' > "$CHROOT/etc/apt/apt.conf.d/80fairlane"
if [ "$(cat "$CHROOT/.packages" 2>/dev/null)" != "$PACKAGES" ]; then
    say "Installing $PACKAGES in the chroot"
    # shellcheck disable=SC2086  # (a list of packages)
    { in_chroot apt-get update -q && in_chroot apt-get install -y -q --no-install-recommends $PACKAGES; } \
        > "$OUT/apt.log" 2>&1 || { tail -20 "$OUT/apt.log" >&2; die "apt-get failed ($OUT/apt.log)"; }
    echo "$PACKAGES" > "$CHROOT/.packages"
fi
PY=$(in_chroot python3.14 -c 'import platform; print(platform.python_version())') ||
    die "python3.14 does not run in the chroot"

# --- 3. The release's venv: Home Assistant, its test helper, the project's pins. -----------------
mkdir -p "$CHROOT$VENVS/scripts"
cp "$HERE"/ha_current/*.py "$CHROOT$VENVS/scripts/"
if [ ! -x "$CHROOT$VENVS/tools/bin/python" ]; then
    { in_chroot python3.14 -m venv "$VENVS/tools" && in_chroot "$VENVS/tools/bin/pip" install -q packaging; } ||
        die "could not make the tools venv in the chroot"
fi
if [ -z "${HA_VERSION:-}" ]; then
    HA_VERSION=$(in_chroot "$VENVS/tools/bin/python" "$VENVS/scripts/pins.py" newest) ||
        die "could not ask PyPI for the newest homeassistant: set HA_VERSION"
fi
read -r HELPER MADE_FOR < <(in_chroot "$VENVS/tools/bin/python" "$VENVS/scripts/pins.py" helper "$HA_VERSION") ||
    die "no pytest-homeassistant-custom-component for Home Assistant $HA_VERSION"
VENV=$VENVS/$HA_VERSION
RUN=$OUT/$HA_VERSION-$(date +%Y%m%d-%H%M%S)
mkdir -p "$RUN"
KEY=$(cat "$PROJECT/tests_ha/requirements.txt" "$HERE"/ha_current/*.py - <<<"$RECIPE $PY $HELPER" | sha256sum | cut -c1-16)
if [ "$(cat "$CHROOT$VENV/.key" 2>/dev/null)" != "$KEY" ]; then
    say "Making the venv for Home Assistant $HA_VERSION (~3 min)"
    rm -rf "${CHROOT:?}$VENV"
    cp "$PROJECT/tests_ha/requirements.txt" "$CHROOT$VENVS/requirements-project.txt"
    {
        in_chroot python3.14 -m venv "$VENV" &&
        in_chroot "$VENV/bin/pip" install "homeassistant==$HA_VERSION" packaging &&
        in_chroot "$VENV/bin/python" "$VENVS/scripts/pins.py" requirements "$HA_VERSION" "$HELPER" \
            "$VENVS/requirements-project.txt" "$VENV/requirements.txt" "$VENV/pin-changes.txt" &&
        in_chroot "$VENV/bin/pip" install -r "$VENV/requirements.txt" \
            -c "$(in_chroot "$VENV/bin/python" "$VENVS/scripts/pins.py" constraints)" &&
        in_chroot "$VENV/bin/pip" install --no-deps "pytest-homeassistant-custom-component==$HELPER"
    } > "$RUN/pip.log" 2>&1 || { tail -30 "$RUN/pip.log" >&2; die "the venv could not be made ($RUN/pip.log)"; }
    echo "$KEY" > "$CHROOT$VENV/.key"
fi
sed 's/^/    pin: /' "$CHROOT$VENV/pin-changes.txt"
if [ "$MADE_FOR" != "$HA_VERSION" ]; then
    printf '    WARNING: no test helper is made for %s yet: %s (made for %s), with helper_first.py\n' \
        "$HA_VERSION" "$HELPER" "$MADE_FOR"
fi

# --- 4. The mounts: the project, the server's venv and interpreter, the models, the logs. --------
bind() {  # PATH MODE: the same path inside the chroot
    [ -e "$1" ] || return 0
    mkdir -p "$CHROOT$1"
    mount --bind "$1" "$CHROOT$1"
    [ "$2" = rw ] || mount -o remount,bind,ro "$CHROOT$1"
}
bind "$PROJECT" rw
bind "$OUT" rw
SERVER_PYTHON=$(realpath "$PROJECT/.venv/bin/python")
BASE=$(dirname "$(dirname "$SERVER_PYTHON")")  # the interpreter the venv was made from (pyenv)
case $BASE in "$PROJECT"/*) ;; *) bind "$BASE" ro ;; esac
MODELS=${FAIRLANE_MODEL_DIR:-$HOME/.cache/fairlane/models}
bind "$MODELS" rw
in_chroot "$PROJECT/.venv/bin/python" -c 'import fairlane' || die "the server's venv does not run in the chroot"

# shellcheck disable=SC2016  # ($0 and $@ are the inner shell's)
run() {  # a tool of the release's venv, in the project, with what `make unit-ha` exports
    in_chroot PATH="$VENV/bin:/usr/bin:/bin" OMP_NUM_THREADS=1 FAIRLANE_MODEL_DIR="$MODELS" \
        COVERAGE_FILE=/tmp/ha-current.coverage PYTHONPATH="$VENVS/scripts" \
        /bin/sh -c 'cd "$0" && exec "$@"' "$PROJECT" "$@"
}

say "Home Assistant $HA_VERSION, pytest-homeassistant-custom-component $HELPER, Python $PY; logs: $RUN"
STATUS=0
if [ "${HA_SKIP_TYPECHECK:-}" != 1 ]; then
    say "mypy --config-file tests_ha/mypy.ini (strict, against this release's types)"
    # --python-version: this release's own code is 3.14 syntax (tests_ha/mypy.ini says 3.13).
    if run mypy --config-file tests_ha/mypy.ini --python-version "${PY%.*}" \
            --cache-dir "/var/cache/ha-current-mypy-$HA_VERSION" > "$RUN/mypy.txt" 2>&1; then
        echo "    $(tail -1 "$RUN/mypy.txt")"
    else
        STATUS=1; tail -40 "$RUN/mypy.txt"
    fi
fi
if [ "${HA_SKIP_TESTS:-}" != 1 ]; then
    FIRST=()
    [ "$MADE_FOR" = "$HA_VERSION" ] || FIRST=(-p helper_first)
    [ $# -gt 0 ] || set -- tests_ha
    say "pytest -c tests_ha/pytest.ini ${FIRST[*]} $*"
    run pytest -c tests_ha/pytest.ini -q "${FIRST[@]}" --log-file "$RUN/ha-log.txt" \
        --log-file-level WARNING "$@" 2>&1 | tee "$RUN/pytest.txt" || STATUS=1
    # What Home Assistant says of the integration: deprecations are next year's failures.
    grep -i "custom integration 'fairlane'" "$RUN/ha-log.txt" 2>/dev/null |
        grep -i -E 'deprecat|will stop working|no longer|removed in' | sort | uniq -c > "$RUN/deprecations.txt" || true
    if [ -s "$RUN/deprecations.txt" ]; then
        say "Home Assistant warns about the integration:"; head -20 "$RUN/deprecations.txt"
    fi
fi
say "Done in $(( SECONDS - START )) s: Home Assistant $HA_VERSION, $([ $STATUS = 0 ] && echo PASSED || echo FAILED); logs: $RUN"
exit $STATUS
