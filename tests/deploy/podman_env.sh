# shellcheck shell=bash
# Sourced by tests/deploy/*.sh: podman as it works on Debian 12 machines without systemd and with
# hybrid cgroups (CI's): runc (crun refuses those cgroups), cgroupfs, file events, and ulimits
# within the machine's hard limits (podman's defaults exceed them). Kept in CACHE_DIR, named by
# CONTAINERS_CONF, so nothing under /etc changes.
# usage: source tests/deploy/podman_env.sh CACHE_DIR
mkdir -p "$1"
CONTAINERS_CONF=$(realpath "$1")/containers.conf
export CONTAINERS_CONF
cat > "$CONTAINERS_CONF" << 'CONF'
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
