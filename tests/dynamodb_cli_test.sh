#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The command on the DynamoDB store, against a private dynalite started on
# a free loopback port and stopped by its PID: every replay vector gives
# the memory store's output byte for byte and leaves no item behind; check
# adds up across calls; a policy too long for an item, a malformed URL and
# missing credentials are clear errors.
# Usage: dynamodb_cli_test.sh RATELIMIT_BINARY VECTORS_DIR DYNALITE
# Exit 77 (skipped) without dynalite, unless CI=true (then 1).
set -u
R=$1
V=$2
D=${DYNALITE:-$3}
if [ ! -x "$D" ] || ! command -v node >/dev/null 2>&1; then
  if [ "${CI:-}" = true ]; then
    echo "dynamodb_cli_test: FAILED: no dynalite at $D (CI=true): run make deps" >&2
    exit 1
  fi
  echo "dynamodb_cli_test: SKIPPED: no dynalite at $D (make deps installs it)" >&2
  exit 77
fi
T=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

port=$(node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
"$D" --host 127.0.0.1 --port "$port" --createTableMs 0 >/dev/null 2>&1 &
pid=$!
# One request to dynalite: OP JSON; prints the answer.
ddb() {
  node -e '
const http = require("http");
const req = http.request({host: "127.0.0.1", port: process.argv[1], method: "POST", path: "/",
  headers: {"Content-Type": "application/x-amz-json-1.0",
            "X-Amz-Target": "DynamoDB_20120810." + process.argv[2],
            "X-Amz-Date": "20200101T000000Z",
            "Authorization": "AWS4-HMAC-SHA256 Credential=x/20200101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=0"}},
  res => { let b = ""; res.on("data", d => b += d); res.on("end", () => console.log(b)); });
req.on("error", e => { console.log("error " + e.message); });
req.end(process.argv[3]);' "$port" "$1" "$2"
}
for _ in $(seq 300); do
  case "$(ddb ListTables '{}')" in *TableNames*) break ;; esac
  sleep 0.1
done
export AWS_ACCESS_KEY_ID=AKIDTEST AWS_SECRET_ACCESS_KEY=secret
unset AWS_SESSION_TOKEN AWS_PROFILE
U="dynamodb://cli-vectors?region=us-east-1&endpoint=http://127.0.0.1:$port"

# --- every vector, byte for byte, then nothing left in the table
for args in "$V"/*.args; do
  n=$(basename "$args" .args)
  # shellcheck disable=SC2046
  if "$R" replay $(cat "$args") --store "$U" "$V/$n.trace" >"$T/out" 2>"$T/err" &&
     cmp -s "$T/out" "$V/$n.out"; then ok
  else bad "replay vector $n on DynamoDB: $(tail -n 1 "$T/err")"; diff "$V/$n.out" "$T/out" | head -5; fi
done
if "$R" replay --input clf --algorithm fixed-window --limit 2 --window 1s \
     --store "$U" "$V/access.log" >"$T/out" 2>/dev/null && cmp -s "$T/out" "$V/access.out"
then ok; else bad "replay --input clf on DynamoDB"; fi
case "$(ddb Scan '{"TableName":"cli-vectors","Select":"COUNT"}')" in
  *'"Count":0'*) ok ;;
  *) bad "replay left items behind: $(ddb Scan '{"TableName":"cli-vectors","Select":"COUNT"}')" ;;
esac

# --- check: decisions add up across calls (the table made by the first)
C="dynamodb://cli-check?region=us-east-1&endpoint=http://127.0.0.1:$port"
"$R" check --key k --algorithm fixed-window --limit 2 --window 1h --store "$C" >"$T/first" 2>&1; a=$?
"$R" check --key k --algorithm fixed-window --limit 2 --window 1h --store "$C" >/dev/null 2>&1; b=$?
"$R" check --key k --algorithm fixed-window --limit 2 --window 1h --store "$C" >"$T/out" 2>&1; c=$?
if [ $a -eq 0 ] && [ $b -eq 0 ] && [ $c -eq 1 ] && grep -q "^reason limited" "$T/out"; then ok
else bad "check on DynamoDB: $a $b $c: $(cat "$T/first")"; fi

# --- errors
"$R" check --key k --policy "sliding-log 10000/1h; sliding-log 10000/1d; sliding-log 10000/7d" \
  --store "$C" >/dev/null 2>"$T/err"; rc=$?
if [ $rc -eq 2 ] && grep -q "cannot keep this policy: .*400 KB" "$T/err"; then ok
else bad "a policy too long for an item: rc=$rc $(cat "$T/err")"; fi
"$R" check --key k --limit 1 --window 1s --algorithm fixed-window \
  --store "dynamodb://cli-check?endpoint=http://127.0.0.1:$port" >/dev/null 2>"$T/err"; rc=$?
if [ $rc -eq 2 ] && grep -q "no region" "$T/err"; then ok
else bad "a URL without region: rc=$rc $(cat "$T/err")"; fi
env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY AWS_SHARED_CREDENTIALS_FILE=/nonexistent \
  "$R" check --key k --limit 1 --window 1s --algorithm fixed-window --store "$C" \
  >/dev/null 2>"$T/err"; rc=$?
if [ $rc -eq 2 ] && grep -q "no AWS credentials" "$T/err"; then ok
else bad "no credentials: rc=$rc $(cat "$T/err")"; fi
# dynalite gone: the check is a store error with the transport's words
kill -9 "$pid"; wait "$pid" 2>/dev/null; pid=
"$R" check --key k --limit 1 --window 1s --algorithm fixed-window --store "$C" \
  >/dev/null 2>"$T/err"; rc=$?
if [ $rc -eq 2 ] && grep -q "DescribeTable on http://127.0.0.1:$port" "$T/err"; then ok
else bad "dynalite gone: rc=$rc $(cat "$T/err")"; fi

echo "dynamodb_cli_test: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
