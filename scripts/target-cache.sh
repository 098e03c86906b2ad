# Sourced by the suites (scripts/test.sh, test-cross.sh, test-vm.sh): keeps
# the checkout's target directory under /var/tmp between clones on this
# machine, one per host toolchain, so a fresh clone (every CI run is one)
# compiles only what changed since the run before, host and cross.
#
# Correct across commits: scripts/source-mtimes.py gives each source whose
# content (SHA-256) is the one the run before had that run's time again, and
# every other source the time of now, so cargo's own fingerprints (file
# times against the time each crate was built; versions, features, profile
# and compiler for the rest) rebuild exactly what changed. Runs take the
# cache one at a time (a lock held until the run's shell exits), so no run
# builds over another's binaries. Nothing but compiler output is trusted
# across runs: .ci/run removes the packages, the release binaries the VM
# suites look for and the tests' artefacts before its suites run.
#
# Only where ./target does not exist yet (a fresh clone): a checkout with a
# target directory of its own keeps it. DROVER_TARGET_CACHE=off turns it
# off; DROVER_TARGET_CACHE_MAX_GIB (default 40) caps it: past it the cache
# is emptied first (a new toolchain, or many feature sets, grow it).
# DROVER_TARGET_CACHE_WAIT (seconds, default 1800) is how long a run waits
# for another to let the cache go before it builds in a target of its own.
_cache=
if [ "${DROVER_TARGET_CACHE:-on}" != off ] && [ ! -e target ] && [ ! -L target ]; then
    _toolchain=$(rustc -vV 2>/dev/null | sha256sum | cut -c1-12)
    _cache=/var/tmp/drover-target/host-$_toolchain
    mkdir -p "$_cache"
    # Held by this shell and what it starts, until they exit (a run that
    # already holds it, this shell or its parent, takes it again).
    if [ -z "${DROVER_TARGET_LOCK_FD:-}" ] || [ "$(readlink "/proc/self/fd/$DROVER_TARGET_LOCK_FD" 2>/dev/null)" != "$_cache.lock" ]; then
        exec {DROVER_TARGET_LOCK_FD}>"$_cache.lock"
        export DROVER_TARGET_LOCK_FD
    fi
    if ! flock -n "$DROVER_TARGET_LOCK_FD"; then
        echo "target cache: another run holds $_cache.lock; waiting for it"
        if ! flock -w "${DROVER_TARGET_CACHE_WAIT:-1800}" "$DROVER_TARGET_LOCK_FD"; then
            _holders=$(for _fd in /proc/[0-9]*/fd/*; do [ "$(readlink "$_fd" 2>/dev/null)" = "$_cache.lock" ] && echo "${_fd#/proc/}"; done | cut -d/ -f1 | sort -u | tr '\n' ' ')
            echo "target cache: still held (processes: ${_holders:-none found}); building in a target of this checkout's own"
            exec {DROVER_TARGET_LOCK_FD}>&-
            _cache=
        fi
    fi
fi
if [ -n "${_cache:-}" ]; then
    _kib=$(du -sk "$_cache" 2>/dev/null | cut -f1)
    if [ "${_kib:-0}" -gt $(( ${DROVER_TARGET_CACHE_MAX_GIB:-40} * 1024 * 1024 )) ]; then
        echo "target cache: $_cache holds $((_kib / 1024 / 1024)) GiB, over the cap; emptied"
        rm -rf "$_cache" "$_cache.sources"
        mkdir -p "$_cache"
    fi
    ln -s "$_cache" target
    echo "target cache: target -> $_cache ($(( ${_kib:-0} / 1024 )) MiB kept from earlier runs)"
    if command -v python3 >/dev/null && [ -e .git ]; then
        python3 scripts/source-mtimes.py "$_cache.sources"
    else
        # Without the manifest's help every source is new to the cache.
        git ls-files -z 2>/dev/null | xargs -0 -r touch --
    fi
fi
unset _toolchain _cache _kib _holders _fd
