#!/usr/bin/env bash
# Makes a local Debian bookworm base image without a registry: debootstrap (minbase, trimmed as
# Debian's -slim images are) from the mirror this machine's apt uses, kept as a tarball in
# CACHE_DIR, then `podman import` as IMAGE. A second run reuses both: the image is imported
# again only when the tarball changed, so builds on it keep their layer cache.
# usage: tests/deploy/make_base_image.sh CACHE_DIR IMAGE
set -euo pipefail
cache=$1
image=$2
tarball=$cache/debian-bookworm-slim.tar

# The first Debian mirror apt is configured with (deb822 or one-line format).
apt_mirror() {
  local uri
  uri=$(grep -hs -m1 -E '^URIs:' /etc/apt/sources.list.d/debian.sources | awk '{print $2}')
  [ -n "$uri" ] || uri=$(grep -hs -m1 -E '^deb +(\[[^]]*\] +)?[a-z]+://[^ ]+ +bookworm ' /etc/apt/sources.list \
    | sed -E 's/^deb +(\[[^]]*\] +)?//' | awk '{print $1}')
  [ -n "$uri" ] || { echo "make_base_image: no Debian mirror in /etc/apt/sources.list*" >&2; exit 1; }
  echo "$uri"
}

if [ ! -f "$tarball" ]; then
  mkdir -p "$cache"
  root=$(mktemp -d "$cache/rootfs.XXXXXX")
  trap 'rm -rf "$root"' EXIT
  mirror=$(apt_mirror)
  echo "make_base_image: debootstrap bookworm (minbase) from $mirror"
  debootstrap --variant=minbase bookworm "$root" "$mirror" > "$cache/debootstrap.log" 2>&1 \
    || { tail -20 "$cache/debootstrap.log"; exit 1; }
  # The same suites as this machine (updates, security), so images get its package versions.
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    cp /etc/apt/sources.list.d/debian.sources "$root/etc/apt/sources.list.d/"
    rm -f "$root/etc/apt/sources.list"
  fi
  # Slim: never install documentation, man pages or translations; drop the package lists.
  cat > "$root/etc/dpkg/dpkg.cfg.d/slim" <<'CFG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
CFG
  find "$root/usr/share/doc" -mindepth 2 -not -name copyright -not -type d -delete
  rm -rf "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* \
    "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
    "$root"/var/log/* "$root"/tmp/*
  tar --numeric-owner -C "$root" -cf "$tarball.part" .
  mv "$tarball.part" "$tarball"
fi
sum=$(sha256sum "$tarball" | cut -d' ' -f1)
if [ "$(podman image inspect -f '{{index .Labels "fp8serve.rootfs.sha256"}}' "$image" 2> /dev/null)" != "$sum" ]; then
  podman import --quiet --change 'CMD ["bash"]' --change "LABEL fp8serve.rootfs.sha256=$sum" "$tarball" "$image" > /dev/null
fi
echo "make_base_image: $image ($(du -m "$tarball" | cut -f1) MB tarball)"
