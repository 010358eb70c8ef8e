#!/bin/sh
# Moves fp8serve from an image's build stage to its runtime stage, with exactly the shared
# libraries the runtime base lacks (ldd decides; nothing else of the build stage comes along).
#   install-runtime.sh stage BINARY DIR   (build stage) DIR/fp8serve, stripped, DIR/lib/: the
#                                         binary's whole library closure by soname, and this script
#   install-runtime.sh install DIR        (runtime stage) /usr/local/bin/fp8serve; each library
#                                         ldd cannot resolve here from DIR/lib into
#                                         /usr/local/lib/fp8serve; the user fp8serve (uid 10001)
# Both stages must come from the same distribution release (the libraries the runtime base has
# are used as they are). The driver's libcuda.so.1 is never copied: the NVIDIA container
# toolkit mounts the host's at run time.
set -eu
lib_dir=/usr/local/lib/fp8serve

unresolved() {
  ldd /usr/local/bin/fp8serve | awk '$2 == "=>" && $3 == "not" {print $1}' | grep -v '^libcuda\.so\.1$' || true
}

case "$1" in
  stage)
    mkdir -p "$3/lib"
    cp "$0" "$3/install-runtime.sh"
    strip --strip-unneeded -o "$3/fp8serve" "$2"
    ldd "$2" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r soname path; do
      cp -L "$path" "$3/lib/$soname"
    done
    ;;
  install)
    install -m 0755 "$2/fp8serve" /usr/local/bin/fp8serve
    mkdir -p "$lib_dir"
    echo "$lib_dir" > /etc/ld.so.conf.d/fp8serve.conf
    # A copied library can need another one ldd could not see before: repeat until none is missing.
    for _ in 1 2 3 4 5; do
      missing=$(unresolved)
      [ -n "$missing" ] || break
      for soname in $missing; do
        [ -f "$2/lib/$soname" ] || { echo "install-runtime: $soname is missing from the build stage" >&2; exit 1; }
        cp "$2/lib/$soname" "$lib_dir/"
        echo "install-runtime: copied $soname"
      done
      ldconfig
    done
    [ -z "$(unresolved)" ] || { echo "install-runtime: unresolved: $(unresolved)" >&2; exit 1; }
    useradd --uid 10001 --user-group --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin fp8serve
    ;;
  *)
    echo "usage: install-runtime.sh stage BINARY DIR | install DIR" >&2
    exit 2
    ;;
esac
