#!/usr/bin/env bash
# Builds docker/Dockerfile, the CUDA image, where NVIDIA's nvidia/cuda images cannot be pulled:
# its bases are stand-ins made from NVIDIA's PyPI wheels (tests/deploy/Dockerfile.cuda-wheels)
# on the local Debian base. Then runs the image's binary without a GPU: the CUDA libraries
# load, and it serves a completion on the CPU backend. Not in .ci/run: it downloads ~700 MB of
# wheels and compiles CUDA code. Needs what tests/deploy/test_container.sh needs.
# usage: tests/deploy/build_cuda_image.sh [CUDA_ARCHITECTURES, default "80;90"]
set -euo pipefail
cd "$(dirname "$0")/../.."
archs=${1:-80;90}
cache=build/deploy-cache
base_image=localhost/fp8serve-test/debian:bookworm-slim
image=localhost/fp8serve-test/fp8serve:cuda
# shellcheck source=tests/deploy/podman_env.sh
source tests/deploy/podman_env.sh "$cache"

tests/deploy/make_base_image.sh "$cache" "$base_image"
# The toolkit of this project's CUDA 13.0.2, downloaded here (pip as this machine has it set up).
wheels=$cache/cuda-wheels
"${PYTHON:-.venv/bin/python}" -m pip download -q --disable-pip-version-check --no-deps -d "$wheels" \
  nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-cccl==13.0.85 \
  nvidia-cuda-runtime==13.0.96 nvidia-cublas==13.1.0.3 cmake==3.28.3
for target in devel runtime; do
  echo "== CUDA $target stand-in (NVIDIA's PyPI wheels)"
  podman build --format docker --build-arg BASE_IMAGE="$base_image" --target "$target" \
    -f tests/deploy/Dockerfile.cuda-wheels -t "localhost/fp8serve-test/cuda:13.0.2-$target" "$wheels" \
    > "$cache/cuda-$target.log" 2>&1 || { tail -30 "$cache/cuda-$target.log"; exit 1; }
done
echo "== docker/Dockerfile (CUDA_ARCHITECTURES=$archs)"
t=$SECONDS
podman build --format docker --build-arg BUILD_IMAGE=localhost/fp8serve-test/cuda:13.0.2-devel \
  --build-arg RUNTIME_IMAGE=localhost/fp8serve-test/cuda:13.0.2-runtime --build-arg CUDA_ARCHITECTURES="$archs" \
  -f docker/Dockerfile -t "$image" . > "$cache/cuda-image.log" 2>&1 || { tail -40 "$cache/cuda-image.log"; exit 1; }
echo "   built in $((SECONDS - t)) s: $(($(podman image inspect -f '{{.Size}}' "$image") / 1000000)) MB"
grep "install-runtime:" "$cache/cuda-image.log" || true

echo "== the binary's libraries in the image"
podman run --rm --entrypoint ldd "$image" /usr/local/bin/fp8serve
echo "== a completion on the CPU backend (no GPU here)"
models=$(realpath .models)
port=$("${PYTHON:-.venv/bin/python}" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
name=fp8serve-test-cuda-$$
trap 'podman rm -f -t 0 "$name" > /dev/null 2>&1 || true' EXIT
podman run -d --name "$name" --network host --read-only -v "$models:/models:ro" -e FP8SERVE_PORT="$port" \
  -e FP8SERVE_THREADS=2 "$image" > /dev/null 2> /dev/null
for _ in $(seq 180); do
  podman healthcheck run "$name" > /dev/null 2>&1 && break
  [ "$(podman inspect -f '{{.State.Running}}' "$name")" = true ] || break
  sleep 1
done
podman logs "$name" 2>&1 | tail -8
curl -sS "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model": "SmolLM2-135M-Instruct.Q4_1", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}'
echo
