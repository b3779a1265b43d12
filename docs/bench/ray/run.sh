#!/bin/bash
# 8 clients of mixed modes through /v1 against `serve --ray` with 2 replicas (1 CPU each) and 1 replica (2 CPUs)
cd "$(dirname "$0")/../../.."
for setup in "2 1" "1 2"; do
  set -- $setup
  port=$((7880 + $1))
  rm -f /tmp/ray$1.db
  .venv/bin/specscope serve --ray --replicas $1 --replica-cpus $2 --no-ui --port $port --db sqlite:////tmp/ray$1.db > /tmp/serve$1.log 2>&1 &
  pid=$!
  for i in $(seq 1 120); do curl -sf http://127.0.0.1:$port/api/health > /dev/null && break; sleep 1; done
  curl -s http://127.0.0.1:$port/api/health | head -c 600; echo
  .venv/bin/specscope loadtest --url http://127.0.0.1:$port --phases load --clients 8 --requests 48 --max-tokens 32 --modes ar,isd,quadratic,linear_spec --out docs/bench/ray/replicas-$1.json > /tmp/load$1.log 2>&1
  tail -20 /tmp/load$1.log
  kill -INT $pid; wait $pid
done
