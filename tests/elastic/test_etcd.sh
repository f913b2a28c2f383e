#!/bin/bash
# Elastic training with its state in a real etcd cluster (src/elastic/etcd.c):
# three etcd members on free loopback ports, data under a mktemp folder, all
# killed by the trap on every exit. Skips (77) without /usr/bin/etcd or curl.
#   test_etcd.sh SCENARIO COLLIE_RUN WORKER...
# Scenarios:
#   train  workers a, b, c train; b kills itself (SIGKILL) at step 8, and
#          right after, etcd member 0 (the first endpoint every worker uses)
#          is killed too; the survivors form epoch 2 through the other two
#          members, then worker d is started and joins; everyone ends with
#          the state of a run without failures (the embedded store's
#          one-worker run gives that hash)
#   run    collie-run --elastic --store etcd://...: the launcher serves no
#          store; slot 1's worker dies at step 8 and etcd member 0 is killed;
#          collie-run restarts the slot, the new worker joins through etcd
#   auth   etcd with authentication: user and password in the URL or the
#          environment work, a wrong password fails at once with etcd's reason
#   tls    etcds:// against members that serve https only and want a client
#          certificate (COLLIE_ETCD_CACERT/CERT/KEY); without one: an error
#   lost   workers a, b train; every etcd member is killed: each worker fails
#          with an error naming etcd within a bounded time, none hangs
set -u
scenario=$1 run=$2
shift 2
worker=("$@")
[ -x /usr/bin/etcd ] || { echo "SKIPPED: /usr/bin/etcd missing (apt-get install etcd-server)"; exit 77; }
command -v curl >/dev/null || { echo "SKIPPED: curl missing"; exit 77; }
# The sanitizer build preloads the ASan runtime for the Python workers; the
# curl binary hangs with it preloaded (seen: even `curl -m 2` never returns),
# so the script's own curl calls run without it.
curl() { env -u LD_PRELOAD curl "$@"; }
tmp=$(mktemp -d)
pids=()
etcd_pids=()
cleanup() {
  for p in "${pids[@]}" "${etcd_pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
export NCCL_SOCKET_IFNAME=lo COLLIE_PEER_TIMEOUT=${COLLIE_PEER_TIMEOUT:-3}
export ELASTIC_STEPS=${ELASTIC_STEPS:-40}

fail() {
  echo "FAIL ($scenario): $*"
  for f in "$tmp"/out.* "$tmp"/etcd*.log; do
    [ -f "$f" ] && { echo "--- $(basename "$f")"; tail -25 "$f"; }
  done
  exit 1
}

# Ports nobody listens on now; etcd refuses to start on a taken one, and the
# whole cluster is then tried again with new ports.
free_ports() {
  /usr/bin/python3 - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

# With TLS (scenario tls) the members serve https and want a client
# certificate; tls_curl holds curl's options for that.
scheme=http
tls_curl=()
etcd_tls=()
put_ok() { # endpoint: 0 when the member serves kv requests
  curl -s -m 2 "${tls_curl[@]}" -X POST "$scheme://$1/v3/kv/put" -d '{"key":"aGVhbHRo","value":"MQ=="}' 2>/dev/null |
    grep -q revision
}

start_cluster() {
  local attempt ports i cluster
  for attempt in 1 2 3; do
    read -r -a ports <<<"$(free_ports 6)"
    cluster=""
    for i in 0 1 2; do cluster+="${cluster:+,}m$i=http://127.0.0.1:${ports[$((3 + i))]}"; done
    etcd_pids=()
    endpoints=()
    for i in 0 1 2; do
      endpoints+=("127.0.0.1:${ports[$i]}")
      /usr/bin/etcd --name "m$i" --data-dir "$tmp/m$i.$attempt" \
        --listen-client-urls "$scheme://127.0.0.1:${ports[$i]}" --advertise-client-urls "$scheme://127.0.0.1:${ports[$i]}" \
        "${etcd_tls[@]}" \
        --listen-peer-urls "http://127.0.0.1:${ports[$((3 + i))]}" \
        --initial-advertise-peer-urls "http://127.0.0.1:${ports[$((3 + i))]}" \
        --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token "collie-$$-$attempt" \
        --heartbeat-interval 250 --election-timeout 2500 \
        >"$tmp/etcd$i.log" 2>&1 &
      etcd_pids+=($!)
    done
    for _ in $(seq 150); do
      put_ok "${endpoints[0]}" && put_ok "${endpoints[1]}" && put_ok "${endpoints[2]}" && return 0
      sleep 0.2
    done
    for p in "${etcd_pids[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  done
  fail "could not start a 3-member etcd cluster"
}

# Waits until a file matches, at most $3 seconds.
wait_for() { # regex files... (last argument: seconds)
  local secs=${*: -1} re=$1 files=("${@:2:$#-2}")
  for _ in $(seq $((secs * 10))); do
    grep -q "$re" "${files[@]}" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

expect_final() { # file count hash
  local n ok hashes
  n=$(grep -c "final step=$ELASTIC_STEPS " "$1")
  ok=$(grep "final step=$ELASTIC_STEPS " "$1" | grep -c " OK$")
  hashes=$(grep -o "final step=$ELASTIC_STEPS .*hash=[0-9a-f]*" "$1" | sed 's/.*hash=//' | sort -u)
  [ "$n" -eq "$2" ] || fail "expected $2 workers to finish, got $n"
  [ "$ok" -eq "$2" ] || fail "a worker's final state differs from the no-failure state"
  [ "$(echo "$hashes" | wc -l)" -eq 1 ] || fail "workers ended with different states: $hashes"
  [ "$hashes" = "$3" ] || fail "final state hash $hashes differs from the no-failure run's $3"
}

if [ "$scenario" = tls ]; then
  command -v openssl >/dev/null || { echo "SKIPPED: openssl missing"; exit 77; }
  # A CA, a server certificate for 127.0.0.1 (also good for client auth:
  # etcd's JSON gateway dials its own gRPC server with it) and a client one.
  (
    cd "$tmp" || exit 1
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=collie test CA" -keyout ca.key -out ca.pem &&
      openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout server.key -out server.csr &&
      printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' >server.ext &&
      openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile server.ext -out server.pem &&
      openssl req -newkey rsa:2048 -nodes -subj "/CN=root" -keyout client.key -out client.csr &&
      printf 'extendedKeyUsage=clientAuth\n' >client.ext &&
      openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile client.ext -out client.pem
  ) >"$tmp/openssl.log" 2>&1 || fail "openssl could not make the test certificates: $(tail -3 "$tmp/openssl.log")"
  scheme=https
  tls_curl=(--cacert "$tmp/ca.pem" --cert "$tmp/client.pem" --key "$tmp/client.key")
  etcd_tls=(--cert-file "$tmp/server.pem" --key-file "$tmp/server.key" --client-cert-auth --trusted-ca-file "$tmp/ca.pem")
fi

start_cluster
job="job$$"
export COLLIE_RENDEZVOUS="etcd://$(IFS=,; echo "${endpoints[*]}")/$job"
# Short leases so that a killed worker is gone soon; long enough that a
# loaded machine does not starve a live worker's keepalives past them. The
# members' election timeout is raised for the same reason.
export COLLIE_ETCD_TTL=5 COLLIE_ELASTIC_HEARTBEAT_MS=300 COLLIE_ELASTIC_SETTLE_MS=300
unset COLLIE_RENDEZVOUS_SECRET COLLIE_ETCD_PREFIX

case $scenario in
train)
  base=$(env -u COLLIE_RENDEZVOUS ELASTIC_STEP_MS=0 timeout 200 "$run" --elastic --min 1 --max 1 -n 1 "${worker[@]}" \
         2>/dev/null | grep -o "hash=[0-9a-f]*" | sed 's/hash=//')
  [ -n "$base" ] || fail "the one-worker run without failures gave no hash"
  export COLLIE_ELASTIC_MIN=2 COLLIE_ELASTIC_MAX=3 COLLIE_ELASTIC_EXPECT=3 COLLIE_ETCD_TIMEOUT=30
  export ELASTIC_KILL_SLOT=b ELASTIC_KILL_STEP=8 ELASTIC_WAIT_SIZE=3
  for s in a b c; do
    COLLIE_ELASTIC_SLOT=$s timeout 200 "${worker[@]}" >"$tmp/out.$s" 2>&1 &
    pids+=($!)
  done
  wait "${pids[1]}" 2>/dev/null
  rc=$?
  [ $rc -eq 137 ] || fail "worker b should have killed itself at step 8 (exit status $rc)"
  kill -9 "${etcd_pids[0]}"
  wait "${etcd_pids[0]}" 2>/dev/null
  put_ok "${endpoints[0]}" && fail "etcd member 0 still answers after SIGKILL"
  wait_for "epoch 2, rank" "$tmp/out.a" "$tmp/out.c" 120 || fail "the survivors did not form epoch 2 without worker b"
  COLLIE_ELASTIC_SLOT=d timeout 200 "${worker[@]}" >"$tmp/out.d" 2>&1 &
  pids+=($!)
  for i in 0 2 3; do wait "${pids[$i]}" || fail "worker ${i} failed"; done
  cat "$tmp"/out.[acd] >"$tmp/all"
  grep -q "lost a peer at step" "$tmp/all" || fail "no survivor saw the lost peer"
  grep -q "membership changed" "$tmp/all" || fail "the survivors never saw worker d join"
  [ "$(grep -c "epoch 3, rank .* of 3" "$tmp/all")" -eq 2 ] || fail "the survivors did not form epoch 3 with worker d"
  expect_final "$tmp/all" 3 "$base"
  grep -h "worker" "$tmp"/out.[acd]
  ;;
run)
  # collie-run --elastic --store: no store in the launcher; it restarts the
  # killed slot, whose new worker joins through etcd (one member down).
  base=$(env -u COLLIE_RENDEZVOUS ELASTIC_STEP_MS=0 timeout 200 "$run" --elastic --min 1 --max 1 -n 1 "${worker[@]}" \
         2>/dev/null | grep -o "hash=[0-9a-f]*" | sed 's/hash=//')
  [ -n "$base" ] || fail "the one-worker run without failures gave no hash"
  export COLLIE_ETCD_TIMEOUT=30
  ELASTIC_KILL_SLOT=1 ELASTIC_KILL_STEP=8 ELASTIC_WAIT_SIZE=3 timeout 200 "$run" --elastic --store "$COLLIE_RENDEZVOUS" \
    --min 2 --max 3 -n 3 --heartbeat-timeout 5 --tag-output "${worker[@]}" >"$tmp/out.run" 2>&1 &
  pids+=($!)
  wait_for "killed by signal 9" "$tmp/out.run" 120 || fail "the worker of slot 1 did not die"
  kill -9 "${etcd_pids[0]}"
  wait "${etcd_pids[0]}" 2>/dev/null
  wait "${pids[0]}" || fail "collie-run failed"
  grep -q "slot 1 .*killed by signal 9.*restarting the slot" "$tmp/out.run" || fail "collie-run did not restart slot 1"
  grep -q "lost a peer at step" "$tmp/out.run" || fail "no survivor saw the lost peer"
  grep -q "elastic job ended after [2-9] epoch" "$tmp/out.run" || fail "collie-run did not read the epochs from etcd"
  expect_final "$tmp/out.run" 3 "$base"
  grep "worker\|collie-run" "$tmp/out.run"
  ;;
auth)
  # etcd with authentication on: credentials in the URL (worker a) or in
  # COLLIE_ETCD_USER/PASSWORD (worker b); a wrong password fails at once.
  export ELASTIC_STEPS=10
  base=$(env -u COLLIE_RENDEZVOUS ELASTIC_STEP_MS=0 timeout 200 "$run" --elastic --min 1 --max 1 -n 1 "${worker[@]}" \
         2>/dev/null | grep -o "hash=[0-9a-f]*" | sed 's/hash=//')
  [ -n "$base" ] || fail "the one-worker run without failures gave no hash"
  api="http://${endpoints[1]}/v3"
  for req in "user/add {\"name\":\"root\",\"password\":\"pw:1@x\"}" "role/add {\"name\":\"root\"}" \
             "user/grant {\"user\":\"root\",\"role\":\"root\"}" "enable {}"; do
    curl -s -m 10 -X POST "$api/auth/${req%% *}" -d "${req#* }" | grep -q '"header"' || fail "etcd auth setup: $req"
  done
  plain=$COLLIE_RENDEZVOUS
  export COLLIE_ELASTIC_MIN=2 COLLIE_ELASTIC_MAX=2 COLLIE_ELASTIC_EXPECT=2 COLLIE_ETCD_TIMEOUT=60
  COLLIE_ELASTIC_SLOT=a COLLIE_RENDEZVOUS="etcd://root:pw%3A1%40x@${plain#etcd://}" timeout 200 "${worker[@]}" \
    >"$tmp/out.a" 2>&1 &
  pids+=($!)
  COLLIE_ELASTIC_SLOT=b COLLIE_ETCD_USER=root COLLIE_ETCD_PASSWORD='pw:1@x' timeout 200 "${worker[@]}" >"$tmp/out.b" 2>&1 &
  pids+=($!)
  for i in 0 1; do wait "${pids[$i]}" || fail "worker $i failed"; done
  cat "$tmp"/out.[ab] >"$tmp/all"
  expect_final "$tmp/all" 2 "$base"
  COLLIE_ELASTIC_SLOT=c COLLIE_ETCD_USER=root COLLIE_ETCD_PASSWORD=wrong timeout 30 "${worker[@]}" >"$tmp/out.c" 2>&1
  rc=$?
  [ $rc -ne 124 ] || fail "a wrong password made the worker wait instead of failing"
  [ $rc -ne 0 ] || fail "a wrong password was accepted"
  grep -q "authentication failed" "$tmp/out.c" || fail "the worker with a wrong password did not say so"
  grep -h "authentication failed" "$tmp/out.c" | head -1
  ! env -u COLLIE_ETCD_USER -u LD_PRELOAD curl -s -m 5 -X POST "$api/kv/range" -d '{"key":"Lw==","range_end":"MA=="}' | grep -q '"kvs"' ||
    fail "etcd answered without credentials: auth is not on"
  ;;
tls)
  # etcds://: the members serve https only and want a client certificate.
  export ELASTIC_STEPS=10
  base=$(env -u COLLIE_RENDEZVOUS ELASTIC_STEP_MS=0 timeout 200 "$run" --elastic --min 1 --max 1 -n 1 "${worker[@]}" \
         2>/dev/null | grep -o "hash=[0-9a-f]*" | sed 's/hash=//')
  [ -n "$base" ] || fail "the one-worker run without failures gave no hash"
  export COLLIE_RENDEZVOUS="etcds://${COLLIE_RENDEZVOUS#etcd://}" COLLIE_ETCD_CACERT=$tmp/ca.pem
  export COLLIE_ETCD_CERT=$tmp/client.pem COLLIE_ETCD_KEY=$tmp/client.key
  export COLLIE_ELASTIC_MIN=2 COLLIE_ELASTIC_MAX=2 COLLIE_ELASTIC_EXPECT=2 COLLIE_ETCD_TIMEOUT=60
  for s in a b; do
    COLLIE_ELASTIC_SLOT=$s timeout 200 "${worker[@]}" >"$tmp/out.$s" 2>&1 &
    pids+=($!)
  done
  for i in 0 1; do wait "${pids[$i]}" || fail "worker $i failed"; done
  cat "$tmp"/out.[ab] >"$tmp/all"
  expect_final "$tmp/all" 2 "$base"
  # Without the client certificate the members refuse the connection.
  COLLIE_ELASTIC_SLOT=c COLLIE_ETCD_CERT= COLLIE_ETCD_KEY= COLLIE_ETCD_TIMEOUT=3 timeout 60 "${worker[@]}" \
    >"$tmp/out.c" 2>&1 && fail "a worker without a client certificate got in"
  grep -q "no etcd endpoint answered" "$tmp/out.c" || fail "the worker without a certificate gave no clear error"
  ;;
lost)
  export COLLIE_ELASTIC_MIN=2 COLLIE_ELASTIC_MAX=2 COLLIE_ELASTIC_EXPECT=2 COLLIE_ETCD_TIMEOUT=5
  export ELASTIC_STEPS=1000000 ELASTIC_STEP_MS=20
  for s in a b; do
    COLLIE_ELASTIC_SLOT=$s timeout 120 "${worker[@]}" >"$tmp/out.$s" 2>&1 &
    pids+=($!)
  done
  # Training: the state key (epoch 1) is in etcd.
  key=$(printf '/collie/%s/state' "$job" | base64 -w0)
  for _ in $(seq 600); do
    curl -s -m 2 -X POST "http://${endpoints[1]}/v3/kv/range" -d "{\"key\":\"$key\"}" | grep -q '"kvs"' && break
    sleep 0.1
  done
  sleep 1
  for i in 0 1; do kill -0 "${pids[$i]}" 2>/dev/null || fail "worker $i ended before etcd went away"; done
  for p in "${etcd_pids[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  etcd_pids=()
  start=$(date +%s)
  for i in 0 1; do
    wait "${pids[$i]}" 2>/dev/null
    rc=$?
    [ $rc -ne 124 ] || fail "worker $i hung after etcd went away"
    [ $rc -ne 0 ] || fail "worker $i succeeded without etcd"
  done
  # The bound is the timeout above (rc 124 fails); COLLIE_ETCD_TIMEOUT
  # bounds each request: a check, then the rendezvous, plus the peer timeout.
  secs=$(($(date +%s) - start))
  for s in a b; do
    grep -q "no etcd endpoint answered" "$tmp/out.$s" || fail "worker $s did not say that etcd is unreachable"
  done
  echo "workers gave up $secs s after etcd went away"; cat "$tmp"/out.a
  ;;
*)
  echo "unknown scenario $scenario"
  exit 2
  ;;
esac
echo "PASS ($scenario)"
