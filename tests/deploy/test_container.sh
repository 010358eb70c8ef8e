#!/usr/bin/env bash
# The deployment test, with podman and no Docker daemon or registry (as CI's machines are):
#   0. static checks: hadolint on the Dockerfiles, yamllint on every YAML file, the Kubernetes
#      manifests against the Kubernetes schemas (kubernetes-validate --strict);
#   1. a local Debian bookworm base image (debootstrap, cached in build/deploy-cache);
#   2. docker/Dockerfile.cpu built on it; the image's size, user, health check and stop signal;
#   3. the image serving the default model (mounted read-only, read-only root, non-root user,
#      the key from a mounted secret file): health check, a completion against the transformers
#      reference, a streaming chat; SIGTERM to the server as PID 1 drains and exits 0;
#   4. two replicas behind haproxy on the loopback: a burst shared by both, then SIGTERM to one
#      under load: its in-flight streams finish, new requests go to the other;
#   5. docker/Dockerfile.router built on the same base; two replicas with an API key behind it
#      (smg, cache-aware): the key checked and forwarded, requests that share a prefix all on
#      one replica;
#   6. every container it started removed (also on failure: trap).
# Needs root, `.ci/install build test deploy` and the default model (.ci/fetch-model).
set -euo pipefail
cd "$(dirname "$0")/../.."
start=$SECONDS

cache=build/deploy-cache
base_image=localhost/fp8serve-test/debian:bookworm-slim
image=localhost/fp8serve-test/fp8serve:cpu
router_image=localhost/fp8serve-test/fp8serve-router:smg
model_name=SmolLM2-135M-Instruct.Q4_1
model_file=.models/$model_name.gguf
reference=tests/fixtures/engine/smollm2-135m-q4_1.kv-bf16.json  # transformers, bf16 KV
prefix=fp8serve-test-$$
py=.venv/bin/python

if ! command -v podman > /dev/null; then
  echo "deploy: skipped: podman is not installed (.ci/install deploy installs it)"
  exit 77
fi
[ -x "$py" ] || { echo "deploy: no .venv: run .ci/install build test deploy"; exit 1; }
[ -f "$model_file" ] || { echo "deploy: $model_file is missing: run .ci/fetch-model"; exit 1; }

# shellcheck source=tests/deploy/podman_env.sh
source tests/deploy/podman_env.sh "$cache"

tmp=$(mktemp -d)
chmod 755 "$tmp"
containers=()
background=()
lb_pid=""
cleanup() {
  local pid name
  for pid in "${background[@]}" $lb_pid; do kill "$pid" 2> /dev/null || true; done
  for name in "${containers[@]}"; do podman rm -f -t 0 "$name" > /dev/null 2>&1 || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'echo "deploy: a command failed at line $LINENO"' ERR

passed=0
failed=0
# check DESCRIPTION COMMAND...: one assertion; the run goes on after a failure.
check() {
  if "${@:2}"; then
    passed=$((passed + 1))
    echo "   ok: $1"
  else
    failed=$((failed + 1))
    echo "   FAIL: $1"
  fi
}
die() {
  echo "deploy: $*"
  local name
  for name in "${containers[@]}"; do
    echo "--- podman logs $name (last 30 lines)"
    podman logs "$name" 2>&1 | tail -30 || true
  done
  echo "deploy: $passed passed, $((failed + 1)) failed"
  exit 1
}
equals() { [ "$1" = "$2" ] || { echo "      got '$1', want '$2'"; return 1; }; }
at_least() { [ "$1" -ge "$2" ] || { echo "      got $1, want at least $2"; return 1; }; }
at_most() { [ "$1" -le "$2" ] || { echo "      got $1, want at most $2"; return 1; }; }
contains() { grep -q -- "$2" "$1" || { echo "      '$2' not in $1: $(tail -c 300 "$1")"; return 1; }; }
free_port() { "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
json() { "$py" -c "import json, sys; d = json.load(open(sys.argv[1])); print($2)" "$1"; }
# The sum of every sample of one metric family on a replica's /metrics.
metric() {
  curl -s "http://127.0.0.1:$1/metrics" | awk -v m="$2" '$1 == m || index($1, m "{") == 1 {s += $2} END {print s + 0}'
}

models=$(realpath "$(dirname "$model_file")")
# run_replica NAME PORT [podman run options...]: the image, detached, on the host network (a
# server inside is reached as it would be on the host), the models read-only, root read-only.
run_replica() {
  podman run -d --name "$1" --network host --read-only -v "$models:/models:ro" \
    -e FP8SERVE_PORT="$2" -e FP8SERVE_THREADS=1 "${@:3}" "$image" > /dev/null 2>> "$tmp/podman.log" \
    || die "podman run $1 failed: $(tail -5 "$tmp/podman.log")"
  containers+=("$1")
}
# No systemd here, so no health-check timer: run the image's HEALTHCHECK until it passes.
wait_healthy() {
  local deadline=$((SECONDS + 180))
  until podman healthcheck run "$1" > /dev/null 2>&1; do
    [ "$(podman inspect -f '{{.State.Running}}' "$1")" = true ] || die "$1 exited before it was healthy"
    ((SECONDS < deadline)) || die "$1 not healthy after 180 s"
    sleep 1
  done
}
post() {  # post PORT PATH BODY [curl options...] -> body on stdout
  curl -sS --max-time 120 "http://127.0.0.1:$1$2" -H 'Content-Type: application/json' -d "$3" "${@:4}"
}

echo "== 0. static checks: hadolint, yamllint, kubernetes-validate"
check "hadolint docker/Dockerfile docker/Dockerfile.cpu docker/Dockerfile.router" \
  .venv/bin/hadolint docker/Dockerfile docker/Dockerfile.cpu docker/Dockerfile.router
mapfile -t yaml_files < <(git ls-files --cached --others --exclude-standard -- '*.yaml' '*.yml' .yamllint)
check "yamllint --strict on ${#yaml_files[@]} YAML files" .venv/bin/yamllint --strict "${yaml_files[@]}"
check "kubernetes-validate --strict docker/kubernetes/*.yaml docker/kubernetes/routing/*.yaml" \
  .venv/bin/kubernetes-validate --strict --quiet docker/kubernetes/*.yaml docker/kubernetes/routing/*.yaml

echo "== 1. base image (debootstrap bookworm, cached in $cache)"
t=$SECONDS
tests/deploy/make_base_image.sh "$cache" "$base_image" || die "no base image"
echo "   $((SECONDS - t)) s"

echo "== 2. podman build docker/Dockerfile.cpu"
t=$SECONDS
podman build --format docker --build-arg BASE_IMAGE="$base_image" -f docker/Dockerfile.cpu -t "$image" . \
  > "$cache/build.log" 2>&1 || { tail -40 "$cache/build.log"; die "podman build failed (log: $cache/build.log)"; }
echo "   built in $((SECONDS - t)) s"
# Old dangling build stages go; the newest stays as the layer cache of the next build.
podman image prune -f --filter until=24h > /dev/null 2>&1 || true
size_mb=$(($(podman image inspect -f '{{.Size}}' "$image") / 1000000))
base_mb=$(($(podman image inspect -f '{{.Size}}' "$base_image") / 1000000))
echo "   image $image: $size_mb MB (its base: $base_mb MB)"
check "the image adds at most 30 MB to its base" at_most "$size_mb" $((base_mb + 30))
check "runs as uid 10001" equals "$(podman image inspect -f '{{.Config.User}}' "$image")" "10001:10001"
check "stop signal SIGTERM" equals "$(podman image inspect -f '{{.Config.StopSignal}}' "$image")" "SIGTERM"
check "HEALTHCHECK kept (docker format)" equals "$(podman image inspect -f '{{.Config.Healthcheck.Test}}' "$image")" \
  "[CMD fp8serve-healthcheck]"
podman image inspect -f '{{range .Config.Env}}{{println .}}{{end}}' "$image" > "$tmp/env"
check "listens on 0.0.0.0 inside the container" contains "$tmp/env" "^FP8SERVE_HOST=0.0.0.0$"
check "no API key in the image" equals "$(grep -c API_KEY "$tmp/env")" 0

echo "== 3. one container: health, completion, streaming chat, API key file, SIGTERM as PID 1"
port=$(free_port)
key=sk-deploy-$$
echo "$key" > "$tmp/api_key"
chmod 644 "$tmp/api_key"
run_replica "$prefix-single" "$port" -v "$tmp/api_key:/run/secrets/fp8serve_api_key:ro" \
  -e FP8SERVE_API_KEY_FILE=/run/secrets/fp8serve_api_key -e FP8SERVE_KV_CACHE_DTYPE=bf16
t=$SECONDS
wait_healthy "$prefix-single"
echo "   healthy after $((SECONDS - t)) s"
podman top "$prefix-single" pid user args > "$tmp/top"
check "PID 1 is fp8serve serve, as user fp8serve" contains "$tmp/top" "^1 *fp8serve *fp8serve serve /models/$model_name.gguf"
check "no key: 401" equals "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v1/models")" 401
auth=(-H "Authorization: Bearer $key")
# The reference's first prompt, as token ids: 8 greedy tokens as transformers produced them
# (its first 8 steps have top-1/top-2 logit margins of 0.26 or more: no near-tie).
prompt_ids=$(json "$reference" 'd["prompts"][0]["prompt_ids"]')
greedy_ids=$(json "$reference" 'd["prompts"][0]["greedy_ids"][:8]')
post "$port" /v1/completions "{\"model\": \"$model_name\", \"prompt\": $prompt_ids, \"max_tokens\": 8, \"temperature\": 0,
  \"ignore_eos\": true, \"skip_special_tokens\": false}" "${auth[@]}" > "$tmp/completion.json"
post "$port" /detokenize "{\"model\": \"$model_name\", \"tokens\": $greedy_ids}" "${auth[@]}" > "$tmp/expected.json"
check "completion: the 8 greedy tokens of transformers" \
  equals "$(json "$tmp/completion.json" 'd["choices"][0]["text"]')" "$(json "$tmp/expected.json" 'd["prompt"]')"
chat="{\"model\": \"$model_name\", \"messages\": [{\"role\": \"user\", \"content\": \"What is the capital of France?\"}],
  \"max_tokens\": 24, \"temperature\": 0"
post "$port" /v1/chat/completions "$chat}" "${auth[@]}" > "$tmp/chat.json"
post "$port" /v1/chat/completions "$chat, \"stream\": true}" -N "${auth[@]}" > "$tmp/chat.sse"
answer=$(json "$tmp/chat.json" 'd["choices"][0]["message"]["content"]')
streamed=$("$py" -c '
import json, sys
lines = [l[6:] for l in open(sys.argv[1]).read().splitlines() if l.startswith("data: ")]
assert lines[-1] == "[DONE]", lines[-1]
print("".join(json.loads(l)["choices"][0]["delta"].get("content") or "" for l in lines[:-1]))' "$tmp/chat.sse")
echo "   chat: $answer"
check "chat answers Paris" contains "$tmp/chat.json" "Paris"
check "streamed chat (SSE to [DONE]) = the same answer" equals "$streamed" "$answer"
podman stop -t 60 "$prefix-single" > /dev/null 2>&1
podman logs "$prefix-single" > "$tmp/single.log" 2>&1
check "SIGTERM to PID 1: drained and stopped" contains "$tmp/single.log" "SIGTERM received: draining"
check "exit code 0 after SIGTERM" equals "$(podman inspect -f '{{.State.ExitCode}}' "$prefix-single")" 0
check "FP8SERVE_KV_CACHE_DTYPE from the environment" contains "$tmp/single.log" "KV cache: .*, bf16[ ,]"

echo "== 4. two replicas behind haproxy: a burst, then SIGTERM to one under load"
p1=$(free_port)
p2=$(free_port)
lb=$(free_port)
stats=$(free_port)
# A drain long enough for 320 tokens even on a busy 2-core machine (they take 5-10 s on an idle
# one; seven parallel builds made them take over 30 s, the default --shutdown-timeout).
drain=(-e FP8SERVE_SHUTDOWN_TIMEOUT=120)
run_replica "$prefix-r1" "$p1" "${drain[@]}"
run_replica "$prefix-r2" "$p2" "${drain[@]}"
cat > "$tmp/haproxy.cfg" << EOF
global
  maxconn 256
defaults
  mode http
  timeout connect 2s
  timeout client 120s
  timeout server 120s
  # A request refused by a draining replica (503) or by a closed port is sent to the other.
  option http-buffer-request
  retries 2
  retry-on conn-failure empty-response 503
  option redispatch 1
frontend api
  bind 127.0.0.1:$lb
  default_backend replicas
frontend stats
  bind 127.0.0.1:$stats
  stats enable
  stats uri /stats
backend replicas
  balance roundrobin
  option httpchk GET /health
  http-check expect status 200
  default-server inter 500ms fall 1 rise 2
  http-response set-header X-Replica %[srv_name]
  server r1 127.0.0.1:$p1 check
  server r2 127.0.0.1:$p2 check
EOF
haproxy -f "$tmp/haproxy.cfg" -db > "$tmp/haproxy.log" 2>&1 &
lb_pid=$!
wait_healthy "$prefix-r1"
wait_healthy "$prefix-r2"
deadline=$((SECONDS + 30))
until [ "$(curl -s "http://127.0.0.1:$stats/stats;csv" | grep -c '^replicas,r[12],.*,UP,')" = 2 ]; do
  ((SECONDS < deadline)) || die "haproxy did not see both replicas up: $(tail -5 "$tmp/haproxy.log")"
  sleep 0.5
done

# lb_request I MAX_TOKENS TAG [JSON]: one completion through the balancer; its status code and
# the X-Replica header that haproxy adds land in $tmp/TAG.I.{code,hdr}, the body in .body.
lb_request() {
  curl -s --max-time 120 -o "$tmp/$3.$1.body" -D "$tmp/$3.$1.hdr" -w '%{http_code}' \
    -H 'Content-Type: application/json' "http://127.0.0.1:$lb/v1/completions" \
    -d "{\"model\": \"$model_name\", \"prompt\": \"Request $1: the weather today is\", \"max_tokens\": $2${4:-}}" \
    > "$tmp/$3.$1.code" || true
}
replica_of() { awk -F': ' 'tolower($1) == "x-replica" {print $2}' "$1" | tr -d '\r'; }
burst=24
pids=()
for i in $(seq "$burst"); do
  lb_request "$i" 16 burst &
  pids+=($!)
  if ((${#pids[@]} == 8)); then wait "${pids[@]}"; pids=(); fi
done
((${#pids[@]} == 0)) || wait "${pids[@]}"
ok=0 on_r1=0 on_r2=0
for i in $(seq "$burst"); do
  if [ "$(cat "$tmp/burst.$i.code")" = 200 ]; then ok=$((ok + 1)); fi
  case "$(replica_of "$tmp/burst.$i.hdr")" in r1) on_r1=$((on_r1 + 1)) ;; r2) on_r2=$((on_r2 + 1)) ;; esac
done
served1=$(metric "$p1" fp8serve:request_success_total)
served2=$(metric "$p2" fp8serve:request_success_total)
echo "   burst of $burst (8 at a time): $ok answered 200; r1 served $on_r1 ($served1 by its /metrics), r2 $on_r2 ($served2)"
check "every request of the burst answered 200" equals "$ok" "$burst"
check "both replicas served some (their /metrics)" at_least "$((served1 < served2 ? served1 : served2))" 1
check "the replicas' /metrics count every request once" equals "$((served1 + served2))" "$burst"

# Under load: 4 long streams (2 land on each replica), then SIGTERM to r1 while they run.
stream_tokens=320
for i in 1 2 3 4; do
  lb_request "$i" "$stream_tokens" stream ', "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}' &
  background+=($!)
done
deadline=$((SECONDS + 30))
until (($(metric "$p1" fp8serve:num_requests_running) >= 1)); do
  ((SECONDS < deadline)) || die "no stream reached r1"
  sleep 0.2
done
podman stop -t 150 "$prefix-r1" > /dev/null 2>&1 &
stop_pid=$!
deadline=$((SECONDS + 10))
until [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$p1/health")" = 503 ]; do
  ((SECONDS < deadline)) || die "r1 did not start draining after SIGTERM"
  sleep 0.1
done
running_at_sigterm=$(metric "$p1" fp8serve:num_requests_running)
echo "   r1 draining with $running_at_sigterm streams in flight"
check "r1 had streams in flight when it began to drain" at_least "$running_at_sigterm" 1
new=8
pids=()
for i in $(seq "$new"); do
  lb_request "$i" 8 after &
  pids+=($!)
done
wait "${pids[@]}"
wait "${background[@]}"
background=()
wait "$stop_pid" || true
after_ok=0 after_r2=0
for i in $(seq "$new"); do
  if [ "$(cat "$tmp/after.$i.code")" = 200 ]; then after_ok=$((after_ok + 1)); fi
  if [ "$(replica_of "$tmp/after.$i.hdr")" = r2 ]; then after_r2=$((after_r2 + 1)); fi
done
echo "   $new new requests while r1 drained: $after_ok answered 200, $after_r2 by r2"
check "every new request answered 200" equals "$after_ok" "$new"
check "the balancer sent every new request to r2" equals "$after_r2" "$new"
streams_r1=0 streams_done=0
for i in 1 2 3 4; do
  if [ "$(replica_of "$tmp/stream.$i.hdr")" = r1 ]; then streams_r1=$((streams_r1 + 1)); fi
  if [ "$(cat "$tmp/stream.$i.code")" = 200 ] && tail -n 3 "$tmp/stream.$i.body" | grep -q '^data: \[DONE\]' \
    && grep -q "\"completion_tokens\":$stream_tokens," "$tmp/stream.$i.body"; then
    streams_done=$((streams_done + 1))
  fi
done
echo "   streams: $streams_done of 4 complete ($stream_tokens tokens, [DONE]); $streams_r1 of them on r1"
check "every stream finished whole, those on the draining r1 too" equals "$streams_done" 4
check "some streams were on r1" at_least "$streams_r1" 1
podman logs "$prefix-r1" > "$tmp/r1.log" 2>&1
check "r1 drained and stopped on SIGTERM" contains "$tmp/r1.log" "] stopped"
check "r1 aborted nothing" equals "$(grep -c 'shutdown timeout' "$tmp/r1.log")" 0
check "r1 exit code 0" equals "$(podman inspect -f '{{.State.ExitCode}}' "$prefix-r1")" 0

echo "== 5. the router image (smg, cache-aware) in front of two replicas with an API key"
t=$SECONDS
# pip inside the build fetches smg from PyPI; behind a TLS-intercepting proxy (PIP_CERT names its
# CA bundle here) the build gets that bundle too.
pip_ca=()
if [ -n "${PIP_CERT:-}" ] && [ -f "$PIP_CERT" ]; then
  pip_ca=(-v "$(realpath "$PIP_CERT"):/run/pip-ca.crt:ro" --build-arg PIP_CERT=/run/pip-ca.crt)
fi
podman build --format docker --build-arg BASE_IMAGE="$base_image" "${pip_ca[@]}" -f docker/Dockerfile.router -t "$router_image" . \
  > "$cache/build-router.log" 2>&1 || { tail -40 "$cache/build-router.log"; die "podman build of the router failed"; }
echo "   built in $((SECONDS - t)) s"
check "the router runs as uid 10001" equals "$(podman image inspect -f '{{.Config.User}}' "$router_image")" "10001:10001"
p3=$(free_port)
p4=$(free_port)
rport=$(free_port)
# The key as in production; /metrics open to the scraper as docker/kubernetes/configmap.yaml has it.
keyed=(-v "$tmp/api_key:/run/secrets/fp8serve_api_key:ro" -e FP8SERVE_API_KEY_FILE=/run/secrets/fp8serve_api_key
  -e FP8SERVE_METRICS_PUBLIC=true)
run_replica "$prefix-r3" "$p3" "${keyed[@]}"
run_replica "$prefix-r4" "$p4" "${keyed[@]}"
wait_healthy "$prefix-r3"
wait_healthy "$prefix-r4"
# As docker/compose.yaml runs it: the key read from the mounted secret, never on the line.
podman run -d --name "$prefix-router" --network host --read-only \
  -v "$tmp/api_key:/run/secrets/fp8serve_api_key:ro" --entrypoint /bin/bash "$router_image" -c \
  "exec /opt/router/bin/smg launch --host 127.0.0.1 --port $rport --prometheus-port $(free_port) --policy cache_aware \
   --worker-urls http://127.0.0.1:$p3 http://127.0.0.1:$p4 --api-key \"\$(cat /run/secrets/fp8serve_api_key)\"" \
  > /dev/null 2>> "$tmp/podman.log" || die "podman run of the router failed: $(tail -5 "$tmp/podman.log")"
containers+=("$prefix-router")
deadline=$((SECONDS + 60))
until curl -s "http://127.0.0.1:$rport/readiness" | grep -q '"healthy_workers":2'; do
  [ "$(podman inspect -f '{{.State.Running}}' "$prefix-router")" = true ] || die "the router exited"
  ((SECONDS < deadline)) || die "the router did not see both replicas: $(curl -s "http://127.0.0.1:$rport/readiness")"
  sleep 0.5
done
check "router: no key, 401" equals "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$rport/v1/completions" \
  -H 'Content-Type: application/json' -d "{\"model\": \"$model_name\", \"prompt\": \"x\", \"max_tokens\": 1}")" 401
# Six requests on one ~300-token document, each with its own question: one replica serves them.
document=$("$py" -c 'print(" ".join(f"Section {i}: the river runs past the mill and the bridge." for i in range(30)))')
before3=$(metric "$p3" fp8serve:request_success_total)
before4=$(metric "$p4" fp8serve:request_success_total)
routed_ok=0
for i in 1 2 3 4 5 6; do
  code=$(curl -s --max-time 120 -o "$tmp/routed.$i.body" -w '%{http_code}' "http://127.0.0.1:$rport/v1/completions" \
    "${auth[@]}" -H 'Content-Type: application/json' \
    -d "{\"model\": \"$model_name\", \"prompt\": \"$document Question $i:\", \"max_tokens\": 4}")
  if [ "$code" = 200 ]; then routed_ok=$((routed_ok + 1)); fi
done
# A replica counts a request once its response is out: the client may see the end first.
deadline=$((SECONDS + 10))
while :; do
  on3=$(($(metric "$p3" fp8serve:request_success_total) - before3))
  on4=$(($(metric "$p4" fp8serve:request_success_total) - before4))
  if ((on3 + on4 >= routed_ok || SECONDS >= deadline)); then break; fi
  sleep 0.2
done
hits=$(($(metric "$p3" fp8serve:prefix_cache_hits_total) + $(metric "$p4" fp8serve:prefix_cache_hits_total)))
echo "   6 requests sharing a document through the router: $routed_ok answered 200; r3 served $on3, r4 $on4; $hits prompt tokens from the prefix cache"
check "every routed request answered 200 (the key forwarded)" equals "$routed_ok" 6
check "one replica served every request that shares the prefix" equals "$((on3 == 6 || on4 == 6 ? 1 : 0))" 1
check "the repeats hit the prefix cache" at_least "$hits" 1

echo "== 6. cleanup"
kill "$lb_pid" 2> /dev/null || true
wait "$lb_pid" 2> /dev/null || true
lb_pid=""
for name in "${containers[@]}"; do podman rm -f -t 0 "$name" > /dev/null 2>&1 || true; done
check "no container of this test is left" equals "$(podman ps -a --filter "name=^$prefix-" -q | wc -l)" 0
containers=()

echo "deploy: $((SECONDS - start)) s"
echo "deploy: $passed passed, $failed failed"
((failed == 0))
