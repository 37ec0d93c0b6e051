#!/usr/bin/env bash
# `make test` runs this first: it installs the system packages some tests need, where this
# machine lets it (apt-get, as root or with passwordless sudo), and says so in one line:
#   chromium                                      the report test renders a real page
#   slurmctld slurmd slurm-client munge           a private single-node SLURM (the tests
#                                                 start its daemons in a temp dir)
#   fuse3 libfuse2                                the slow store of the tiers benchmark (a
#                                                 throttled FUSE mount; its test mounts one)
# Where it cannot (no apt-get, no root, PROVISION=no, apt-get failed) it says why and the
# run goes on: those tests skip, and pytest's closing lines name what to install
# (tests/system.py). Nothing is installed when everything is there already.
set -u
has() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; }

browser=()
has chromium || has chromium-browser || has google-chrome || browser=(chromium)
slurm=()
# only as root: the SLURM tests run as root (slurmd starts the jobs), and elsewhere they skip
if [ "$(id -u)" -eq 0 ]; then
    for p in munged slurmctld slurmd sbatch; do has "$p" || { slurm=(slurmctld slurmd slurm-client munge); break; }; done
fi
fuse=()
{ has fusermount3 && ldconfig -p 2>/dev/null | grep -q 'libfuse\.so\.2'; } || fuse=(fuse3 libfuse2)
[ ${#browser[@]} -eq 0 ] && [ ${#slurm[@]} -eq 0 ] && [ ${#fuse[@]} -eq 0 ] && exit 0

wanted="${browser[*]} ${slurm[*]} ${fuse[*]}"
wanted="${wanted//  / }"
wanted="${wanted# }"
skip() { echo "make test: not installing $wanted ($1); the tests that need them skip"; exit 0; }
[ "${PROVISION:-yes}" = no ] && skip "PROVISION=no"
command -v apt-get >/dev/null 2>&1 || skip "no apt-get here: install them with your package manager"
sudo=()
if [ "$(id -u)" -ne 0 ]; then
    sudo -n true 2>/dev/null || skip "neither root nor passwordless sudo: apt-get install them as root"
    sudo=(sudo -n)
fi
apt() { "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "$@" </dev/null; }
echo "make test: installing $wanted with apt-get (once: a later run finds them)"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
apt update -qq >"$log" 2>&1 || { tail -3 "$log"; skip "apt-get update failed, above"; }
# the browser with its recommends (fonts); SLURM without (8 small packages)
if [ ${#browser[@]} -gt 0 ]; then
    apt install -y -qq "${browser[@]}" >"$log" 2>&1 || { tail -3 "$log"; skip "apt-get install failed, above"; }
fi
if [ ${#slurm[@]} -gt 0 ] || [ ${#fuse[@]} -gt 0 ]; then
    apt install -y -qq --no-install-recommends "${slurm[@]}" "${fuse[@]}" >"$log" 2>&1 || { tail -3 "$log"; skip "apt-get install failed, above"; }
fi
exit 0
