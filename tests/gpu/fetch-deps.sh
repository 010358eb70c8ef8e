#!/usr/bin/env bash
# Downloads, here, the Debian packages tests/gpu/run.sh needs on a GPU machine that cannot reach
# a package registry (the build's headers and the few shared libraries they come with) into
# .gpu-deps/ (git-ignored, 17 MB). run.sh unpacks them into a private prefix, never into /, when the
# machine lacks any of the headers or pkg-config.
#   tests/gpu/fetch-deps.sh      then carry .gpu-deps to the GPU machine with the checkout
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .gpu-deps
cd .gpu-deps
packages=(
  libboost1.74-dev nlohmann-json3-dev catch2
  libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
  libsentencepiece-dev libsentencepiece0 libprotobuf-lite32
  libpcre2-dev libpcre2-8-0 libssl-dev libssl3
  pkgconf-bin libpkgconf3  # pkg-config for pkg_check_modules (pcre2, sentencepiece): run.sh names it
)
apt-get download "${packages[@]}" 2> >(grep -v "unsandboxed" >&2)
du -sh .
