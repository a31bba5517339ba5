// SPDX-License-Identifier: MIT
// The Node.js peer of `ratelimit bench --redis URL --workload` (issue 27):
// rate-limiter-flexible's RateLimiterRedis (its fixed-window script) on one
// ioredis connection without auto-pipelining, DEPTH concurrent promises,
// N decisions over KEYS random keys, a limit that admits everything.
//   node peer.js HOST PORT N KEYS DEPTH
// Prints "decisions/s R client_us C" (C: this process's CPU per decision).
'use strict';
const Redis = require('ioredis');
const { RateLimiterRedis } = require('rate-limiter-flexible');

const [host, port, n, keys, depth] = process.argv.slice(2);
const total = Number(n || 200000), nkeys = Number(keys || 100000);
const inflight = Number(depth || 64);

async function main() {
  const redis = new Redis({ host: host || '127.0.0.1', port: Number(port || 6379),
                            enableAutoPipelining: false, lazyConnect: true });
  await redis.connect();
  const limiter = new RateLimiterRedis({
    storeClient: redis, points: 1e9, duration: 1,
    keyPrefix: `ratelimit:peer:${process.pid}:${Date.now()}`,
  });
  // The same kind of key draw as the C bench (xorshift), its own sequence.
  let x = 88172645463325252n;
  const mask = (1n << 64n) - 1n;
  const draw = new Array(total);
  for (let i = 0; i < total; i++) {
    x ^= (x << 13n) & mask; x ^= x >> 7n; x ^= (x << 17n) & mask;
    draw[i] = 'k' + (x % BigInt(nkeys)).toString();
  }
  await limiter.consume('warm-up', 1); // the script loaded, the connection up
  let next = 0, errors = 0;
  async function worker() {
    while (next < total) {
      const k = draw[next++];
      try { await limiter.consume(k, 1); } catch (e) { errors++; }
    }
  }
  const cpu0 = process.cpuUsage();
  const t0 = process.hrtime.bigint();
  await Promise.all(Array.from({ length: inflight }, worker));
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  const cpu = process.cpuUsage(cpu0);
  redis.disconnect();
  if (errors) console.error(`peer: ${errors} decisions failed`);
  console.log(`decisions/s ${(total / secs).toFixed(0)} client_us ${((cpu.user + cpu.system) / total).toFixed(2)}`);
}
main().catch((e) => { console.error('peer:', e.message); process.exit(1); });
