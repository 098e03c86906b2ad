# Sourced by the suites (scripts/test.sh, test-cross.sh, test-vm.sh): keeps
# the checkout's target directory under /var/tmp between clones on this
# machine, one per host toolchain, so a fresh clone (every CI run is one)
# compiles only the workspace's own crates and takes the dependencies'
# builds, host and cross, from the run before.
#
# Correct across commits by cargo's own fingerprints: a fresh clone's
# sources are all newer than anything built before, so every workspace crate
# is compiled again and every binary linked again; a dependency is taken
# from the cache only when its version, features, profile and compiler are
# the ones it was built with (the fingerprint holds each). Nothing but
# compiler output is trusted across runs: .ci/run removes the packages, the
# release binaries the VM suites look for and the tests' artefacts before
# its suites run.
#
# Only where ./target does not exist yet (a fresh clone): a checkout with a
# target directory of its own keeps it. DROVER_TARGET_CACHE=off turns it
# off; DROVER_TARGET_CACHE_MAX_GIB (default 40) caps it: past it the cache
# is emptied first (a new toolchain, or many feature sets, grow it).
if [ "${DROVER_TARGET_CACHE:-on}" != off ] && [ ! -e target ] && [ ! -L target ]; then
    _toolchain=$(rustc -vV 2>/dev/null | sha256sum | cut -c1-12)
    _cache=/var/tmp/drover-target/host-$_toolchain
    mkdir -p "$_cache"
    _kib=$(du -sk "$_cache" 2>/dev/null | cut -f1)
    if [ "${_kib:-0}" -gt $(( ${DROVER_TARGET_CACHE_MAX_GIB:-40} * 1024 * 1024 )) ]; then
        echo "target cache: $_cache holds $((_kib / 1024 / 1024)) GiB, over the cap; emptied"
        rm -rf "$_cache"
        mkdir -p "$_cache"
    fi
    ln -s "$_cache" target
    echo "target cache: target -> $_cache ($(( ${_kib:-0} / 1024 )) MiB kept from earlier runs)"
    unset _toolchain _cache _kib
fi
